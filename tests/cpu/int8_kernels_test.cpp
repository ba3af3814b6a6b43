// The int8 V decode microkernel (src/cpu/simd/int8_kernels.h) against float64 sums of the
// unrounded weights, within the bound its int16 rounding allows (σ_r / 2 per weight,
// docs/numerics.md): every row count, head dims on and off its 32-dim step, an odd key
// count, both weight layouts, -128 and 127 among the values, a row of zero weights and
// negative ones; and a weight that is not finite, which it must refuse, writing nothing.
// Skipped on a CPU without AVX-512 VNNI, where nothing calls it.
#include "cpu/simd/int8_kernels.h"

#include <gtest/gtest.h>

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
  const std::int64_t cols = 37, ahead = 4;
  for (std::int64_t Ev : {1, 17, 32, 33, 64, 100, 128, 130})
    for (std::int64_t rows = 1; rows <= kMaxRows; ++rows)
      for (std::int64_t stride : {rows, std::int64_t{16}}) {
        SCOPED_TRACE(testing::Message() << "Ev " << Ev << " rows " << rows << " stride " << stride);
        const Values v = random_values(cols + ahead, Ev, rng);
        std::vector<float> wt(cols * stride, std::numeric_limits<float>::quiet_NaN());  // NaN past the rows
        for (std::int64_t c = 0; c < cols; ++c)
          for (std::int64_t r = 0; r < rows; ++r)
            wt[c * stride + r] = r == 1 ? 0.0f : r == 2 ? -weight(rng) : weight(rng) * (c % 5 == 0 ? 1e-3f : 1.0f);
        std::vector<float> out(rows * Ev, -1.0f);
        ASSERT_TRUE(row_accumulate(wt.data(), stride, rows, v.pointers.data(), cols, Ev, ahead, out.data()));
        for (std::int64_t r = 0; r < rows; ++r) {
          double largest = 0;
          for (std::int64_t c = 0; c < cols; ++c) largest = std::max(largest, std::abs(double{wt[c * stride + r]}));
          const double sigma = largest / 32767;
          for (std::int64_t d = 0; d < Ev; ++d) {
            double want = 0, bound = 0;
            for (std::int64_t c = 0; c < cols; ++c) {
              want += double{wt[c * stride + r]} * v.rows[c][d];
              bound += sigma / 2 * std::abs(v.rows[c][d]);
            }
            // The rounding's bound, the float32 scaling of the exact int32 sum, a margin.
            ASSERT_NEAR(out[r * Ev + d], want, 1.01 * bound + 1e-6 * (1 + std::abs(want))) << r << " " << d;
            if (r == 1) {
              ASSERT_EQ(out[r * Ev + d], 0.0f);  // a row of zero weights
            }
          }
        }
      }
}

TEST(Int8Kernels, RowAccumulateRefusesAWeightThatIsNotFinite) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(8);
  const std::int64_t cols = 9, Ev = 40, rows = 4;
  const Values v = random_values(cols + 2, Ev, rng);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> wt(cols * rows, 0.5f);
    wt[5 * rows + 3] = bad;
    std::vector<float> out(rows * Ev, -1.0f);
    EXPECT_FALSE(row_accumulate(wt.data(), rows, rows, v.pointers.data(), cols, Ev, 2, out.data())) << bad;
    for (float x : out) ASSERT_EQ(x, -1.0f);
  }
}

}  // namespace
}  // namespace sdpa::detail::int8
