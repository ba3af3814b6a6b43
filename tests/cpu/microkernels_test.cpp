// The SIMD kernels' building blocks, tested one by one on every x86 target this build
// compiles and this CPU runs, as Highway's own tests do (HWY_EXPORT_AND_TEST_P runs a
// per-target function once per target): 2^x, the online softmax's reference max, the
// score blocks and tiles, the accumulate blocks, the transposes between row-major and
// lane-major tiles, the backward's rank update, row loads and stores of every dtype, row
// addresses of plain and paged rows, and the log-sum-exp merge of split keys —
// each against the same computation in float64. A target whose microkernel is wrong
// fails here by name, before the whole-kernel tests
// (forward_test.cpp, backward_test.cpp, targets_test.cpp) see a wrong attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/element.h"
#include "common/half.h"
#include "common/problem.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/microkernels_test.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
// Per-target headers go after highway.h, inside the foreach_target loop.
#include "cpu/simd/exp2-inl.h"
#include "cpu/simd/lse_merge-inl.h"
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"
#include "cpu/simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {

using namespace simd;  // NOLINT(google-build-using-namespace): the pieces under test

// Random floats in [−1, 1) in an aligned buffer.
inline hwy::AlignedFreeUniquePtr<float[]> RandomFloats(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto values = hwy::AllocateAligned<float>(count);
  for (std::size_t n = 0; n < count; ++n) values[n] = uniform(rng);
  return values;
}

// A copy of `count` floats (what an accumulating kernel started from).
inline std::vector<float> Copy(const float* values, std::size_t count) {
  std::vector<float> copy(count);
  for (std::size_t n = 0; n < count; ++n) copy[n] = values[n];
  return copy;
}

// Float32 summation of `terms` products: |error| ≤ terms · ε · Σ|products| (Higham 3.1),
// with a factor 2 for the FMA-or-not ambiguity across targets.
inline double SumTolerance(int terms, double sum_of_magnitudes) {
  return 2.0 * terms * std::numeric_limits<float>::epsilon() * sum_of_magnitudes + 1e-30;
}

HWY_NOINLINE void TestExp2() {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::vector<float> inputs;
  // Up to 8: conditional rescaling (NextReferenceMax) lets a score exceed its row's
  // reference m by that much.
  for (float x = -125.0f; x <= 8.0f; x += 1.0f / 64) inputs.push_back(x);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-125.0f, 8.0f);
  for (int n = 0; n < 1000; ++n) inputs.push_back(uniform(rng));
  const float below = -125.5f, far_below = -1e30f;  // 2^x under float's normal range: exactly 0
  inputs.insert(inputs.end(), {below, far_below, -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()});
  while (inputs.size() % N != 0) inputs.push_back(0.0f);
  auto x = hwy::AllocateAligned<float>(inputs.size()), y = hwy::AllocateAligned<float>(inputs.size());
  for (std::size_t n = 0; n < inputs.size(); ++n) x[n] = inputs[n];
  for (std::size_t n = 0; n < inputs.size(); n += N) hn::Store(Exp2(df, hn::Load(df, x.get() + n)), df, y.get() + n);
  for (std::size_t n = 0; n < inputs.size(); ++n) {
    const float in = x[n];
    if (std::isnan(in)) {
      EXPECT_TRUE(std::isnan(y[n]));
    } else if (in < -125.0f) {
      EXPECT_EQ(y[n], 0.0f) << "2^" << in;
    } else {
      const double exact = std::exp2(static_cast<double>(in));
      // Degree-6 Taylor on [−½, ½] (≤ 1.2e-7) plus the float rounding of Horner's steps.
      EXPECT_LE(std::abs(y[n] - exact), 4e-7 * exact) << "2^" << in;
    }
  }
}

