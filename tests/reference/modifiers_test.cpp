// The oracle's score modifiers (include/sdpa/options.h: the sliding window and its
// alignment, ALiBi, logit softcapping, with masks and dropout) against a float64
// re-implementation written straight from the formula (testing/formula.h), never from
// the library's code; and the closed forms no softmax error can hide.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "testing/cases.h"
#include "testing/formula.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Rows whose expected lse is −inf must come out exactly as output 0, lse −inf, weights 0
// (never NaN, never a tiny number). Returns how many such rows there were.
int expect_empty_rows_exact(const Expected& want, const ForwardResult& got) {
  const std::int64_t rows = want.lse.numel();
  const std::int64_t Ev = rows ? want.output.numel() / rows : 0, S = rows ? want.weights.numel() / rows : 0;
  int empty = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (want.lse.get(r) != -kInf) continue;
    ++empty;
    EXPECT_EQ(got.lse.get(r), -kInf) << "row " << r;
    for (std::int64_t c = 0; c < Ev; ++c) EXPECT_EQ(got.output.get(r * Ev + c), 0.0) << "row " << r;
    if (got.weights.numel()) {
      for (std::int64_t j = 0; j < S; ++j) EXPECT_EQ(got.weights.get(r * S + j), 0.0) << "row " << r;
    }
  }
  return empty;
}

// The oracle (on these views) against expected_attention: 1e-12 relative, and empty rows
// exact. Returns the number of empty rows.
int expect_oracle_matches_formula(const TensorView& q, const TensorView& k, const TensorView& v, Options o) {
  o.backend = Backend::reference;
  const ForwardResult got = forward(q, k, v, o, Returns{true, true});
  const Expected want = expected_attention(q, k, v, o);
  EXPECT_LE(max_abs_diff(to_float64(got.output.view()), want.output), 1e-12 * std::max(1.0, max_abs(want.output)));
  EXPECT_LE(max_abs_diff(to_float64(got.lse.view()), want.lse), 1e-12 * std::max(1.0, max_abs(want.lse)));
  EXPECT_LE(max_abs_diff(to_float64(got.weights.view()), want.weights), 1e-12);
  return expect_empty_rows_exact(want, got);
}

// Every window side in {−1, 0, 1, 3}, both alignments, with and without causal of
// either alignment, L < S and L > S. Rows the window leaves empty (L > S with a top-left
// diagonal past the last key, bottom-right diagonals before the first key) must give
// output 0 and lse −inf exactly, and the grid must contain such rows.
TEST(ReferenceModifiers, WindowMatchesFormulaEverySideAndAlignment) {
  int empty_rows = 0, n = 0;
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 5}})
    for (std::int64_t left : {-1, 0, 1, 3})
      for (std::int64_t right : {-1, 0, 1, 3})
        for (const CausalAlignment& ca : kCausalAlignments) {
          Case c = small_gqa_case();
          c.L = L, c.S = S, c.window_left = left, c.window_right = right;
          c.causal = ca.causal, c.alignment = ca.alignment;
          SCOPED_TRACE(c.name());
          const Inputs in = make_inputs(c, ++n);
          empty_rows += expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
  EXPECT_GT(empty_rows, 100);
}

// A window of (0, 0) keeps the diagonal key only: the output is that key's value row,
// whatever the scores (a closed form no softmax error can hide), and with L > S
// top-left the rows past the last key see nothing.
TEST(ReferenceModifiers, DiagonalOnlyWindowCopiesTheDiagonalValue) {
  std::mt19937_64 rng(3);
  const Tensor q = random_tensor(DType::float64, {1, 1, 6, 4}, rng),
               k = random_tensor(DType::float64, {1, 1, 4, 4}, rng),
               v = random_tensor(DType::float64, {1, 1, 4, 3}, rng);
  for (Alignment a : {Alignment::top_left, Alignment::bottom_right}) {
    Options o;
    o.backend = Backend::reference;
    o.window_left = o.window_right = 0;
    o.alignment = a;
    const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    for (std::int64_t i = 0; i < 6; ++i) {
      const std::int64_t d = a == Alignment::top_left ? i : i - 2;
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(r.output.at({0, 0, i, c}), (d >= 0 && d < 4) ? v.at({0, 0, d, c}) : 0.0) << i;
      if (d >= 0 && d < 4) {
        double dot = 0;
        for (std::int64_t e = 0; e < 4; ++e) dot += q.at({0, 0, i, e}) * k.at({0, 0, d, e});
        EXPECT_NEAR(r.lse.at({0, 0, i}), 0.5 * dot, 1e-14) << i;  // one key: lse = its score
      } else {
        EXPECT_EQ(r.lse.at({0, 0, i}), -kInf) << i;
      }
    }
  }
}

