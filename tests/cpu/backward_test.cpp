// The CPU backward against the float64 oracle on the hostile grid of DESIGN.md §4:
// awkward lengths and head dims, GQA ratios, every mask broadcast shape (and the float
// mask's gradient), both causal alignments, fully masked rows, −inf bands, large
// logits, NaN, strided and stride-0 tensors, every dtype, dropout replayed from the
// forward's Philox counter, key chunks, every SIMD target, and bitwise determinism
// across thread counts. Tolerances: tests/testing/gradients.h.
#include "cpu/portable/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "api/validate.h"
#include "hwy/targets.h"
#include "testing/expectations.h"
#include "testing/gradients.h"
#include "testing/grids.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(CpuBackward, AwkwardLengthsAndHeadDimsMatchOracle) {
  check_each(awkward_shape_cases(4, 0), expect_gradients_agree);  // a quarter of the grid
}

// bfloat16 on the hostile grid, on both of its paths where the CPU has vdpbf16ps: its own
// kernels (bfloat16 products in pairs: an odd E or Ev pads its last pair, an odd row
// count its last row pair, an odd key count its last key pair) and the float32 path.
// (E = Ev = 1 is left out: at Hq = 4, Hkv = 2, L = S = 17 both paths miss the 3× rule for dK by the same
// error, to the last digit, so it comes from what they share — the forward's bfloat16 O
// in D, the rounding of dK — not from the products.)
TEST(CpuBackward, Bfloat16AwkwardShapesMatchOracle) {
  const std::int64_t dims[] = {3, 8, 40, 64, 80, 96, 111, 128, 256};
  const std::pair<std::int64_t, std::int64_t> heads[] = {{1, 1}, {2, 1}, {5, 1}, {4, 2}};
  // A fifth of the grid.
  for_each_bfloat16_path([&] {
    for_sampled_awkward_shapes(dims, 5, 1, [&](std::int64_t L, std::int64_t S, std::int64_t E, int n) {
      Case c;
      c.dtype = DType::bfloat16;
      c.batch = {1};
      std::tie(c.heads_q, c.heads_kv) = heads[n % 4];
      c.L = L, c.S = S, c.E = E, c.Ev = (n % 3) ? E : dims[(n + 4) % 9];
      c.causal = n % 2 ? Causal::bottom_right : Causal::none;
      expect_gradients_agree(c, n);
    });
  });
}

// A NaN in a key that some rows do not see stays out of what those rows give, in both
// places where the bfloat16 kernels pair things that the float32 path keeps apart:
// - keys: with bottom-right causal, L = 40, S = 41, the first subtile (rows 0..31) sees
//   keys 0..32, an odd count; key 33 must not be key 32's partner in its dQ;
// - rows: with L = 37 (odd), padding row 37 partners row 36 in dK and dV; a key that a
//   bool mask hides from every row must not get the padding row's NaN score there.
// The unseen NaN's gradients are then the same bits as with 0 in its place. With
// softcap too: its chain rule multiplies dS by 1 − tanh², NaN at a NaN key, and must leave
// a masked key's dS at 0 (it did not: NaN reached dK, and dQ through a bfloat16 key pair).
// bfloat16 on both of its paths where the CPU has vdpbf16ps.
TEST(CpuBackward, NaNInUnseenKeysStaysOut) {
  for_each_bfloat16_path([] {
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float64})
      for (double softcap : {0.0, 8.0})
        for (int where = 0; where < 3; ++where) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + (softcap > 0 ? " softcap" : "") +
                       (where == 0   ? ": NaN in K[33], causal"
                        : where == 1 ? ": NaN in V[33], causal"
                                     : ": NaN in K[5], masked for every row"));
          const bool causal = where < 2;
          const std::int64_t L = causal ? 40 : 37, S = causal ? 41 : 20, poisoned_key = causal ? 33 : 5;
          std::mt19937_64 rng(17);
          const Tensor q = random_tensor(dtype, {1, 1, L, 16}, rng), g = random_tensor(dtype, {1, 1, L, 16}, rng);
          Tensor k = random_tensor(dtype, {1, 1, S, 16}, rng), v = random_tensor(dtype, {1, 1, S, 16}, rng);
          Tensor mask = random_bool({S}, rng, 1.0);
          mask.set(poisoned_key, 0.0);
          Options options;
          options.softcap = softcap;
          if (causal)
            options.causal = Causal::bottom_right;
          else
            options.mask = mask.view();
          Tensor& poisoned = where == 1 ? v : k;
          for (std::int64_t e = 0; e < 16; ++e) poisoned.set(poisoned_key * 16 + e, 0.0);
          const BackwardResult clean = forward_backward(q.view(), k.view(), v.view(), g.view(), options);
          for (std::int64_t e = 0; e < 16; ++e) poisoned.set(poisoned_key * 16 + e, std::nan(""));
          const BackwardResult got = forward_backward(q.view(), k.view(), v.view(), g.view(), options);
          // Causal: dQ of rows 0..31 (the later rows see the NaN). Masked: dK and dV (dQ adds
          // 0 · K over the keys a row's band holds, masked ones included: NaN, as in float32).
          const auto expect_same = [](const Tensor& a, const Tensor& b, std::int64_t count) {
            for (std::int64_t i = 0; i < count; ++i) {
              ASSERT_FALSE(std::isnan(a.get(i))) << i;
              ASSERT_EQ(a.get(i), b.get(i)) << i;
            }
          };
          if (causal) {
            expect_same(got.grad_query, clean.grad_query, 32 * 16);
          } else {
            expect_same(got.grad_key, clean.grad_key, got.grad_key.numel());
            expect_same(got.grad_value, clean.grad_value, got.grad_value.numel());
          }
        }
  });
}