// The online softmax's reference max: kept while the max rises by at most 8, moved to
// the max beyond (a rise of 8 plus one ulp), and moved to the max from −inf or NaN or to
// a NaN max; lane by lane (the cases are laid across the lanes in turn).
HWY_NOINLINE void TestNextReferenceMax() {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float m_old, m_max;
    bool kept;
  };
  const std::vector<Case> cases = {
      {3.0f, 3.0f, true},         {3.0f, 11.0f, true},   {3.0f, std::nextafter(11.0f, inf), false},
      {0.0f, 7.5f, true},         {-100.0f, -92.0f, true}, {-100.0f, -91.5f, false},
      {-inf, 2.0f, false},        {-inf, -inf, false},   {nan, 2.0f, false},
      {2.0f, nan, false},         {-1e30f, 0.0f, false}};
  auto m_old = hwy::AllocateAligned<float>(N), m_max = hwy::AllocateAligned<float>(N);
  auto got = hwy::AllocateAligned<float>(N);
  for (std::size_t first = 0; first < cases.size(); ++first) {
    for (std::size_t i = 0; i < N; ++i) {
      const Case& c = cases[(first + i) % cases.size()];
      m_old[i] = c.m_old, m_max[i] = c.m_max;
    }
    hn::Store(NextReferenceMax(hn::Load(df, m_old.get()), hn::Load(df, m_max.get())), df, got.get());
    for (std::size_t i = 0; i < N; ++i) {
      const Case& c = cases[(first + i) % cases.size()];
      const float want = c.kept ? c.m_old : c.m_max;
      EXPECT_TRUE(got[i] == want || (std::isnan(got[i]) && std::isnan(want)))
          << "old m " << c.m_old << ", max " << c.m_max << ": got " << got[i];
    }
  }
}

// Subtiles of 1 (decoding), 2 and 3 (long query groups on AVX-512) row vectors.
template <std::size_t Vectors>
void CheckScoreBlock() {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = Vectors * N, st_stride = rows + N;
  constexpr std::size_t kKeys = kKeyBlockOf<Vectors>;
  std::mt19937 rng(2);
  for (std::int64_t E : {1, 7, 64, 131}) {
    const std::int64_t k_stride = E + 3;  // K rows apart by more than their length
    const auto qt = RandomFloats(static_cast<std::size_t>(E) * rows, rng);
    const auto k = RandomFloats(kKeys * static_cast<std::size_t>(k_stride), rng);
    auto st = hwy::AllocateAligned<float>(kKeys * st_stride);
    ScoreBlock<Vectors>(qt.get(), rows, E, k.get(), k_stride, st.get(), st_stride);
    for (std::size_t c = 0; c < kKeys; ++c)
      for (std::size_t r = 0; r < rows; ++r) {
        double exact = 0, magnitude = 0;
        for (std::int64_t e = 0; e < E; ++e) {
          const double term = static_cast<double>(k[c * k_stride + e]) * qt[e * rows + r];
          exact += term;
          magnitude += std::abs(term);
        }
        EXPECT_NEAR(st[c * st_stride + r], exact, SumTolerance(static_cast<int>(E), magnitude))
            << Vectors << " vectors, E=" << E << " key " << c << " row " << r;
      }
  }
}

HWY_NOINLINE void TestScoreBlock() {
  CheckScoreBlock<1>();
  CheckScoreBlock<2>();
  CheckScoreBlock<3>();
}

