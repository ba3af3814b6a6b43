// The int8 V decode microkernel (src/cpu/simd/int8_kernels.h) against float64 sums of the
// unrounded weights, within the bound its int16 rounding allows (σ_r / 2 per weight,
// docs/numerics.md) and float32's rounding of the scaling: every row count, each row's
// weights at its own scale (so one σ for all rows fails), head dims on and off its 32-dim
// step, 1 to 96 keys, both weight layouts, -128 and 127 among the values, a row of zero
// weights and negative ones, a sentinel past the output; and weights it must refuse,
// writing nothing: not finite, or a row's largest below 2^-96.
// Skipped on a CPU without AVX-512 VNNI, where nothing calls it.
#include "cpu/simd/int8_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace sdpa::detail::int8 {
namespace {

#define SKIP_WITHOUT_VNNI() \
  if (!supported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU"

struct Values {
  std::vector<std::vector<std::int8_t>> rows;  // each its own buffer, 32 past Ev of 127s
  std::vector<const std::byte*> pointers;
};

Values random_values(std::int64_t keys, std::int64_t Ev, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(-128, 127);
  Values v;
  for (std::int64_t c = 0; c < keys; ++c) {
    v.rows.emplace_back(Ev + 32, std::int8_t{127});
    for (std::int64_t d = 0; d < Ev; ++d) v.rows.back()[d] = static_cast<std::int8_t>(byte(rng));
  }
  v.rows[0][0] = -128;
  for (const auto& row : v.rows) v.pointers.push_back(reinterpret_cast<const std::byte*>(row.data()));
  return v;
}

TEST(Int8Kernels, RowAccumulateWithinTheInt16RoundingBound) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> weight(0.0f, 3.0f);
  const std::int64_t ahead = 4;
  for (std::int64_t cols : {1, 2, 37, 96})
    for (std::int64_t Ev : {1, 17, 32, 33, 64, 100, 128, 130})
      for (std::int64_t rows = 1; rows <= kMaxRows; ++rows)
        for (std::int64_t stride : {rows, std::int64_t{16}}) {
          SCOPED_TRACE(testing::Message()
                       << "cols " << cols << " Ev " << Ev << " rows " << rows << " stride " << stride);
          const Values v = random_values(cols + ahead, Ev, rng);
          std::vector<float> wt(cols * stride, std::numeric_limits<float>::quiet_NaN());  // NaN past the rows
          for (std::int64_t c = 0; c < cols; ++c)
            for (std::int64_t r = 0; r < rows; ++r) {
              const float w = weight(rng) * std::pow(10.0f, -static_cast<float>(r)) * (c % 5 == 0 ? 1e-3f : 1.0f);
              wt[c * stride + r] = r == 1 ? 0.0f : r == 2 ? -w : w;
            }
          std::vector<float> out(rows * Ev + 16, -1.0f);  // (16 sentinels past the end)
          ASSERT_TRUE(row_accumulate(wt.data(), stride, rows, v.pointers.data(), cols, Ev, ahead, out.data()));
          for (std::int64_t r = 0; r < rows; ++r) {
            double largest = 0;
            for (std::int64_t c = 0; c < cols; ++c) largest = std::max(largest, std::abs(double{wt[c * stride + r]}));
            const double sigma = largest / 32767;
            for (std::int64_t d = 0; d < Ev; ++d) {
              double want = 0, bound = 0, size = 0;
              for (std::int64_t c = 0; c < cols; ++c) {
                want += double{wt[c * stride + r]} * v.rows[c][d];
                bound += sigma / 2 * std::abs(v.rows[c][d]);
                size += std::abs(double{wt[c * stride + r]} * v.rows[c][d]);
              }
              // The rounding's bound, then float32's: σ, 32767 / max, w · that, the int32
              // sum to float and × σ, each a relative 2^-24 of the products' size.
              ASSERT_NEAR(out[r * Ev + d], want, 1.0001 * bound + 1e-6 * size) << r << " " << d;
              if (r == 1) {
                ASSERT_EQ(out[r * Ev + d], 0.0f);  // a row of zero weights
              }
            }
          }
          for (std::int64_t i = rows * Ev; i < rows * Ev + 16; ++i) ASSERT_EQ(out[i], -1.0f) << i;
        }
}

TEST(Int8Kernels, RowAccumulateRefusesWeightsItCannotRound) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(8);
  const std::int64_t cols = 9, Ev = 40, rows = 4;
  const Values v = random_values(cols + 2, Ev, rng);
  // Not finite; and a row whose largest is tiny but not 0 (32767 / max would overflow).
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), 1e-35f, 0x1p-97f}) {
    std::vector<float> wt(cols * rows, 0.5f);
    for (std::int64_t c = 0; c < cols; ++c) wt[c * rows + 3] = std::isfinite(bad) ? bad : 0.0f;
    wt[5 * rows + 3] = bad;
    std::vector<float> out(rows * Ev, -1.0f);
    EXPECT_FALSE(row_accumulate(wt.data(), rows, rows, v.pointers.data(), cols, Ev, 2, out.data())) << bad;
    for (float x : out) ASSERT_EQ(x, -1.0f);
  }
  // The smallest largest weight it takes: σ stays a normal float, and the sums hold.
  std::vector<float> wt(cols * rows, 0x1p-96f);
  std::vector<float> out(rows * Ev, -1.0f);
  ASSERT_TRUE(row_accumulate(wt.data(), rows, rows, v.pointers.data(), cols, Ev, 2, out.data()));
  for (std::int64_t d = 0; d < Ev; ++d) {
    double want = 0;
    for (std::int64_t c = 0; c < cols; ++c) want += 0x1p-96 * v.rows[c][d];
    ASSERT_NEAR(out[d], want, 1e-6 * 0x1p-96 * 128 * cols) << d;
  }
}

}  // namespace
}  // namespace sdpa::detail::int8
