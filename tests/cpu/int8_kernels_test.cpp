// The int8 K/V decode microkernels (src/cpu/simd/int8_kernels.h). P·V against float64
// sums of the unrounded weights, within the bound its int16 rounding allows (σ_r / 2 per
// weight, docs/numerics.md) and float32's rounding of the scaling: every row count, each
// row's weights at its own scale (so one σ for all rows fails), head dims on and off its
// 32-dim step, 1 to 256 keys (kMaxKeys), the three weight layouts, -128 and 127 among the values, a row of
// zero weights and negative ones, a sentinel past the output; and weights it must refuse,
// writing nothing: not finite, or a row's largest below 2^-96. The scores: the query's
// rounding (pack_query) and the exact integer sums (row_scores), below.
// Skipped on a CPU without AVX-512 VNNI, where nothing calls them.
#include "cpu/simd/int8_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
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
  // Strides: the rows packed (3, 5, 6, 7: no dense Sᵀ's), a dense Sᵀ's group (the rows
  // rounded up to a power of two: a vector holds several keys, the padding rows NaN),
  // a vector of rows (the tiles' Sᵀ). Up to kMaxKeys = 256 keys (a decode tile: 192).
  for (std::int64_t cols : {1, 2, 37, 96, 192, 255, 256})
    for (std::int64_t Ev : {1, 17, 32, 33, 64, 100, 128, 130})
      for (std::int64_t rows = 1; rows <= kMaxRows; ++rows)
        for (std::int64_t stride :
             {rows, static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(rows))), std::int64_t{16}}) {
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

// A dense Sᵀ's weights (a vector of several keys: pack_dense_weights) and the same
// weights a key a vector (pack_weights) are the same products and roundings: the same
// bits, for every row count and a tile's last odd key.
TEST(Int8Kernels, DenseAndStridedWeightsGiveTheSameBits) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> weight(-2.0f, 2.0f);
  const std::int64_t Ev = 100, ahead = 2;
  for (std::int64_t cols : {1, 37, 192})
    for (std::int64_t rows = 1; rows <= kMaxRows; ++rows) {
      const auto dense = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(rows)));
      const Values v = random_values(cols + ahead, Ev, rng);
      std::vector<float> packed(cols * dense, 0.0f), strided(cols * 16, 0.0f);
      for (std::int64_t c = 0; c < cols; ++c)
        for (std::int64_t r = 0; r < rows; ++r) packed[c * dense + r] = strided[c * 16 + r] = weight(rng);
      std::vector<float> a(rows * Ev), b(rows * Ev);
      ASSERT_TRUE(row_accumulate(packed.data(), dense, rows, v.pointers.data(), cols, Ev, ahead, a.data()));
      ASSERT_TRUE(row_accumulate(strided.data(), 16, rows, v.pointers.data(), cols, Ev, ahead, b.data()));
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "cols " << cols << " rows " << rows;
      // `add`: the same sums added to what out holds (a decode task's tiles, row-major):
      // within a rounding or two of the rounded sum plus 1.5; nothing past the rows.
      std::vector<float> sum(rows * Ev + 16, 1.5f);
      ASSERT_TRUE(row_accumulate(packed.data(), dense, rows, v.pointers.data(), cols, Ev, ahead, sum.data(), true));
      for (std::int64_t i = 0; i < rows * Ev; ++i) {
        const double want = 1.5 + double{a[i]};
        ASSERT_LE(std::abs(sum[i] - want), 0x1p-23 * (std::abs(want) + std::abs(double{a[i]}))) << i;
      }
      for (std::int64_t i = rows * Ev; i < rows * Ev + 16; ++i) ASSERT_EQ(sum[i], 1.5f) << i;
    }
}