// A tile of every length up to three key blocks: the columns < cols against float64, and
// no row of K past cols read — those rows are NaN, and the padding columns, which read
// the last valid row again, must come out finite.
template <std::size_t Vectors>
void CheckScoreTile() {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = Vectors * N, st_stride = rows;
  const auto block = static_cast<std::int64_t>(kKeyBlockOf<Vectors>);
  std::mt19937 rng(5);
  for (std::int64_t E : {3, 40})
    for (std::int64_t cols = 1; cols <= 3 * block; ++cols) {
      const std::int64_t k_stride = E + 1, padded = ScoreTileColumns<Vectors>(cols);
      EXPECT_GE(padded, cols);
      EXPECT_LE(padded, RoundUp(cols, block));
      const auto qt = RandomFloats(static_cast<std::size_t>(E) * rows, rng);
      auto k = RandomFloats(static_cast<std::size_t>((cols + block) * k_stride), rng);
      for (std::int64_t x = cols * k_stride; x < (cols + block) * k_stride; ++x)
        k[static_cast<std::size_t>(x)] = std::numeric_limits<float>::quiet_NaN();
      auto st = hwy::AllocateAligned<float>(static_cast<std::size_t>(padded) * st_stride);
      ScoreTile<Vectors>(qt.get(), rows, E, k.get(), k_stride, cols, st.get(), st_stride);
      for (std::int64_t c = 0; c < padded; ++c)
        for (std::size_t r = 0; r < rows; ++r) {
          const float got = st[static_cast<std::size_t>(c) * st_stride + r];
          if (c >= cols) {
            EXPECT_TRUE(std::isfinite(got)) << Vectors << " vectors, cols=" << cols << ": padding column " << c;
            continue;
          }
          double exact = 0, magnitude = 0;
          for (std::int64_t e = 0; e < E; ++e) {
            const double term = static_cast<double>(k[c * k_stride + e]) * qt[e * rows + r];
            exact += term;
            magnitude += std::abs(term);
          }
          EXPECT_NEAR(got, exact, SumTolerance(static_cast<int>(E), magnitude))
              << Vectors << " vectors, cols=" << cols << " key " << c << " row " << r;
        }
    }
}

HWY_NOINLINE void TestScoreTile() {
  CheckScoreTile<1>();
  CheckScoreTile<2>();
  CheckScoreTile<3>();
}

// Whole 8 × 8 blocks, single elements and the edges between them, with strides wider
// than the matrices: the transpose exactly (TransposeScaled: each element times the
// scale, the float product's bits), and nothing written between the output's rows.
HWY_NOINLINE void TestTranspose() {
  std::mt19937 rng(6);
  for (const bool scaled : {false, true})
    for (std::size_t rows : {1, 7, 8, 15, 16, 17, 33, 48})
      for (std::size_t cols : {1, 8, 9, 16, 24, 40, 64}) {
        const std::size_t in_stride = cols + 3, out_stride = rows + 5;
        const float scale = 0.3f;
        const auto in = RandomFloats(rows * in_stride, rng);
        auto out = hwy::AllocateAligned<float>(cols * out_stride);
        for (std::size_t x = 0; x < cols * out_stride; ++x) out[x] = -7.0f;
        if (scaled)
          TransposeScaled(in.get(), in_stride, rows, cols, out.get(), out_stride, scale);
        else
          Transpose(in.get(), in_stride, rows, cols, out.get(), out_stride);
        for (std::size_t c = 0; c < cols; ++c)
          for (std::size_t r = 0; r < out_stride; ++r) {
            const float value = r < rows ? in[r * in_stride + c] : -7.0f;
            EXPECT_EQ(out[c * out_stride + r], scaled && r < rows ? value * scale : value)
                << (scaled ? "scaled " : "") << rows << " x " << cols << ": row " << r << " column " << c;
          }
      }
}

template <std::size_t Vectors>
void CheckAccumulate() {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = Vectors * N, pt_stride = rows + N;
  std::mt19937 rng(3);
  // Every path through the blocks (whole blocks of 16, 12 or 8 dims on AVX-512, half
  // that on AVX2, then at most one block of 8 and one of 4 narrower than the whole
  // block, then single dims): e.g. 27 = 12 + 12 + 3 for two vectors, 31 = 16 + 8 + 4 + 3
  // for one, 15 = 8 + 4 + 3 for three; and model head dims. With `overwrite`, ot's old
  // values (NaN here) are not read: the sum starts from 0.
  for (const bool overwrite : {false, true})
    for (std::int64_t dims : {1, 3, 4, 7, 8, 12, 15, 16, 27, 31, 37, 64, 128}) {
      const std::int64_t cols = 29, v_stride = dims + 2;
      const auto pt = RandomFloats(cols * pt_stride, rng);
      const auto v = RandomFloats(static_cast<std::size_t>(cols * v_stride), rng);
      auto ot = RandomFloats(static_cast<std::size_t>(dims) * rows, rng);
      if (overwrite) std::fill(ot.get(), ot.get() + dims * rows, std::numeric_limits<float>::quiet_NaN());
      const std::vector<float> before = Copy(ot.get(), static_cast<std::size_t>(dims) * rows);
      Accumulate<Vectors>(pt.get(), pt_stride, cols, v.get(), v_stride, dims, ot.get(), rows, overwrite);
      for (std::int64_t d = 0; d < dims; ++d)
        for (std::size_t r = 0; r < rows; ++r) {
          double exact = overwrite ? 0.0 : before[d * rows + r], magnitude = std::abs(exact);
          for (std::int64_t c = 0; c < cols; ++c) {
            const double term = static_cast<double>(v[c * v_stride + d]) * pt[c * pt_stride + r];
            exact += term;
            magnitude += std::abs(term);
          }
          EXPECT_NEAR(ot[d * rows + r], exact, SumTolerance(cols + 1, magnitude))
              << Vectors << " vectors, dims=" << dims << " d=" << d << (overwrite ? ", overwrite" : "");
        }
    }
}

