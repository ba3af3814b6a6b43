// sdpa::nn::MultiHeadAttention against a float64 re-implementation of the formulas
// (reference_mha.h): self- and cross-attention, GQA, biases, RoPE, every mask the layer
// takes, strided (seq-first) inputs, the weights, and loading weights under sdpa's and
// torch.nn.MultiheadAttention's names, from state dicts and safetensors files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include <unistd.h>

#include "io/safetensors.h"
#include "reference_mha.h"
#include "sdpa/error.h"
#include "sdpa/nn.h"
#include "testing/helpers.h"

namespace {

using sdpa::Causal;
using sdpa::DType;
using sdpa::Tensor;
using sdpa::TensorView;
using sdpa::nn::AttentionCall;
using sdpa::nn::MultiHeadAttention;
using sdpa::nn::MultiHeadAttentionConfig;
using sdpa::nn::RopeLayout;
using sdpa::nn::RopeOptions;
using sdpa::testing::max_abs;
using sdpa::testing::max_abs_diff;
using sdpa::testing::reference_mha;

// Random biases too (the layer starts them at zero, which would hide a missing bias).
void randomize(MultiHeadAttention& layer, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.3);
  for (const auto& [name, t] : layer.parameters()) {
    Tensor& p = layer.parameter(name);
    for (std::int64_t i = 0; i < p.numel(); ++i) p.set(i, normal(rng));
  }
}

Tensor random64(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return sdpa::testing::random_tensor(DType::float64, shape, rng);
}

// The float64 rule of DESIGN.md §4: 1e-10 relative to the output's scale.
void expect_close(const Tensor& got, const Tensor& expected, const char* what) {
  ASSERT_EQ(got.shape(), expected.shape()) << what;
  EXPECT_LE(max_abs_diff(got, expected), 1e-10 * std::max(1.0, max_abs(expected))) << what;
}

MultiHeadAttentionConfig config(std::int64_t embed, std::int64_t heads, std::int64_t kv_heads = 0, bool bias = true) {
  MultiHeadAttentionConfig c;
  c.embed_dim = embed;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.bias = bias;
  c.dtype = DType::float64;
  return c;
}

struct SelfCase {
  std::int64_t embed, heads, kv_heads;
  bool bias;
  std::optional<RopeLayout> rope;
  std::int64_t batch, length;
  Causal causal;
};

class SelfAttentionTest : public ::testing::TestWithParam<SelfCase> {};

TEST_P(SelfAttentionTest, MatchesTheFormulaInFloat64) {
  const SelfCase p = GetParam();
  MultiHeadAttentionConfig c = config(p.embed, p.heads, p.kv_heads, p.bias);
  if (p.rope) c.rope = RopeOptions{10000.0, *p.rope, 0};
  MultiHeadAttention layer(c);
  randomize(layer, 1);
  const Tensor x = random64({p.batch, p.length, p.embed}, 2);
  AttentionCall call;
  call.causal = p.causal;
  call.need_weights = true;
  const auto result = layer.forward(x.view(), call);
  Tensor weights;
  const Tensor expected = reference_mha(layer, x, x, x, nullptr, p.causal != Causal::none, 0, &weights);
  expect_close(result.output, expected, "output");
  expect_close(result.weights, weights, "weights");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, SelfAttentionTest,
    ::testing::Values(SelfCase{16, 4, 0, true, std::nullopt, 2, 7, Causal::none},
                      SelfCase{16, 4, 0, true, std::nullopt, 2, 7, Causal::top_left},
                      SelfCase{24, 6, 2, false, RopeLayout::half_split, 3, 5, Causal::top_left},  // GQA 3:1
                      SelfCase{32, 4, 1, true, RopeLayout::interleaved, 1, 17, Causal::none},     // MQA
                      SelfCase{8, 1, 0, true, RopeLayout::interleaved, 2, 1, Causal::top_left},   // one token
                      SelfCase{40, 5, 5, true, std::nullopt, 1, 33, Causal::top_left}),
    [](const ::testing::TestParamInfo<SelfCase>& info) {
      const SelfCase& c = info.param;
      const char* rope = !c.rope ? "NoRope" : *c.rope == RopeLayout::half_split ? "RopeHalfSplit" : "RopeInterleaved";
      // Appended piecewise: `"E" + std::to_string(...)` trips GCC 12's -Wrestrict (PR105329).
      std::string name = "E";
      name += std::to_string(c.embed);
      name += "Hq";
      name += std::to_string(c.heads);
      name += "Hkv";
      name += std::to_string(c.kv_heads == 0 ? c.heads : c.kv_heads);
      name += c.bias ? "Bias" : "NoBias";
      name += rope;
      name += "B";
      name += std::to_string(c.batch);
      name += "L";
      name += std::to_string(c.length);
      name += c.causal == Causal::none ? "" : "Causal";
      return name;
    });