TEST(Int8Kernels, RowAccumulateRefusesWeightsItCannotRound) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(8);
  const std::int64_t cols = 9, Ev = 40, rows = 4;
  const Values v = random_values(cols + 2, Ev, rng);
  // Not finite (NaN of either sign and any payload: pack_weights compares |w|'s bits as
  // integers); and a row whose largest is tiny but not 0 (32767 / max would overflow),
  // subnormal or not.
  // A dense Sᵀ (stride 4, a vector of 4 keys) and the tiles' (stride 16, a key a vector).
  for (std::int64_t stride : {rows, std::int64_t{16}})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                      std::bit_cast<float>(std::uint32_t{0x7fffffff}), std::bit_cast<float>(std::uint32_t{0xff800001}),
                      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 1e-35f, 0x1p-97f,
                      -0x1p-97f, 1e-40f}) {
      std::vector<float> wt(cols * stride, 0.5f);
      for (std::int64_t c = 0; c < cols; ++c) wt[c * stride + 3] = std::isfinite(bad) ? bad : 0.0f;
      wt[5 * stride + 3] = bad;
      std::vector<float> out(rows * Ev, -1.0f);
      EXPECT_FALSE(row_accumulate(wt.data(), stride, rows, v.pointers.data(), cols, Ev, 2, out.data()))
          << bad << " stride " << stride;
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

// The query's int16 rounding for the scores: σ the least power of two with max|q| / σ <=
// 32767 (so > half of it), q̂ = round(q / σ) exactly (the division by a power of two is
// exact), zeros up to QueryStride(E); every row count, E on and off the 32-dim step up to
// kMaxQueryDims, rows at their own scales, a row of zeros, a row whose largest over 2^k
// is 32767.5 (σ one power of two up), a sentinel past the rows.
TEST(Int8Kernels, PackQueryRoundsAgainstAPowerOfTwoPerRow) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  for (std::int64_t E : std::vector<std::int64_t>{1, 17, 32, 40, 64, 100, 128, kMaxQueryDims})
    for (std::int64_t rows = 1; rows <= kMaxRows; ++rows) {
      SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows);
      std::vector<float> q(rows * E);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t e = 0; e < E; ++e) q[r * E + e] = r == 1 ? 0.0f : normal(rng) * std::pow(7.0f, 2.0f - r);
      q[E / 2] = -32767.5f * 4;  // (row 0's largest: 2^15 - 1/2 times 4)
      const std::int64_t stride = QueryStride(E);
      std::vector<std::int16_t> q_hat(rows * stride + 16, std::int16_t{-7});
      std::vector<float> sigma(kMaxRows, -1.0f);
      ASSERT_TRUE(pack_query(q.data(), rows, E, q_hat.data(), sigma.data()));
      for (std::int64_t r = 0; r < rows; ++r) {
        double largest = 0;
        for (std::int64_t e = 0; e < E; ++e) largest = std::max(largest, std::abs(double{q[r * E + e]}));
        if (largest == 0) {
          ASSERT_EQ(sigma[r], 0.0f);
        } else {
          int exponent = 0;
          ASSERT_EQ(std::frexp(sigma[r], &exponent), 0.5f) << r;  // a power of two
          ASSERT_LE(largest / sigma[r], 32767.0) << r;
          ASSERT_GT(largest / sigma[r], 32767.0 / 2) << r;
        }
        for (std::int64_t e = 0; e < stride; ++e) {
          const double want = e < E && sigma[r] > 0 ? std::nearbyint(q[r * E + e] / double{sigma[r]}) : 0.0;
          ASSERT_EQ(q_hat[r * stride + e], want) << r << " " << e;
        }
      }
      for (std::int64_t r = rows; r < kMaxRows; ++r) ASSERT_EQ(sigma[r], -1.0f);
      for (std::int64_t i = rows * stride; i < rows * stride + 16; ++i) ASSERT_EQ(q_hat[i], -7) << i;
    }
}

// As row_accumulate's weights: a query element that is not finite, or a row's largest
// below 2^-96 but not 0, is refused with nothing written; 2^-96 itself is taken.
TEST(Int8Kernels, PackQueryRefusesRowsItCannotRound) {
  SKIP_WITHOUT_VNNI();
  const std::int64_t rows = 3, E = 40;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), 1e-35f, 0x1p-97f}) {
    std::vector<float> q(rows * E, 0.5f);
    for (std::int64_t e = 0; e < E; ++e) q[2 * E + e] = std::isfinite(bad) ? bad : 0.0f;
    q[2 * E + 7] = bad;
    std::vector<std::int16_t> q_hat(rows * QueryStride(E), std::int16_t{-7});
    std::vector<float> sigma(kMaxRows, -1.0f);
    EXPECT_FALSE(pack_query(q.data(), rows, E, q_hat.data(), sigma.data())) << bad;
    for (std::int16_t x : q_hat) ASSERT_EQ(x, -7);
    for (float x : sigma) ASSERT_EQ(x, -1.0f);
  }
  std::vector<float> q(rows * E, 0x1p-96f);
  std::vector<std::int16_t> q_hat(rows * QueryStride(E));
  std::vector<float> sigma(kMaxRows);
  ASSERT_TRUE(pack_query(q.data(), rows, E, q_hat.data(), sigma.data()));
  for (std::int64_t e = 0; e < E; ++e) ASSERT_EQ(double{sigma[0]} * q_hat[e], 0x1p-96) << e;
}

