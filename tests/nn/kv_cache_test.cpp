// Incremental decoding: feeding a sequence through the layer a token (or a chunk) at a
// time with a KV cache must give, position by position, the outputs of one causal pass
// over the whole sequence — RoPE positions continuing from the cache, the causal mask
// aligned bottom-right, GQA heads shared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

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
using sdpa::nn::KVCache;
using sdpa::nn::MultiHeadAttention;
using sdpa::nn::MultiHeadAttentionConfig;
using sdpa::nn::RopeLayout;
using sdpa::nn::RopeOptions;

Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return sdpa::testing::random_tensor(dtype, shape, rng);
}

// Rows [begin, begin + count) of every batch of a packed (B, T, E) tensor, as a view.
TensorView rows(const Tensor& x, std::int64_t begin, std::int64_t count) {
  const std::int64_t T = x.shape()[1], E = x.shape()[2];
  return TensorView{static_cast<std::byte*>(const_cast<void*>(x.data())) + begin * E * sdpa::dtype_size(x.dtype()),
                    x.dtype(),
                    {x.shape()[0], count, E},
                    {T * E, E, 1}};
}

struct DecodeCase {
  DType dtype;
  std::int64_t heads, kv_heads;
  std::optional<RopeLayout> rope;
  std::vector<std::int64_t> chunks;  // tokens per call; they sum to the sequence length
  bool extensions = false;           // a sliding window of 3, ALiBi slopes, softcap 2
};

class DecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeTest, TokenByTokenEqualsOneCausalPass) {
  const DecodeCase p = GetParam();
  MultiHeadAttentionConfig c;
  c.embed_dim = 8 * p.heads;
  c.num_heads = p.heads;
  c.num_kv_heads = p.kv_heads;
  c.dtype = p.dtype;
  c.seed = 5;
  if (p.rope) c.rope = RopeOptions{10000.0, *p.rope, 0};
  if (p.extensions) {
    c.window_left = 3;
    c.softcap = 2.0;
    for (std::int64_t h = 0; h < p.heads; ++h) c.alibi_slopes.push_back(std::exp2(-static_cast<double>(h + 1)));
  }
  MultiHeadAttention layer(c);
  for (const auto& [name, t] : layer.parameters()) {
    if (name.ends_with(".bias")) layer.parameter(name) = random_tensor(p.dtype, t->shape(), 6);
  }
  std::int64_t total = 0;
  for (std::int64_t n : p.chunks) total += n;
  const std::int64_t B = 2;
  const Tensor x = random_tensor(p.dtype, {B, total, c.embed_dim}, 7);

  AttentionCall whole_call;
  whole_call.causal = Causal::top_left;
  const Tensor whole = layer.forward(x.view(), whole_call).output;

  KVCache cache = layer.make_cache(B, 2);  // small: growth happens on the way
  std::int64_t at = 0;
  double worst = 0;
  for (std::int64_t n : p.chunks) {
    AttentionCall call;
    call.causal = Causal::top_left;  // applied bottom-right with a cache
    call.cache = &cache;
    const Tensor out = layer.forward(rows(x, at, n), call).output;
    ASSERT_EQ(cache.length(), at + n);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t e = 0; e < c.embed_dim; ++e)
          worst = std::max(worst, std::abs(out.get((b * n + t) * c.embed_dim + e) -
                                           whole.get((b * total + at + t) * c.embed_dim + e)));
    at += n;
  }
  const double scale = std::max(1.0, sdpa::testing::max_abs(whole));
  EXPECT_LE(worst, (p.dtype == DType::float64 ? 1e-12 : 1e-5) * scale);
  EXPECT_GE(cache.capacity(), total);
}

