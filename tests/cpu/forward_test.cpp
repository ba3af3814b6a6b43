// The CPU forward against the float64 oracle on the hostile grid of DESIGN.md §4:
// awkward lengths, head dims, GQA ratios, every mask broadcast shape, both causal
// alignments, fully masked rows, −inf bands, large logits, NaN, strided inputs, every
// dtype. Each case also checks that asking for weights leaves the output bit-identical.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "cpu/work_split.h"
#include "testing/expectations.h"
#include "testing/grids.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(CpuForward, AwkwardLengthsAndHeadDimsMatchOracle) {
  check_each(awkward_shape_cases(3, 0), expect_forward_agrees);  // a third of the grid
}

TEST(CpuForward, LongSequenceBothWays) {
  check_each(long_sequence_cases({{1023, 129}, {17, 1023}, {1023, 1023}}), expect_forward_agrees);
}

TEST(CpuForward, GqaRatiosMatchOracle) { check_each(gqa_ratio_cases(), expect_forward_agrees); }

TEST(CpuForward, EveryMaskBroadcastShapeBoolAndFloat) { check_each(mask_broadcast_cases(), expect_forward_agrees); }

TEST(CpuForward, CausalAlignmentsWithAndWithoutMask) { check_each(causal_alignment_cases(), expect_forward_agrees); }

TEST(CpuForward, EveryDtypeMatchesOracleByTheToleranceRule) { check_each(dtype_cases(), expect_forward_agrees); }

TEST(CpuForward, InterleavedStridedInputs) { check_each(interleaved_cases(), expect_forward_agrees); }

// The lse is written a run of consecutive rows at a time (StoreLse,
// simd/store_outputs-inl.h): into a strided buffer — (B, L, Hq) memory viewed as (B, Hq,
// L), and L reversed by a negative stride — it must land on the same values as a packed
// one (which the oracle tests check), a GQA subtile's runs broken at each head (L = 33),
// and leave the elements between alone. A float32 lse 2 bytes off float alignment (a
// NumPy view can be) takes the per-element store: the same values (x86 would also give
// them through float stores; the sanitizer build's alignment check is what sees such
// stores).
TEST(CpuForward, StridedLseMatchesPacked) {
  std::mt19937_64 rng(7);
  const std::int64_t B = 2, Hq = 4, Hkv = 2, L = 33, S = 40, E = 24;
  const Tensor q = random_tensor(DType::float32, {B, Hq, L, E}, rng),
               k = random_tensor(DType::float32, {B, Hkv, S, E}, rng),
               v = random_tensor(DType::float32, {B, Hkv, S, E}, rng);
  Options options;
  options.causal = Causal::top_left;
  Tensor out(DType::float32, {B, Hq, L, E}), packed(DType::float32, {B, Hq, L});
  forward(q.view(), k.view(), v.view(), {out.view(), std::nullopt, packed.view()}, options);

  constexpr float kUntouched = 12345.0f;
  Tensor storage(DType::float32, {B, L, Hq, 2});  // every other float is a gap
  for (std::int64_t i = 0; i < storage.numel(); ++i) storage.set(i, kUntouched);
  for (bool reversed : {false, true}) {
    TensorView lse = storage.view();
    lse.shape = {B, Hq, L};
    lse.strides = {L * Hq * 2, 2, Hq * 2};
    if (reversed) {
      lse.data = static_cast<float*>(lse.data) + (L - 1) * Hq * 2;
      lse.strides[2] = -lse.strides[2];
    }
    forward(q.view(), k.view(), v.view(), {out.view(), std::nullopt, lse}, options);
    const auto* data = static_cast<const float*>(storage.view().data);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t i = 0; i < L; ++i) {
          const std::int64_t at = ((b * L + (reversed ? L - 1 - i : i)) * Hq + h) * 2;
          EXPECT_EQ(data[at], packed.get(((b * Hq + h) * L + i)))
              << "reversed=" << reversed << " b=" << b << " h=" << h << " i=" << i;
          EXPECT_EQ(data[at + 1], kUntouched) << "a gap written, reversed=" << reversed;
        }
  }

  std::vector<unsigned char> bytes(static_cast<std::size_t>(packed.numel()) * sizeof(float) + 2);
  TensorView misaligned = packed.view();
  misaligned.data = bytes.data() + 2;  // operator new's memory is at least 16-byte aligned
  forward(q.view(), k.view(), v.view(), {out.view(), std::nullopt, misaligned}, options);
  for (std::int64_t n = 0; n < packed.numel(); ++n) {
    float value = 0.0f;
    std::memcpy(&value, static_cast<const unsigned char*>(misaligned.data) + n * sizeof(float), sizeof(float));
    EXPECT_EQ(value, packed.get(n)) << "misaligned, at " << n;
  }
}

TEST(CpuForward, ScaleNegativeZeroAndLarge) { check_each(scale_cases(), expect_forward_agrees); }