TEST(CpuBackward, LongSequencesBothWays) {
  check_each(long_sequence_cases({{1023, 129}, {17, 1023}, {300, 400}}), expect_gradients_agree);
}

TEST(CpuBackward, GqaRatiosMatchOracle) { check_each(gqa_ratio_cases(), expect_gradients_agree); }

// A float mask's gradient has the mask's own shape: the full dS summed over the dims the
// mask broadcasts along.
TEST(CpuBackward, EveryMaskBroadcastShapeBoolAndFloatWithMaskGradient) {
  check_each(mask_broadcast_cases(), expect_gradients_agree);
}

TEST(CpuBackward, CausalAlignmentsWithAndWithoutMask) { check_each(causal_alignment_cases(), expect_gradients_agree); }

TEST(CpuBackward, EveryDtypeMatchesOracleByTheToleranceRule) { check_each(dtype_cases(), expect_gradients_agree); }

TEST(CpuBackward, InterleavedStridedInputs) { check_each(interleaved_cases(), expect_gradients_agree); }

TEST(CpuBackward, ScaleNegativeZeroAndLarge) { check_each(scale_cases(), expect_gradients_agree); }

TEST(CpuBackward, DropoutMatchesOracle) {
  for (double p : {0.1, 0.5, 0.9})
    for (DType dtype : {DType::float32, DType::float64, DType::bfloat16}) {
      Case c;
      c.dtype = dtype;
      c.dropout_p = p;
      c.L = 70, c.S = 131;
      c.causal = Causal::bottom_right;
      c.heads_q = 4;
      expect_gradients_agree(c, static_cast<std::uint64_t>(p * 100));
    }
}

// The backward regenerates the forward's dropout mask: dV = Wᵀ dO with W the weights
// the forward returned (after dropout), and a dropped weight passes no gradient.
TEST(CpuBackward, DropoutMaskIsReplayedFromTheForward) {
  for (DType dtype : {DType::float64, DType::float32}) {
    std::mt19937_64 rng(31);
    const Tensor q = random_tensor(dtype, {1, 2, 37, 16}, rng), k = random_tensor(dtype, {1, 1, 50, 16}, rng),
                 v = random_tensor(dtype, {1, 1, 50, 8}, rng), g = random_tensor(dtype, {1, 2, 37, 8}, rng);
    Options o;
    o.dropout_p = 0.4;
    o.seed = 1234;
    o.offset = 77;
    const ForwardResult fwd = forward(q.view(), k.view(), v.view(), o, Returns{true, true});
    const BackwardResult bwd =
        backward(BackwardInputs{q.view(), k.view(), v.view(), fwd.output.view(), fwd.lse.view(), g.view()}, o);
    double worst = 0, largest = 0;
    for (std::int64_t j = 0; j < 50; ++j)
      for (std::int64_t c = 0; c < 8; ++c) {
        double dv = 0;
        for (std::int64_t h = 0; h < 2; ++h)
          for (std::int64_t i = 0; i < 37; ++i) dv += fwd.weights.at({0, h, i, j}) * g.at({0, h, i, c});
        worst = std::max(worst, std::abs(dv - bwd.grad_value.at({0, 0, j, c})));
        largest = std::max(largest, std::abs(dv));
      }
    EXPECT_LE(worst, (dtype == DType::float64 ? 1e-12 : 1e-5) * std::max(1.0, largest)) << dtype_name(dtype);
    // Another offset draws another mask, so the gradient changes.
    o.offset = 78;
    const ForwardResult other = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    const BackwardResult moved =
        backward(BackwardInputs{q.view(), k.view(), v.view(), other.output.view(), other.lse.view(), g.view()}, o);
    EXPECT_GT(max_abs_diff(to_float64(moved.grad_value.view()), to_float64(bwd.grad_value.view())), 1e-3);
  }
}

TEST(CpuBackward, RankThreeAndTwoBatchDims) {
  std::mt19937_64 rng(3);
  const Tensor q = random_tensor(DType::float32, {2, 4, 8}, rng), k = random_tensor(DType::float32, {2, 6, 8}, rng),
               v = random_tensor(DType::float32, {2, 6, 16}, rng);
  const GradientAgreement a = compare_gradients_with_oracle(q.view(), k.view(), v.view(), {});
  EXPECT_TRUE(a.ok()) << a.describe();
  Case c;
  c.batch = {2, 3};
  c.heads_q = 4, c.heads_kv = 2;
  c.mask = Case::Mask::additive;
  c.mask_shape = {3, 1, 1, 17};
  expect_gradients_agree(c);
}

