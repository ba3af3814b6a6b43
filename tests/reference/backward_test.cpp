// The oracle backward against what needs no implementation to know: finite differences
// of its own forward (the score modifiers' chain rules too), closed forms, and the
// structure of GQA and masking.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "testing/cases.h"
#include "testing/finite_differences.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Options reference() {
  Options o;
  o.backend = Backend::reference;
  return o;
}

// GQA (2 query heads per KV head), L ≠ S, Ev ≠ E, a float mask broadcast over batch and
// heads with a −inf entry, bottom-right causal and dropout: every path of the chain rule.
FiniteDifferenceCase hostile_case(std::uint64_t seed, double dropout_p) {
  std::mt19937_64 rng(seed);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {2, 4, 3, 5}, rng);
  c.k = random_tensor(DType::float64, {2, 2, 6, 5}, rng);
  c.v = random_tensor(DType::float64, {2, 2, 6, 4}, rng);
  c.g = random_tensor(DType::float64, {2, 4, 3, 4}, rng);
  c.mask = random_tensor(DType::float64, {3, 6}, rng);
  c.mask.set(1 * 6 + 2, -kInf);
  c.options = reference();
  c.options.mask = c.mask.view();
  c.options.causal = Causal::bottom_right;
  c.options.dropout_p = dropout_p;
  c.options.seed = seed;
  return c;
}

TEST(ReferenceBackward, MatchesFiniteDifferences) { hostile_case(1, 0.0).check(Backend::reference, 1e-8); }

// The dropout mask is a fixed function of the seed, so the loss stays differentiable.
TEST(ReferenceBackward, MatchesFiniteDifferencesWithDropout) { hostile_case(2, 0.3).check(Backend::reference, 1e-8); }

TEST(ReferenceBackward, MatchesFiniteDifferencesWithBoolMaskAndTopLeftCausal) {
  std::mt19937_64 rng(3);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {1, 2, 5, 3}, rng);
  c.k = random_tensor(DType::float64, {1, 2, 4, 3}, rng);
  c.v = random_tensor(DType::float64, {1, 2, 4, 3}, rng);
  c.g = random_tensor(DType::float64, {1, 2, 5, 3}, rng);
  c.mask = random_bool({1, 2, 5, 4}, rng, 0.7);
  c.options = reference();
  c.options.mask = c.mask.view();
  c.options.causal = Causal::top_left;
  c.options.scale = -0.8;
  c.check(Backend::reference, 1e-8);
}

// One key: the output is that key's value whatever Q and K are, so dQ = dK = 0 and
// dV = Σ_i dO_i.
TEST(ReferenceBackward, OneKeyPassesTheGradientToTheValue) {
  std::mt19937_64 rng(4);
  const Tensor q = random_tensor(DType::float64, {1, 3, 4}, rng), k = random_tensor(DType::float64, {1, 1, 4}, rng),
               v = random_tensor(DType::float64, {1, 1, 2}, rng), g = random_tensor(DType::float64, {1, 3, 2}, rng);
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), reference());
  for (std::int64_t n = 0; n < r.grad_query.numel(); ++n) EXPECT_NEAR(r.grad_query.get(n), 0.0, 1e-15);
  for (std::int64_t n = 0; n < r.grad_key.numel(); ++n) EXPECT_NEAR(r.grad_key.get(n), 0.0, 1e-15);
  for (std::int64_t c = 0; c < 2; ++c) EXPECT_NEAR(r.grad_value.get(c), g.get(c) + g.get(2 + c) + g.get(4 + c), 1e-15);
}

// Two keys: P_1 = σ(Δ), Δ = scale·q·(k_1 − k_0), so dL/dq = scale·σ'(Δ)·(g·(v_1 − v_0))·(k_1 − k_0).
TEST(ReferenceBackward, TwoKeysGiveTheLogisticDerivative) {
  Tensor q(DType::float64, {1, 1, 2}), k(DType::float64, {1, 2, 2}), v(DType::float64, {1, 2, 1}),
      g(DType::float64, {1, 1, 1});
  q.set(0, 1.0), q.set(1, 2.0);
  k.set(0, 0.5), k.set(1, -1.0), k.set(2, 3.0), k.set(3, 0.25);
  v.set(0, 10.0), v.set(1, -4.0);
  g.set(0, 1.5);
  Options o = reference();
  o.scale = 0.5;
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o);
  const double delta = 0.5 * ((1.0 * 3.0 + 2.0 * 0.25) - (1.0 * 0.5 + 2.0 * -1.0));
  const double s = 1.0 / (1.0 + std::exp(-delta)), ds = s * (1 - s);
  const double chain = 0.5 * ds * 1.5 * (-4.0 - 10.0);
  EXPECT_NEAR(r.grad_query.get(0), chain * (3.0 - 0.5), 1e-14);
  EXPECT_NEAR(r.grad_query.get(1), chain * (0.25 - -1.0), 1e-14);
  EXPECT_NEAR(r.grad_value.get(0), 1.5 * (1 - s), 1e-14);
  EXPECT_NEAR(r.grad_value.get(1), 1.5 * s, 1e-14);
}