// Cross-attention: L != S, key and value inputs of other widths (torch's kdim, vdim), and
// a head_dim that does not come from embed_dim / heads.
TEST(MultiHeadAttentionTest, CrossAttentionWithOtherInputWidths) {
  MultiHeadAttentionConfig c = config(20, 4, 2);
  c.kdim = 12;
  c.vdim = 28;
  c.head_dim = 6;
  MultiHeadAttention layer(c);
  randomize(layer, 3);
  const Tensor q = random64({2, 5, 20}, 4), k = random64({2, 9, 12}, 5), v = random64({2, 9, 28}, 6);
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    AttentionCall call;
    call.causal = causal;
    expect_close(layer.forward(q.view(), k.view(), v.view(), call).output,
                 reference_mha(layer, q, k, v, nullptr, causal != Causal::none), "cross");
  }
}

// A sliding window, ALiBi slopes and softcapping from the config (Mistral's local layers,
// ALiBi models, Gemma 2), against the formula: self-attention with and without causal,
// and cross-attention (L != S, where the window and ALiBi count from the bottom-right
// diagonal).
TEST(MultiHeadAttentionTest, WindowAlibiAndSoftcapMatchTheFormula) {
  MultiHeadAttentionConfig c = config(24, 6, 2);
  c.window_left = 2;
  c.window_right = 1;
  c.alibi_slopes = {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625};
  c.softcap = 1.5;
  MultiHeadAttention layer(c);
  randomize(layer, 11);
  const Tensor x = random64({2, 7, 24}, 12), k = random64({2, 10, 24}, 13), v = random64({2, 10, 24}, 14);
  for (Causal causal : {Causal::none, Causal::top_left}) {
    AttentionCall call;
    call.causal = causal;
    expect_close(layer.forward(x.view(), call).output, reference_mha(layer, x, x, x, nullptr, causal != Causal::none),
                 causal == Causal::none ? "self" : "self, causal");
  }
  expect_close(layer.forward(x.view(), k.view(), v.view()).output, reference_mha(layer, x, k, v, nullptr, false),
               "cross");
  // The options matter: the same weights without them give another output.
  MultiHeadAttentionConfig plain_config = c;
  plain_config.window_left = plain_config.window_right = -1;
  plain_config.alibi_slopes.clear();
  plain_config.softcap = 0;
  MultiHeadAttention plain(plain_config);
  for (const auto& [name, t] : layer.parameters()) plain.parameter(name) = *t;
  const Tensor a = layer.forward(x.view()).output, b = plain.forward(x.view()).output;
  double difference = 0;
  for (std::int64_t n = 0; n < a.numel(); ++n) difference = std::max(difference, std::abs(a.get(n) - b.get(n)));
  EXPECT_GT(difference, 1e-3);
}

// Every row keeps at least one key, so no row is fully masked (torch's MHA gives NaN
// there, sdpa gives 0; the Python tests pin that separately).
class MaskTest : public ::testing::Test {
 protected:
  static constexpr std::int64_t B = 2, L = 6, S = 6, E = 16, H = 4;
  MaskTest() : layer_(config(E, H)) { randomize(layer_, 7); }
  MultiHeadAttention layer_;
  Tensor x_ = random64({B, L, E}, 8);
  static bool padded(std::int64_t b, std::int64_t s) { return s >= S - 1 - b; }  // b=0: last key; b=1: last two
  static bool blocked(std::int64_t l, std::int64_t s) { return (l + 2 * s) % 3 == 0 && s != 0; }
};

TEST_F(MaskTest, BoolAttentionMaskKeepsTrueKeys) {
  Tensor mask(DType::boolean, {L, S});  // broadcast over batch and heads
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t s = 0; s < S; ++s) mask.set(l * S + s, blocked(l, s) ? 0 : 1);
  AttentionCall call;
  call.mask = mask.view();
  expect_close(
      layer_.forward(x_.view(), call).output,
      reference_mha(
          layer_, x_, x_, x_, [](auto, auto, auto l, auto s) { return blocked(l, s) ? -INFINITY : 0.0; }, false),
      "bool mask");
}