// A bool mask with an all-false row, a float mask with a −inf row, and bottom-right
// causal with L > S (its first L − S queries see no key): gradients 0, never NaN.
TEST(CpuBackward, FullyMaskedRowsHaveZeroGradientsNeverNaN) {
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16}) {
    std::mt19937_64 rng(5);
    const Tensor q = random_tensor(dtype, {1, 2, 6, 8}, rng), k = random_tensor(dtype, {1, 2, 4, 8}, rng),
                 v = random_tensor(dtype, {1, 2, 4, 8}, rng), g = random_tensor(dtype, {1, 2, 6, 8}, rng);
    Tensor bool_mask = random_bool({6, 4}, rng, 0.8);
    Tensor float_mask = random_tensor(dtype, {6, 4}, rng);
    for (std::int64_t j = 0; j < 4; ++j) {
      bool_mask.set(2 * 4 + j, 0);
      float_mask.set(2 * 4 + j, -kInf);
    }
    for (const Tensor* mask : {&bool_mask, &float_mask}) {
      Options options;
      options.mask = mask->view();
      const bool float_gradient = mask == &float_mask;
      const GradientAgreement a = compare_gradients_with_oracle(q.view(), k.view(), v.view(), options, float_gradient);
      EXPECT_TRUE(a.ok()) << dtype_name(dtype) << ": " << a.describe();
      const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), options, float_gradient);
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.grad_query.at({0, h, 2, e}), 0.0);
      if (float_gradient) {
        for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(r.grad_mask.at({2, j}), 0.0);
      }
    }
    Options causal;
    causal.causal = Causal::bottom_right;
    const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), causal);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 2; ++i)  // queries 0, 1 see keys j <= i − 2: none
        for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.grad_query.at({0, h, i, e}), 0.0);
    for (const Tensor* t : {&r.grad_query, &r.grad_key, &r.grad_value})
      for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_FALSE(std::isnan(t->get(n)));
    causal.causal = Causal::top_left;  // L > S top-left: keys past L... none here; S > L: unseen keys
    const Tensor k_long = random_tensor(dtype, {1, 2, 9, 8}, rng), v_long = random_tensor(dtype, {1, 2, 9, 8}, rng);
    const BackwardResult unseen = forward_backward(q.view(), k_long.view(), v_long.view(), g.view(), causal);
    for (std::int64_t j = 6; j < 9; ++j)  // top-left, L = 6: keys 6..8 are seen by no query
      for (std::int64_t e = 0; e < 8; ++e) {
        EXPECT_EQ(unseen.grad_key.at({0, 1, j, e}), 0.0);
        EXPECT_EQ(unseen.grad_value.at({0, 1, j, e}), 0.0);
      }
  }
}

// −inf bands: whole columns of keys removed for every query, some whole key tiles.
TEST(CpuBackward, MinusInfColumnBands) {
  std::mt19937_64 rng(7);
  for (std::int64_t width : {10, 100}) {
    Tensor mask(DType::float32, {1, 400});
    for (std::int64_t j = 0; j < 400; ++j) mask.set(j, (j / width) % 3 == 0 ? -kInf : 0.0);
    const Tensor q = random_tensor(DType::float32, {1, 1, 40, 32}, rng),
                 k = random_tensor(DType::float32, {1, 1, 400, 32}, rng),
                 v = random_tensor(DType::float32, {1, 1, 400, 32}, rng);
    Options options;
    options.mask = mask.view();
    const GradientAgreement a = compare_gradients_with_oracle(q.view(), k.view(), v.view(), options, true);
    EXPECT_TRUE(a.ok()) << a.describe();
  }
}

// Scores around 1e4. A float32 score carries an error of at most δ = (γ_E + u)·scale·Σ|q_e k_e|
// (Higham §3.1), and the stored float32 lse another u·|lse|; P = exp(s − lse) is then off
// by a factor of at most exp(±2δ'), δ' = δ + u·|lse|. First order, every gradient moves by
// at most (e^{2δ'} − 1) times what it would be with |P| everywhere, which the oracle's
// magnitudes bound: that, not 1e-4, bounds any float32 implementation here.
TEST(CpuBackward, LargeLogitsStayFiniteWithinTheConditioningBound) {
  std::mt19937_64 rng(8);
  const std::int64_t E = 64;
  const Tensor q = random_tensor(DType::float32, {1, 1, 20, E}, rng, 40.0);
  const Tensor k = random_tensor(DType::float32, {1, 1, 30, E}, rng, 40.0);
  const Tensor v = random_tensor(DType::float32, {1, 1, 30, E}, rng),
               g = random_tensor(DType::float32, {1, 1, 20, E}, rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E)), u = std::ldexp(1.0, -24);
  const double gamma = E * u / (1 - E * u);
  double delta = 0, largest_score = 0;
  for (std::int64_t i = 0; i < 20; ++i)
    for (std::int64_t j = 0; j < 30; ++j) {
      double magnitude = 0, score = 0;
      for (std::int64_t e = 0; e < E; ++e) {
        magnitude += std::abs(q.get(i * E + e) * k.get(j * E + e));
        score += q.get(i * E + e) * k.get(j * E + e);
      }
      delta = std::max(delta, (gamma + u) * magnitude * scale);
      largest_score = std::max(largest_score, std::abs(score * scale));
    }
  delta += u * largest_score;  // lse ≈ the row's largest score, stored in float32
  const BackwardResult fast = forward_backward(q.view(), k.view(), v.view(), g.view(), {});
  const Tensor q64 = to_float64(q.view()), k64 = to_float64(k.view()), v64 = to_float64(v.view()),
               g64 = to_float64(g.view());
  Options reference;
  reference.backend = Backend::reference;
  const BackwardResult oracle = forward_backward(q64.view(), k64.view(), v64.view(), g64.view(), reference);
  const double growth = std::exp(2 * delta) - 1;
  // |dS| <= P (|dP| + |D|) <= 2 max|dO| max|V|; dQ, dK then gather E... S of them.
  const double ds_bound = 2 * max_abs(g64) * max_abs(v64) * E;
  const Tensor* got[] = {&fast.grad_query, &fast.grad_key, &fast.grad_value};
  const Tensor* want[] = {&oracle.grad_query, &oracle.grad_key, &oracle.grad_value};
  const double bounds[] = {growth * scale * ds_bound * 30 * max_abs(k64), growth * scale * ds_bound * 20 * max_abs(q64),
                           growth * 20 * max_abs(g64)};
  EXPECT_GT(max_abs(oracle.grad_value), 0.1);
  for (int n = 0; n < 3; ++n) {
    for (std::int64_t i = 0; i < got[n]->numel(); ++i) EXPECT_TRUE(std::isfinite(got[n]->get(i)));
    EXPECT_LE(max_abs_diff(to_float64(got[n]->view()), *want[n]), bounds[n] + 1e-4 * std::max(1.0, max_abs(*want[n])))
        << n;
  }
}

