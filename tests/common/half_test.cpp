// float16 / bfloat16 conversions: exact values, rounding to nearest even, specials.
#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sdpa::detail {
namespace {

TEST(Half, Float16RoundTripsEveryBitPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
    } else {
      EXPECT_EQ(float_to_fp16(f), h) << "bits " << bits;
    }
  }
}

TEST(Half, Float16RoundsToNearestEven) {
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 2048)), 1.0f);  // tie → even (1.0)
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 4.0f / 2048);  // tie → even (up)
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(65520.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65519.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -25))), 0.0f);  // tie → even (0)
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(3.0f, -26))), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(Half, Bfloat16RoundsToNearestEven) {
  for (std::uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float f = bf16_to_float(static_cast<std::uint16_t>(bits));
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f), bits);
    }
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);  // tie → even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // The largest float rounds to inf, not to NaN.
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
}

}  // namespace
}  // namespace sdpa::detail
