// The SIMD forward is compiled once per x86 target (AVX-512, AVX2, SSE4, scalar) and
// dispatched at run time; this machine runs only the best one unless told otherwise.
// Each target the CPU supports must agree with the oracle on its own, so that an AVX2-
// or SSE-only machine gets the same contract.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "cpu/simd/bf16_kernels.h"
#include "hwy/targets.h"
#include "testing/expectations.h"
#include "testing/gradients.h"
#include "testing/helpers.h"

namespace sdpa::testing {
namespace {

class EveryTarget : public ::testing::Test {
 protected:
  // Makes the dispatch pick `target` (0: every target the CPU supports, the best first).
  static void Choose(std::int64_t target) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  }
  void TearDown() override { Choose(0); }
};

// K and V as given, or for dtype int8 quantized with a scale per row (quantize_kv),
// the scales set in `options`. Not copyable: the views point into its own tensors.
struct KeysAndValues {
  QuantizedKV k8, v8;
  TensorView keys, values;
  KeysAndValues(const Tensor& k, const Tensor& v, DType dtype, Options& options) : keys(k.view()), values(v.view()) {
    if (dtype != DType::int8) return;
    k8 = quantize_kv(keys);
    v8 = quantize_kv(values);
    keys = k8.values.view();
    values = v8.values.view();
    options.key_scale = k8.scale.view();
    options.value_scale = v8.scale.view();
  }
  KeysAndValues(const KeysAndValues&) = delete;
  KeysAndValues& operator=(const KeysAndValues&) = delete;
};

TEST_F(EveryTarget, MatchesOracle) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  EXPECT_GE(targets.size(), 2u) << "expected at least one SIMD target and a fallback";
  for (std::int64_t target : targets) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    EXPECT_NE(runtime_info().cpu_kernel.find(hwy::TargetName(target)), std::string::npos) << runtime_info().cpu_kernel;
    std::mt19937_64 rng(static_cast<std::uint64_t>(target));
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      const Tensor q = random_tensor(dtype, {2, 6, 37, 40}, rng), k = random_tensor(dtype, {2, 2, 101, 40}, rng),
                   v = random_tensor(dtype, {2, 2, 101, 24}, rng);
      const Tensor mask = random_bool({37, 101}, rng, 0.8);
      Options options;
      options.mask = mask.view();
      options.causal = Causal::bottom_right;
      const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
      EXPECT_TRUE(a.ok()) << dtype_name(dtype) << ": " << a.describe();
      options.dropout_p = 0.25;
      const Agreement d = compare_with_oracle(q.view(), k.view(), v.view(), options);
      EXPECT_TRUE(d.ok()) << dtype_name(dtype) << " with dropout: " << d.describe();
    }
  }
}

// A fully masked row in a subtile whose other rows see keys: its lanes of Oᵀ hold 0 · V
// summed over the tile, NaN where V holds an infinity, and its output must still be 0.
// O = Oᵀ · (1 / l) is applied as Oᵀ is transposed out (TransposeRowsScaled), except in a
// subtile with such a row, which scales Oᵀ first with a select. Rows 2 and 11 (both
// halves of 8-row blocks), Ev = 12 (an 8 × 8 block and a tail), float32 outputs (written
// straight) and bfloat16 (through row-major rows), on every target.
TEST_F(EveryTarget, FullyMaskedRowIsZeroBesideRowsThatSeeAnInfiniteValue) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(41);
    for (const DType dtype : {DType::float32, DType::bfloat16}) {
      const Tensor q = random_tensor(dtype, {1, 1, 16, 8}, rng), k = random_tensor(dtype, {1, 1, 4, 8}, rng);
      Tensor v = random_tensor(dtype, {1, 1, 4, 12}, rng);
      v.set(1 * 12 + 3, std::numeric_limits<double>::infinity());  // key 1: seen by the other rows
      Tensor mask(DType::boolean, {16, 4});
      for (std::int64_t i = 0; i < 16; ++i)
        for (std::int64_t j = 0; j < 4; ++j) mask.set(i * 4 + j, i == 2 || i == 11 ? 0 : 1);
      Options options;
      options.mask = mask.view();
      const ForwardResult r = forward(q.view(), k.view(), v.view(), options, Returns{false, true});
      for (const std::int64_t row : {2, 11}) {
        EXPECT_EQ(r.lse.at({0, 0, row}), -std::numeric_limits<double>::infinity()) << dtype_name(dtype);
        for (std::int64_t e = 0; e < 12; ++e)
          EXPECT_EQ(r.output.at({0, 0, row, e}), 0.0) << dtype_name(dtype) << " row " << row << " dim " << e;
      }
      // The other rows: the infinity where they see it, finite values elsewhere.
      EXPECT_TRUE(std::isinf(r.output.at({0, 0, 0, 3})) || std::isnan(r.output.at({0, 0, 0, 3})));
      for (std::int64_t e = 4; e < 12; ++e) EXPECT_TRUE(std::isfinite(r.output.at({0, 0, 5, e}))) << dtype_name(dtype);
    }
  }
}

