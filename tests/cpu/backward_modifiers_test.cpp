// The CPU backward's score modifiers (include/sdpa/options.h: the sliding window and its
// alignment, ALiBi, logit softcapping, with masks and dropout) against the float64
// oracle's gradients by the tolerance rule of DESIGN.md §4 (a naive low-precision
// backward with the softcap's chain rule for float16 / bfloat16), against central
// differences, and bitwise the same for 1, 2 and 3 threads. The float mask is added after
// the cap: its gradient is dS, not dS·(1 − tanh²).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "testing/expectations.h"
#include "testing/finite_differences.h"

namespace sdpa::testing {
namespace {

// The CPU gradients against the oracle's. bfloat16 only without softcap: the tolerance
// rule's naive low-precision backward (naive_gradients) knows no tanh.
// bfloat16 on both of its paths where the CPU has vdpbf16ps.
TEST(CpuBackwardModifiers, MatchesOracle) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16, DType::float16}) {
    const auto grid = [&] {
      for (const Dims& d :
           {Dims{2, 4, 2, 129, 200, 7, 7}, Dims{1, 3, 1, 37, 300, 96, 40}, Dims{1, 1, 1, 200, 70, 1, 1}})
        for (const Modifiers& k : kModifierGrid) {
          if ((dtype == DType::bfloat16 || dtype == DType::float16) && k.softcap > 0) continue;
          if (dtype == DType::float16 && d.S == 300) continue;  // bfloat16 covers the long rows
          if (dtype != DType::float32 && d.E == 1) continue;
          Case c = with(d, k, dtype);
          c.interleaved = n % 2 == 0;
          if (n % 3 == 0) c.mask_shape = {c.L, c.S};
          if (k.softcap == 2.0) c.stddev = 2;
          expect_gradients_agree(c, ++n);
        }
    };
    if (dtype == DType::bfloat16)
      for_each_bfloat16_path(grid);
    else
      grid();
  }
}

// naive_gradients (tests/testing/gradients.h) with the softcap's chain rule: a backward
// that rounds to `dtype` after every step, sums in float32, from exact inputs and the
// exact softmax P (no dropout):
//   dP = r(dO Vᵀ),  D = r(Σ P dP),  dS = r(P (dP − D)),  dS' = r(dS (1 − tanh²(scale q·k / cap))),
//   dV = r(Pᵀ dO),  dQ = r(scale dS' K),  dK = r(scale dS'ᵀ Q)
// Rank 4, float64 tensors.
BackwardResult naive_softcap_gradients(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                       const Tensor& probs, double scale, double cap, DType dtype) {
  const std::int64_t B = q.shape()[0], Hq = q.shape()[1], L = q.shape()[2], E = q.shape()[3];
  const std::int64_t Hkv = k.shape()[1], S = k.shape()[2], Ev = v.shape()[3];
  auto r = [dtype](double x) { return round_to(dtype, x); };
  BackwardResult g{Tensor(DType::float64, q.shape()), Tensor(DType::float64, k.shape()),
                   Tensor(DType::float64, v.shape()), Tensor(), Tensor()};
  std::vector<float> dk(static_cast<std::size_t>(k.numel())), dv(static_cast<std::size_t>(v.numel()));
  std::vector<double> ds(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kv = b * Hkv + h / (Hq / Hkv);
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = (b * Hq + h) * L + i;
        float D = 0;
        for (std::int64_t j = 0; j < S; ++j) {
          float dw = 0;
          for (std::int64_t c = 0; c < Ev; ++c)
            dw += static_cast<float>(dout.get(row * Ev + c)) * static_cast<float>(v.get((kv * S + j) * Ev + c));
          dp[static_cast<std::size_t>(j)] = r(dw);
          D += static_cast<float>(r(probs.get(row * S + j)) * dp[static_cast<std::size_t>(j)]);
        }
        for (std::int64_t j = 0; j < S; ++j) {
          const double p = r(probs.get(row * S + j));
          double dot = 0;
          for (std::int64_t e = 0; e < E; ++e) dot += q.get(row * E + e) * k.get((kv * S + j) * E + e);
          const double t = std::tanh(scale * dot / cap);
          ds[static_cast<std::size_t>(j)] = r(r(p * (dp[static_cast<std::size_t>(j)] - r(D))) * (1 - t * t));
          for (std::int64_t c = 0; c < Ev; ++c)
            dv[static_cast<std::size_t>((kv * S + j) * Ev + c)] +=
                static_cast<float>(p) * static_cast<float>(dout.get(row * Ev + c));
          for (std::int64_t e = 0; e < E; ++e)
            dk[static_cast<std::size_t>((kv * S + j) * E + e)] +=
                static_cast<float>(ds[static_cast<std::size_t>(j)]) * static_cast<float>(q.get(row * E + e));
        }
        for (std::int64_t e = 0; e < E; ++e) {
          float sum = 0;
          for (std::int64_t j = 0; j < S; ++j)
            sum +=
                static_cast<float>(ds[static_cast<std::size_t>(j)]) * static_cast<float>(k.get((kv * S + j) * E + e));
          g.grad_query.set(row * E + e, r(scale * sum));
        }
      }
    }
  for (std::int64_t n = 0; n < k.numel(); ++n) g.grad_key.set(n, r(scale * dk[static_cast<std::size_t>(n)]));
  for (std::int64_t n = 0; n < v.numel(); ++n) g.grad_value.set(n, r(dv[static_cast<std::size_t>(n)]));
  return g;
}