// ALiBi slopes (Hq,) and (batch, Hq), float32 and float64, with GQA (4 query heads on 2
// KV heads: the slope follows the query head), both alignments and causal.
TEST(ReferenceModifiers, AlibiMatchesFormulaPerHeadAndPerBatchHead) {
  int n = 0;
  for (auto slopes : {Case::PerHead::per_head, Case::PerHead::per_batch_head})
    for (DType slopes_dtype : {DType::float32, DType::float64})
      for (const CausalAlignment& ca : kCausalAlignments)
        for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 5}}) {
          Case c = small_gqa_case();
          c.L = L, c.S = S, c.slopes = slopes, c.slopes_dtype = slopes_dtype;
          c.causal = ca.causal, c.alignment = ca.alignment;
          SCOPED_TRACE(c.name());
          const Inputs in = make_inputs(c, ++n);
          expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
}

// ALiBi with identical keys: every score is the same, so weight_j ∝ exp(−slope·|d(i) − j|)
// exactly; and a bias that depends on the batch (slopes (batch, Hq)) must change the
// batch elements differently.
TEST(ReferenceModifiers, AlibiWithIdenticalKeysGivesGeometricWeights) {
  std::mt19937_64 rng(4);
  const std::int64_t L = 3, S = 6;
  const Tensor q = random_tensor(DType::float64, {2, 2, L, 4}, rng),
               v = random_tensor(DType::float64, {2, 1, S, 2}, rng);
  Tensor k(DType::float64, {2, 1, S, 4});
  for (std::int64_t n = 0; n < k.numel(); ++n) k.set(n, 0.25 * static_cast<double>(n % 4));
  const Tensor slopes = alibi_slopes(DType::float64, {2}, 2, true);
  Options o;
  o.backend = Backend::reference;
  o.alibi_slopes = slopes.view();
  const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, false});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < L; ++i) {
        const double slope = slopes.get(b * 2 + h);
        double sum = 0;
        for (std::int64_t j = 0; j < S; ++j) sum += std::exp(-slope * std::abs(static_cast<double>(i + S - L - j)));
        for (std::int64_t j = 0; j < S; ++j)
          EXPECT_NEAR(r.weights.at({b, h, i, j}), std::exp(-slope * std::abs(static_cast<double>(i + S - L - j))) / sum,
                      1e-14);
      }
}