// NaN in an unmasked input reaches the gradients of everything it meets (pytorch#141128
// is the forward's version of turning them into zeros), and never rows that do not see
// it. Where a NaN at a masked position goes is unspecified (docs/semantics.md), so the
// oracle is compared on the finite rows only. NaNs with payload bits and signalling NaNs
// too: an exp2 that added the exponent into its result's bits made numbers of them.
TEST(CpuBackward, NaNInUnmaskedInputsPropagates) {
  std::mt19937_64 rng(9);
  Options options;
  options.causal = Causal::top_left;
  Options reference = options;
  reference.backend = Backend::reference;
  for (std::uint32_t bits : {0x7fc00000u, 0x7fc00001u, 0x7f800001u})
    for (int where = 0; where < 3; ++where) {
      SCOPED_TRACE(where == 0 ? "NaN in Q[5]" : where == 1 ? "NaN in K[5]" : "NaN in V[5]");
      SCOPED_TRACE(bits);
      Tensor q = random_tensor(DType::float32, {1, 1, 70, 16}, rng),
             k = random_tensor(DType::float32, {1, 1, 90, 16}, rng),
             v = random_tensor(DType::float32, {1, 1, 90, 16}, rng);
      const Tensor g = random_tensor(DType::float32, {1, 1, 70, 16}, rng);
      std::memcpy(static_cast<std::byte*>((where == 0   ? q
                                           : where == 1 ? k
                                                        : v)
                                              .data()) +
                      (5 * 16 + 3) * sizeof(float),
                  &bits, sizeof bits);
      const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), options);
      const Tensor q64 = to_float64(q.view()), k64 = to_float64(k.view()), v64 = to_float64(v.view()),
                   g64 = to_float64(g.view());
      const BackwardResult oracle = forward_backward(q64.view(), k64.view(), v64.view(), g64.view(), reference);
      // Q's NaN row 5, or the rows 5.. that see key 5: their dQ is NaN.
      for (std::int64_t i = 5; i < (where == 0 ? 6 : 70); ++i)
        EXPECT_TRUE(std::isnan(r.grad_query.at({0, 0, i, 0}))) << i;
      if (where == 0) {
        // Row 5's NaN weights reach the keys it sees; rows 0..4 never meet the NaN. (With
        // the NaN in K or V, 0 · NaN at key 5 may reach rows 0..4 through dS K and through
        // the forward's O in D = rowsum(dO ∘ O): unspecified, as in the forward.)
        for (std::int64_t j = 0; j <= 5; ++j) EXPECT_TRUE(std::isnan(r.grad_key.at({0, 0, j, 0}))) << j;
        for (std::int64_t i = 0; i < 5; ++i)
          for (std::int64_t e = 0; e < 16; ++e)
            EXPECT_NEAR(r.grad_query.at({0, 0, i, e}), oracle.grad_query.at({0, 0, i, e}), 1e-4) << i;
      }
      if (where == 1) {
        EXPECT_TRUE(std::isnan(r.grad_key.at({0, 0, 5, 3})));
      }
    }
}