TEST_F(MaskTest, FloatAttentionMaskIsAddedPerHead) {
  const Tensor mask = random64({B, H, L, S}, 9);
  AttentionCall call;
  call.mask = mask.view();
  expect_close(layer_.forward(x_.view(), call).output,
               reference_mha(
                   layer_, x_, x_, x_,
                   [&](auto b, auto h, auto l, auto s) { return mask.get(((b * H + h) * L + l) * S + s); }, false),
               "float mask");
}

TEST_F(MaskTest, KeyPaddingMaskTrueMeansPadding) {
  Tensor pad(DType::boolean, {B, S});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) pad.set(b * S + s, padded(b, s));
  AttentionCall call;
  call.key_padding_mask = pad.view();
  const auto padding = [](auto b, auto, auto, auto s) { return padded(b, s) ? -INFINITY : 0.0; };
  expect_close(layer_.forward(x_.view(), call).output, reference_mha(layer_, x_, x_, x_, padding, false), "padding");
  // With causal, and with a bool attention mask: all three apply.
  Tensor mask(DType::boolean, {L, S});
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t s = 0; s < S; ++s) mask.set(l * S + s, !blocked(l, s));
  call.mask = mask.view();
  call.causal = Causal::top_left;
  const auto both = [](auto b, auto, auto l, auto s) { return padded(b, s) || blocked(l, s) ? -INFINITY : 0.0; };
  expect_close(layer_.forward(x_.view(), call).output, reference_mha(layer_, x_, x_, x_, both, true), "padding+mask");
}

TEST_F(MaskTest, FloatKeyPaddingAndFloatMaskAreSummed) {
  const Tensor pad = random64({B, S}, 10), mask = random64({1, H, L, S}, 11);
  AttentionCall call;
  call.key_padding_mask = pad.view();
  expect_close(layer_.forward(x_.view(), call).output,
               reference_mha(
                   layer_, x_, x_, x_, [&](auto b, auto, auto, auto s) { return pad.get(b * S + s); }, false),
               "float padding");
  call.mask = mask.view();
  expect_close(
      layer_.forward(x_.view(), call).output,
      reference_mha(
          layer_, x_, x_, x_,
          [&](auto b, auto h, auto l, auto s) { return pad.get(b * S + s) + mask.get((h * L + l) * S + s); }, false),
      "float padding + float mask");
}

// An int8 mask is neither bool nor an additive float: adding its integers as a float
// mask would be a silent wrong answer, so each mask, alone or with the other, is refused
// by name.
TEST_F(MaskTest, Int8MasksAreRefusedByName) {
  Tensor int8_mask(DType::int8, {L, S}), int8_pad(DType::int8, {B, S});
  Tensor bool_mask(DType::boolean, {L, S}), float_pad = random64({B, S}, 12);
  auto expect_refused = [&](const AttentionCall& call, const std::string& argument, const char* what) {
    try {
      layer_.forward(x_.view(), call);
      ADD_FAILURE() << what << ": accepted an int8 mask";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
      EXPECT_EQ(e.kind(), sdpa::ErrorKind::type) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << what << ": " << e.what();
    }
  };
  AttentionCall call;
  call.mask = int8_mask.view();
  expect_refused(call, "call.mask", "int8 mask alone");
  call.key_padding_mask = float_pad.view();
  expect_refused(call, "call.mask", "int8 mask with a float padding mask");
  call.mask = bool_mask.view();
  call.key_padding_mask = int8_pad.view();
  expect_refused(call, "call.key_padding_mask", "int8 padding mask with a bool mask");
  call.mask.reset();
  expect_refused(call, "call.key_padding_mask", "int8 padding mask alone");
}

