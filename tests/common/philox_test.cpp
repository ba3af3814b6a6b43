// Philox4x32-10 and the dropout decision built on it.
#include "common/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace sdpa::detail {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, 0, 0), (PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
            (PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
            (PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Kept fraction within 5 standard deviations of 1 − p (binomial bounds).
TEST(DropoutMask, KeptFractionWithinBinomialBounds) {
  for (double p : {0.0, 0.1, 0.5, 0.9, 0.999}) {
    const DropoutMask mask(p, 1234, 0);
    const std::int64_t n = 400 * 500;
    std::int64_t kept = 0;
    for (std::int64_t i = 0; i < 400; ++i)
      for (std::int64_t j = 0; j < 500; ++j) kept += mask.keep(0, 3, i, j);
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 5 * sigma + 1) << "p = " << p;
  }
}

TEST(DropoutMask, SameSeedSameMaskOtherSeedOrOffsetAnother) {
  const DropoutMask a(0.5, 42, 0), same(0.5, 42, 0), other_seed(0.5, 43, 0), other_offset(0.5, 42, 1);
  int equal_same = 0, equal_seed = 0, equal_offset = 0;
  const int n = 4096;
  for (int j = 0; j < n; ++j) {
    equal_same += a.keep(1, 2, 3, j) == same.keep(1, 2, 3, j);
    equal_seed += a.keep(1, 2, 3, j) == other_seed.keep(1, 2, 3, j);
    equal_offset += a.keep(1, 2, 3, j) == other_offset.keep(1, 2, 3, j);
  }
  EXPECT_EQ(equal_same, n);
  EXPECT_NEAR(equal_seed, n / 2, 5 * 32);  // independent masks agree half the time
  EXPECT_NEAR(equal_offset, n / 2, 5 * 32);
}

// Batch, head, i and j each select a different stream: no two coordinates share bits.
TEST(DropoutMask, EveryCoordinateMatters) {
  const DropoutMask mask(0.5, 7, 0);
  int differ_batch = 0, differ_head = 0, differ_row = 0, differ_col = 0;
  for (int j = 0; j < 1024; ++j) {
    const bool base = mask.keep(0, 0, 0, j);
    differ_batch += base != mask.keep(1, 0, 0, j);
    differ_head += base != mask.keep(0, 1, 0, j);
    differ_row += base != mask.keep(0, 0, 1, j);
    differ_col += base != mask.keep(0, 0, 0, j + 4);
  }
  for (int differ : {differ_batch, differ_head, differ_row, differ_col}) EXPECT_NEAR(differ, 512, 5 * 16);
}

// A shard's mask (ring attention: rows and keys counted from row0, col0) is the whole
// problem's, bitwise, including a first key that is not a multiple of four (one Philox
// call serves four keys: the shard must pick the right word of the right block).
TEST(DropoutMask, ShardOffsetsDrawTheWholeProblemsMask) {
  const DropoutMask whole(0.37, 11, 3);
  for (std::int64_t row0 : {0, 5, 1000})
    for (std::int64_t col0 : {0, 1, 2, 3, 6, 4097}) {
      const DropoutMask shard(0.37, 11, 3, row0, col0);
      for (std::int64_t i = 0; i < 3; ++i) {
        for (std::int64_t j = 0; j < 37; ++j)
          ASSERT_EQ(shard.keep(1, 2, i, j), whole.keep(1, 2, i + row0, j + col0)) << row0 << ' ' << col0;
        for (std::int64_t j0 : {0, 1, 5})
          shard.for_each_key(1, 2, i, j0, 23, [&](std::int64_t c, bool kept) {
            ASSERT_EQ(kept, whole.keep(1, 2, i + row0, j0 + c + col0)) << row0 << ' ' << col0 << ' ' << j0;
          });
      }
    }
}

}  // namespace
}  // namespace sdpa::detail