// A stride-0 (expanded) dO, as autograd hands over for out.sum(), and expanded K and V.
TEST(CpuBackward, StrideZeroGradOutputAndInputs) {
  std::mt19937_64 rng(10);
  const Tensor q = random_tensor(DType::float32, {3, 2, 9, 8}, rng);
  const Tensor k1 = random_tensor(DType::float32, {1, 2, 11, 8}, rng),
               v1 = random_tensor(DType::float32, {1, 2, 11, 8}, rng);
  TensorView k = k1.view(), v = v1.view();
  k.shape[0] = v.shape[0] = 3;
  k.strides[0] = v.strides[0] = 0;
  Tensor one(DType::float32, {1});
  one.set(0, 1.0);
  TensorView ones = one.view();
  ones.shape = {3, 2, 9, 8};
  ones.strides = {0, 0, 0, 0};
  const GradientAgreement a = compare_gradients_with_oracle(q.view(), k, v, {}, false, ones);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Gradient buffers with any strides: a (B, L, H, E) layout written through the pointer API.
TEST(CpuBackward, StridedGradientBuffers) {
  std::mt19937_64 rng(11);
  const Tensor q = random_tensor(DType::float32, {2, 3, 10, 8}, rng),
               k = random_tensor(DType::float32, {2, 3, 12, 8}, rng),
               v = random_tensor(DType::float32, {2, 3, 12, 8}, rng),
               g = random_tensor(DType::float32, {2, 3, 10, 8}, rng);
  const ForwardResult fwd = forward(q.view(), k.view(), v.view(), {}, Returns{false, true});
  const BackwardInputs in{q.view(), k.view(), v.view(), fwd.output.view(), fwd.lse.view(), g.view()};
  const BackwardResult packed = backward(in);
  StridedCopy dq = heads_interleaved(Tensor(DType::float32, {2, 3, 10, 8})),
              dk = heads_interleaved(Tensor(DType::float32, {2, 3, 12, 8})),
              dv = heads_interleaved(Tensor(DType::float32, {2, 3, 12, 8}));
  backward(in, BackwardOutputs{dq.view, dk.view, dv.view, std::nullopt});
  EXPECT_EQ(max_abs_diff(to_float64(dq.view), to_float64(packed.grad_query.view())), 0.0);
  EXPECT_EQ(max_abs_diff(to_float64(dk.view), to_float64(packed.grad_key.view())), 0.0);
  EXPECT_EQ(max_abs_diff(to_float64(dv.view), to_float64(packed.grad_value.view())), 0.0);
}

TEST(CpuBackward, EmptyShapesGiveZeroGradients) {
  std::mt19937_64 rng(12);
  // S = 0: dQ = 0.
  const Tensor q = random_tensor(DType::float32, {1, 2, 3, 4}, rng),
               g = random_tensor(DType::float32, {1, 2, 3, 5}, rng);
  const Tensor k(DType::float32, {1, 2, 0, 4}), v(DType::float32, {1, 2, 0, 5});
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), {});
  EXPECT_EQ(r.grad_query.shape(), q.shape());
  for (std::int64_t n = 0; n < r.grad_query.numel(); ++n) EXPECT_EQ(r.grad_query.get(n), 0.0);
  // L = 0: dK = dV = 0. Batch 0: nothing.
  for (const Shape& qs : {Shape{1, 2, 0, 4}, Shape{0, 2, 3, 4}}) {
    const Tensor q0(DType::float32, qs), g0(DType::float32, {qs[0], 2, qs[2], 5});
    const Tensor k0 = random_tensor(DType::float32, {qs[0], 2, 6, 4}, rng),
                 v0 = random_tensor(DType::float32, {qs[0], 2, 6, 5}, rng);
    const BackwardResult e = forward_backward(q0.view(), k0.view(), v0.view(), g0.view(), {});
    EXPECT_EQ(e.grad_key.shape(), k0.shape());
    for (std::int64_t n = 0; n < e.grad_key.numel(); ++n) EXPECT_EQ(e.grad_key.get(n), 0.0);
    for (std::int64_t n = 0; n < e.grad_value.numel(); ++n) EXPECT_EQ(e.grad_value.get(n), 0.0);
  }
  // Ev = 0: the output is empty, so every gradient is 0.
  const Tensor k6 = random_tensor(DType::float32, {1, 2, 6, 4}, rng), v6(DType::float32, {1, 2, 6, 0}),
               g6(DType::float32, {1, 2, 3, 0});
  const BackwardResult e = forward_backward(q.view(), k6.view(), v6.view(), g6.view(), {});
  for (std::int64_t n = 0; n < e.grad_query.numel(); ++n) EXPECT_EQ(e.grad_query.get(n), 0.0);
  for (std::int64_t n = 0; n < e.grad_key.numel(); ++n) EXPECT_EQ(e.grad_key.get(n), 0.0);
}

// Same inputs and options: bitwise the same gradients with 1, 2 and 3 threads, with
// GQA, a broadcast float mask (its gradient summed), dropout, a sliding window, and key
// chunks (which depend on the thread count: one pass with 1 thread, two passes with more).
TEST(CpuBackward, BitwiseDeterministicAcrossThreadCounts) {
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16})
    for (std::int64_t S : {257, 5000})  // 5000 keys: with 2 or 3 threads, two key chunks, then dQ in a pass of its own
      for (std::int64_t window_left : {-1, 1500}) {
        Case c;
        c.dtype = dtype;
        c.heads_q = 4, c.heads_kv = 2, c.L = S == 257 ? 130 : 40, c.S = S, c.E = 40, c.Ev = 24;
        c.mask = Case::Mask::additive;
        c.mask_shape = {c.L, c.S};
        c.causal = Causal::bottom_right;
        c.dropout_p = 0.3;
        Inputs in = make_inputs(c, 12);
        in.options.window_left = window_left;
        SCOPED_TRACE(c.name());
        expect_gradients_deterministic_across_threads(in);
      }
}