TEST(MultiHeadAttentionTest, UnbatchedInputIsABatchOfOne) {
  MultiHeadAttention layer(config(12, 3));
  randomize(layer, 12);
  const Tensor x = random64({1, 5, 12}, 13);
  Tensor x2(DType::float64, {5, 12});
  std::memcpy(x2.data(), x.data(), x.nbytes());
  Tensor pad(DType::boolean, {5});
  pad.set(4, 1);
  Tensor pad_batched(DType::boolean, {1, 5});
  pad_batched.set(4, 1);
  AttentionCall call, call_batched;
  call.key_padding_mask = pad.view();
  call.need_weights = call_batched.need_weights = true;
  call_batched.key_padding_mask = pad_batched.view();
  const auto unbatched = layer.forward(x2.view(), call);
  const auto batched = layer.forward(x.view(), call_batched);
  EXPECT_EQ(unbatched.output.shape(), (std::vector<std::int64_t>{5, 12}));
  EXPECT_EQ(unbatched.weights.shape(), (std::vector<std::int64_t>{3, 5, 5}));
  EXPECT_EQ(std::memcmp(unbatched.output.data(), batched.output.data(), batched.output.nbytes()), 0);
  EXPECT_EQ(std::memcmp(unbatched.weights.data(), batched.weights.data(), batched.weights.nbytes()), 0);
}

// torch's batch_first=False layout: a (L, B, E) buffer is a strided (B, L, E) view; and a
// view whose rows the BLAS cannot address (inner stride 2) goes through a packed copy.
TEST(MultiHeadAttentionTest, StridedInputsGiveThePackedResult) {
  MultiHeadAttention layer(config(16, 2));
  randomize(layer, 14);
  const std::int64_t B = 3, L = 4, E = 16;
  const Tensor packed = random64({B, L, E}, 15);
  Tensor seq_first(DType::float64, {L, B, E});
  Tensor spread(DType::float64, {B, L, 2 * E});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t e = 0; e < E; ++e) {
        seq_first.set((l * B + b) * E + e, packed.get((b * L + l) * E + e));
        spread.set((b * L + l) * 2 * E + 2 * e, packed.get((b * L + l) * E + e));
      }
  const TensorView seq_view{seq_first.data(), DType::float64, {B, L, E}, {E, B * E, 1}};
  const TensorView spread_view{spread.data(), DType::float64, {B, L, E}, {L * 2 * E, 2 * E, 2}};
  const Tensor expected = layer.forward(packed.view()).output;
  EXPECT_EQ(max_abs_diff(layer.forward(seq_view).output, expected), 0.0);
  EXPECT_EQ(max_abs_diff(layer.forward(spread_view).output, expected), 0.0);
}

TEST(MultiHeadAttentionTest, Float32LayerAgreesWithFloat64) {
  MultiHeadAttentionConfig c = config(32, 4, 2);
  c.rope = RopeOptions{};
  MultiHeadAttention layer64(c);
  randomize(layer64, 16);
  c.dtype = DType::float32;
  MultiHeadAttention layer32(c);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : layer64.parameters()) state.emplace(name, *t);
  layer32.load_state_dict(state);  // rounds to float32
  const Tensor x64 = random64({2, 9, 32}, 17);
  const Tensor x32 = sdpa::testing::convert(x64, DType::float32);
  AttentionCall call;
  call.causal = Causal::top_left;
  const Tensor expected = layer64.forward(x64.view(), call).output;
  const Tensor got = sdpa::testing::to_float64(layer32.forward(x32.view(), call).output.view());
  EXPECT_LE(max_abs_diff(got, expected), 1e-5 * std::max(1.0, max_abs(expected)));
}