TEST(CpuForward, DropoutMatchesOracleMaskExactly) {
  for (double p : {0.1, 0.5, 0.9})
    for (DType dtype : {DType::float32, DType::float64}) {
      Case c;
      c.dtype = dtype;
      c.dropout_p = p;
      c.L = 70, c.S = 131;
      c.causal = Causal::bottom_right;
      expect_forward_agrees(c, static_cast<std::uint64_t>(p * 100));
    }
}

// A thread keeps its last call's scratch for the next call of the same shape (the SIMD
// forward's ScratchCache). Calls in one thread that change each thing the scratch's sizes
// depend on — E, Ev, dropout, bfloat16, few rows (one-vector subtiles) or many — and come
// back, each against the oracle (the sanitizer build sees any buffer a stale scratch
// overruns).
TEST(CpuForward, ConsecutiveCallsOfChangingShapesMatchOracle) {
  struct Step {
    DType dtype;
    std::int64_t L, E, Ev;
    double dropout_p;
  };
  const Step steps[] = {{DType::float32, 33, 16, 16, 0.0}, {DType::float32, 33, 16, 16, 0.3},
                        {DType::float32, 33, 96, 40, 0.3}, {DType::bfloat16, 65, 96, 40, 0.0},
                        {DType::float32, 1, 96, 40, 0.0},  {DType::float32, 33, 16, 16, 0.0},
                        {DType::float16, 1, 130, 8, 0.5},  {DType::float32, 65, 16, 130, 0.0}};
  for (const Step& step : steps) {
    Case c;
    c.dtype = step.dtype;
    c.L = step.L, c.S = 77, c.E = step.E, c.Ev = step.Ev;
    c.dropout_p = step.dropout_p;
    expect_forward_agrees(c, 5);
  }
}

TEST(CpuForward, RankThreeAndRankFiveInputs) {
  // Rank 3 (batch, seq, dim), as in the seeds: dim −3 plays the part of the heads.
  std::mt19937_64 rng(3);
  const Tensor q = random_tensor(DType::float32, {2, 4, 8}, rng), k = random_tensor(DType::float32, {2, 6, 8}, rng),
               v = random_tensor(DType::float32, {2, 6, 16}, rng);
  EXPECT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), {}).ok());
  // Two batch dims.
  Case c;
  c.batch = {2, 3};
  c.heads_q = 4, c.heads_kv = 2;
  c.mask = Case::Mask::boolean;
  c.mask_shape = {3, 1, 1, 17};
  expect_forward_agrees(c);
}

// A bool mask with some rows all false, a float mask with −inf rows, and bottom-right
// causal with L > S (its first L − S queries see no key): output 0, lse −inf, weights 0,
// never NaN (PyTorch >= 2.5, FlashAttention).
TEST(CpuForward, FullyMaskedRowsGiveZeroAndMinusInfNeverNaN) {
  std::mt19937_64 rng(5);
  const Tensor q = random_tensor(DType::float32, {1, 2, 6, 8}, rng),
               k = random_tensor(DType::float32, {1, 2, 4, 8}, rng),
               v = random_tensor(DType::float32, {1, 2, 4, 8}, rng);
  Tensor bool_mask = random_bool({6, 4}, rng, 0.8);
  Tensor float_mask = random_tensor(DType::float32, {6, 4}, rng);
  for (std::int64_t j = 0; j < 4; ++j) {
    bool_mask.set(2 * 4 + j, 0);
    float_mask.set(2 * 4 + j, -kInf);
  }
  for (const Tensor* mask : {&bool_mask, &float_mask}) {
    Options options;
    options.mask = mask->view();
    EXPECT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), options).ok());
    const ForwardResult r = forward(q.view(), k.view(), v.view(), options, Returns{true, true});
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(r.lse.at({0, h, 2}), -kInf);
      for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.output.at({0, h, 2, e}), 0.0);
      for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(r.weights.at({0, h, 2, j}), 0.0);
    }
  }
  Options causal;
  causal.causal = Causal::bottom_right;
  const ForwardResult r = forward(q.view(), k.view(), v.view(), causal, Returns{true, true});
  for (std::int64_t i = 0; i < 2; ++i) {  // queries 0, 1 see keys j <= i − 2: none
    EXPECT_EQ(r.lse.at({0, 0, i}), -kInf);
    for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.output.at({0, 0, i, e}), 0.0);
  }
  for (std::int64_t i = 0; i < r.output.numel(); ++i) EXPECT_FALSE(std::isnan(r.output.get(i)));
}

