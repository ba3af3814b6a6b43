// quantize_kv (include/sdpa/quantize.h), the int8 K/V maker: its rounding property, on
// which the error bound of docs/numerics.md ("Quantized K/V") rests, strided views, and
// the refusal of bad inputs with nothing written. The attention on what it makes:
// tests/cpu/quantized_kv_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "testing/helpers.h"
#include "testing/rejection.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// quantize_kv: scale = max|row| / 127 (rounded to float32), q in [−127, 127] with the
// row's largest element at ±127, every |x − scale · q| <= scale / 2 (the property the
// error bound rests on), a zero row gives scale 0 and q = 0, strided views work, and
// a non-finite input is refused with nothing written.
TEST(QuantizeKV, RoundTripProperty) {
  std::mt19937_64 rng(600);
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16, DType::float16}) {
    Tensor x = random_tensor(dtype, {3, 4, 7, 33}, rng, 3.0);
    for (std::int64_t e = 0; e < 33; ++e) x.set(2 * 33 + e, 0.0);  // row 2: zeros
    const QuantizedKV qk = quantize_kv(x.view());
    ASSERT_EQ(qk.values.shape(), x.shape());
    ASSERT_EQ(qk.scale.shape(), (Shape{3, 4, 7}));
    for (std::int64_t row = 0; row < qk.scale.numel(); ++row) {
      double max = 0;
      for (std::int64_t e = 0; e < 33; ++e) max = std::max(max, std::abs(x.get(row * 33 + e)));
      const double scale = qk.scale.get(row);
      EXPECT_EQ(scale, static_cast<double>(static_cast<float>(max / 127))) << "row " << row;
      double largest_q = 0;
      for (std::int64_t e = 0; e < 33; ++e) {
        const double q = qk.values.get(row * 33 + e), xv = x.get(row * 33 + e);
        EXPECT_LE(std::abs(q), 127.0);
        EXPECT_LE(std::abs(xv - scale * q), scale / 2 * (1 + 1e-12)) << "row " << row << " e " << e;
        largest_q = std::max(largest_q, std::abs(q));
      }
      EXPECT_EQ(largest_q, max == 0 ? 0.0 : 127.0) << "row " << row;
    }
    EXPECT_EQ(qk.scale.get(2), 0.0);
  }
  // Strided input and outputs: the transpose of a packed tensor gives the same numbers.
  const Tensor x = random_tensor(DType::float32, {5, 9}, rng);
  TensorView xt = x.view();
  xt.shape = {9, 5};
  xt.strides = {1, 9};
  const QuantizedKV direct = quantize_kv(xt);
  const Tensor packed = to_float64(xt);
  const QuantizedKV from_packed = quantize_kv(packed.view());
  EXPECT_TRUE(bitwise_equal(direct.values, from_packed.values));
  EXPECT_TRUE(bitwise_equal(direct.scale, from_packed.scale));

  // Refused: NaN / inf, a non-float x, wrong output shapes or dtypes; nothing written.
  Tensor bad = random_tensor(DType::float32, {2, 4}, rng);
  bad.set(5, std::numeric_limits<double>::quiet_NaN());
  Tensor values(DType::int8, {2, 4}), scale(DType::float32, {2});
  fill_with_sentinel({&values, &scale});
  expect_rejected_naming([&] { quantize_kv(bad.view(), values.view(), scale.view()); }, "x", {&values, &scale});
  bad.set(5, kInf);
  expect_rejected_naming([&] { quantize_kv(bad.view(), values.view(), scale.view()); }, "x", {&values, &scale});
  const Tensor good = random_tensor(DType::float32, {2, 4}, rng);
  Tensor wrong_scale(DType::float32, {2, 4}), wrong_values(DType::float32, {2, 4});
  expect_rejected_naming([&] { quantize_kv(good.view(), values.view(), wrong_scale.view()); }, "scale", {&values});
  expect_rejected_naming([&] { quantize_kv(good.view(), wrong_values.view(), scale.view()); }, "values", {&scale});
  const Tensor ints(DType::int8, {2, 4});
  expect_rejected_naming([&] { quantize_kv(ints.view(), values.view(), scale.view()); }, "x", {&values, &scale});
}

}  // namespace
}  // namespace sdpa::testing