// Slopes (batch..., Hq) with two batch dims, and slopes read through strides: the same
// as the rank-4 problem with the batch dims flattened and packed slopes, on the oracle
// (against the formula) and the CPU (against the oracle).
TEST(ReferenceModifiers, AlibiSlopesWithTwoBatchDimsAndStrides) {
  std::mt19937_64 rng(5);
  const Tensor q = random_tensor(DType::float64, {2, 3, 4, 9, 8}, rng),
               k = random_tensor(DType::float64, {2, 3, 2, 12, 8}, rng),
               v = random_tensor(DType::float64, {2, 3, 2, 12, 5}, rng);
  const Tensor packed_slopes = alibi_slopes(DType::float32, {6}, 4, true);  // (6, 4) = the (2, 3, 4) slopes flattened
  Tensor spread(DType::float32, {6, 4, 2});                                 // every other float32 holds a slope
  for (std::int64_t n = 0; n < 24; ++n) spread.set(2 * n, packed_slopes.get(n)), spread.set(2 * n + 1, kNaN);
  TensorView strided{spread.data(), DType::float32, {2, 3, 4}, {24, 8, 2}};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    Options o;
    o.backend = backend;
    o.alibi_slopes = strided;
    o.window_left = 5;
    o.alignment = Alignment::top_left;
    const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    TensorView q4 = q.view(), k4 = k.view(), v4 = v.view();
    q4.shape = {6, 4, 9, 8}, k4.shape = {6, 2, 12, 8}, v4.shape = {6, 2, 12, 5};
    q4.strides = k4.strides = v4.strides = {};  // packed
    Options o4 = o;
    o4.alibi_slopes = packed_slopes.view();
    const Expected want = expected_attention(q4, k4, v4, o4);
    const double tolerance = backend == Backend::reference ? 1e-12 : 1e-10;
    TensorView out4 = r.output.view(), lse4 = r.lse.view();
    out4.shape = {6, 4, 9, 5}, lse4.shape = {6, 4, 9};
    out4.strides = lse4.strides = {};
    EXPECT_LE(max_abs_diff(to_float64(out4), want.output), tolerance) << static_cast<int>(backend);
    EXPECT_LE(max_abs_diff(to_float64(lse4), want.lse), tolerance) << static_cast<int>(backend);
  }
  Options o;
  o.alibi_slopes = strided;
  o.softcap = 4;
  const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), o);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Softcap on scores of ~±100 (stddev 10): tanh saturates, so every score lies within
// ±softcap and a row's weights stay within a factor exp(2·softcap) of each other.
TEST(ReferenceModifiers, SoftcapMatchesFormulaAndBoundsTheScores) {
  int n = 0;
  for (double softcap : {0.5, 5.0, 30.0})
    for (double stddev : {1.0, 10.0}) {
      Case c = small_gqa_case();
      c.softcap = softcap, c.stddev = stddev;
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c, ++n);
      expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
      Options o = in.options;
      o.backend = Backend::reference;
      const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), o, Returns{true, false});
      for (std::int64_t row = 0; row < r.weights.numel() / c.S; ++row) {
        double lo = kInf, hi = 0;
        for (std::int64_t j = 0; j < c.S; ++j) {
          lo = std::min(lo, r.weights.get(row * c.S + j));
          hi = std::max(hi, r.weights.get(row * c.S + j));
        }
        EXPECT_LE(hi / lo, std::exp(2 * softcap) * (1 + 1e-12));
      }
    }
}

// Softcap, ALiBi and the window together, with a float mask (added after the cap and
// the bias) or a bool mask, both alignments, causal, GQA, dropout.
TEST(ReferenceModifiers, AllTogetherWithFloatAndBoolMask) {
  int n = 0;
  for (auto mask : {Case::Mask::additive, Case::Mask::boolean})
    for (bool broadcast : {false, true})
      for (const CausalAlignment& ca : kCausalAlignments)
        for (double dropout : {0.0, 0.3}) {
          Case c = small_gqa_case();
          c.L = 9, c.S = 13, c.window_left = 4, c.window_right = 2;
          c.slopes = n % 2 ? Case::PerHead::per_head : Case::PerHead::per_batch_head;
          c.softcap = 2.0, c.stddev = 2.0;
          c.mask = mask;
          if (broadcast) c.mask_shape = {c.L, c.S};
          c.causal = ca.causal, c.alignment = ca.alignment;
          c.dropout_p = dropout;
          SCOPED_TRACE(c.name());
          const Inputs in = make_inputs(c, ++n);
          expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
}
// Attention sinks (Hq,) and (batch, Hq), with GQA (the sink follows the query head),
// every causal alignment and a window that leaves rows with no key: the oracle against
// the formula. A row with no key left gives output 0, weights 0 and lse = its sink, or
// −inf where that sink is −inf (sink_logits has one).
TEST(ReferenceModifiers, SinksMatchFormulaAndRowsWithNoKeyGiveTheSink) {
  int n = 0, only_sink = 0;
  for (auto sinks : {Case::PerHead::per_head, Case::PerHead::per_batch_head})
    for (const CausalAlignment& ca : kCausalAlignments)
      for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 5}}) {
        Case c = small_gqa_case();
        c.L = L, c.S = S, c.sinks = sinks, c.causal = ca.causal, c.alignment = ca.alignment;
        c.window_left = 1, c.window_right = 0;
        SCOPED_TRACE(c.name());
        const Inputs in = make_inputs(c, ++n);
        expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        Options o = in.options;
        o.backend = Backend::reference;
        const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), o, Returns{true, true});
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t h = 0; h < c.heads_q; ++h)
            for (std::int64_t i = 0; i < L; ++i) {
              if (!window_row_empty(in.options, L, S, i)) continue;
              ++only_sink;
              EXPECT_EQ(r.lse.at({b, h, i}), in.sinks.get(sinks == Case::PerHead::per_head ? h : b * c.heads_q + h));
              for (std::int64_t e = 0; e < c.Ev; ++e) EXPECT_EQ(r.output.at({b, h, i, e}), 0.0);
              for (std::int64_t j = 0; j < S; ++j) EXPECT_EQ(r.weights.at({b, h, i, j}), 0.0);
            }
      }
  EXPECT_GT(only_sink, 0);
}