// A subtile of rows that see no key ends with Oᵀ = 0, whatever an earlier call left in
// the thread's kept scratch: Oᵀ is written by the first P·V, not zeroed ahead (a small
// head's saving), so a subtile no P·V reaches is zeroed at the end. With a sink, its
// rows fold 0 · α into the output; left as the previous call's NaN, they gave NaN.
TEST(CpuForward, RowsThatSeeNoKeyGiveZeroAfterACallThatLeftNaN) {
  std::mt19937_64 rng(31);
  const Tensor q = random_tensor(DType::float32, {1, 1, 40, 8}, rng),
               k = random_tensor(DType::float32, {1, 1, 40, 8}, rng);
  Tensor v = random_tensor(DType::float32, {1, 1, 40, 8}, rng);
  for (std::int64_t j = 0; j < 40; ++j) v.set(j * 8 + 3, std::numeric_limits<double>::quiet_NaN());
  Options options;
  options.num_threads = 1;  // the calling thread's scratch, both calls
  const ForwardResult poisoned = forward(q.view(), k.view(), v.view(), options);
  ASSERT_TRUE(std::isnan(poisoned.output.at({0, 0, 0, 3})));

  Tensor sinks(DType::float32, {1});
  sinks.set(0, 0.5);
  Tensor mask(DType::boolean, {40, 40});  // all false: no row sees a key
  // Sinks first: a call without them stores 0 into Oᵀ as it writes the output.
  for (const bool with_sinks : {true, false}) {
    Options hidden = options;
    hidden.mask = mask.view();
    if (with_sinks) hidden.sinks = sinks.view();
    const ForwardResult r = forward(q.view(), k.view(), random_tensor(DType::float32, {1, 1, 40, 8}, rng).view(),
                                    hidden, Returns{false, true});
    for (std::int64_t i = 0; i < 40; ++i) {
      if (with_sinks)
        EXPECT_NEAR(r.lse.at({0, 0, i}), 0.5, 1e-6);
      else
        EXPECT_EQ(r.lse.at({0, 0, i}), -kInf);
      for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.output.at({0, 0, i, e}), 0.0) << "row " << i << " dim " << e;
    }
  }
}

// A float mask of −1e9 everywhere is not "fully masked". In float32, s − 1e9 rounds to
// −1e9 for every score (floats near 1e9 are 64 apart), so the softmax is uniform, as
// seeds 001 and 004 observe — not 0, and not NaN.
TEST(CpuForward, MinusOneBillionMaskGivesUniformWeights) {
  std::mt19937_64 rng(6);
  const Tensor q = random_tensor(DType::float32, {1, 3, 8}, rng), k = random_tensor(DType::float32, {1, 5, 8}, rng),
               v = random_tensor(DType::float32, {1, 5, 8}, rng);
  Tensor mask(DType::float32, {3, 5});
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.set(i, -1e9);
  Options options;
  options.mask = mask.view();
  const ForwardResult r = forward(q.view(), k.view(), v.view(), options, Returns{true, false});
  for (std::int64_t i = 0; i < r.weights.numel(); ++i) EXPECT_NEAR(r.weights.get(i), 0.2, 1e-6);
}