HWY_NOINLINE void TestAccumulate() {
  CheckAccumulate<1>();
  CheckAccumulate<2>();
  CheckAccumulate<3>();
}

template <std::size_t Vectors>
void CheckRankUpdate(std::mt19937& rng) {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = 2 * N, wt_stride = rows, width = Vectors * N, x_stride = width + N;
  const std::int64_t r0 = 1, r1 = static_cast<std::int64_t>(rows) - 1;  // a sub-range of rows
  const auto wt = RandomFloats(kRankKeys * wt_stride, rng);
  const auto x = RandomFloats(rows * x_stride, rng);
  auto acc = RandomFloats(kRankKeys * x_stride, rng);
  const std::vector<float> before = Copy(acc.get(), kRankKeys * x_stride);
  RankUpdate<Vectors>(wt.get(), wt_stride, r0, r1, x.get(), x_stride, acc.get(), x_stride);
  for (std::size_t c = 0; c < kRankKeys; ++c)
    for (std::size_t d = 0; d < x_stride; ++d) {
      if (d >= width) {  // past the updated vectors: untouched
        EXPECT_EQ(acc[c * x_stride + d], before[c * x_stride + d]);
        continue;
      }
      double exact = before[c * x_stride + d], magnitude = std::abs(exact);
      for (std::int64_t r = r0; r < r1; ++r) {
        const double term = static_cast<double>(wt[c * wt_stride + r]) * x[r * x_stride + d];
        exact += term;
        magnitude += std::abs(term);
      }
      EXPECT_NEAR(acc[c * x_stride + d], exact, SumTolerance(static_cast<int>(r1 - r0 + 1), magnitude))
          << Vectors << " vectors, key " << c << " dim " << d;
    }
}

HWY_NOINLINE void TestRankUpdate() {
  std::mt19937 rng(4);
  CheckRankUpdate<1>(rng);
  CheckRankUpdate<2>(rng);
  CheckRankUpdate<4>(rng);
}

// LoadRow converts exactly as the scalar element access does, and StoreRow rounds as it
// does (nearest even), for every dtype, unit and non-unit column strides, and counts that
// leave a tail after whole vectors.
HWY_NOINLINE void TestRowLoadStore() {
  const std::size_t N = hn::Lanes(DF());
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uniform(-3.0, 3.0);
  for (DType dtype : {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::boolean}) {
    for (std::int64_t col_stride : {1, 3}) {
      const std::int64_t count = 3 * static_cast<std::int64_t>(N) + 1, col0 = 5, rows = 2;
      const std::int64_t row_stride = (col0 + count) * col_stride + 1;
      Operand op;
      op.dtype = dtype;
      op.element_size = dtype_size(dtype);
      op.head_offset = {0};
      op.row_stride = row_stride;
      op.col_stride = col_stride;
      std::vector<std::byte> bytes(static_cast<std::size_t>(rows * row_stride) * op.element_size);
      op.data = bytes.data();
      for (std::int64_t c = 0; c < col0 + count; ++c)
        op.store<double>(0, 1, c, dtype == DType::boolean ? static_cast<double>(uniform(rng) > 0) : uniform(rng));
      std::vector<float> loaded(static_cast<std::size_t>(count));
      LoadRow(op, 0, 1, col0, count, loaded.data());
      for (std::int64_t c = 0; c < count; ++c)
        EXPECT_EQ(loaded[c], op.load<float>(0, 1, col0 + c)) << dtype_name(dtype) << " stride " << col_stride;
      if (dtype == DType::boolean) continue;  // never an output

      std::vector<float> values(static_cast<std::size_t>(count));
      for (float& value : values) value = static_cast<float>(uniform(rng));
      const std::vector<std::byte> untouched = bytes;
      StoreRow(op, 0, 0, col0, count, values.data());
      std::vector<std::byte> expected = untouched;
      Operand scalar = op;
      scalar.data = expected.data();
      for (std::int64_t c = 0; c < count; ++c) scalar.store<float>(0, 0, col0 + c, values[c]);
      EXPECT_EQ(bytes, expected) << dtype_name(dtype) << " stride " << col_stride;  // and nothing else written
    }
  }
}