// Softcap in bfloat16 and float16, with the window and ALiBi: the CPU gradients within 3×
// the error of the naive low-precision backward above (DESIGN.md §4's rule for gradients).
// The naive backward's own float64 limit (dtype float64) must agree with the oracle, so
// the tolerance is not measured against a wrong formula.
TEST(CpuBackwardModifiers, LowPrecisionSoftcapMatchesOracleByTheToleranceRule) {
  int n = 0;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (double cap : {2.0, 30.0}) {
      Case c;
      c.dtype = dtype;
      c.batch = {1}, c.heads_q = 4, c.heads_kv = 2, c.L = 100, c.S = 150, c.E = 32, c.Ev = 16;
      c.window_left = 60, c.window_right = 5, c.slopes = Case::PerHead::per_head, c.softcap = cap, c.stddev = 1.5;
      c.interleaved = n % 2 == 0;
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c, ++n);
      const Tensor dout = random_grad_output(in.qv(), in.vv(), 5);
      Options cpu = in.options;
      cpu.backend = Backend::cpu;
      const BackwardResult got = forward_backward(in.qv(), in.kv(), in.vv(), dout.view(), cpu);
      const Tensor q64 = to_float64(in.qv()), k64 = to_float64(in.kv()), v64 = to_float64(in.vv()),
                   d64 = to_float64(dout.view());
      Options ref = in.options;
      ref.backend = Backend::reference;
      const BackwardResult want = forward_backward(q64.view(), k64.view(), v64.view(), d64.view(), ref);
      const ForwardResult probs = forward(q64.view(), k64.view(), v64.view(), ref, Returns{true, false});
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
      const BackwardResult exact =
          naive_softcap_gradients(q64, k64, v64, d64, probs.weights, scale, cap, DType::float64);
      const BackwardResult naive = naive_softcap_gradients(q64, k64, v64, d64, probs.weights, scale, cap, dtype);
      const Tensor* g[] = {&got.grad_query, &got.grad_key, &got.grad_value};
      const Tensor* w[] = {&want.grad_query, &want.grad_key, &want.grad_value};
      const Tensor* e[] = {&exact.grad_query, &exact.grad_key, &exact.grad_value};
      const Tensor* nv[] = {&naive.grad_query, &naive.grad_key, &naive.grad_value};
      for (int t = 0; t < 3; ++t) {
        EXPECT_LE(max_abs_diff(*e[t], *w[t]), 1e-5 * std::max(1.0, max_abs(*w[t]))) << "naive formula, gradient " << t;
        const double tolerance = std::max(3 * max_abs_diff(*nv[t], *w[t]), 1e-5);
        EXPECT_LE(max_abs_diff(to_float64(g[t]->view()), *w[t]), tolerance) << "gradient " << t;
      }
    }
}

TEST(CpuBackwardModifiers, SmallWindowsWithCausalMatchOracle) {
  int n = 0;
  for (std::int64_t left : {-1, 0, 1, 3})
    for (std::int64_t right : {-1, 0, 1, 3})
      for (const CausalAlignment& ca : kCausalAlignments) {
        Case c = small_gqa_case();
        c.dtype = DType::float32;
        c.L = 40, c.S = 17, c.window_left = left, c.window_right = right;
        c.causal = ca.causal, c.alignment = ca.alignment;
        c.num_threads = 1;
        c.slopes = n % 2 ? Case::PerHead::per_head : Case::PerHead::none;
        expect_gradients_agree(c, ++n);
      }
}

// Dropout replayed under every extension at once.
TEST(CpuBackwardModifiers, DropoutWithEveryModifierMatchesOracle) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64})
    for (const CausalAlignment& ca : {kCausalAlignments[2], kCausalAlignments[3]}) {
      Case c;
      c.dtype = dtype;
      c.batch = {2}, c.heads_q = 4, c.heads_kv = 2, c.L = 70, c.S = 131, c.E = 24, c.Ev = 16;
      c.window_left = 30, c.window_right = 10, c.causal = ca.causal, c.alignment = ca.alignment;
      c.slopes = Case::PerHead::per_batch_head, c.softcap = 3, c.stddev = 1.5;
      c.mask = Case::Mask::additive, c.mask_shape = {c.L, c.S};
      c.dropout_p = 0.3;
      c.interleaved = true;
      expect_gradients_agree(c, ++n);
    }
}