// −inf bands: whole columns of keys removed for every query.
TEST(CpuForward, MinusInfColumnBands) {
  std::mt19937_64 rng(7);
  Tensor mask(DType::float32, {1, 200});
  for (std::int64_t j = 0; j < 200; ++j) mask.set(j, (j / 10) % 3 == 0 ? -kInf : 0.0);
  const Tensor q = random_tensor(DType::float32, {1, 1, 40, 32}, rng),
               k = random_tensor(DType::float32, {1, 1, 200, 32}, rng),
               v = random_tensor(DType::float32, {1, 1, 200, 32}, rng);
  Options options;
  options.mask = mask.view();
  const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Scores around 1e4: the softmax must not overflow. A float32 dot product carries an
// error of at most γ_E·Σ|q_e k_e| (Higham, Accuracy and Stability, §3.1), which moves
// each weight by a factor of at most exp(±2δ): that, not 1e-5, bounds any float32
// implementation here.
TEST(CpuForward, LargeLogitsStayFiniteWithinTheConditioningBound) {
  std::mt19937_64 rng(8);
  const std::int64_t E = 64;
  Tensor q = random_tensor(DType::float32, {1, 1, 20, E}, rng, 40.0);
  Tensor k = random_tensor(DType::float32, {1, 1, 30, E}, rng, 40.0);
  const Tensor v = random_tensor(DType::float32, {1, 1, 30, E}, rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  double delta = 0;
  for (std::int64_t i = 0; i < 20; ++i)
    for (std::int64_t j = 0; j < 30; ++j) {
      double magnitude = 0;
      for (std::int64_t e = 0; e < E; ++e) magnitude += std::abs(q.get(i * E + e) * k.get(j * E + e));
      const double gamma = E * std::ldexp(1.0, -24) / (1 - E * std::ldexp(1.0, -24));
      delta = std::max(delta, (gamma * magnitude + std::ldexp(1.0, -24) * magnitude) * scale);
    }
  const ForwardResult fast = forward(q.view(), k.view(), v.view());
  const Tensor q64 = to_float64(q.view()), k64 = to_float64(k.view()), v64 = to_float64(v.view());
  Options reference;
  reference.backend = Backend::reference;
  const ForwardResult oracle = forward(q64.view(), k64.view(), v64.view(), reference);
  EXPECT_GT(max_abs(oracle.output), 0.1);
  for (std::int64_t i = 0; i < fast.output.numel(); ++i) EXPECT_TRUE(std::isfinite(fast.output.get(i)));
  const double tolerance = (std::exp(2 * delta) - 1) * 2 * max_abs(v64) + 1e-5;
  EXPECT_LE(max_abs_diff(to_float64(fast.output.view()), oracle.output), tolerance);

  // float16 inputs of magnitude 256: q·k ~ 256² · E overflows float16 but not the
  // float32 accumulator.
  Tensor q16(DType::float16, {1, 1, 4, E}), k16(DType::float16, {1, 1, 4, E});
  for (std::int64_t i = 0; i < q16.numel(); ++i) q16.set(i, (i % 3 == 0) ? 256.0 : -256.0);
  for (std::int64_t i = 0; i < k16.numel(); ++i) k16.set(i, ((i / E) % 2 == 0) ? 256.0 : -256.0);
  const Tensor v16 = convert(random_tensor(DType::float32, {1, 1, 4, E}, rng), DType::float16);
  const Agreement a = compare_with_oracle(q16.view(), k16.view(), v16.view(), {});
  EXPECT_TRUE(a.ok()) << a.describe();
}

// A row's max that rises by more than 125 (log2 units) from one key tile to the next:
// α = 2^(m − m') is then exactly 0, and the first tile's contributions must be dropped
// from Oᵀ, not kept. Every row of a subtile jumps together (the kernel once skipped the
// rescale when α was 0 in every lane). Subtiles of 1, 2 and 3 row vectors (on AVX-512):
// L = 16, 64, and 16 batch elements of 48 rows, over 96-key tiles; and decode rows (L =
// 1 and 4: the row kernels) over their 192-key tiles.
TEST(CpuForward, MaxJumpBetweenKeyTilesDropsTheEarlierKeys) {
  struct Shape {
    std::int64_t B, L, tile;
  };
  for (auto [B, L, tile] : {Shape{1, 16, 96}, {1, 64, 96}, {16, 48, 96}, {1, 1, 192}, {3, 4, 192}}) {
    SCOPED_TRACE("B = " + std::to_string(B) + ", L = " + std::to_string(L));
    const std::int64_t S = 2 * tile;
    Tensor q(DType::float32, {B, 1, L, 1}), k(DType::float32, {B, 1, S, 1}), v(DType::float32, {B, 1, S, 1});
    for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, 1.0);
    for (std::int64_t j = 0; j < k.numel(); ++j) {
      const bool later = j % S >= tile;  // the second tile
      k.set(j, later ? 100.0 : 0.0);     // scores 0, then 100 (144 in log2 units)
      v.set(j, later ? 0.0 : 1.0);       // so the output is e^-100-small, not 1
    }
    Options options;
    options.scale = 1.0;
    const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
    EXPECT_TRUE(a.ok()) << a.describe();
    const Tensor out = forward(q.view(), k.view(), v.view(), options).output;
    EXPECT_LT(max_abs(out), 1e-30);
  }
}

// Rows whose max rises tile after tile, each at its own pace: by 0.4 to 20 (log2 units)
// per 96-key tile over 20 tiles. Conditional rescaling (NextReferenceMax) keeps a row's
// reference m while the rise stays within 8 and P reaches 2^8; it must still match the
// oracle, and decide row by row: the rows shuffled across the vectors (row i at position
// 7i mod L) give each row the same bits.
TEST(CpuForward, RisingMaxWithConditionalRescalingMatchesOracleRowByRow) {
  const std::int64_t L = 48, S = 20 * 96;
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor q(dtype, {1, 1, L, 2}), shuffled(dtype, {1, 1, L, 2}), k(dtype, {1, 1, S, 2});
    std::mt19937_64 rng(11);
    const Tensor v = convert(random_tensor(DType::float32, {1, 1, S, 3}, rng), dtype);
    const auto position = [&](std::int64_t i) { return 7 * i % L; };  // 7 and L coprime
    for (std::int64_t i = 0; i < L; ++i) {
      const double pace = 0.3 * std::pow(50.0, static_cast<double>(i) / (L - 1));  // 0.3 to 15
      for (std::int64_t e = 0; e < 2; ++e) {
        q.set(i * 2 + e, e == 0 ? pace : 0.5);
        shuffled.set(position(i) * 2 + e, e == 0 ? pace : 0.5);
      }
    }
    for (std::int64_t j = 0; j < S; ++j) {
      k.set(j * 2, 0.01 * j);                   // scores rise along the keys by 1.4·pace a tile
      k.set(j * 2 + 1, (j % 7) * 0.25 - 0.75);  // and wobble
    }
    Options options;
    options.scale = 1.0;
    const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
    EXPECT_TRUE(a.ok()) << a.describe();
    const ForwardResult forward_order = forward(q.view(), k.view(), v.view(), options, Returns{false, true});
    const ForwardResult shuffled_order = forward(shuffled.view(), k.view(), v.view(), options, Returns{false, true});
    for (std::int64_t i = 0; i < L; ++i) {
      EXPECT_EQ(forward_order.lse.get(i), shuffled_order.lse.get(position(i))) << "row " << i;
      for (std::int64_t d = 0; d < 3; ++d)
        EXPECT_EQ(forward_order.output.get(i * 3 + d), shuffled_order.output.get(position(i) * 3 + d)) << "row " << i;
    }
  }
}

