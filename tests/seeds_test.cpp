// The seeds' own checks, in C++ (shared/seeds/000 and 004).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "testing/helpers.h"

namespace sdpa::testing {
namespace {

// Seed 000, test_basic_functionality: shapes, weights >= 0, rows sum to 1 (atol 1e-6).
TEST(Seed000, BasicFunctionality) {
  const std::int64_t batch = 2, seq_len = 4, d_k = 8;
  std::mt19937_64 rng(0);
  const Tensor query = random_tensor(DType::float32, {batch, seq_len, d_k}, rng);
  const Tensor key = random_tensor(DType::float32, {batch, seq_len, d_k}, rng);
  const Tensor value = random_tensor(DType::float32, {batch, seq_len, d_k}, rng);
  const ForwardResult r = forward(query.view(), key.view(), value.view(), {}, Returns{true, false});
  EXPECT_EQ(r.output.shape(), (Shape{batch, seq_len, d_k}));
  EXPECT_EQ(r.weights.shape(), (Shape{batch, seq_len, seq_len}));
  for (std::int64_t i = 0; i < r.weights.numel(); ++i) EXPECT_GE(r.weights.get(i), 0.0);
  for (std::int64_t row = 0; row < batch * seq_len; ++row) {
    double sum = 0;
    for (std::int64_t j = 0; j < seq_len; ++j) sum += r.weights.get(row * seq_len + j);
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

// Seed 004's verification: batch 2, n = 4, m = 6, d_k = 8, d_v = 16, against the
// oracle (the seed compares with F.scaled_dot_product_attention at atol 1e-5), without
// a mask and with a causal mask.
TEST(Seed004, VerificationShapesWithAndWithoutCausalMask) {
  const std::int64_t batch = 2, n = 4, m = 6, d_k = 8, d_v = 16;
  std::mt19937_64 rng(42);
  const Tensor Q = random_tensor(DType::float32, {batch, n, d_k}, rng);
  const Tensor K = random_tensor(DType::float32, {batch, m, d_k}, rng);
  const Tensor V = random_tensor(DType::float32, {batch, m, d_v}, rng);
  for (Causal causal : {Causal::none, Causal::top_left}) {
    Options options;
    options.causal = causal;
    const ForwardResult r = forward(Q.view(), K.view(), V.view(), options, Returns{true, false});
    EXPECT_EQ(r.output.shape(), (Shape{batch, n, d_v}));
    EXPECT_EQ(r.weights.shape(), (Shape{batch, n, m}));
    for (std::int64_t row = 0; row < batch * n; ++row) {
      double sum = 0;
      for (std::int64_t j = 0; j < m; ++j) sum += r.weights.get(row * m + j);
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
    const Agreement a = compare_with_oracle(Q.view(), K.view(), V.view(), options);
    EXPECT_TRUE(a.ok()) << a.describe();
    EXPECT_LE(a.output_error, 1e-5);
  }
}

// Seed 004's masking experiment: a (1, 5, 5) tril mask (1 = attend) on seq_len 5,
// d = 16: as a bool mask it equals is_causal; the weights above the diagonal are 0.
TEST(Seed004, TrilMaskEqualsCausal) {
  std::mt19937_64 rng(4);
  const Tensor Q = random_tensor(DType::float32, {1, 5, 16}, rng), K = random_tensor(DType::float32, {1, 5, 16}, rng),
               V = random_tensor(DType::float32, {1, 5, 16}, rng);
  Tensor tril(DType::boolean, {1, 5, 5});
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 5; ++j) tril.set(i * 5 + j, j <= i);
  Options masked, causal;
  masked.mask = tril.view();
  causal.causal = Causal::top_left;
  const ForwardResult a = forward(Q.view(), K.view(), V.view(), masked, Returns{true, false});
  const ForwardResult b = forward(Q.view(), K.view(), V.view(), causal, Returns{true, false});
  EXPECT_EQ(max_abs_diff(a.output, b.output), 0.0);
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = i + 1; j < 5; ++j) EXPECT_EQ(a.weights.at({0, i, j}), 0.0);
}

}  // namespace
}  // namespace sdpa::testing