// torch.nn.MultiheadAttention stores [W_q; W_k; W_v] as one in_proj_weight (3E, E) and
// in_proj_bias (3E), or q_proj_weight / k_proj_weight / v_proj_weight when kdim or vdim
// differ from embed_dim; out_proj.weight and out_proj.bias as sdpa does.
TEST(MultiHeadAttentionTest, LoadsTorchNamesIntoTheSameParameters) {
  MultiHeadAttention source(config(8, 2));
  randomize(source, 18);
  Tensor in_w(DType::float32, {24, 8}), in_b(DType::float32, {24});  // float32: converted on load
  for (int part = 0; part < 3; ++part) {
    const char* names[] = {"q_proj", "k_proj", "v_proj"};
    const Tensor& w = source.parameter(std::string(names[part]) + ".weight");
    const Tensor& b = source.parameter(std::string(names[part]) + ".bias");
    for (std::int64_t i = 0; i < 64; ++i) in_w.set(part * 64 + i, w.get(i));
    for (std::int64_t i = 0; i < 8; ++i) in_b.set(part * 8 + i, b.get(i));
  }
  MultiHeadAttention loaded(config(8, 2));
  loaded.load_state_dict({{"in_proj_weight", in_w},
                          {"in_proj_bias", in_b},
                          {"out_proj.weight", source.parameter("out_proj.weight")},
                          {"out_proj.bias", source.parameter("out_proj.bias")}});
  for (const auto& [name, t] : source.parameters()) {
    // The in_proj parts went through float32; out_proj was given in float64.
    const Tensor expected = name.starts_with("out_proj")
                                ? *t
                                : sdpa::testing::to_float64(sdpa::testing::convert(*t, DType::float32).view());
    EXPECT_EQ(max_abs_diff(loaded.parameter(name), expected), 0.0) << name;
  }

  MultiHeadAttentionConfig c = config(8, 2);
  c.kdim = 4;
  c.vdim = 6;
  MultiHeadAttention separate(c);
  const Tensor qw = random64({8, 8}, 1), kw = random64({8, 4}, 2), vw = random64({8, 6}, 3);
  separate.load_state_dict({{"q_proj_weight", qw},
                            {"k_proj_weight", kw},
                            {"v_proj_weight", vw},
                            {"in_proj_bias", random64({24}, 4)},
                            {"out_proj.weight", random64({8, 8}, 5)},
                            {"out_proj.bias", random64({8}, 6)}});
  EXPECT_EQ(max_abs_diff(separate.parameter("k_proj.weight"), kw), 0.0);
  EXPECT_EQ(max_abs_diff(separate.parameter("v_proj.weight"), vw), 0.0);
}

TEST(MultiHeadAttentionTest, LoadStateDictChecksEverythingBeforeChangingAnything) {
  MultiHeadAttention layer(config(8, 2));
  randomize(layer, 19);
  std::map<std::string, Tensor> good;
  for (const auto& [name, t] : layer.parameters()) good.emplace(name, random64(t->shape(), 20));
  const Tensor before = layer.parameter("q_proj.weight");

  auto expect_rejected = [&](std::map<std::string, Tensor> state, const std::string& needle) {
    try {
      layer.load_state_dict(state);
      ADD_FAILURE() << "accepted a state dict that should fail with " << needle;
    } catch (const sdpa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(max_abs_diff(layer.parameter("q_proj.weight"), before), 0.0) << "changed by a rejected load";
  };
  auto missing = good;
  missing.erase("v_proj.bias");
  expect_rejected(missing, "v_proj.bias");
  auto wrong_shape = good;
  wrong_shape["k_proj.weight"] = random64({8, 9}, 1);
  expect_rejected(wrong_shape, "(8, 8)");
  auto extra = good;
  extra["bias_k"] = random64({1, 1, 8}, 1);
  expect_rejected(extra, "add_bias_kv");
  auto unknown = good;
  unknown["rotary.inv_freq"] = random64({4}, 1);
  expect_rejected(unknown, "rotary.inv_freq");
  auto twice = good;
  twice["in_proj_weight"] = random64({24, 8}, 1);
  expect_rejected(twice, "a second time");
  auto boolean = good;
  boolean["q_proj.bias"] = Tensor(DType::boolean, {8});
  expect_rejected(boolean, "bool");
  // int8 (a quantized K/V dtype, and what a safetensors I8 tensor loads as) is no weight:
  // its integers would load as integer-valued weights.
  auto quantized = good;
  quantized["q_proj.bias"] = Tensor(DType::int8, {8});
  expect_rejected(quantized, "q_proj.bias: expected a floating-point tensor, got int8");
}

// An I8 tensor of the layer's in a safetensors file (the reader loads it as int8) is
// refused, naming the file and the tensor, and the weights stay as they were.
TEST(MultiHeadAttentionTest, Int8SafetensorsParameterIsRefused) {
  MultiHeadAttention layer(config(8, 2));
  randomize(layer, 25);
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  const Tensor int8_bias(DType::int8, {8});
  for (const auto& [name, t] : layer.parameters())
    tensors.emplace_back(name, name == "k_proj.bias" ? &int8_bias : t);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("sdpa_mha_int8_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  sdpa::io::write_safetensors(path, tensors);
  MultiHeadAttention loaded(config(8, 2));
  const Tensor before = loaded.parameter("k_proj.bias");
  try {
    loaded.load_safetensors(path);
    ADD_FAILURE() << "loaded an int8 parameter";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), path);
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::type) << e.what();
    EXPECT_NE(std::string(e.what()).find("k_proj.bias: expected a floating-point tensor, got int8"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_EQ(max_abs_diff(loaded.parameter("k_proj.bias"), before), 0.0);
}

class SafetensorsLayerTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }
  // One file per test and process: ctest runs this fixture's tests in parallel.
  static std::string unique_path() {
    std::string name = "sdpa_mha_test_";  // appended piecewise: GCC 12's -Wrestrict (PR105329)
    name += ::testing::UnitTest::GetInstance()->current_test_info()->name();
    name += '_';
    name += std::to_string(::getpid());
    name += ".safetensors";
    return (std::filesystem::temp_directory_path() / name).string();
  }
  std::string path_ = unique_path();
};