// A new token against many keys: the one-vector subtiles (Forward<1>, taken when a KV
// head's query rows, Hq/Hkv · L = 4 here, fit one vector) with every score modifier, and
// at S = 9001 the key range split across tasks and merged by the lse, on every target.
TEST_F(EveryTarget, DecodeMatchesOracle) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(static_cast<std::uint64_t>(target) + 1);
    Tensor slopes(DType::float64, {8});
    for (std::int64_t h = 0; h < 8; ++h) slopes.set(h, 0.02 / static_cast<double>(h + 1));
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16})
      for (std::int64_t S : {101, 9001}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + ", S = " + std::to_string(S));
        const Tensor q = random_tensor(dtype, {1, 8, 1, 40}, rng), k = random_tensor(dtype, {1, 2, S, 40}, rng),
                     v = random_tensor(dtype, {1, 2, S, 24}, rng);
        Options plain;
        plain.causal = Causal::bottom_right;
        EXPECT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), plain).ok());
        const Tensor mask = random_bool({1, S}, rng, 0.8);
        Options options = plain;
        options.mask = mask.view();
        options.window_left = S / 2;
        options.alibi_slopes = slopes.view();
        options.softcap = 3.0;
        const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
        EXPECT_TRUE(a.ok()) << "window, ALiBi, softcap, mask: " << a.describe();
        options.dropout_p = 0.25;
        const Agreement d = compare_with_oracle(q.view(), k.view(), v.view(), options);
        EXPECT_TRUE(d.ok()) << "with dropout: " << d.describe();
      }
  }
}

// The decode row kernels (decode_rows-inl.h) group keys and value dims by the target's
// register count (AVX-512: up to 8 keys or 8 vectors of dims; AVX2: 2; SSE4 and the
// fallback differ in lanes): every row count 1–8 a KV head, for every K/V dtype they
// read (int8 with a scale per row, beside a float32 Q), with head dims that leave partial
// blocks and tails (E = 40, Ev = 24; E = 136, Ev = 200), on every target.
TEST_F(EveryTarget, DecodeRowCountsMatchOracle) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(static_cast<std::uint64_t>(target) + 2);
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16, DType::int8})
      for (auto [E, Ev] : {std::pair<std::int64_t, std::int64_t>{40, 24}, {136, 200}})
        for (std::int64_t rows = 1; rows <= 8; ++rows) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + ", E = " + std::to_string(E) +
                       ", rows = " + std::to_string(rows));
          const DType q_dtype = dtype == DType::int8 ? DType::float32 : dtype;
          const Tensor q = random_tensor(q_dtype, {1, rows, 1, E}, rng),
                       k = random_tensor(q_dtype, {1, 1, 150, E}, rng),
                       v = random_tensor(q_dtype, {1, 1, 150, Ev}, rng);
          Options options;
          const KeysAndValues kv(k, v, dtype, options);
          const Agreement a = compare_with_oracle(q.view(), kv.keys, kv.values, options);
          EXPECT_TRUE(a.ok()) << a.describe();
        }
  }
}

