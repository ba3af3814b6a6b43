// RoPE must be the rotation RoFormer defines (eq. 13-15: a block-diagonal R_Θ,p with
// 2x2 rotations by p·θ_i, θ_i = base^(−2i/d)), in both channel pairings, and must make
// q·k depend on the relative position only — the property attention relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/nn.h"
#include "testing/helpers.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;
using sdpa::nn::apply_rope;
using sdpa::nn::RopeLayout;
using sdpa::nn::RopeOptions;

// R_p as an explicit d x d matrix (RoFormer eq. 15), for the first `rotary` channels;
// identity on the rest. Pair i is (2i, 2i+1) interleaved, (i, i + rotary/2) half-split.
std::vector<std::vector<double>> rotation_matrix(std::int64_t d, std::int64_t rotary, double p, double base,
                                                 RopeLayout layout) {
  std::vector<std::vector<double>> r(d, std::vector<double>(d, 0.0));
  for (std::int64_t c = 0; c < d; ++c) r[c][c] = 1.0;
  for (std::int64_t i = 0; i < rotary / 2; ++i) {
    const double theta = std::pow(base, -2.0 * i / rotary);
    const std::int64_t a = layout == RopeLayout::interleaved ? 2 * i : i;
    const std::int64_t b = layout == RopeLayout::interleaved ? 2 * i + 1 : i + rotary / 2;
    r[a][a] = std::cos(p * theta);
    r[a][b] = -std::sin(p * theta);
    r[b][a] = std::sin(p * theta);
    r[b][b] = std::cos(p * theta);
  }
  return r;
}

Tensor random64(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return sdpa::testing::random_tensor(DType::float64, shape, rng);
}

double dot_row(const Tensor& a, std::int64_t row_a, const Tensor& b, std::int64_t row_b, std::int64_t d) {
  double s = 0;
  for (std::int64_t c = 0; c < d; ++c) s += a.get(row_a * d + c) * b.get(row_b * d + c);
  return s;
}

struct Case {
  RopeLayout layout;
  std::int64_t dim, rotary;
  double base;
  std::int64_t offset;
};

class RopeFormulaTest : public ::testing::TestWithParam<Case> {};

TEST_P(RopeFormulaTest, EqualsTheRotationMatrixTimesTheVector) {
  const Case c = GetParam();
  const std::int64_t L = 7;
  const Tensor x = random64({2, L, c.dim}, 1);
  Tensor y = x;
  apply_rope(y.view(), c.offset, RopeOptions{c.base, c.layout, c.rotary});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t l = 0; l < L; ++l) {
      const auto r =
          rotation_matrix(c.dim, c.rotary == 0 ? c.dim : c.rotary, static_cast<double>(c.offset + l), c.base, c.layout);
      for (std::int64_t i = 0; i < c.dim; ++i) {
        double expected = 0;
        for (std::int64_t j = 0; j < c.dim; ++j) expected += r[i][j] * x.get((b * L + l) * c.dim + j);
        EXPECT_NEAR(y.get((b * L + l) * c.dim + i), expected, 1e-12) << "b " << b << " l " << l << " channel " << i;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RopeFormulaTest,
    ::testing::Values(Case{RopeLayout::half_split, 8, 0, 10000.0, 0}, Case{RopeLayout::interleaved, 8, 0, 10000.0, 0},
                      Case{RopeLayout::half_split, 64, 0, 10000.0, 1000},
                      Case{RopeLayout::interleaved, 64, 0, 500000.0, 1000},  // LLaMA 3's base
                      Case{RopeLayout::half_split, 40, 16, 10000.0, 3},      // partial rotary (GPT-NeoX)
                      Case{RopeLayout::interleaved, 40, 16, 10000.0, 3},
                      Case{RopeLayout::half_split, 2, 0, 10.0, -5}),  // negative positions rotate backwards
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return std::string(c.layout == RopeLayout::half_split ? "HalfSplit" : "Interleaved") + "D" +
             std::to_string(c.dim) + "Rotary" + std::to_string(c.rotary == 0 ? c.dim : c.rotary) + "Base" +
             std::to_string(static_cast<long long>(c.base)) + "Offset" + (c.offset < 0 ? "Minus" : "") +
             std::to_string(std::abs(c.offset));
    });

// Hugging Face's LLaMA writes the half-split form as x·cos + rotate_half(x)·sin with
// rotate_half(x) = cat(−x[d/2:], x[:d/2]) and cos, sin repeated over both halves;
// checkpoints trained that way must load with layout half_split.
TEST(RopeTest, HalfSplitIsHuggingFaceRotateHalf) {
  const std::int64_t L = 5, d = 16;
  const Tensor x = random64({L, d}, 2);
  Tensor y = x;
  apply_rope(y.view(), 0, RopeOptions{});
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t c = 0; c < d; ++c) {
      const std::int64_t i = c % (d / 2);
      const double angle = l * std::pow(10000.0, -2.0 * i / d);
      const double rotated_half = c < d / 2 ? -x.get(l * d + c + d / 2) : x.get(l * d + c - d / 2);
      EXPECT_NEAR(y.get(l * d + c), x.get(l * d + c) * std::cos(angle) + rotated_half * std::sin(angle), 1e-12);
    }
}

