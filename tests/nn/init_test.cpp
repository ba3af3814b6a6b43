// Xavier/Glorot initialisation: the documented bounds and variances (Glorot & Bengio
// 2010; torch.nn.init), within statistical bounds of 6 standard errors, and bitwise
// reproducibility from the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "sdpa/error.h"
#include "sdpa/nn.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;

struct Moments {
  double mean = 0, var = 0, m4 = 0;
  std::int64_t n = 0;
};
Moments moments(const Tensor& t) {
  Moments m;
  m.n = t.numel();
  for (std::int64_t i = 0; i < m.n; ++i) m.mean += t.get(i);
  m.mean /= m.n;
  for (std::int64_t i = 0; i < m.n; ++i) {
    const double d = t.get(i) - m.mean;
    m.var += d * d, m.m4 += d * d * d * d;
  }
  m.var /= m.n - 1;
  m.m4 /= m.n;
  return m;
}

TEST(XavierTest, UniformStaysWithinBoundsWithVarianceTwoOverFanSum) {
  Tensor w(DType::float64, {256, 512});  // (out, in): fan_in 512, fan_out 256
  sdpa::nn::xavier_uniform(w.view(), 7);
  const double a = std::sqrt(6.0 / (512 + 256));
  double lo = 0, hi = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) lo = std::min(lo, w.get(i)), hi = std::max(hi, w.get(i));
  EXPECT_GE(lo, -a);
  EXPECT_LT(hi, a);
  EXPECT_LT(lo, -0.999 * a);  // and it fills the interval
  EXPECT_GT(hi, 0.999 * a);
  const Moments m = moments(w);
  const double var = a * a / 3;  // = 2 / (fan_in + fan_out)
  EXPECT_NEAR(var, 2.0 / (512 + 256), 1e-15);
  const double var_se = std::sqrt(4 * a * a * a * a / 45 / m.n);  // Var(x²) = 4a⁴/45 for U(−a, a)
  EXPECT_NEAR(m.var, var, 6 * var_se);
  EXPECT_NEAR(m.mean, 0.0, 6 * std::sqrt(var / m.n));
  // Uniform: a quarter of the values in each quarter of the interval.
  std::int64_t inner = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) inner += std::abs(w.get(i)) < a / 2;
  EXPECT_NEAR(static_cast<double>(inner) / m.n, 0.5, 6 * std::sqrt(0.25 / m.n));
}

TEST(XavierTest, NormalHasVarianceTwoOverFanSumAndGaussianShape) {
  Tensor w(DType::float64, {300, 700});
  sdpa::nn::xavier_normal(w.view(), 11);
  const double var = 2.0 / (300 + 700);
  const Moments m = moments(w);
  EXPECT_NEAR(m.var, var, 6 * std::sqrt(2 * var * var / m.n));  // Var(x²) = 2σ⁴
  EXPECT_NEAR(m.mean, 0.0, 6 * std::sqrt(var / m.n));
  EXPECT_NEAR(m.m4 / (m.var * m.var), 3.0, 0.1);  // kurtosis of a Gaussian
  std::int64_t within = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) within += std::abs(w.get(i)) < std::sqrt(var);
  const double p = 0.682689492137;
  EXPECT_NEAR(static_cast<double>(within) / m.n, p, 6 * std::sqrt(p * (1 - p) / m.n));
}

TEST(XavierTest, GainScalesTheStandardDeviation) {
  Tensor a(DType::float64, {64, 64}), b(DType::float64, {64, 64});
  sdpa::nn::xavier_normal(a.view(), 3);
  sdpa::nn::xavier_normal(b.view(), 3, 2.5);
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_DOUBLE_EQ(b.get(i), 2.5 * a.get(i));
}

TEST(XavierTest, SameSeedSameWeightsOtherSeedOtherWeights) {
  Tensor a(DType::float32, {33, 17}), b(DType::float32, {33, 17}), c(DType::float32, {33, 17});
  sdpa::nn::xavier_uniform(a.view(), 42);
  sdpa::nn::xavier_uniform(b.view(), 42);
  sdpa::nn::xavier_uniform(c.view(), 43);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.nbytes()), 0);
  // float32 holds the float64 values rounded.
  Tensor d(DType::float64, {33, 17});
  sdpa::nn::xavier_uniform(d.view(), 42);
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.get(i), static_cast<double>(static_cast<float>(d.get(i))));
}

// torch.nn.init._calculate_fan_in_and_fan_out: (out, in, k1, k2) has fan_in = in·k1·k2.
TEST(XavierTest, ReceptiveFieldCountsInTheFans) {
  Tensor w(DType::float64, {8, 4, 3, 3});
  sdpa::nn::xavier_uniform(w.view(), 1);
  const double a = std::sqrt(6.0 / (4 * 9 + 8 * 9));
  for (std::int64_t i = 0; i < w.numel(); ++i) EXPECT_LE(std::abs(w.get(i)), a);
}

TEST(XavierTest, FillsStridedViewsInRowMajorOrder) {
  Tensor packed(DType::float64, {6, 4}), storage(DType::float64, {4, 6});
  sdpa::nn::xavier_uniform(packed.view(), 5);
  sdpa::TensorView transposed{storage.data(), DType::float64, {6, 4}, {1, 6}};
  sdpa::nn::xavier_uniform(transposed, 5);
  for (std::int64_t i = 0; i < 6; ++i)
    for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(storage.get(j * 6 + i), packed.get(i * 4 + j));
}

TEST(XavierTest, RejectsVectorsAndNonFloatTensors) {
  Tensor v(DType::float64, {10});
  EXPECT_THROW(sdpa::nn::xavier_uniform(v.view(), 0), sdpa::Error);
  Tensor b(DType::boolean, {3, 3});
  EXPECT_THROW(sdpa::nn::xavier_normal(b.view(), 0), sdpa::Error);
}

}  // namespace