INSTANTIATE_TEST_SUITE_P(
    Sequences, DecodeTest,
    ::testing::Values(DecodeCase{DType::float64, 4, 4, std::nullopt, {1, 1, 1, 1, 1, 1, 1}},
                      DecodeCase{DType::float64, 4, 2, RopeLayout::half_split, std::vector<std::int64_t>(19, 1)},
                      DecodeCase{DType::float64, 6, 1, RopeLayout::interleaved, {5, 1, 1, 3, 1, 1}},  // prefill + steps
                      DecodeCase{DType::float32, 4, 2, RopeLayout::half_split, {4, 1, 1, 1, 1, 1, 1, 1, 1}},
                      // The window reaches back from each new token into the cache.
                      DecodeCase{DType::float64, 4, 2, RopeLayout::half_split, {5, 1, 1, 3, 1, 1}, true}),
    [](const ::testing::TestParamInfo<DecodeCase>& info) {
      const DecodeCase& c = info.param;
      return std::string(sdpa::dtype_name(c.dtype)) + "Hq" + std::to_string(c.heads) + "Hkv" +
             std::to_string(c.kv_heads) + (!c.rope ? "NoRope" : "Rope") + "Prefill" + std::to_string(c.chunks[0]) +
             "Calls" + std::to_string(c.chunks.size()) + (c.extensions ? "WindowAlibiSoftcap" : "");
    });

// The cached path against the formula directly, with a key-padding mask over the cached
// positions: the queries of the second call see the first call's keys.
TEST(KVCacheTest, SecondCallAttendsToCachedKeysWithPadding) {
  MultiHeadAttentionConfig c;
  c.embed_dim = 12;
  c.num_heads = 3;
  c.dtype = DType::float64;
  c.rope = RopeOptions{};
  MultiHeadAttention layer(c);
  const Tensor x = random_tensor(DType::float64, {1, 6, 12}, 8);
  KVCache cache = layer.make_cache(1);
  AttentionCall call;
  call.cache = &cache;
  layer.forward(rows(x, 0, 4), call);
  Tensor pad(DType::boolean, {1, 6});
  pad.set(1, 1);  // key 1 is padding
  call.key_padding_mask = pad.view();
  const Tensor got = layer.forward(rows(x, 4, 2), call).output;
  // Reference: queries 4, 5 against keys 0..5, no causal mask, RoPE positions 4.. and 0..
  Tensor q(DType::float64, {1, 2, 12});
  std::memcpy(q.data(), static_cast<const double*>(x.data()) + 4 * 12, 2 * 12 * sizeof(double));
  const Tensor expected = sdpa::testing::reference_mha(
      layer, q, x, x, [](auto, auto, auto, auto s) { return s == 1 ? -INFINITY : 0.0; }, false, 4, nullptr, 0);
  EXPECT_LE(sdpa::testing::max_abs_diff(got, expected), 1e-12 * std::max(1.0, sdpa::testing::max_abs(expected)));
}

TEST(KVCacheTest, AppendGrowsKeepsAndViewsTheData) {
  KVCache cache(DType::float32, 2, 3, 4, 5, 1);
  std::vector<Tensor> keys, values;
  for (int step = 0; step < 5; ++step) {
    keys.push_back(random_tensor(DType::float32, {2, 3, step + 1, 4}, 10 + step));
    values.push_back(random_tensor(DType::float32, {2, 3, step + 1, 5}, 20 + step));
    cache.append(keys.back().view(), values.back().view());
  }
  ASSERT_EQ(cache.length(), 15);
  const Tensor k = sdpa::testing::to_float64(cache.keys()), v = sdpa::testing::to_float64(cache.values());
  EXPECT_EQ(k.shape(), (std::vector<std::int64_t>{2, 3, 15, 4}));
  EXPECT_EQ(v.shape(), (std::vector<std::int64_t>{2, 3, 15, 5}));
  std::int64_t at = 0;
  for (int step = 0; step < 5; ++step) {
    const std::int64_t n = step + 1;
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t t = 0; t < n; ++t) {
          for (std::int64_t e = 0; e < 4; ++e) ASSERT_EQ(k.at({b, h, at + t, e}), keys[step].at({b, h, t, e}));
          for (std::int64_t e = 0; e < 5; ++e) ASSERT_EQ(v.at({b, h, at + t, e}), values[step].at({b, h, t, e}));
        }
    at += n;
  }
  cache.truncate(3);
  EXPECT_EQ(cache.keys().shape[2], 3);
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
}