// RowWalker gives each row of a run the address the operand's own element access gives it:
// plain rows, and paged rows whose pages lie in scrambled order, for runs that start
// inside a page, end inside one, span several, or lie within one; pages of one row too;
// rows stepping forward and backward (a reversed NumPy view).
HWY_NOINLINE void TestRowWalker() {
  for (std::int64_t page_rows : {1, 3, 16})
    for (const bool paged : {false, true})
      for (const std::int64_t direction : {1, -1}) {
        const std::int64_t rows = 50, heads = 2, width = 5;
        Operand op;
        op.dtype = DType::float32;
        op.element_size = 4;
        op.col_stride = 1;
        op.row_stride = direction * (width + 2);
        std::vector<std::byte> bytes(1 << 16);
        op.data = bytes.data() + (direction > 0 ? 0 : bytes.size() / 2);  // (addresses compared, never read)
        if (paged) {
          // (pages, heads, page_rows, width + 2), the pages listed in reverse order.
          const std::int64_t pages = (rows + page_rows - 1) / page_rows, page_size = heads * page_rows * op.row_stride;
          op.page_rows = page_rows;
          for (std::int64_t k = 0; k < pages; ++k) op.page_offset.push_back((pages - 1 - k) * page_size);
          op.head_offset = {0, page_rows * op.row_stride};
        } else {
          op.head_offset = {0, rows * op.row_stride};
        }
        for (std::int64_t matrix = 0; matrix < heads; ++matrix)
          for (const auto& [j0, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                   {0, rows}, {1, 1}, {2, 17}, {page_rows - 1, 2}, {page_rows, page_rows}, {rows - 5, 5}, {7, 0}}) {
            RowWalker walk(op, matrix, j0);
            for (std::int64_t c = 0; c < count; ++c)
              EXPECT_EQ(walk.next(), op.address(matrix, j0 + c, 0))
                  << "page_rows " << page_rows << " paged " << paged << " step " << op.row_stride << " matrix "
                  << matrix << " row " << j0 + c;
            // fill, in pieces of 1, 2, 4, … rows (a piece ending mid-page, the next
            // starting there), then next() for one more row where there is one.
            RowWalker pieces(op, matrix, j0);
            std::vector<const std::byte*> out(static_cast<std::size_t>(count));
            for (std::int64_t c = 0, piece = 1; c < count; c += piece, piece *= 2)
              pieces.fill(out.data() + c, std::min(piece, count - c));
            for (std::int64_t c = 0; c < count; ++c)
              EXPECT_EQ(out[static_cast<std::size_t>(c)], op.address(matrix, j0 + c, 0))
                  << "fill: page_rows " << page_rows << " paged " << paged << " step " << op.row_stride << " matrix "
                  << matrix << " row " << j0 + c;
            if (j0 + count < rows) {
              EXPECT_EQ(pieces.next(), op.address(matrix, j0 + count, 0));
            }
          }
      }
}