// bfloat16 takes the vdpbf16ps kernels where detail::bf16::chosen() (AMD's cores) and is
// widened to float32 elsewhere (Intel's, whose vdpbf16ps runs at half the FMAs' rate): a
// machine runs one of them, so both are forced here where the CPU has the instruction —
// the forward's tiles (causal, GQA), the backward, the decode rows (4 rows a KV head) and
// a decode of 16 rows a KV head in tiles — each against the oracle. Each of the three
// places that choose (the forward's tiles, the backward, the decode rows' scores) must
// give other bits on the other path: the switch reaches each.
TEST(Bfloat16Arithmetic, BothPathsMatchOracle) {
  struct Bits {
    Tensor prefill_lse, grad_key, decode_lse;
  };
  Bits bits_of_path[2];  // [on_vdpbf16ps]
  int paths = 0;
  std::mt19937_64 rng(7);
  const Tensor q = random_tensor(DType::bfloat16, {1, 4, 70, 64}, rng),
               k = random_tensor(DType::bfloat16, {1, 2, 90, 64}, rng),
               v = random_tensor(DType::bfloat16, {1, 2, 90, 48}, rng), g = random_grad_output(q.view(), v.view(), 1);
  // One forward's O and lse for both backward runs: their gradients differ by the backward alone.
  const ForwardResult fixed = forward(q.view(), k.view(), v.view(), {}, Returns{false, true});
  for_each_bfloat16_path([&] {
    const bool on_vdpbf16ps = detail::bf16::chosen();
    const RuntimeInfo info = runtime_info();
    const bool wide_vectors = info.cpu_kernel.find("simd-AVX3") != std::string::npos;  // (kBf16KernelsFit)
    EXPECT_EQ(info.bfloat16_on_vdpbf16ps, on_vdpbf16ps && wide_vectors) << info.cpu_kernel;
    rng.seed(8);  // (the same decode inputs on each path)
    for (Causal causal : {Causal::none, Causal::top_left}) {
      Options options;
      options.causal = causal;
      EXPECT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), options).ok()) << "prefill";
      const GradientAgreement g = compare_gradients_with_oracle(q.view(), k.view(), v.view(), options);
      EXPECT_TRUE(g.ok()) << "backward: " << g.describe();
    }
    Bits& bits = bits_of_path[on_vdpbf16ps];
    ++paths;
    bits.prefill_lse = forward(q.view(), k.view(), v.view(), {}, Returns{false, true}).lse;
    bits.grad_key =
        backward(BackwardInputs{q.view(), k.view(), v.view(), fixed.output.view(), fixed.lse.view(), g.view()},
                 Options{})
            .grad_key;
    for (std::int64_t L : {1, 4}) {
      const Tensor dq = random_tensor(DType::bfloat16, {1, 8, L, 128}, rng),
                   dk = random_tensor(DType::bfloat16, {1, 2, 3000, 128}, rng),
                   dv = random_tensor(DType::bfloat16, {1, 2, 3000, 128}, rng);
      Options options;
      options.causal = Causal::bottom_right;
      const Agreement a = compare_with_oracle(dq.view(), dk.view(), dv.view(), options);
      EXPECT_TRUE(a.ok()) << "decode, L = " << L << ": " << a.describe();
    }
    // The decode rows' scores: their two kernels pair and round alike (vdpbf16ps adds a
    // pair's products one after the other, as two FMAs would), except that vdpbf16ps reads
    // a subnormal as zero. One subnormal K element (2^-130) against a query element of
    // 2^120 adds 2^-10 to key 0's score on the widened path only (the other keys' element
    // is 0).
    Tensor sq = random_tensor(DType::bfloat16, {1, 4, 1, 32}, rng),
           sk = random_tensor(DType::bfloat16, {1, 1, 64, 32}, rng);
    const Tensor sv = random_tensor(DType::bfloat16, {1, 1, 64, 32}, rng);
    for (std::int64_t j = 0; j < 64; ++j) sk.set(j * 32, j == 0 ? std::ldexp(1.0, -130) : 0.0);
    for (std::int64_t h = 0; h < 4; ++h) sq.set(h * 32, std::ldexp(1.0, 120));
    bits.decode_lse = forward(sq.view(), sk.view(), sv.view(), {}, Returns{false, true}).lse;
  });
  if (paths == 2) {
    const Bits &widened = bits_of_path[0], &dot = bits_of_path[1];
    EXPECT_FALSE(bitwise_equal(widened.prefill_lse, dot.prefill_lse)) << "the forward's tiles";
    EXPECT_FALSE(bitwise_equal(widened.grad_key, dot.grad_key)) << "the backward";
    EXPECT_FALSE(bitwise_equal(widened.decode_lse, dot.decode_lse)) << "the decode rows' scores";
  }
}