TEST_F(SafetensorsLayerTest, SavedWeightsLoadBackBitwise) {
  MultiHeadAttentionConfig c = config(12, 6, 3);
  c.rope = RopeOptions{};
  MultiHeadAttention layer(c);
  randomize(layer, 21);
  layer.save_safetensors(path_, {{"note", "test"}});
  const sdpa::io::SafetensorsFile file = sdpa::io::read_safetensors(path_);
  EXPECT_EQ(file.metadata.at("note"), "test");
  EXPECT_EQ(file.metadata.at("sdpa.num_kv_heads"), "3");
  EXPECT_EQ(file.tensors.size(), 8u);

  c.seed = 99;  // other initial weights
  MultiHeadAttention loaded(c);
  loaded.load_safetensors(path_);
  for (const auto& [name, t] : layer.parameters()) EXPECT_EQ(max_abs_diff(loaded.parameter(name), *t), 0.0) << name;
  const Tensor x = random64({2, 4, 12}, 22);
  EXPECT_EQ(max_abs_diff(loaded.forward(x.view()).output, layer.forward(x.view()).output), 0.0);
}

// A layer out of a whole model's file: other tensors (an int64 buffer among them) are
// left alone.
TEST_F(SafetensorsLayerTest, LoadsOneLayerByPrefix) {
  MultiHeadAttention layer(config(8, 2));
  randomize(layer, 23);
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  const Tensor other = random64({3, 3}, 24);
  tensors.emplace_back("layers.1.attn.q_proj.weight", &other);
  for (const auto& [name, t] : layer.parameters()) tensors.emplace_back("layers.0.attn." + name, t);
  std::string bytes = sdpa::io::serialize_safetensors(tensors);
  {
    std::ofstream out(path_, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  MultiHeadAttention loaded(config(8, 2));
  loaded.load_safetensors(path_, "layers.0.attn.");
  for (const auto& [name, t] : layer.parameters()) EXPECT_EQ(max_abs_diff(loaded.parameter(name), *t), 0.0) << name;
  // Without the prefix the names are unknown to the layer: an error naming the file.
  try {
    loaded.load_safetensors(path_);
    FAIL() << "loaded a whole model's file as one layer";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), path_);
  }
}

TEST(MultiHeadAttentionTest, DropoutAppliesInTrainingOnlyAndFollowsTheSeed) {
  MultiHeadAttentionConfig c = config(16, 4);
  c.dropout = 0.5;
  MultiHeadAttention layer(c);
  randomize(layer, 25);
  const Tensor x = random64({2, 8, 16}, 26);
  AttentionCall eval, train;
  train.training = true;
  train.dropout_seed = 7;
  const Tensor plain = layer.forward(x.view(), eval).output;
  expect_close(plain, reference_mha(layer, x, x, x, nullptr, false), "eval ignores dropout");
  const Tensor a = layer.forward(x.view(), train).output, b = layer.forward(x.view(), train).output;
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  EXPECT_GT(max_abs_diff(a, plain), 1e-3);
  train.dropout_seed = 8;
  EXPECT_GT(max_abs_diff(layer.forward(x.view(), train).output, a), 1e-3);
}