// NaN in an unmasked input reaches the output (pytorch#141128 turned them into 0).
TEST(CpuForward, NaNInUnmaskedInputsPropagates) {
  std::mt19937_64 rng(9);
  for (int where = 0; where < 3; ++where) {
    Tensor q = random_tensor(DType::float32, {1, 1, 70, 16}, rng),
           k = random_tensor(DType::float32, {1, 1, 90, 16}, rng),
           v = random_tensor(DType::float32, {1, 1, 90, 16}, rng);
    (where == 0 ? q : where == 1 ? k : v).set(5 * 16 + 3, std::numeric_limits<double>::quiet_NaN());
    Options options;
    options.causal = Causal::top_left;
    const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), options);
    EXPECT_TRUE(a.ok()) << "NaN in input " << where << ": " << a.describe();
    const ForwardResult r = forward(q.view(), k.view(), v.view(), options);
    EXPECT_TRUE(std::isnan(r.output.at({0, 0, where == 0 ? 5 : 69, where == 2 ? 3 : 0})));
    EXPECT_FALSE(std::isnan(r.output.at({0, 0, 0, 0})));  // query 0 sees key 0 only
  }
}

// NaNs with payload bits (and signalling NaNs) must propagate like the default NaN:
// an exp2 that adds the exponent into the bits of its result turned them into numbers.
TEST(CpuForward, NaNPayloadsPropagate) {
  std::mt19937_64 rng(19);
  for (std::uint32_t bits : {0x7fc00001u, 0x7f800001u, 0xffc00123u})
    for (int where = 0; where < 3; ++where) {
      Tensor q = random_tensor(DType::float32, {1, 1, 4, 8}, rng), k = random_tensor(DType::float32, {1, 1, 6, 8}, rng),
             v = random_tensor(DType::float32, {1, 1, 6, 8}, rng);
      Tensor mask = random_tensor(DType::float32, {4, 6}, rng);
      Tensor& target = where == 0 ? q : where == 1 ? k : mask;
      std::memcpy(static_cast<std::byte*>(target.data()) + 9 * sizeof(float), &bits, sizeof bits);  // row 1 (k: row 1)
      Options options;
      options.mask = mask.view();
      const ForwardResult r = forward(q.view(), k.view(), v.view(), options, Returns{true, true});
      // Q row 1, K row 1 (seen by every query), mask row 1: query 1 always sees the NaN.
      for (std::int64_t e = 0; e < 8; ++e) EXPECT_TRUE(std::isnan(r.output.at({0, 0, 1, e}))) << std::hex << bits;
      EXPECT_TRUE(std::isnan(r.lse.at({0, 0, 1}))) << std::hex << bits << " in input " << where;
      EXPECT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), options).ok()) << std::hex << bits;
    }
}

// A stride-0 (expanded) key and value: every batch entry reads the same memory
// (pytorch#191937 returned wrong answers for such views).
TEST(CpuForward, StrideZeroBroadcastInputs) {
  std::mt19937_64 rng(10);
  const Tensor q = random_tensor(DType::float32, {3, 2, 9, 8}, rng);
  const Tensor k1 = random_tensor(DType::float32, {1, 2, 11, 8}, rng),
               v1 = random_tensor(DType::float32, {1, 2, 11, 8}, rng);
  TensorView k = k1.view(), v = v1.view();
  k.shape[0] = v.shape[0] = 3;
  k.strides[0] = v.strides[0] = 0;
  EXPECT_TRUE(compare_with_oracle(q.view(), k, v, {}).ok());
}

// A float32 (B, H, L, E) tensor's values in storage of another layout.
enum class Layout { packed, misaligned, rows_reversed, heads_interleaved };
struct LaidOut {
  std::vector<std::byte> storage;
  TensorView view;
};
LaidOut laid_out(const Tensor& packed, Layout layout) {
  const Shape& s = packed.shape();
  const std::int64_t n = packed.numel();
  LaidOut x{std::vector<std::byte>(static_cast<std::size_t>(n) * 4 + 8), packed.view()};
  std::byte* base = x.storage.data();
  switch (layout) {
    case Layout::packed:
      break;
    case Layout::misaligned:  // 2 bytes past a float boundary
      base += 2;
      break;
    case Layout::rows_reversed:  // row i at L − 1 − i: a negative row stride
      x.view.strides = {s[1] * s[2] * s[3], s[2] * s[3], -s[3], 1};
      base += (s[2] - 1) * s[3] * 4;
      break;
    case Layout::heads_interleaved:  // (B, L, H, E) storage
      x.view.strides = {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1};
      break;
  }
  x.view.data = base;
  const Shape strides = x.view.effective_strides();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t offset = 0, rest = flat;
    for (std::size_t d = s.size(); d-- > 0; rest /= s[d]) offset += rest % s[d] * strides[d];
    const auto value = static_cast<float>(packed.get(flat));
    std::memcpy(base + offset * 4, &value, 4);
  }
  return x;
}