// dK, dV of a KV head shared by a group are the sums of what each query head would give
// it with its own copy.
TEST(ReferenceBackward, GqaKeyAndValueGradientsSumOverTheGroup) {
  std::mt19937_64 rng(5);
  const Tensor q = random_tensor(DType::float64, {1, 3, 4, 2}, rng),
               k = random_tensor(DType::float64, {1, 1, 5, 2}, rng),
               v = random_tensor(DType::float64, {1, 1, 5, 3}, rng),
               g = random_tensor(DType::float64, {1, 3, 4, 3}, rng);
  const BackwardResult shared = forward_backward(q.view(), k.view(), v.view(), g.view(), reference());
  TensorView k3 = k.view(), v3 = v.view();  // the same K and V repeated for 3 heads (stride 0)
  k3.shape[1] = v3.shape[1] = 3;
  k3.strides[1] = v3.strides[1] = 0;
  const BackwardResult repeated = forward_backward(q.view(), k3, v3, g.view(), reference());
  EXPECT_LE(max_abs_diff(shared.grad_query, repeated.grad_query), 1e-15);
  for (std::int64_t n = 0; n < k.numel(); ++n)
    EXPECT_NEAR(shared.grad_key.get(n),
                repeated.grad_key.get(n) + repeated.grad_key.get(10 + n) + repeated.grad_key.get(20 + n), 1e-14);
  for (std::int64_t n = 0; n < v.numel(); ++n)
    EXPECT_NEAR(shared.grad_value.get(n),
                repeated.grad_value.get(n) + repeated.grad_value.get(15 + n) + repeated.grad_value.get(30 + n), 1e-14);
}

// A row that sees no key has output 0 whatever Q, K, V: all its gradients are 0, never
// NaN (PyTorch >= 2.5, FlashAttention).
TEST(ReferenceBackward, FullyMaskedRowsHaveZeroGradients) {
  std::mt19937_64 rng(6);
  const Tensor q = random_tensor(DType::float64, {1, 4, 3}, rng), k = random_tensor(DType::float64, {1, 5, 3}, rng),
               v = random_tensor(DType::float64, {1, 5, 2}, rng), g = random_tensor(DType::float64, {1, 4, 2}, rng);
  Tensor mask = random_tensor(DType::float64, {4, 5}, rng);
  for (std::int64_t j = 0; j < 5; ++j) mask.set(2 * 5 + j, -kInf);  // row 2 fully masked
  Options o = reference();
  o.mask = mask.view();
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
  for (std::int64_t e = 0; e < 3; ++e) EXPECT_EQ(r.grad_query.at({0, 2, e}), 0.0);
  for (std::int64_t j = 0; j < 5; ++j) EXPECT_EQ(r.grad_mask.at({2, j}), 0.0);
  for (const Tensor* t : {&r.grad_query, &r.grad_key, &r.grad_value, &r.grad_mask})
    for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_FALSE(std::isnan(t->get(n)));
  // The other rows' gradients do not see row 2 at all.
  Tensor g_without = g;
  for (std::int64_t c = 0; c < 2; ++c) g_without.set(2 * 2 + c, 0.0);
  const BackwardResult r0 = forward_backward(q.view(), k.view(), v.view(), g_without.view(), o);
  EXPECT_LE(max_abs_diff(r.grad_key, r0.grad_key), 0.0);
  EXPECT_LE(max_abs_diff(r.grad_value, r0.grad_value), 0.0);
}

// The mask gradient of a broadcast mask is the full dS summed over the broadcast dims.
TEST(ReferenceBackward, BroadcastMaskGradientSumsOverBroadcastDims) {
  std::mt19937_64 rng(7);
  const Tensor q = random_tensor(DType::float64, {2, 3, 4, 2}, rng),
               k = random_tensor(DType::float64, {2, 3, 5, 2}, rng),
               v = random_tensor(DType::float64, {2, 3, 5, 2}, rng),
               g = random_tensor(DType::float64, {2, 3, 4, 2}, rng);
  const Tensor full_mask = random_tensor(DType::float64, {2, 3, 4, 5}, rng);
  Tensor mask(DType::float64, {3, 1, 5});  // broadcast along batch and query rows
  for (std::int64_t n = 0; n < mask.numel(); ++n) mask.set(n, full_mask.get(n));
  Options o = reference();
  o.mask = mask.view();
  const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
  TensorView expanded = mask.view();  // the same mask, expanded to full shape (stride 0)
  expanded.shape = {2, 3, 4, 5};
  expanded.strides = {0, 5, 0, 1};
  o.mask = expanded;
  const BackwardResult full = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
  EXPECT_EQ(r.grad_mask.shape(), (Shape{3, 1, 5}));
  EXPECT_LE(max_abs_diff(r.grad_mask, sum_to_shape(full.grad_mask, {3, 1, 5})), 1e-14);
  EXPECT_LE(max_abs_diff(r.grad_query, full.grad_query), 0.0);
}