// Rows the window empties: gradient 0 for their queries, never NaN; keys no query sees
// get dK = dV = 0.
TEST(CpuBackwardModifiers, EmptyWindowRowsHaveZeroGradients) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    Case c;
    c.dtype = DType::float32;
    c.batch = {1}, c.heads_q = 2, c.heads_kv = 1, c.L = 70, c.S = 40, c.E = 8, c.Ev = 8;
    c.window_left = 2, c.window_right = 0, c.alignment = Alignment::top_left;  // rows i > 41 see nothing
    c.slopes = Case::PerHead::per_head, c.softcap = 5;
    Inputs in = make_inputs(c, 14);
    in.options.backend = backend;
    std::mt19937_64 rng(15);
    const Tensor g = random_tensor(DType::float32, {1, 2, 70, 8}, rng);
    const BackwardResult r = forward_backward(in.qv(), in.kv(), in.vv(), g.view(), in.options);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 42; i < 70; ++i)
        for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.grad_query.at({0, h, i, e}), 0.0) << i;
    for (const Tensor* t : {&r.grad_query, &r.grad_key, &r.grad_value})
      for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_FALSE(std::isnan(t->get(n)));
    // Window (0, 0) bottom-right with S > L: keys 0 .. S − L − 1 are seen by no query.
    in.options.window_left = in.options.window_right = 0;
    in.options.alignment = Alignment::bottom_right;
    const Tensor q = random_tensor(DType::float32, {1, 2, 10, 8}, rng),
                 g10 = random_tensor(DType::float32, {1, 2, 10, 8}, rng);
    const BackwardResult unseen = forward_backward(q.view(), in.kv(), in.vv(), g10.view(), in.options);
    for (std::int64_t j = 0; j < 30; ++j)
      for (std::int64_t e = 0; e < 8; ++e) {
        EXPECT_EQ(unseen.grad_key.at({0, 0, j, e}), 0.0) << j;
        EXPECT_EQ(unseen.grad_value.at({0, 0, j, e}), 0.0) << j;
      }
    EXPECT_GT(max_abs(unseen.grad_value), 0.0);
  }
}

// The float mask is added after the cap, so its gradient is dS itself; the chain rule
// through tanh multiplies Q's and K's gradients only. With scores of ~±4 under a cap of
// 1, 1 − tanh² is mostly below 1e-2: a mask gradient scaled by it would lose most of dS.
// For a full-shape mask each row of dS sums to 0 (Σ_j P_j (dP_j − D) = 0); a gradient
// scaled by (1 − tanh²) would not.
TEST(CpuBackwardModifiers, FloatMaskGradientUnderSoftcapIsDsNotScaledByTanhDerivative) {
  std::mt19937_64 rng(21);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {1, 2, 6, 4}, rng, 2.0);
  c.k = random_tensor(DType::float64, {1, 2, 9, 4}, rng, 2.0);
  c.v = random_tensor(DType::float64, {1, 2, 9, 3}, rng);
  c.g = random_tensor(DType::float64, {1, 2, 6, 3}, rng);
  c.mask = random_tensor(DType::float64, {1, 2, 6, 9}, rng);
  c.options.mask = c.mask.view();
  c.options.softcap = 1.0;
  c.check(Backend::reference, 1e-8);
  c.check(Backend::cpu, 1e-8);
  for (DType dtype : {DType::float64, DType::float32}) {
    const Tensor q = convert(c.q, dtype), k = convert(c.k, dtype), v = convert(c.v, dtype), g = convert(c.g, dtype),
                 m = convert(c.mask, dtype);
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      Options o = c.options;
      o.mask = m.view();
      o.backend = backend;
      const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
      double largest = 0;
      for (std::int64_t row = 0; row < 12; ++row) {
        double sum = 0;
        for (std::int64_t j = 0; j < 9; ++j) {
          sum += r.grad_mask.get(row * 9 + j);
          largest = std::max(largest, std::abs(r.grad_mask.get(row * 9 + j)));
        }
        EXPECT_NEAR(sum, 0.0, dtype == DType::float64 ? 1e-13 : 1e-5) << dtype_name(dtype) << " row " << row;
      }
      EXPECT_GT(largest, 1e-2) << "dS must not vanish";
    }
  }
  const GradientAgreement a =
      compare_gradients_with_oracle(convert(c.q, DType::float32).view(), convert(c.k, DType::float32).view(),
                                    convert(c.v, DType::float32).view(), c.options, true);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Bitwise the same gradients for 1, 2 and 3 threads with every extension on.
TEST(CpuBackwardModifiers, BitwiseDeterministicAcrossThreadCounts) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Case c;
    c.dtype = dtype;
    c.batch = {1}, c.heads_q = 4, c.heads_kv = 2, c.L = 130, c.S = 257, c.E = 40, c.Ev = 24;
    c.window_left = 70, c.window_right = 10, c.slopes = Case::PerHead::per_head, c.softcap = 20;
    c.mask = Case::Mask::additive, c.mask_shape = {c.L, c.S}, c.dropout_p = 0.2;
    Inputs in = make_inputs(c, 16);
    in.options.backend = Backend::cpu;
    SCOPED_TRACE(dtype_name(dtype));
    expect_gradients_deterministic_across_threads(in);
  }
}
}  // namespace
}  // namespace sdpa::testing