// The SIMD forward transposes float32 query rows straight from the input and output rows
// straight into the output, a run of consecutive rows of one head at a time, when the
// rows are float-aligned with a non-negative stride, and through a row-major copy
// otherwise. Every pairing of layouts gives the packed call's bits (GQA subtiles that
// cross heads; decoding's one-vector subtiles at L = 1), and the packed call agrees
// with the oracle.
TEST(CpuForward, QueryAndOutputRowsOfAnyLayoutGiveThePackedBits) {
  constexpr Layout kLayouts[] = {Layout::packed, Layout::misaligned, Layout::rows_reversed, Layout::heads_interleaved};
  std::mt19937_64 rng(43);
  for (std::int64_t L : {45, 1}) {
    SCOPED_TRACE("L = " + std::to_string(L));
    const Tensor q = random_tensor(DType::float32, {2, 3, L, 40}, rng),
                 k = random_tensor(DType::float32, {2, 1, 50, 40}, rng),
                 v = random_tensor(DType::float32, {2, 1, 50, 24}, rng);
    Options options;
    options.causal = Causal::bottom_right;
    ASSERT_TRUE(compare_with_oracle(q.view(), k.view(), v.view(), options).ok());
    const Tensor packed = forward(q.view(), k.view(), v.view(), options).output;
    for (Layout query_layout : kLayouts)
      for (Layout output_layout : kLayouts) {
        const LaidOut query = laid_out(q, query_layout);
        LaidOut out = laid_out(Tensor(DType::float32, packed.shape()), output_layout);
        forward(query.view, k.view(), v.view(), ForwardOutputs{out.view, std::nullopt, std::nullopt}, options);
        EXPECT_TRUE(bitwise_equal(to_float64(out.view), to_float64(packed.view())))
            << "query layout " << static_cast<int>(query_layout) << ", output layout "
            << static_cast<int>(output_layout);
      }
  }
}

TEST(CpuForward, EmptyShapesReturnCorrectlyShapedResults) {
  std::mt19937_64 rng(11);
  // S = 0: zero output, lse −inf.
  const Tensor q = random_tensor(DType::float32, {1, 2, 3, 4}, rng);
  const Tensor k(DType::float32, {1, 2, 0, 4}), v(DType::float32, {1, 2, 0, 5});
  const ForwardResult r = forward(q.view(), k.view(), v.view(), {}, Returns{true, true});
  EXPECT_EQ(r.output.shape(), (Shape{1, 2, 3, 5}));
  EXPECT_EQ(r.weights.shape(), (Shape{1, 2, 3, 0}));
  for (std::int64_t i = 0; i < r.output.numel(); ++i) EXPECT_EQ(r.output.get(i), 0.0);
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) EXPECT_EQ(r.lse.get(i), -kInf);
  // L = 0 and batch 0.
  for (const Shape& qs : {Shape{1, 2, 0, 4}, Shape{0, 2, 3, 4}}) {
    const Tensor q0(DType::float32, qs);
    const Tensor k0(DType::float32, {qs[0], 2, 6, 4}), v0(DType::float32, {qs[0], 2, 6, 5});
    const ForwardResult e = forward(q0.view(), k0.view(), v0.view(), {}, Returns{true, true});
    EXPECT_EQ(e.output.shape(), (Shape{qs[0], 2, qs[2], 5}));
    EXPECT_EQ(e.output.numel(), 0);
  }
}

// Same inputs and options: bitwise the same output, weights and lse with 1, 2 and 3 threads.
TEST(CpuForward, BitwiseDeterministicAcrossThreadCounts) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.L = 130, c.S = 257, c.E = 40, c.Ev = 24;
  c.mask = Case::Mask::additive;
  c.causal = Causal::bottom_right;
  c.dropout_p = 0.3;
  expect_forward_deterministic_across_threads(make_inputs(c, 12));
}