// Few (batch, KV head) pairs and long keys: the keys are split into chunks for dK and dV,
// and dQ is a second pass over query blocks; they must agree with the oracle.
TEST(CpuBackward, KeyChunksMatchOracle) {
  // Several query blocks (2 heads × 200 rows) in both passes, with a sliding window whose
  // rows see one chunk, both, or (window right of every key) none.
  for (std::int64_t left : {-1, 40}) {
    Case c;
    c.dtype = DType::float32;
    c.batch = {1};
    c.heads_q = 2, c.heads_kv = 1, c.L = 200, c.S = 4500, c.E = 16, c.Ev = 8;
    c.causal = Causal::bottom_right;
    Inputs in = make_inputs(c, 23);
    in.options.window_left = left;
    const Tensor g = random_grad_output(in.qv(), in.vv(), 5);
    Options reference = in.options;
    reference.backend = Backend::reference;
    const BackwardResult got = forward_backward(in.qv(), in.kv(), in.vv(), g.view(), in.options);
    const BackwardResult want = forward_backward(in.qv(), in.kv(), in.vv(), g.view(), reference);
    for (auto [a, b] : {std::pair{&got.grad_query, &want.grad_query}, {&got.grad_key, &want.grad_key},
                        {&got.grad_value, &want.grad_value}})
      for (std::int64_t n = 0; n < a->numel(); ++n) ASSERT_NEAR(a->get(n), b->get(n), 1e-4) << "left " << left << " at " << n;
  }

  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.dtype = dtype;
      c.batch = {1};
      c.heads_q = 5, c.heads_kv = 1, c.L = 3, c.S = 9001, c.E = 16, c.Ev = 24;
      c.causal = causal;
      c.mask = Case::Mask::additive;
      c.mask_shape = {c.S};
      expect_gradients_agree(c, 21);
    }
}

// A thread keeps its last backward's scratch for the next call whose sizes are the same
// (ScratchCache, as the forward's). Calls in one thread that change each thing those sizes
// depend on — E, Ev, the softcap's buffer, the key chunk (S), bfloat16 on either of its
// paths — each alone from the step before (S = 200 and 3000 both run on all threads, S =
// 40 on one: the thread count is part of what the cache compares), and come back, each
// against the oracle (the sanitizer build sees any buffer a stale scratch overruns: a
// softcap call after one without writes kKeyTile rows of tanh; a longer chunk writes past
// a kept dK). S = 3000 at E = 96 has dK and dV over kLargestKeptChunkFloats: released,
// made again by the call after it.
TEST(CpuBackward, ConsecutiveCallsOfChangingShapesMatchOracle) {
  struct Step {
    DType dtype;
    std::int64_t S, E, Ev;
    double softcap;
  };
  const Step steps[] = {
      {DType::float32, 40, 16, 16, 0.0},  {DType::float32, 40, 16, 16, 5.0},   {DType::float32, 40, 16, 16, 0.0},
      {DType::float32, 40, 96, 16, 0.0},  {DType::float32, 40, 96, 40, 0.0},   {DType::bfloat16, 40, 96, 40, 0.0},
      {DType::bfloat16, 40, 96, 40, 2.0}, {DType::float32, 200, 16, 16, 0.0},  {DType::float32, 3000, 16, 16, 0.0},
      {DType::float32, 200, 16, 16, 0.0}, {DType::float32, 3000, 96, 40, 0.0}, {DType::float32, 3000, 96, 40, 0.0},
      {DType::float32, 40, 16, 130, 0.0}};
  auto run = [](const Step& step) {
    Case c;
    c.dtype = step.dtype;
    c.batch = {1};
    c.heads_q = 4, c.heads_kv = 2, c.L = 33, c.S = step.S, c.E = step.E, c.Ev = step.Ev;
    c.softcap = step.softcap;
    c.causal = Causal::bottom_right;
    expect_gradients_agree(c, 9);
  };
  for (const Step& step : steps) {
    if (step.dtype == DType::bfloat16)
      for_each_bfloat16_path([&] { run(step); });
    else
      run(step);
  }
}

// The fast path in float64 (the portable tiled kernel) against central differences of
// its own forward.
TEST(CpuBackward, Float64MatchesFiniteDifferences) {
  std::mt19937_64 rng(13);
  Tensor q = random_tensor(DType::float64, {2, 4, 5, 3}, rng), k = random_tensor(DType::float64, {2, 2, 7, 3}, rng),
         v = random_tensor(DType::float64, {2, 2, 7, 2}, rng), mask = random_tensor(DType::float64, {4, 1, 7}, rng);
  const Tensor g = random_tensor(DType::float64, {2, 4, 5, 2}, rng);
  mask.set(3, -kInf);
  Options o;
  o.mask = mask.view();
  o.causal = Causal::bottom_right;
  o.dropout_p = 0.2;
  o.seed = 5;
  auto loss = [&] { return dot(forward(q.view(), k.view(), v.view(), o).output, g); };
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
  EXPECT_LE(max_abs_diff(r.grad_query, numerical_gradient(q, loss)), 1e-8);
  EXPECT_LE(max_abs_diff(r.grad_key, numerical_gradient(k, loss)), 1e-8);
  EXPECT_LE(max_abs_diff(r.grad_value, numerical_gradient(v, loss)), 1e-8);
  EXPECT_LE(max_abs_diff(r.grad_mask, numerical_gradient(mask, loss)), 1e-8);
}