TEST(KVCacheTest, RejectsMismatchesAndLeavesTheCacheUnchanged) {
  KVCache cache(DType::float64, 1, 2, 4, 4);
  const Tensor k = random_tensor(DType::float64, {1, 2, 3, 4}, 1);
  cache.append(k.view(), k.view());
  const Tensor wrong_heads = random_tensor(DType::float64, {1, 3, 1, 4}, 2);
  const Tensor wrong_len = random_tensor(DType::float64, {1, 2, 2, 4}, 3);
  const Tensor f32 = random_tensor(DType::float32, {1, 2, 1, 4}, 4);
  EXPECT_THROW(cache.append(wrong_heads.view(), wrong_heads.view()), sdpa::Error);
  EXPECT_THROW(cache.append(k.view(), wrong_len.view()), sdpa::Error);
  EXPECT_THROW(cache.append(f32.view(), f32.view()), sdpa::Error);
  EXPECT_THROW(cache.truncate(4), sdpa::Error);
  EXPECT_EQ(cache.length(), 3);

  // A layer call that fails leaves the cache as it was.
  MultiHeadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.dtype = DType::float64;
  MultiHeadAttention layer(c);
  KVCache layer_cache = layer.make_cache(1);
  const Tensor x = random_tensor(DType::float64, {1, 2, 8}, 5);
  AttentionCall call;
  call.cache = &layer_cache;
  call.num_threads = -1;
  EXPECT_THROW(layer.forward(x.view(), call), sdpa::Error);
  EXPECT_EQ(layer_cache.length(), 0);
  KVCache wrong = layer.make_cache(2);
  call.num_threads = 0;
  call.cache = &wrong;
  EXPECT_THROW(layer.forward(x.view(), call), sdpa::Error);  // batch 1 vs a cache for 2
  EXPECT_EQ(wrong.length(), 0);
}

}  // namespace