// The decode scores of int8 K rows: scale · σ_r · s^K_c · Σ_e q̂ · k, the sum exact in
// int32, so within float32's rounding of the scaling (4 roundings: σ·scale, times s^K,
// the sum to float, the product) of the exact value — not of the products' size. Every
// row count (blocks of keys, q̂ held in registers or read from memory, then single keys
// for the rest of cols = 37), E on and off the 32-dim step (its masked last loads: past E
// the keys hold 127s and q̂'s padding is overwritten with 1000s, so a load past E would
// show), the unrolled E = 64 and 128, both Sᵀ strides, each row at its own scale, -128
// and 127 among the keys, and E = kMaxQueryDims with every q̂ at 32767 and every key
// -128: the int32 sum at its headroom's edge.
TEST(Int8Kernels, RowScoresAreExactSumsTimesTheirScales) {
  SKIP_WITHOUT_VNNI();
  std::mt19937_64 rng(10);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> positive(0.001f, 0.1f);
  const std::int64_t cols = 37, ahead = 4;
  const float scale = 0.3f;
  for (std::int64_t E : std::vector<std::int64_t>{1, 31, 33, 64, 100, 128, kMaxQueryDims})
    for (std::int64_t rows = 1; rows <= kMaxRows; ++rows)
      for (std::int64_t st_stride : {rows, std::int64_t{16}}) {
        SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " stride " << st_stride);
        const bool edge = E == kMaxQueryDims;
        std::vector<float> q(rows * E);  // (each row at its own scale: so its own σ)
        for (std::int64_t i = 0; i < rows * E; ++i)
          q[i] = edge ? 32767.0f / 32768 : normal(rng) * std::pow(3.0f, i / E);  // (edge: σ = 2^-15)
        std::vector<std::int16_t> q_hat(rows * QueryStride(E));
        std::vector<float> sigma(kMaxRows);
        ASSERT_TRUE(pack_query(q.data(), rows, E, q_hat.data(), sigma.data()));
        for (std::int64_t r = 0; r < rows; ++r)
          std::fill(q_hat.begin() + r * QueryStride(E) + E, q_hat.begin() + (r + 1) * QueryStride(E), 1000);
        Values k = random_values(cols + ahead, E, rng);
        if (edge)
          for (auto& row : k.rows) std::fill(row.begin(), row.begin() + E, std::int8_t{-128});
        if (!edge) k.rows[1][E - 1] = 127;
        std::vector<float> k_scale(cols + 16);  // (read up to 15 past cols)
        for (auto& x : k_scale) x = positive(rng);
        std::vector<float> st(cols * st_stride + 16, -1.0f);  // (16 sentinels past the end)
        row_scores(q_hat.data(), sigma.data(), rows, E, k.pointers.data(), k_scale.data(), cols, ahead, scale,
                   st.data(), st_stride);
        for (std::int64_t c = 0; c < cols; ++c)
          for (std::int64_t r = 0; r < st_stride; ++r) {
            if (r >= rows) {
              ASSERT_EQ(st[c * st_stride + r], -1.0f) << c << " " << r;
              continue;
            }
            std::int64_t sum = 0;
            for (std::int64_t e = 0; e < E; ++e) sum += std::int64_t{q_hat[r * QueryStride(E) + e]} * k.rows[c][e];
            if (edge) {
              ASSERT_EQ(sum, -128 * E * 32767);
            }
            const double want = double{scale} * sigma[r] * k_scale[c] * static_cast<double>(sum);
            ASSERT_NEAR(st[c * st_stride + r], want, 3e-7 * std::abs(want)) << c << " " << r;
          }
        for (std::int64_t i = cols * st_stride; i < cols * st_stride + 16; ++i) ASSERT_EQ(st[i], -1.0f) << i;
      }
}

}  // namespace
}  // namespace sdpa::detail::int8