// float16 K and V holding an infinity and a NaN, decoded on every target: the NaN must
// reach the rows that weigh its value, and the infinite score turns every row's softmax
// into NaN (inf − inf), as the oracle's. Highway 1.0's emulated float16 widening (below
// its AVX2 target) mapped 0x7C00 to 65536 and a NaN to a finite number.
TEST_F(EveryTarget, HalfInfinityAndNaNInKeysAndValuesPropagate) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(static_cast<std::uint64_t>(target) + 3);
    for (bool infinite_key : {false, true}) {
      SCOPED_TRACE(infinite_key ? "an infinite key" : "a NaN value");
      const Tensor q = random_tensor(DType::float16, {1, 4, 1, 40}, rng);
      Tensor k = random_tensor(DType::float16, {1, 1, 150, 40}, rng),
             v = random_tensor(DType::float16, {1, 1, 150, 24}, rng);
      // Key 20's dim 5 and value 7's dim 3 lie in a row's first vector, value 90's dim 21
      // in its tail on AVX-512 (Ev = 24: a vector of 16 and 8 more).
      if (infinite_key) {
        k.set(20 * 40 + 5, std::numeric_limits<double>::infinity());
      } else {
        v.set(7 * 24 + 3, std::numeric_limits<double>::quiet_NaN());
        v.set(90 * 24 + 21, std::numeric_limits<double>::quiet_NaN());
      }
      const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), Options{});
      EXPECT_TRUE(a.ok()) << a.describe();
    }
  }
}

// A decode task without lane-by-lane modifiers runs its softmax on a dense Sᵀ
// (softmax_step-inl.h: DenseSoftmaxStep); asking for the weights keeps the tiles' layout.
// Both must give each row the same bits (output and lse): every row count 1–8, several
// key tiles and a partial one, keys split in parts whose states are merged (S >= 4096),
// a bool mask (applied at the dense stride), scores that rise along the keys at each
// row's own pace (so that conditional rescaling, NextReferenceMax, keeps some rows'
// reference and moves others'), on every target.
TEST_F(EveryTarget, DenseDecodeSoftmaxGivesTheTilesBits) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    Choose(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(static_cast<std::uint64_t>(target) + 4);
    for (DType dtype : {DType::float32, DType::bfloat16, DType::int8})
      for (bool masked : {false, true})
        for (bool rising : {false, true})
          for (std::int64_t S : {300, 5000})
            for (std::int64_t rows = 1; rows <= 8; ++rows) {
              SCOPED_TRACE(std::string(dtype_name(dtype)) + (masked ? ", masked" : "") + (rising ? ", rising" : "") +
                           ", S = " + std::to_string(S) + ", rows = " + std::to_string(rows));
              const DType q_dtype = dtype == DType::int8 ? DType::float32 : dtype;
              Tensor q = random_tensor(q_dtype, {1, rows, 1, 40}, rng), k = random_tensor(q_dtype, {1, 1, S, 40}, rng);
              const Tensor v = random_tensor(q_dtype, {1, 1, S, 24}, rng);
              if (rising) {  // row r's score rises by (r + 1) · 0.5 (natural units) per 96 keys, plus the noise
                for (std::int64_t r = 0; r < rows; ++r) q.set(r * 40, 0.5 * (r + 1));
                for (std::int64_t j = 0; j < S; ++j) k.set(j * 40, j / 96.0 * std::sqrt(40.0));
              }
              Tensor mask(DType::boolean, {1, S});
              for (std::int64_t j = 0; j < S; ++j) mask.set(j, j % 7 == 3 || (j >= 100 && j < 200) ? 0.0 : 1.0);
              Options options;
              if (masked) options.mask = mask.view();
              const KeysAndValues kv(k, v, dtype, options);
              const ForwardResult dense = forward(q.view(), kv.keys, kv.values, options, Returns{false, true});
              const ForwardResult tiles = forward(q.view(), kv.keys, kv.values, options, Returns{true, true});
              EXPECT_TRUE(bitwise_equal(dense.output, tiles.output));
              EXPECT_TRUE(bitwise_equal(dense.lse, tiles.lse));
            }
  }
}

}  // namespace
}  // namespace sdpa::testing