namespace {

// Appending the cache's own contents (doubling it) must read them before growth frees
// the old storage (a use-after-free that ASan reported in review).
TEST(KVCacheTest, AppendingItsOwnViewAcrossGrowthKeepsTheData) {
  KVCache cache(DType::float32, 1, 1, 2, 2, 1);
  const Tensor k = random_tensor(DType::float32, {1, 1, 16, 2}, 31), v = random_tensor(DType::float32, {1, 1, 16, 2}, 32);
  cache.append(k.view(), v.view());
  ASSERT_EQ(cache.capacity(), 16);  // full: the next append grows
  cache.append(cache.keys(), cache.values());
  ASSERT_EQ(cache.length(), 32);
  const Tensor keys = sdpa::testing::to_float64(cache.keys()), values = sdpa::testing::to_float64(cache.values());
  for (std::int64_t t = 0; t < 32; ++t)
    for (std::int64_t e = 0; e < 2; ++e) {
      EXPECT_EQ(keys.at({0, 0, t, e}), k.at({0, 0, t % 16, e}));
      EXPECT_EQ(values.at({0, 0, t, e}), v.at({0, 0, t % 16, e}));
    }
}

TEST(KVCacheTest, NegativePositionCountIsRejected) {
  KVCache cache(DType::float32, 1, 1, 4, 4);
  float data[4] = {};
  const TensorView negative{data, DType::float32, {1, 1, -3, 4}};
  EXPECT_THROW(cache.append(negative, negative), sdpa::Error);
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace

// An int8 cache quantizes each appended row (growth included) exactly as quantize_kv
// does on the whole sequence, hands out its scales beside keys() and values(), and a
// layer decoding into it reads them: the layer's output equals sdpa::forward on the
// cache's own int8 K/V and scales (the attention it would run), token by token.
TEST(KVCacheTest, Int8CacheQuantizesOnAppendAndTheLayerReadsItsScales) {
  KVCache cache(DType::int8, 2, 3, 4, 5, 1);
  KVCache plain(DType::float32, 2, 3, 4, 5, 1);
  for (int step = 0; step < 5; ++step) {
    const Tensor k = random_tensor(DType::float32, {2, 3, step + 1, 4}, 40 + step);
    const Tensor v = random_tensor(DType::float32, {2, 3, step + 1, 5}, 50 + step);
    cache.append(k.view(), v.view());
    plain.append(k.view(), v.view());
  }
  ASSERT_EQ(cache.length(), 15);
  ASSERT_TRUE(cache.key_scale() && cache.value_scale());
  EXPECT_FALSE(plain.key_scale());
  const sdpa::QuantizedKV want_k = sdpa::quantize_kv(plain.keys()), want_v = sdpa::quantize_kv(plain.values());
  EXPECT_TRUE(sdpa::testing::bitwise_equal(sdpa::testing::to_float64(cache.keys()),
                                           sdpa::testing::to_float64(want_k.values.view())));
  EXPECT_TRUE(sdpa::testing::bitwise_equal(sdpa::testing::to_float64(*cache.key_scale()),
                                           sdpa::testing::to_float64(want_k.scale.view())));
  EXPECT_TRUE(sdpa::testing::bitwise_equal(sdpa::testing::to_float64(cache.values()),
                                           sdpa::testing::to_float64(want_v.values.view())));
  EXPECT_TRUE(sdpa::testing::bitwise_equal(sdpa::testing::to_float64(*cache.value_scale()),
                                           sdpa::testing::to_float64(want_v.scale.view())));
  // A NaN is refused and leaves the cache as it was; so are int8 inputs.
  Tensor nan_k = random_tensor(DType::float32, {2, 3, 1, 4}, 60);
  nan_k.set(3, std::nan(""));
  const Tensor ok_v = random_tensor(DType::float32, {2, 3, 1, 5}, 61);
  // The error names the append's argument (quantize_kv's own name for it is x).
  auto expect_refused_naming = [&](const TensorView& k, const TensorView& v, const std::string& argument) {
    try {
      cache.append(k, v);
      ADD_FAILURE() << "appended a NaN";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(argument + ": expected finite values to quantize, got nan"),
                std::string::npos)
          << e.what();
    }
  };
  expect_refused_naming(nan_k.view(), ok_v.view(), "keys");
  Tensor nan_v = ok_v;
  nan_v.set(7, std::nan(""));
  const Tensor ok_k = random_tensor(DType::float32, {2, 3, 1, 4}, 62);
  expect_refused_naming(ok_k.view(), nan_v.view(), "values");
  EXPECT_EQ(cache.length(), 15);
  const Tensor k8(DType::int8, {2, 3, 1, 4}), v8(DType::int8, {2, 3, 1, 5});
  EXPECT_THROW(cache.append(k8.view(), v8.view()), sdpa::Error);
  EXPECT_EQ(cache.length(), 15);

  MultiHeadAttentionConfig c;
  c.embed_dim = 16;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  MultiHeadAttention layer(c);
  KVCache layer_cache = layer.make_cache(1, 0, DType::int8);
  EXPECT_THROW(layer.make_cache(1, 0, DType::float16), sdpa::Error);
  for (int step = 0; step < 6; ++step) {
    const Tensor x = random_tensor(DType::float32, {1, 1, 16}, 70 + step);
    AttentionCall call;
    call.cache = &layer_cache;
    call.causal = Causal::top_left;
    const sdpa::nn::AttentionResult got = layer.forward(x.view(), call);
    ASSERT_EQ(layer_cache.length(), step + 1);
    EXPECT_EQ(layer_cache.keys().dtype, DType::int8);
    // The same attention by hand from the cache's int8 contents: Q is the layer's query
    // projection (its parameter, zero bias), the output projection applied after.
    const Tensor& wq = layer.parameter("q_proj.weight");
    const Tensor& wo = layer.parameter("out_proj.weight");
    Tensor q(DType::float32, {1, 4, 1, 4});
    for (std::int64_t o = 0; o < 16; ++o) {
      double sum = 0;
      for (std::int64_t i = 0; i < 16; ++i) sum += wq.get(o * 16 + i) * x.get(i);
      q.set(o, sum);  // (1, L = 1, Hq·D) is (1, Hq, 1, D) for one token
    }
    sdpa::Options o;
    o.key_scale = layer_cache.key_scale();
    o.value_scale = layer_cache.value_scale();
    o.backend = sdpa::Backend::reference;
    const sdpa::ForwardResult attended = sdpa::forward(q.view(), layer_cache.keys(), layer_cache.values(), o);
    for (std::int64_t out = 0; out < 16; ++out) {
      double y = 0;
      for (std::int64_t i = 0; i < 16; ++i) y += wo.get(out * 16 + i) * attended.output.get(i);
      EXPECT_NEAR(got.output.get(out), y, 1e-4 * (1 + std::abs(y))) << "step " << step << " out " << out;
    }
  }
}