// GQA, L ≠ S, Ev ≠ E, float64: the window (both alignments), ALiBi (batch, Hq), softcap,
// a float mask with a −inf entry and sinks (batch, Hq) with a −inf one, alone and
// together, for the oracle and for the CPU backend's float64 path.
FiniteDifferenceCase fd_case(std::uint64_t seed, bool window, bool alibi, double softcap, bool mask,
                             std::optional<Alignment> alignment, Causal causal, bool sinks = false) {
  std::mt19937_64 rng(seed);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {2, 4, 5, 3}, rng, 1.5);
  c.k = random_tensor(DType::float64, {2, 2, 7, 3}, rng, 1.5);
  c.v = random_tensor(DType::float64, {2, 2, 7, 4}, rng);
  c.g = random_tensor(DType::float64, {2, 4, 5, 4}, rng);
  if (window) c.options.window_left = 2, c.options.window_right = 1;
  c.options.alignment = alignment;
  c.options.causal = causal;
  if (alibi) {
    c.slopes = alibi_slopes(DType::float64, {2}, 4, true);
    c.options.alibi_slopes = c.slopes.view();
  }
  c.options.softcap = softcap;
  if (mask) {
    c.mask = random_tensor(DType::float64, {4, 5, 7}, rng);
    c.mask.set(9, -kInf);
    c.options.mask = c.mask.view();
  }
  if (sinks) {
    c.sinks = sink_logits(DType::float64, {2}, 4, true);
    c.options.sinks = c.sinks.view();
  }
  return c;
}

TEST(ReferenceBackwardModifiers, MatchesFiniteDifferences) {
  struct Variant {
    bool window, alibi;
    double softcap;
    bool mask;
    std::optional<Alignment> alignment;
    Causal causal;
    bool sinks = false;
  };
  const Variant variants[] = {
      {true, false, 0, false, Alignment::top_left, Causal::none},
      {true, false, 0, false, std::nullopt, Causal::bottom_right},
      {false, true, 0, false, Alignment::top_left, Causal::none},
      {false, true, 0, false, std::nullopt, Causal::none},
      {false, false, 1.5, false, std::nullopt, Causal::none},
      {false, false, 1.5, true, std::nullopt, Causal::none},
      {true, true, 1.5, true, Alignment::bottom_right, Causal::none},
      {true, true, 3.0, true, std::nullopt, Causal::top_left},
      {false, false, 0, false, std::nullopt, Causal::none, true},
      {true, false, 0, false, Alignment::top_left, Causal::none, true},  // rows with no key: only the sink
      {true, true, 1.5, true, std::nullopt, Causal::bottom_right, true},
  };
  int n = 0;
  for (const Variant& v : variants)
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      SCOPED_TRACE(::testing::Message() << "variant " << n / 2 << " backend " << static_cast<int>(backend));
      fd_case(++n, v.window, v.alibi, v.softcap, v.mask, v.alignment, v.causal, v.sinks).check(backend, 1e-8);
    }
}

// The sinks' gradient through the returned lse too (ring attention merges by it):
// loss = Σ G ∘ O + Σ H ∘ lse against central differences in the sinks, (Hq,) sinks summed
// over the batch, on both backends. Top-left with a window (0, 0) and L = 5 > S = 3:
// rows 3 and 4 see no key, only the sink (output 0, lse = sink, dsink = H there).
TEST(ReferenceBackwardModifiers, SinkGradientThroughOutputAndLse) {
  std::mt19937_64 rng(31);
  const Tensor q = random_tensor(DType::float64, {2, 4, 5, 3}, rng, 1.5),
               k = random_tensor(DType::float64, {2, 2, 3, 3}, rng, 1.5),
               v = random_tensor(DType::float64, {2, 2, 3, 4}, rng),
               g = random_tensor(DType::float64, {2, 4, 5, 4}, rng), h = random_tensor(DType::float64, {2, 4, 5}, rng);
  Tensor sinks = sink_logits(DType::float64, {2}, 4, false);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(static_cast<int>(backend));
    Options o;
    o.backend = backend;
    o.window_left = 0, o.window_right = 0, o.alignment = Alignment::top_left;
    o.sinks = sinks.view();
    const ForwardResult f = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    EXPECT_EQ(f.lse.at({1, 2, 4}), sinks.get(2));  // a row with no key: lse = its sink
    BackwardInputs in{q.view(), k.view(), v.view(), f.output.view(), f.lse.view(), g.view(), h.view()};
    const BackwardResult got = backward(in, o);
    auto loss = [&] {
      Options r = o;
      r.backend = Backend::reference;
      const ForwardResult x = forward(q.view(), k.view(), v.view(), r, Returns{false, true});
      return dot(x.output, g) + dot(x.lse, h);
    };
    EXPECT_EQ(got.grad_sinks.shape(), (Shape{4}));
    EXPECT_LE(max_abs_diff(got.grad_sinks, numerical_gradient(sinks, loss)), 1e-8);
  }
}

}  // namespace
}  // namespace sdpa::testing