// Merging the states of key splits gives m = max m_s, l = Σ 2^(m_s − m) l_s,
// Oᵀ = Σ 2^(m_s − m) Oᵀ_s; a row no split saw (all m_s = −inf) stays l = 0, Oᵀ = 0.
HWY_NOINLINE void TestMergeSplitStates() {
  const std::size_t N = hn::Lanes(DF()), rows = 2 * N;
  const std::int64_t Ev = 5, splits = 3;
  const std::int64_t state_floats = SplitStateFloats(rows, Ev), stride = state_floats + static_cast<std::int64_t>(rows);  // aligned, with a gap
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> uniform(-40.0f, 40.0f), positive(0.5f, 100.0f);
  auto states = hwy::AllocateAligned<float>(splits * stride);
  for (std::int64_t sp = 0; sp < splits; ++sp) {
    float* state = states.get() + sp * stride;
    for (std::size_t r = 0; r < rows; ++r) {
      // Row 0: no split saw a key. Row 1: only the last split did.
      const bool unseen = r == 0 || (r == 1 && sp < splits - 1);
      state[r] = unseen ? -std::numeric_limits<float>::infinity() : uniform(rng);
      state[rows + r] = unseen ? 0.0f : positive(rng);
      for (std::int64_t d = 0; d < Ev; ++d) state[(2 + d) * rows + r] = unseen ? 0.0f : uniform(rng);
    }
  }
  auto m = hwy::AllocateAligned<float>(rows), l = hwy::AllocateAligned<float>(rows);
  auto ot = hwy::AllocateAligned<float>(Ev * rows);
  MergeSplitStates(states.get(), splits, stride, rows, Ev, m.get(), l.get(), ot.get());
  for (std::size_t r = 0; r < rows; ++r) {
    double m_exact = -std::numeric_limits<double>::infinity();
    for (std::int64_t sp = 0; sp < splits; ++sp) m_exact = std::max<double>(m_exact, states[sp * stride + r]);
    EXPECT_EQ(m[r], m_exact);
    if (r == 0) {
      EXPECT_EQ(l[r], 0.0f);
      for (std::int64_t d = 0; d < Ev; ++d) EXPECT_EQ(ot[d * rows + r], 0.0f);
      continue;
    }
    double l_exact = 0;
    std::vector<double> o_exact(Ev, 0.0), o_magnitude(Ev, 0.0);
    for (std::int64_t sp = 0; sp < splits; ++sp) {
      const float* state = states.get() + sp * stride;
      const double weight = std::exp2(static_cast<double>(state[r]) - m_exact);
      l_exact += weight * state[rows + r];
      for (std::int64_t d = 0; d < Ev; ++d) {
        o_exact[d] += weight * state[(2 + d) * rows + r];
        o_magnitude[d] += std::abs(weight * state[(2 + d) * rows + r]);
      }
    }
    // Each weight carries Exp2's 4e-7; then float sums of `splits` terms.
    EXPECT_NEAR(l[r], l_exact, 1e-6 * l_exact) << "row " << r;
    for (std::int64_t d = 0; d < Ev; ++d)
      EXPECT_NEAR(ot[d * rows + r], o_exact[d], 1e-6 * o_magnitude[d] + 1e-30) << "row " << r << " dim " << d;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_BEFORE_TEST(Microkernels);
HWY_EXPORT_AND_TEST_P(Microkernels, TestExp2);
HWY_EXPORT_AND_TEST_P(Microkernels, TestNextReferenceMax);
HWY_EXPORT_AND_TEST_P(Microkernels, TestScoreBlock);
HWY_EXPORT_AND_TEST_P(Microkernels, TestScoreTile);
HWY_EXPORT_AND_TEST_P(Microkernels, TestTranspose);
HWY_EXPORT_AND_TEST_P(Microkernels, TestAccumulate);
HWY_EXPORT_AND_TEST_P(Microkernels, TestRankUpdate);
HWY_EXPORT_AND_TEST_P(Microkernels, TestRowLoadStore);
HWY_EXPORT_AND_TEST_P(Microkernels, TestRowWalker);
HWY_EXPORT_AND_TEST_P(Microkernels, TestMergeSplitStates);

}  // namespace sdpa::detail
#endif
