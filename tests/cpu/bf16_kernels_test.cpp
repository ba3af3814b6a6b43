// The vdpbf16ps microkernels (src/cpu/simd/bf16_kernels.h), each against float64
// sums of the same bfloat16 values, and the packing against float_to_bf16: offsets,
// strides and widths the whole-kernel tests reach only by chance (a pair range that
// starts past 0, output strides other than a tile's, widths of 1, 3 and 17 vectors, an
// odd width's zero partner; the decode scores' row counts and masked tails). Skipped on
// a CPU without AVX-512 BF16, where nothing calls them.
#include "cpu/simd/bf16_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/half.h"
#include "hwy/aligned_allocator.h"

namespace sdpa::detail::bf16 {
namespace {

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> x(n);
  for (auto& v : x) v = float_to_bf16(normal(rng));
  return x;
}

// A 64-byte aligned copy (the kernels' aligned loads and stores).
template <class T>
hwy::AlignedFreeUniquePtr<T[]> aligned(const std::vector<T>& x) {
  auto p = hwy::AllocateAligned<T>(x.size());
  std::copy(x.begin(), x.end(), p.get());
  return p;
}

#define SKIP_WITHOUT_BF16() \
  if (!supported()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU"

TEST(Bf16Kernels, ScoreBlockWithAWiderOutputStride) {
  SKIP_WITHOUT_BF16();
  std::mt19937_64 rng(1);
  const std::int64_t pairs = 5, k_stride = 2 * pairs + 6, st_stride = 48;
  const auto qp = aligned(random_bf16(pairs * 2 * kRows, rng));
  const auto k = random_bf16(kKeyBlock * k_stride, rng);
  auto st = hwy::AllocateAligned<float>(kKeyBlock * st_stride);
  score_block(qp.get(), pairs, k.data(), k_stride, 0.5f, st.get(), st_stride);
  for (int c = 0; c < kKeyBlock; ++c)
    for (int r = 0; r < kRows; ++r) {
      double want = 0;
      for (std::int64_t p = 0; p < pairs; ++p)
        for (int h = 0; h < 2; ++h)
          want += double{bf16_to_float(qp[(p * kRows + r) * 2 + h])} * bf16_to_float(k[c * k_stride + 2 * p + h]);
      EXPECT_NEAR(st[c * st_stride + r], 0.5 * want, 1e-5 * (1 + std::abs(want))) << c << " " << r;
    }
}

TEST(Bf16Kernels, PackPairsAndRoundFloatsRoundAsFloatToBf16) {
  SKIP_WITHOUT_BF16();
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal;
  const std::int64_t pairs = 3, width = 48, stride = 80;  // rows 80 floats apart, 48 used
  std::vector<float> x(2 * pairs * stride);
  for (auto& v : x) v = normal(rng);
  std::vector<std::uint16_t> out(pairs * 2 * width);
  pack_pairs(x.data(), stride, pairs, width, out.data());
  for (std::int64_t p = 0; p < pairs; ++p)
    for (std::int64_t w = 0; w < width; ++w)
      for (int h = 0; h < 2; ++h)
        ASSERT_EQ(out[(p * width + w) * 2 + h], float_to_bf16(x[(2 * p + h) * stride + w])) << p << " " << w;
  std::vector<std::uint16_t> rounded(64);
  round_floats(x.data(), 64, rounded.data());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(rounded[i], float_to_bf16(x[i])) << i;
}

TEST(Bf16Kernels, PackAlongAnOddWidthGivesTheLastPairAZeroPartner) {
  SKIP_WITHOUT_BF16();
  const std::int64_t width = 5, rows = 32;
  std::vector<float> xt((width + 1) * rows, 7.0f);  // the row past the width: not zero before
  for (std::int64_t w = 0; w < width; ++w)
    for (std::int64_t r = 0; r < rows; ++r) xt[w * rows + r] = static_cast<float>(w * 100 + r);
  std::vector<std::uint16_t> xp((width + 1) * rows);
  pack_along_width(xt.data(), width, rows, xp.data());
  for (std::int64_t w = 0; w < width + 1; ++w)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float want = w < width ? static_cast<float>(w * 100 + r) : 0.0f;
      ASSERT_EQ(xp[((w / 2) * rows + r) * 2 + w % 2], float_to_bf16(want)) << w << " " << r;
    }
}

// dK, dV's update: pairs [3, 10) of rows; widths of 1, 3, 5, 7 and 17 vectors (blocks of
// 4, 2 and 1 vectors, the 2 after a 4); accumulators 16 floats wider than the width
// (left as they were), added to what they held.
TEST(Bf16Kernels, RankUpdateOverAPairRange) {
  SKIP_WITHOUT_BF16();
  std::mt19937_64 rng(3);
  for (std::int64_t width : {16, 48, 80, 112, 272}) {
    SCOPED_TRACE(width);
    const std::int64_t all_pairs = 12, pair0 = 3, pair1 = 10, wt_stride = 2 * all_pairs + 4,
                       acc_stride = width + 16;
    const auto wt = random_bf16(kRankKeys * wt_stride, rng);
    const auto xp = aligned(random_bf16(all_pairs * 2 * width, rng));
    std::vector<float> acc(kRankKeys * acc_stride);
    std::normal_distribution<float> normal;
    for (auto& v : acc) v = normal(rng);
    const std::vector<float> before = acc;
    rank_update(wt.data(), wt_stride, pair0, pair1, xp.get(), width, acc.data(), acc_stride);
    for (int c = 0; c < kRankKeys; ++c)
      for (std::int64_t d = 0; d < acc_stride; ++d) {
        if (d >= width) {
          ASSERT_EQ(acc[c * acc_stride + d], before[c * acc_stride + d]) << "past the width: " << c << " " << d;
          continue;
        }
        double want = before[c * acc_stride + d];
        for (std::int64_t p = pair0; p < pair1; ++p)
          for (int h = 0; h < 2; ++h)
            want += double{bf16_to_float(wt[c * wt_stride + 2 * p + h])} * bf16_to_float(xp[(p * width + d) * 2 + h]);
        ASSERT_NEAR(acc[c * acc_stride + d], want, 1e-5 * (1 + std::abs(want))) << c << " " << d;
      }
  }
}

// P·V's operands and product: V rows in pairs of rows (an odd count's last with a zero
// partner; Ev off the 32-element vector, so the masked loads and stores), then
// ot[d][r] += Σ pp · vp over the blocks of 8 dims and the rest.
TEST(Bf16Kernels, PackValuesAndAccumulate) {
  SKIP_WITHOUT_BF16();
  std::mt19937_64 rng(4);
  for (std::int64_t Ev : {5, 9, 17, 40}) {
    SCOPED_TRACE(Ev);
    const std::int64_t cols = 7, v_stride = Ev + 3, col_pairs = (cols + 1) / 2;
    const auto v = random_bf16(cols * v_stride, rng);
    std::vector<std::uint16_t> vp(col_pairs * 2 * Ev, 0xffff);
    pack_values(v.data(), v_stride, cols, Ev, vp.data());
    for (std::int64_t c = 0; c < 2 * col_pairs; ++c)
      for (std::int64_t d = 0; d < Ev; ++d)
        ASSERT_EQ(vp[((c / 2) * Ev + d) * 2 + c % 2], c < cols ? v[c * v_stride + d] : 0) << c << " " << d;
    const auto pp = aligned(random_bf16(col_pairs * 2 * kRows, rng));
    std::vector<float> start(Ev * kRows);
    std::normal_distribution<float> normal;
    for (auto& x : start) x = normal(rng);
    auto ot = aligned(start);
    accumulate(pp.get(), col_pairs, vp.data(), Ev, ot.get());
    for (std::int64_t d = 0; d < Ev; ++d)
      for (int r = 0; r < kRows; ++r) {
        double want = start[d * kRows + r];
        for (std::int64_t cp = 0; cp < col_pairs; ++cp)
          for (int h = 0; h < 2; ++h)
            want += double{bf16_to_float(pp[(cp * kRows + r) * 2 + h])} * bf16_to_float(vp[(cp * Ev + d) * 2 + h]);
        ASSERT_NEAR(ot[d * kRows + r], want, 1e-5 * (1 + std::abs(want))) << d << " " << r;
      }
  }
}

// The decode score kernel's st (cols keys, `rows` rows, st_stride apart, 16 sentinels of
// -1 past its end) against float64: st[c·st_stride + r] within 1e-6 of 1 + the products'
// sizes of scale · Σ_e q[r][e] · keys[c][e]; the lanes past the rows and the sentinels
// untouched.
void ExpectRowScores(const std::vector<float>& st, std::int64_t cols, std::int64_t rows, std::int64_t st_stride,
                     const std::vector<std::uint16_t>& q, std::int64_t E,
                     const std::vector<std::vector<std::uint16_t>>& keys, double scale) {
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t r = 0; r < st_stride; ++r) {
      if (r >= rows) {
        ASSERT_EQ(st[c * st_stride + r], -1.0f) << c << " " << r;
        continue;
      }
      double want = 0, size = 0;
      for (std::int64_t e = 0; e < E; ++e) {
        const double product = double{bf16_to_float(q[r * E + e])} * bf16_to_float(keys[c][e]);
        want += product, size += std::abs(product);
      }
      ASSERT_NEAR(st[c * st_stride + r], scale * want, 1e-6 * (1 + scale * size)) << c << " " << r;
    }
  for (std::int64_t i = cols * st_stride; i < cols * st_stride + 16; ++i) ASSERT_EQ(st[i], -1.0f) << i;
}