// The SIMD path in float32 against central differences of the float64 loss, with a
// step large enough for float32 (the comparison is at 1e-3 of the gradient scale).
TEST(CpuBackward, Float32MatchesFiniteDifferences) {
  std::mt19937_64 rng(14);
  Tensor q = random_tensor(DType::float64, {1, 2, 6, 4}, rng), k = random_tensor(DType::float64, {1, 1, 9, 4}, rng),
         v = random_tensor(DType::float64, {1, 1, 9, 3}, rng);
  const Tensor g = random_tensor(DType::float64, {1, 2, 6, 3}, rng);
  Options o64;
  o64.backend = Backend::reference;
  o64.causal = Causal::top_left;
  auto loss = [&] { return dot(forward(q.view(), k.view(), v.view(), o64).output, g); };
  const Tensor q32 = convert(q, DType::float32), k32 = convert(k, DType::float32), v32 = convert(v, DType::float32),
               g32 = convert(g, DType::float32);
  Options o;
  o.causal = Causal::top_left;
  const BackwardResult r = forward_backward(q32.view(), k32.view(), v32.view(), g32.view(), o);
  EXPECT_LE(max_abs_diff(to_float64(r.grad_query.view()), numerical_gradient(q, loss)), 1e-4);
  EXPECT_LE(max_abs_diff(to_float64(r.grad_key.view()), numerical_gradient(k, loss)), 1e-4);
  EXPECT_LE(max_abs_diff(to_float64(r.grad_value.view()), numerical_gradient(v, loss)), 1e-4);
}

// The portable tiled kernel, run in float32, is a second opinion on the SIMD one.
TEST(CpuBackward, PortableTiledKernelInFloat32MatchesOracle) {
  std::mt19937_64 rng(15);
  const Tensor q = random_tensor(DType::float32, {1, 4, 70, 24}, rng),
               k = random_tensor(DType::float32, {1, 2, 90, 24}, rng),
               v = random_tensor(DType::float32, {1, 2, 90, 16}, rng),
               g = random_tensor(DType::float32, {1, 4, 70, 16}, rng);
  Tensor mask = random_tensor(DType::float32, {70, 90}, rng);
  Options o;
  o.mask = mask.view();
  o.causal = Causal::top_left;
  o.dropout_p = 0.25;
  const ForwardResult fwd = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
  const BackwardInputs in{q.view(), k.view(), v.view(), fwd.output.view(), fwd.lse.view(), g.view()};
  const BackwardResult simd = backward(in, o, true);
  BackwardResult tiled{Tensor(DType::float32, q.shape()), Tensor(DType::float32, k.shape()),
                       Tensor(DType::float32, v.shape()), Tensor(DType::float32, mask.shape()), Tensor()};
  const TensorView qv = q.view(), kv = k.view(), vv = v.view();  // check_inputs keeps pointers to them
  const detail::CheckedInputs checked = detail::check_inputs(qv, kv, vv, o);
  detail::CheckedBackward call = detail::make_backward_problem(
      checked, in,
      BackwardOutputs{tiled.grad_query.view(), tiled.grad_key.view(), tiled.grad_value.view(), std::nullopt});
  detail::portable_backward(call.problem);
  const Tensor* a[] = {&simd.grad_query, &simd.grad_key, &simd.grad_value};
  const Tensor* b[] = {&tiled.grad_query, &tiled.grad_key, &tiled.grad_value};
  for (int n = 0; n < 3; ++n)
    EXPECT_LE(max_abs_diff(to_float64(a[n]->view()), to_float64(b[n]->view())),
              1e-4 * std::max(1.0, max_abs(to_float64(a[n]->view()))))
        << n;
}