// The sink takes its share of every row and no value: with every value row equal to the
// same vector c, out_i = c · (1 − P_i) and Σ_j w_ij = 1 − P_i, P_i = exp(sink − lse_i),
// and P_i = exp(sink) / (exp(sink) + Σ_j exp(s_ij)) from the scores alone. On the oracle
// and the CPU (float64, and float32 within its rounding).
TEST(ReferenceModifiers, SinkTakesItsShareAndNoValue) {
  for (DType dtype : {DType::float64, DType::float32})
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " backend " << static_cast<int>(backend));
      std::mt19937_64 rng(6);
      const Tensor q = random_tensor(dtype, {1, 3, 4, 8}, rng), k = random_tensor(dtype, {1, 3, 130, 8}, rng);
      Tensor v(dtype, {1, 3, 130, 2});
      for (std::int64_t n = 0; n < v.numel(); ++n) v.set(n, n % 2 ? -1.5 : 0.75);
      const Tensor sinks = sink_logits(DType::float64, {1}, 3, false);
      Options o;
      o.backend = backend;
      o.sinks = sinks.view();
      const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, true});
      const double tolerance = dtype == DType::float64 ? 1e-14 : 2e-6;
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t i = 0; i < 4; ++i) {
          double sum = std::exp(sinks.get(h)), weights = 0;
          for (std::int64_t j = 0; j < 130; ++j) {
            double dot = 0;
            for (std::int64_t e = 0; e < 8; ++e) dot += q.at({0, h, i, e}) * k.at({0, h, j, e});
            sum += std::exp(dot / std::sqrt(8.0));
            weights += r.weights.at({0, h, i, j});
          }
          const double share = std::exp(sinks.get(h)) / sum;
          EXPECT_NEAR(std::exp(sinks.get(h) - r.lse.at({0, h, i})), share, tolerance);
          EXPECT_NEAR(weights, 1 - share, tolerance);
          EXPECT_NEAR(r.output.at({0, h, i, 0}), 0.75 * (1 - share), tolerance);
          EXPECT_NEAR(r.output.at({0, h, i, 1}), -1.5 * (1 - share), tolerance);
        }
    }
}

// Sinks of −inf are no sinks: the same bits as without them, on both backends.
TEST(ReferenceModifiers, MinusInfinitySinksAreNoSinks) {
  Case c = small_gqa_case();
  c.dtype = DType::float32, c.L = 40, c.S = 150, c.causal = Causal::bottom_right;
  const Inputs in = make_inputs(c, 7);
  Tensor none(DType::float32, {c.heads_q});
  for (std::int64_t h = 0; h < c.heads_q; ++h) none.set(h, -kInf);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    Options o = in.options;
    o.backend = backend;
    const ForwardResult without = forward(in.qv(), in.kv(), in.vv(), o, Returns{true, true});
    o.sinks = none.view();
    const ForwardResult with = forward(in.qv(), in.kv(), in.vv(), o, Returns{true, true});
    EXPECT_TRUE(bitwise_equal(with.output, without.output));
    EXPECT_TRUE(bitwise_equal(with.lse, without.lse));
    EXPECT_TRUE(bitwise_equal(with.weights, without.weights));
  }
}

}  // namespace
}  // namespace sdpa::testing