TEST(MultiHeadAttentionTest, InitialWeightsAreXavierUniformAndBiasesZero) {
  MultiHeadAttention a(config(64, 8, 2)), b(config(64, 8, 2));
  for (const auto& [name, t] : a.parameters()) {
    EXPECT_EQ(max_abs_diff(*t, b.parameter(name)), 0.0) << name << " differs between two layers of seed 0";
    if (name.ends_with(".bias")) {
      EXPECT_EQ(max_abs(*t), 0.0) << name;
    } else {
      const double bound = std::sqrt(6.0 / static_cast<double>(t->shape()[0] + t->shape()[1]));
      EXPECT_LE(max_abs(*t), bound) << name;
      EXPECT_GT(max_abs(*t), 0.9 * bound) << name;
    }
  }
  // Q and K start different (each matrix has its own stream).
  EXPECT_GT(max_abs_diff(a.parameter("q_proj.weight"), a.parameter("out_proj.weight")), 0.0);
}

TEST(MultiHeadAttentionTest, RejectsBadConfigurationsAndInputs) {
  auto bad_config = [](MultiHeadAttentionConfig c, const char* argument) {
    try {
      MultiHeadAttention layer(c);
      ADD_FAILURE() << "accepted a bad " << argument;
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  bad_config(config(10, 3), "config.num_heads");  // 10 % 3
  bad_config(config(12, 4, 3), "config.num_kv_heads");
  MultiHeadAttentionConfig c = config(8, 2);
  c.dropout = 1.0;
  bad_config(c, "config.dropout");
  c = config(8, 2);
  c.rope = RopeOptions{10000.0, RopeLayout::half_split, 3};
  bad_config(c, "config.rope.rotary_dim");
  c = config(8, 2);
  c.dtype = DType::float16;
  bad_config(c, "config.dtype");
  c = config(8, 2);
  c.window_left = -2;
  bad_config(c, "config.window_left");
  c = config(8, 2);
  c.window_right = -5;
  bad_config(c, "config.window_right");
  c = config(8, 2);
  c.softcap = -1.0;
  bad_config(c, "config.softcap");
  c = config(8, 2);
  c.alibi_slopes = {0.5, 0.25, 0.125};  // 2 heads
  bad_config(c, "config.alibi_slopes");
  c = config(8, 2);
  c.sinks = {0.5};  // 2 heads
  bad_config(c, "config.sinks");
  c = config(8, 2);
  c.dtype = DType::float32;
  c.sinks = {0.5, 1e39};  // finite in float64, +inf in float32: refused at construction, not at the first call
  bad_config(c, "config.sinks");

  MultiHeadAttention layer(config(8, 2));
  auto bad_call = [&](const TensorView& q, const TensorView& k, const TensorView& v, const AttentionCall& call,
                      const char* argument, sdpa::ErrorKind kind = sdpa::ErrorKind::value) {
    try {
      layer.forward(q, k, v, call);
      ADD_FAILURE() << "accepted a bad " << argument;
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
      EXPECT_EQ(e.kind(), kind) << e.what();
    }
  };
  const Tensor x = random64({2, 3, 8}, 1), other_batch = random64({3, 3, 8}, 2), wide = random64({2, 3, 9}, 3);
  const Tensor longer = random64({2, 4, 8}, 4);
  const Tensor x32 = sdpa::testing::convert(x, DType::float32);
  bad_call(x32.view(), x.view(), x.view(), {}, "query", sdpa::ErrorKind::type);
  bad_call(wide.view(), x.view(), x.view(), {}, "query");
  bad_call(x.view(), other_batch.view(), x.view(), {}, "key");
  bad_call(x.view(), x.view(), longer.view(), {}, "value");
  Tensor mask(DType::boolean, {4, 3});
  AttentionCall call;
  call.mask = mask.view();
  bad_call(x.view(), x.view(), x.view(), call, "call.mask");
  Tensor pad(DType::boolean, {2, 4});
  call = {};
  call.key_padding_mask = pad.view();
  bad_call(x.view(), x.view(), x.view(), call, "call.key_padding_mask");

  // Issue #12: with RoPE, positions past + offset + l overflowed int64 near 2^63.
  MultiHeadAttentionConfig with_rope = config(8, 2);
  with_rope.rope = RopeOptions{};
  MultiHeadAttention rotary(with_rope);
  call = {};
  call.position_offset = std::numeric_limits<std::int64_t>::max() - 1;  // 3 tokens: last at 2^63
  try {
    rotary.forward(x.view(), x.view(), x.view(), call);
    ADD_FAILURE() << "accepted a position offset whose last position overflows";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), "call.position_offset") << e.what();
  }
}

}  // namespace