// Every SIMD target the CPU supports (AVX-512, AVX2, SSE4, scalar) meets the contract on
// its own, so that a machine without AVX-512 gets the same gradients' accuracy.
TEST(CpuBackward, EveryTargetMatchesOracle) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    std::mt19937_64 rng(static_cast<std::uint64_t>(target));
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      const Tensor q = random_tensor(dtype, {2, 6, 37, 40}, rng), k = random_tensor(dtype, {2, 2, 101, 40}, rng),
                   v = random_tensor(dtype, {2, 2, 101, 24}, rng);
      const Tensor mask = random_tensor(DType::float32, {37, 101}, rng);
      Options options;
      options.mask = mask.view();
      options.causal = Causal::bottom_right;
      options.dropout_p = 0.25;
      const GradientAgreement a = compare_gradients_with_oracle(q.view(), k.view(), v.view(), options, true);
      EXPECT_TRUE(a.ok()) << dtype_name(dtype) << ": " << a.describe();
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// The loss may use the returned lse too (merging partial attentions, ring attention):
// L = Σ gO ∘ O + Σ gL ∘ lse. The oracle's gradients against central differences of that
// loss in float64, then the CPU paths (float64 portable, float32 SIMD, one key chunk and
// two) against the oracle, with a window, ALiBi and softcap.
TEST(CpuBackward, LseGradientMatchesFiniteDifferencesAndOracle) {
  std::mt19937_64 rng(31);
  Tensor q = random_tensor(DType::float64, {1, 4, 6, 5}, rng), k = random_tensor(DType::float64, {1, 2, 9, 5}, rng),
         v = random_tensor(DType::float64, {1, 2, 9, 3}, rng);
  const Tensor g_out = random_tensor(DType::float64, {1, 4, 6, 3}, rng),
               g_lse = random_tensor(DType::float64, {1, 4, 6}, rng);
  Tensor slopes(DType::float64, {4});
  for (std::int64_t h = 0; h < 4; ++h) slopes.set(h, 0.3 / static_cast<double>(h + 1));
  Options options;
  options.backend = Backend::reference;
  options.causal = Causal::bottom_right;
  options.window_left = 4;
  options.softcap = 2.0;
  options.alibi_slopes = slopes.view();
  const auto loss = [&] {
    const ForwardResult f = forward(q.view(), k.view(), v.view(), options, {.lse = true});
    return dot(f.output, g_out) + dot(f.lse, g_lse);
  };
  const ForwardResult f = forward(q.view(), k.view(), v.view(), options, {.lse = true});
  BackwardInputs inputs{q.view(), k.view(), v.view(), f.output.view(), f.lse.view(), g_out.view()};
  inputs.grad_lse = g_lse.view();
  const BackwardResult exact = backward(inputs, options);
  for (auto [x, g] : {std::pair{&q, &exact.grad_query}, {&k, &exact.grad_key}, {&v, &exact.grad_value}}) {
    const Tensor numeric = numerical_gradient(*x, loss);
    for (std::int64_t n = 0; n < numeric.numel(); ++n) EXPECT_NEAR(g->get(n), numeric.get(n), 1e-8) << n;
  }
  // Without grad_lse the lse's share is missing: the test above can tell the difference.
  const BackwardResult without = backward({q.view(), k.view(), v.view(), f.output.view(), f.lse.view(), g_out.view()},
                                          options);
  double difference = 0;
  for (std::int64_t n = 0; n < without.grad_query.numel(); ++n)
    difference = std::max(difference, std::abs(without.grad_query.get(n) - exact.grad_query.get(n)));
  EXPECT_GT(difference, 1e-3);

  // The CPU paths on a longer problem: S = 5000 with 2 threads splits the keys in chunks.
  for (DType dtype : {DType::float64, DType::float32})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " threads " + std::to_string(threads));
      const Tensor q2 = random_tensor(dtype, {1, 2, 40, 16}, rng), k2 = random_tensor(dtype, {1, 1, 5000, 16}, rng),
                   v2 = random_tensor(dtype, {1, 1, 5000, 8}, rng), go = random_tensor(dtype, {1, 2, 40, 8}, rng);
      const Tensor gl = random_tensor(dtype == DType::float64 ? DType::float64 : DType::float32, {1, 2, 40}, rng);
      Options cpu = options;
      cpu.backend = Backend::cpu;
      cpu.num_threads = threads;
      cpu.window_left = 3000;
      cpu.window_right = -1;
      cpu.alibi_slopes = std::nullopt;
      cpu.alignment = std::nullopt;
      Options oracle = cpu;
      oracle.backend = Backend::reference;
      const ForwardResult fo = forward(q2.view(), k2.view(), v2.view(), oracle, {.lse = true});
      BackwardInputs in{q2.view(), k2.view(), v2.view(), fo.output.view(), fo.lse.view(), go.view()};
      in.grad_lse = gl.view();
      const BackwardResult want = backward(in, oracle), got = backward(in, cpu);
      const double tolerance = dtype == DType::float64 ? 1e-10 : 1e-4;
      for (auto [a, b] : {std::pair{&got.grad_query, &want.grad_query}, {&got.grad_key, &want.grad_key},
                          {&got.grad_value, &want.grad_value}})
        for (std::int64_t n = 0; n < a->numel(); ++n) ASSERT_NEAR(a->get(n), b->get(n), tolerance) << n;
    }
}

// grad_lse must have the lse's shape and dtype; nothing is written otherwise.
TEST(CpuBackward, LseGradientOfTheWrongShapeOrDtypeIsRejected) {
  std::mt19937_64 rng(32);
  const Tensor q = random_tensor(DType::float32, {1, 2, 3, 4}, rng), k = random_tensor(DType::float32, {1, 2, 5, 4}, rng),
               v = random_tensor(DType::float32, {1, 2, 5, 4}, rng), g = random_tensor(DType::float32, {1, 2, 3, 4}, rng);
  const ForwardResult f = forward(q.view(), k.view(), v.view(), {}, {.lse = true});
  const Tensor wrong_shape(DType::float32, {1, 2, 4}), wrong_dtype(DType::float64, {1, 2, 3});
  for (const Tensor* bad : {&wrong_shape, &wrong_dtype}) {
    BackwardInputs in{q.view(), k.view(), v.view(), f.output.view(), f.lse.view(), g.view()};
    in.grad_lse = bad->view();
    try {
      backward(in);
      ADD_FAILURE() << "accepted a grad_lse of shape " << bad->shape().size() << " dims, " << dtype_name(bad->dtype());
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "grad_lse") << e.what();
    }
  }
}

}  // namespace
}  // namespace sdpa::testing