// The decode scores, lanes along E: every row count (up to 4 rows at E = 64 and 128, the
// query held and 8/R keys a block; else 16/R keys a block, the query loaded a step; then
// single keys for the rest of cols = 37), E below, at and off the 32-element step
// (its masked last loads), the dense Sᵀ (stride = rows) and a wider one. Each key's
// row sits in its own buffer, as a cache's rows may, and K holds NaN past E, which the
// masked loads must not reach; the rows' pointers run `ahead` past cols (the
// prefetches' targets).
TEST(Bf16Kernels, RowScoresForEveryRowCountAndHeadDim) {
  SKIP_WITHOUT_BF16();
  std::mt19937_64 rng(5);
  const std::int64_t cols = 37, ahead = 4;
  const std::uint16_t nan = 0x7fc0;
  for (std::int64_t E : {1, 31, 32, 33, 64, 100, 128})
    for (std::int64_t rows = 1; rows <= kMaxDecodeRows; ++rows)
      for (std::int64_t st_stride : {rows, std::int64_t{16}}) {
        SCOPED_TRACE(testing::Message() << "E " << E << " rows " << rows << " stride " << st_stride);
        const auto q = random_bf16(rows * E, rng);
        std::vector<std::vector<std::uint16_t>> keys;
        std::vector<const std::byte*> k_rows;
        for (std::int64_t c = 0; c < cols + ahead; ++c) {
          keys.push_back(random_bf16(E, rng));
          keys.back().resize(E + 32, nan);
        }
        for (const auto& key : keys) k_rows.push_back(reinterpret_cast<const std::byte*>(key.data()));
        std::vector<float> st(cols * st_stride + 16, -1.0f);  // (16 sentinels past the end)
        row_scores(q.data(), rows, E, k_rows.data(), cols, ahead, 0.25f, st.data(), st_stride);
        ExpectRowScores(st, cols, rows, st_stride, q, E, keys, 0.25);
      }
}

}  // namespace
}  // namespace sdpa::detail::bf16