// A caller's own OpenMP threads each calling the library (a server's request threads,
// a data loader): every call gives the bits a lone call gives, whether it runs on one
// thread (no region of its own: a worksharing loop there would bind to the caller's team
// and share out its iterations among the caller's threads) or opens its own (nested,
// so a team of one). Problems on both sides of the serial threshold, float32 and float64.
TEST(CpuForward, CallsFromTheCallersParallelRegionGiveTheLoneCallsBits) {
  std::vector<Inputs> problems;
  for (const auto& [dtype, heads, L, S] : {std::tuple{DType::float32, 2, 3, 5},
                                           {DType::float32, 12, 16, 16},
                                           {DType::float32, 4, 70, 90},
                                           {DType::float64, 2, 3, 5},
                                           {DType::float64, 4, 40, 50},
                                           {DType::bfloat16, 2, 1, 300}}) {
    Case c;
    c.dtype = dtype;
    c.batch = {1};
    c.heads_q = heads, c.heads_kv = heads, c.L = L, c.S = S, c.E = 16, c.Ev = 8;
    c.causal = Causal::bottom_right;
    problems.push_back(make_inputs(c, 40 + problems.size()));
  }
  std::vector<ForwardResult> alone;
  for (const Inputs& in : problems)
    alone.push_back(forward(in.qv(), in.kv(), in.vv(), in.options, Returns{false, true}));
  std::atomic<int> mismatches{0}, calls{0}, team{0};
#pragma omp parallel num_threads(4)
  {
    team = omp_get_num_threads();
    const auto thread = static_cast<std::size_t>(omp_get_thread_num());
    for (std::size_t round = 0; round < 3 * problems.size(); ++round) {
      const std::size_t n = (thread + round) % problems.size();  // the threads' problems differ at each step
      const Inputs& in = problems[n];
      const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), in.options, Returns{false, true});
      if (!bitwise_equal(r.output, alone[n].output) || !bitwise_equal(r.lse, alone[n].lse)) ++mismatches;
      ++calls;
    }
  }
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(calls.load(), team.load() * static_cast<int>(3 * problems.size()));  // every call returned
}

// Decoding shapes (a few query rows per KV head, long S) split the keys into ranges
// merged by log-sum-exp; the merge must agree with the oracle and stay bitwise the same
// for any thread count.
TEST(CpuForward, SplitKeyDecodeMatchesOracleAndIsDeterministic) {
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.dtype = dtype;
      c.batch = {1};
      c.heads_q = 5, c.heads_kv = 1, c.L = 3, c.S = 9001, c.E = 16, c.Ev = 24;
      c.causal = causal;
      c.mask = Case::Mask::additive;
      c.mask_shape = {c.S};
      expect_forward_agrees(c, 21);
    }
  Case c;
  c.batch = {1};
  c.heads_q = 4, c.heads_kv = 1, c.L = 1, c.S = 70000, c.E = 8, c.Ev = 8;
  Inputs in = make_inputs(c, 22);
  std::vector<Tensor> outputs;
  for (int threads : {1, 2}) {
    in.options.num_threads = threads;
    outputs.push_back(forward(in.qv(), in.kv(), in.vv(), in.options).output);
  }
  EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].nbytes()), 0);
  in.options.num_threads = 0;
  const Agreement a = compare_with_oracle(in.qv(), in.kv(), in.vv(), in.options);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// A split-KV decode's key ranges: whole tiles of the given size, covering [0, S) in
// order, none empty (rounding each split up to whole tiles once left the last two of
// 32 splits with no keys at S = 67616 and 192-key tiles).
TEST(CpuForward, KeySplitsAreWholeTilesAndNoneEmpty) {
  for (std::int64_t tile : {96, 192})
    for (std::int64_t S : {4096, 8191, 9001, 65536, 67616, 70000, 1000003}) {
      sdpa::detail::Problem p;
      p.batch = 1, p.heads_q = 4, p.heads_kv = 1, p.L = 1, p.S = S, p.E = p.Ev = 8;
      const sdpa::detail::ForwardSchedule schedule = sdpa::detail::schedule_forward(&p, 1, 16, tile, 1);
      ASSERT_EQ(schedule.plans.size(), 1u);
      const sdpa::detail::ForwardPlan& plan = schedule.plans[0];
      ASSERT_GT(plan.splits, 1) << S;
      std::int64_t next = 0;
      for (std::int64_t split = 0; split < plan.splits; ++split) {
        std::int64_t begin = 0, end = 0;
        plan.split_range(split, &begin, &end);
        EXPECT_EQ(begin, next) << "tile " << tile << " S " << S << " split " << split;
        EXPECT_LT(begin, end) << "tile " << tile << " S " << S << " split " << split;
        if (split + 1 < plan.splits) {
          EXPECT_EQ((end - begin) % tile, 0);
        }
        next = end;
      }
      EXPECT_EQ(next, S);
    }
}

