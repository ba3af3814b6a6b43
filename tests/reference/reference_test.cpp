// The oracle against values known in closed form, independent of any implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "testing/helpers.h"

namespace sdpa::testing {
namespace {

Options reference() {
  Options o;
  o.backend = Backend::reference;
  return o;
}

// One query, two keys: weights are the logistic function of the score difference.
TEST(Reference, TwoKeysGiveTheLogistic) {
  Tensor q(DType::float64, {1, 1, 2}), k(DType::float64, {1, 2, 2}), v(DType::float64, {1, 2, 1});
  q.set(0, 1.0), q.set(1, 2.0);
  k.set(0, 0.5), k.set(1, -1.0), k.set(2, 3.0), k.set(3, 0.25);  // q·k0 = −1.5, q·k1 = 3.5
  v.set(0, 10.0), v.set(1, -4.0);
  Options o = reference();
  o.scale = 0.5;
  const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, true});
  const double w1 = 1.0 / (1.0 + std::exp(-(3.5 - -1.5) * 0.5));
  EXPECT_NEAR(r.weights.get(1), w1, 1e-15);
  EXPECT_NEAR(r.output.get(0), (1 - w1) * 10.0 + w1 * -4.0, 1e-14);
  EXPECT_NEAR(r.lse.get(0), std::log(std::exp(-0.75) + std::exp(1.75)), 1e-15);
}

// Identical keys: uniform weights, output = mean of V, whatever the query.
TEST(Reference, IdenticalKeysAverageTheValues) {
  std::mt19937_64 rng(1);
  const Tensor q = random_tensor(DType::float64, {1, 3, 4}, rng), v = random_tensor(DType::float64, {1, 5, 2}, rng);
  Tensor k(DType::float64, {1, 5, 4});
  for (std::int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.3 * (i % 4));
  const ForwardResult r = forward(q.view(), k.view(), v.view(), reference());
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t c = 0; c < 2; ++c) {
      double mean = 0;
      for (std::int64_t j = 0; j < 5; ++j) mean += v.get(j * 2 + c) / 5;
      EXPECT_NEAR(r.output.get(i * 2 + c), mean, 1e-14);
    }
}

// Causal top-left: query 0 sees key 0 only, so its output is V's first row.
// Bottom-right with L = 1: the single query sees every key.
TEST(Reference, CausalAlignments) {
  std::mt19937_64 rng(2);
  const Tensor q = random_tensor(DType::float64, {1, 3, 4}, rng), k = random_tensor(DType::float64, {1, 5, 4}, rng),
               v = random_tensor(DType::float64, {1, 5, 2}, rng);
  Options o = reference();
  o.causal = Causal::top_left;
  const ForwardResult top = forward(q.view(), k.view(), v.view(), o, Returns{true, false});
  EXPECT_EQ(top.output.get(0), v.get(0));
  EXPECT_EQ(top.output.get(1), v.get(1));
  EXPECT_EQ(top.weights.at({0, 1, 2}), 0.0);
  EXPECT_GT(top.weights.at({0, 1, 1}), 0.0);
  o.causal = Causal::bottom_right;  // query i sees j <= i + 2
  const ForwardResult bottom = forward(q.view(), k.view(), v.view(), o, Returns{true, false});
  EXPECT_GT(bottom.weights.at({0, 0, 2}), 0.0);
  EXPECT_EQ(bottom.weights.at({0, 0, 3}), 0.0);
  EXPECT_GT(bottom.weights.at({0, 2, 4}), 0.0);
}

// Dropout: the weights returned are the kept softmax weights times 1/(1−p), zeros
// elsewhere, and the output is exactly those weights times V.
TEST(Reference, DropoutWeightsAreScaledKeptSoftmax) {
  std::mt19937_64 rng(3);
  const Tensor q = random_tensor(DType::float64, {1, 6, 4}, rng), k = random_tensor(DType::float64, {1, 9, 4}, rng),
               v = random_tensor(DType::float64, {1, 9, 2}, rng);
  const ForwardResult plain = forward(q.view(), k.view(), v.view(), reference(), Returns{true, false});
  Options o = reference();
  o.dropout_p = 0.4;
  o.seed = 99;
  const ForwardResult dropped = forward(q.view(), k.view(), v.view(), o, Returns{true, false});
  int zeros = 0;
  for (std::int64_t i = 0; i < plain.weights.numel(); ++i) {
    const double w = dropped.weights.get(i);
    if (w == 0) ++zeros;
    else EXPECT_NEAR(w, plain.weights.get(i) / 0.6, 1e-15);
  }
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, plain.weights.numel());
  for (std::int64_t i = 0; i < 6; ++i)
    for (std::int64_t c = 0; c < 2; ++c) {
      double o_ic = 0;
      for (std::int64_t j = 0; j < 9; ++j) o_ic += dropped.weights.get(i * 9 + j) * v.get(j * 2 + c);
      EXPECT_NEAR(dropped.output.get(i * 2 + c), o_ic, 1e-14);
    }
}

}  // namespace
}  // namespace sdpa::testing