// <R_m q, R_n k> = <q, R_{n−m} k>: the score sees only n − m (RoFormer §3.4.2).
TEST(RopeTest, DotProductDependsOnRelativePositionOnly) {
  const std::int64_t d = 64;
  for (RopeLayout layout : {RopeLayout::half_split, RopeLayout::interleaved}) {
    const Tensor q = random64({1, d}, 3), k = random64({1, d}, 4);
    for (std::int64_t gap : {-9, 0, 1, 7, 100}) {
      std::vector<double> scores;
      for (std::int64_t m : {0, 3, 50, 1000, 100000}) {
        Tensor qr = q, kr = k;
        apply_rope(qr.view(), m, RopeOptions{10000.0, layout, 0});
        apply_rope(kr.view(), m + gap, RopeOptions{10000.0, layout, 0});
        scores.push_back(dot_row(qr, 0, kr, 0, d));
      }
      for (double s : scores) EXPECT_NEAR(s, scores.front(), 1e-9 * std::abs(scores.front()) + 1e-9) << "gap " << gap;
    }
    // And it does depend on the gap (the rotation is not the identity).
    Tensor q0 = q, k1 = k, k2 = k;
    apply_rope(k1.view(), 1, RopeOptions{10000.0, layout, 0});
    apply_rope(k2.view(), 2, RopeOptions{10000.0, layout, 0});
    EXPECT_GT(std::abs(dot_row(q0, 0, k1, 0, d) - dot_row(q0, 0, k2, 0, d)), 1e-6);
  }
}

TEST(RopeTest, KeepsEveryVectorsLength) {
  const Tensor x = random64({3, 11, 32}, 5);
  Tensor y = x;
  apply_rope(y.view(), 17, RopeOptions{10000.0, RopeLayout::interleaved, 0});
  for (std::int64_t row = 0; row < 33; ++row)
    EXPECT_NEAR(dot_row(y, row, y, row, 32), dot_row(x, row, x, row, 32), 1e-10);
}

// The offset is what a KV cache relies on: rotating rows [o, o + n) of a sequence alone
// with offset o gives what rotating the whole sequence gives there.
TEST(RopeTest, OffsetContinuesTheSequence) {
  const std::int64_t L = 12, d = 16, o = 5;
  const Tensor x = random64({L, d}, 6);
  Tensor whole = x;
  apply_rope(whole.view(), 0);
  Tensor tail(DType::float64, {L - o, d});
  for (std::int64_t i = 0; i < (L - o) * d; ++i) tail.set(i, x.get(o * d + i));
  apply_rope(tail.view(), o);
  for (std::int64_t i = 0; i < (L - o) * d; ++i) EXPECT_EQ(tail.get(i), whole.get(o * d + i));
}

// A (B, L, H, D) buffer viewed as (B, H, L, D), the layout the layer rotates in place.
TEST(RopeTest, StridedViewRotatesTheSameElements) {
  const std::int64_t B = 2, H = 3, L = 5, D = 8;
  const Tensor packed = random64({B, H, L, D}, 7);
  const sdpa::testing::StridedCopy strided = sdpa::testing::heads_interleaved(packed);
  Tensor expected = packed;
  apply_rope(expected.view(), 2);
  apply_rope(strided.view, 2);
  EXPECT_EQ(sdpa::testing::max_abs_diff(sdpa::testing::to_float64(strided.view), expected), 0.0);
}

TEST(RopeTest, Float32AgreesWithFloat64) {
  const Tensor x64 = random64({4, 9, 64}, 8);
  Tensor x32 = sdpa::testing::convert(x64, DType::float32);
  Tensor expected = sdpa::testing::to_float64(x32.view());
  apply_rope(expected.view(), 4096);
  apply_rope(x32.view(), 4096);
  EXPECT_LT(sdpa::testing::max_abs_diff(sdpa::testing::to_float64(x32.view()), expected), 1e-5);
}

// Issue #12: offset + l overflowed int64 (undefined behaviour) for offsets near 2^63;
// the largest offset whose last row still fits is accepted.
TEST(RopeTest, RejectsAnOffsetWhoseLastPositionOverflows) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  Tensor x = random64({4, 6}, 9);
  try {
    apply_rope(x.view(), kMax - 2);
    ADD_FAILURE() << "accepted offset 2^63 - 3 for 4 rows";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), "position_offset");
    EXPECT_NE(std::string(e.what()).find("fits in int64"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(apply_rope(x.view(), kMax - 3));
  EXPECT_NO_THROW(apply_rope(x.view(), std::numeric_limits<std::int64_t>::min()));
}

TEST(RopeTest, RejectsBadArguments) {
  Tensor x(DType::float64, {4, 6});
  EXPECT_THROW(apply_rope(x.view(), 0, RopeOptions{10000.0, RopeLayout::half_split, 3}), sdpa::Error);  // odd
  EXPECT_THROW(apply_rope(x.view(), 0, RopeOptions{10000.0, RopeLayout::half_split, 8}), sdpa::Error);  // > D
  EXPECT_THROW(apply_rope(x.view(), 0, RopeOptions{0.0, RopeLayout::half_split, 0}), sdpa::Error);
  EXPECT_THROW(apply_rope(x.view(), 0, RopeOptions{NAN, RopeLayout::half_split, 0}), sdpa::Error);
  Tensor odd(DType::float64, {4, 5});
  EXPECT_THROW(apply_rope(odd.view(), 0), sdpa::Error);
  Tensor vec(DType::float64, {6});
  EXPECT_THROW(apply_rope(vec.view(), 0), sdpa::Error);
  Tensor half(DType::float16, {4, 6});
  try {
    apply_rope(half.view(), 0);
    FAIL() << "float16 accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::type);
  }
}

}  // namespace