// A decode task of few rows (group · L <= 8) reads K and V rows in place with lanes
// along E and Ev, widening bfloat16 and float16 rows in registers (decode_rows-inl.h;
// a bfloat16 query's scores on vdpbf16ps where bf16::chosen(): both paths here where the
// CPU has the instruction):
// every head dim's tail against the vector width (Ev ≠ E), 1 to 8 rows, with and
// without causal. S = 342: a whole decode tile (kDecodeKeyTile, 192 keys) and one that
// ends short, where the kernels' requests for the rows ahead stop at the last key.
TEST(CpuForward, DecodeRowKernelsMatchOracle) {
  for_each_bfloat16_path([] {
    int n = 900;
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16})
      for (std::int64_t E : {1, 3, 16, 17, 40, 111, 128})
        for (auto [heads_q, L] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 1}, {2, 3}, {8, 1}, {4, 2}})
          for (Causal causal : {Causal::none, Causal::bottom_right}) {
            Case c;
            c.dtype = dtype;
            c.batch = {2};
            c.heads_q = heads_q, c.heads_kv = 1, c.L = L, c.S = 342, c.E = E, c.Ev = E == 1 ? 5 : E + 3;
            c.causal = causal;
            expect_forward_agrees(c, ++n);
          }
    // The other row counts: bfloat16's scores take vdpbf16ps where bf16::chosen()
    // (bf16::row_scores); on AVX-512, the P·V takes the rows in groups (2 rows for 8
    // vectors of dims, 4 for 4, the last group smaller: RowAccumulateFewRows; float32 from
    // 3 rows, bfloat16 and float16 at 3 and 4: WholeRows) over chunks of 32 keys (the last
    // tile's 150 keys: a chunk ends short). Ev = E + 3: 1, 2, 4, 8 and 8 + 4 vectors of
    // dims and a tail.
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16})
      for (std::int64_t E : {17, 40, 61, 128, 197})
        for (std::int64_t heads_q : {2, 3, 5, 7}) {
          Case c;
          c.dtype = dtype;
          c.batch = {2};
          c.heads_q = heads_q, c.heads_kv = 1, c.L = 1, c.S = 342, c.E = E, c.Ev = E + 3;
          expect_forward_agrees(c, ++n);
        }
  });
}

// K and V that start off their element size's boundary (a caller's tensor may: float32
// 2 bytes past a float boundary, bfloat16 and float16 1 byte past a 2-byte one). The
// decode row kernels read float32 rows through float pointers, so misaligned float32 K
// and V keep the tiles, which copy them (read through a misaligned float pointer, the
// kernels' scalar tails were undefined behaviour: UBSan's abort); bfloat16 and float16
// rows are read as Highway's packed 2-byte structs (alignment 1), in place, by unaligned
// vector loads. The output is the oracle's either way. float32 K or V alone misaligned:
// the other read in place by the row kernels, over their 192-key tiles (S = 342: a whole
// one and a shorter one), the misaligned one copied by the tiles' KeyValueRows.
TEST(CpuForward, MisalignedKeysAndValuesOnTheDecodePathMatchOracle) {
  std::mt19937_64 rng(41);
  const std::int64_t S = 342, E = 17;
  for (auto [dtype, offset] :
       {std::pair<DType, std::size_t>{DType::float32, 2}, {DType::bfloat16, 1}, {DType::float16, 1}}) {
    const Tensor q = random_tensor(dtype, {1, 4, 1, E}, rng), k = random_tensor(dtype, {1, 1, S, E}, rng),
                 v = random_tensor(dtype, {1, 1, S, E}, rng);
    std::vector<std::byte> k_bytes(k.nbytes() + offset), v_bytes(v.nbytes() + offset);
    std::memcpy(k_bytes.data() + offset, k.data(), k.nbytes());
    std::memcpy(v_bytes.data() + offset, v.data(), v.nbytes());
    const TensorView k_view{k_bytes.data() + offset, dtype, {1, 1, S, E}},
        v_view{v_bytes.data() + offset, dtype, {1, 1, S, E}};
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Options options;
      options.causal = causal;
      const Agreement a = compare_with_oracle(q.view(), k_view, v_view, options);
      EXPECT_TRUE(a.ok()) << dtype_name(dtype) << ": " << a.describe();
      if (dtype != DType::float32) continue;  // (the row kernels read 2-byte rows at any address)
      const Agreement k_alone = compare_with_oracle(q.view(), k_view, v.view(), options);
      EXPECT_TRUE(k_alone.ok()) << "K alone: " << k_alone.describe();
      const Agreement v_alone = compare_with_oracle(q.view(), k.view(), v_view, options);
      EXPECT_TRUE(v_alone.ok()) << "V alone: " << v_alone.describe();
    }
  }
}

// 64-bit offsets: key and value rows 2^30 + 16 elements apart in a sparse mapping, 12 of
// them (read in place by the kernels), reaching past 2^33 elements. A 32-bit offset
// would wrap and read the wrong rows.
TEST(CpuForward, SixtyFourBitOffsets) {
  const std::int64_t row_stride = (std::int64_t{1} << 30) + 16, rows = 12;
  const std::size_t bytes = static_cast<std::size_t>(row_stride * (rows - 1) + 64) * sizeof(float);
  void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) GTEST_SKIP() << "cannot map 44 GiB of address space here";
  float* base = static_cast<float*>(region);
  const std::int64_t E = 4;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t e = 0; e < E; ++e) base[row * row_stride + e] = static_cast<float>(row % 5 + 1) * (e + 1) * 0.1f;
  TensorView k{base, DType::float32, {1, 1, rows, E}, {0, 0, row_stride, 1}};
  Tensor q(DType::float32, {1, 1, 2, E});
  for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, 0.3 * (i % 5));
  const Agreement a = compare_with_oracle(q.view(), k, k, {});
  EXPECT_TRUE(a.ok()) << a.describe();
  munmap(region, bytes);
}

}  // namespace
}  // namespace sdpa::testing
