// The decode microkernels for a task of few query rows (decoding: Hq/Hkv · L <=
// kFewRows) over K and V rows of unit column stride: float32, bfloat16, float16, or int8
// (with Options::key_scale, value_scale). The forward's usual tiles put query rows along the
// lanes (one vector: 16 lanes on AVX-512), which for 4 rows wastes 3/4 of every FMA and
// costs a broadcast and an FMA per K or V element; here the lanes run along E (scores)
// or Ev (values) instead, so each element costs R/N FMAs (R rows, N lanes), and the rows
// are read (widened to float32 in registers, exactly) straight from the cache, never
// into a tile:
//   st[c][r] = s^K_c · Σ_e q[r][e] · k_c[e]          (q pre-scaled by scale · log2(e); s^K only for int8)
//   ot[d][r] += Σ_c pt[c][r] · v_c[d]                 (pt already times s^V_c for int8)
// Results stay in the transposed (Sᵀ, Oᵀ) layout the rest of the forward uses. float32
// decoding took these for the tiles on 2026-11-27 (10–26 % faster on the Cascade Lake
// Xeon of bench/RESULTS.md), bfloat16 and float16 later that day (2.0–2.3×).
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#undef SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#else
#define SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/problem.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// At most this many query rows take the decode kernels (their accumulators must fit the
// 16 vector registers of AVX2).
constexpr std::int64_t kFewRows = 8;

// The kernels request row c + kRowsAhead's lines while they compute with row c, so the
// row lists they take hold kRowsAhead rows past the tile (the next tile's first rows).
// Requests spread over the arithmetic keep the memory busy while it runs; a burst of
// the next tile's lines at the tile's start (the previous way) left the two in turn.
constexpr std::int64_t kRowsAhead = 8;

// Requests the 64-byte line of row[e] if e starts one (e: a multiple of the lanes).
template <class T>
HWY_INLINE void PrefetchLine(const T* row, std::int64_t e) {
  constexpr std::int64_t kPerLine = 64 / static_cast<std::int64_t>(sizeof(T));
  if (static_cast<std::int64_t>(hn::Lanes(DF())) >= kPerLine || e % kPerLine == 0) hwy::Prefetch(row + e);
}

// The kernels take a tile's rows as untyped pointers (one list whatever the dtype);
// RowAt<T> reads one as a row of T.
template <class T>
HWY_INLINE const T* RowAt(const std::byte* const* rows, std::int64_t c) {
  return reinterpret_cast<const T*>(rows[c]);
}

// Whether the kernels read op's rows in place: rows of unit column stride, of a dtype
// WithRowType knows, through pointers of their element type. A float32 row needs a
// float-aligned tensor (a caller's may start at any address; a misaligned one keeps the
// tiles); Highway's bfloat16_t and float16_t are packed 2-byte structs (alignment 1),
// and every row of a tensor lies whole elements from its start.
inline bool RowKernelsRead(const Operand& op) {
  const bool known = op.dtype == DType::float32 || op.dtype == DType::bfloat16 || op.dtype == DType::float16 ||
                     op.dtype == DType::int8;
  const bool aligned = op.dtype != DType::float32 || reinterpret_cast<std::uintptr_t>(op.data) % alignof(float) == 0;
  return known && aligned && op.col_stride == 1;
}

// f(T()) for the element type T of dtype: one of the dtypes the row kernels read
// (RowKernelsRead admits no other).
template <class F>
HWY_INLINE void WithRowType(DType dtype, F f) {
  switch (dtype) {
    case DType::int8:
      return f(std::int8_t());
    case DType::bfloat16:
      return f(hwy::bfloat16_t());
    case DType::float16:
      return f(hwy::float16_t());
    case DType::float32:
      return f(float());
    default:
      HWY_DASSERT(false);
      return f(float());
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// The sums of four vectors' lanes, four sums in each 128-bit block: block b holds
// [Σ a, Σ b, Σ c, Σ d] over that block's lanes. 9 instructions for 4 vectors, where a
// horizontal sum each costs ~8 (and a dependent chain): the reduction was ~40 % of the
// scores kernel's time on the Cascade Lake Xeon of bench/RESULTS.md.
HWY_INLINE VF BlockSums4(VF a, VF b, VF c, VF d) {
  const DF df;
  const hn::Repartition<double, DF> d64;  // (double, not uint64: no int/float domain crossing)
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));  // a02 b02 a13 b13
  const VF cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));  // c02 d02 c13 d13
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64)),
                 hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64)));
}

// The four sums of BlockSums4 over all blocks, into sums[0..4).
template <class D>
HWY_INLINE void StoreBlockTotals(D d, hn::Vec<D> v, float* HWY_RESTRICT sums) {
  if constexpr (hn::MaxLanes(D()) <= 4) {
    hn::StoreU(v, d, sums);
  } else {
    const hn::Half<D> dh;
    StoreBlockTotals(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), sums);
  }
}

// sums[i] = Σ lanes of acc[i], i < M: four vectors at a time (sums has M rounded up to 4).
template <int M>
HWY_INLINE void SumsOfLanes(const VF* acc, float* HWY_RESTRICT sums) {
  const DF df;
  for (int i = 0; i < M; i += 4) {
    const auto at = [&](int j) { return i + j < M ? acc[i + j] : hn::Zero(df); };
    StoreBlockTotals(df, BlockSums4(at(0), at(1), at(2), at(3)), sums + i);
  }
}
#else
template <int M>
HWY_INLINE void SumsOfLanes(const VF* acc, float* HWY_RESTRICT sums) {
  const DF df;
  for (int i = 0; i < M; ++i) sums[i] = hn::GetLane(hn::SumOfLanes(df, acc[i]));
}
#endif

// Keys [c, c + Keys) against R query rows q (row-major, R × E): the scores (times the
// keys' scales, if k_scale) into st[(c + k)·st_stride + r].
template <int R, int Keys, class T>
HWY_INLINE void RowScoreKeys(const float* HWY_RESTRICT q, std::int64_t E, const std::byte* const* k_rows,
                             std::int64_t c, const float* k_scale, float* HWY_RESTRICT st, std::size_t st_stride) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t whole = E / N * N;
  constexpr int M = Keys * R;
  VF acc[M];  // acc[k·R + r]
  for (int i = 0; i < M; ++i) acc[i] = hn::Zero(df);
  for (std::int64_t e = 0; e < whole; e += N) {
    VF x[Keys];
    for (int k = 0; k < Keys; ++k) {
      x[k] = WidenRow(RowAt<T>(k_rows, c + k) + e);
      PrefetchLine(RowAt<T>(k_rows, c + k + kRowsAhead), e);
    }
    for (int r = 0; r < R; ++r) {
      const VF qv = hn::LoadU(df, q + r * E + e);
      for (int k = 0; k < Keys; ++k) acc[k * R + r] = hn::MulAdd(qv, x[k], acc[k * R + r]);
    }
  }
  HWY_ALIGN float sums[(M + 3) / 4 * 4];
  SumsOfLanes<M>(acc, sums);
  if (HWY_UNLIKELY(whole < E))  // the dims past whole vectors
    for (int k = 0; k < Keys; ++k)
      for (int r = 0; r < R; ++r)
        for (std::int64_t e = whole; e < E; ++e) sums[k * R + r] += q[r * E + e] * ToFloat(RowAt<T>(k_rows, c + k), e);
  // (A scale of 1 leaves a float32 score's bits as they are: no branch per score.)
  for (int k = 0; k < Keys; ++k) {
    const float factor = k_scale != nullptr ? k_scale[c + k] : 1.0f;
    for (int r = 0; r < R; ++r) st[(c + k) * static_cast<std::int64_t>(st_stride) + r] = sums[k * R + r] * factor;
  }
}

// Keys scored together (RowScoresFewRows) and vectors of dims accumulated per pass over
// the keys (RowAccumulateFewRows) for R rows: as many as keep R times as many
// accumulators, and the rows' vectors, within the vector registers (32 on AVX-512, 16
// below).
template <int R>
constexpr int RegisterBlock() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return R <= 2 ? 8 : R <= 4 ? 4 : 2;
#else
  return R <= 4 ? 2 : 1;
#endif
}

// Sᵀ of keys [0, cols) (k_rows[c]: key c's row, unit stride; k_scale[c] its scale, or
// k_scale null) for R rows: RegisterBlock<R>() keys at a time.
template <int R, class T>
HWY_NOINLINE void RowScoresFewRows(const float* q, std::int64_t E, const std::byte* const* k_rows, std::int64_t cols,
                                   const float* k_scale, float* st, std::size_t st_stride) {
  constexpr int kKeys = RegisterBlock<R>();
  std::int64_t c = 0;
  for (; c + kKeys <= cols; c += kKeys) RowScoreKeys<R, kKeys, T>(q, E, k_rows, c, k_scale, st, st_stride);
  for (; c < cols; ++c) RowScoreKeys<R, 1, T>(q, E, k_rows, c, k_scale, st, st_stride);
}

// Oᵀ[d][r] += Σ_{c < cols} pt[c·pt_stride + r] · v_c[d] for R rows and the V·N dims
// [d0, d0 + V·N) (v_rows[c]: value c's row, unit stride). The accumulators hold R rows ×
// V vectors of dims over all the keys, then add into Oᵀ once per tile.
template <int R, int V, class T>
HWY_INLINE void RowAccumulateDims(const float* HWY_RESTRICT pt, std::int64_t ps, const std::byte* const* v_rows,
                                  std::int64_t cols, std::int64_t d0, float* HWY_RESTRICT ot, std::int64_t stride) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  for (std::int64_t c = 0; c < cols; ++c) {
    VF x[V];
    for (int v = 0; v < V; ++v) {
      x[v] = WidenRow(RowAt<T>(v_rows, c) + d0 + v * N);
      PrefetchLine(RowAt<T>(v_rows, c + kRowsAhead), d0 + v * N);
    }
    for (int r = 0; r < R; ++r) {
      const VF p = hn::Set(df, pt[c * ps + r]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(p, x[v], acc[r][v]);
    }
  }
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      hn::Store(acc[r][v], df, lanes);
      for (std::int64_t i = 0; i < N; ++i) ot[(d0 + v * N + i) * stride + r] += lanes[i];
    }
}

// Oᵀ += … for the dims from d on, in blocks of V vectors, then V/2, …, 1, while whole
// vectors remain (fewer passes over the keys than single vectors where Ev is not a
// multiple of V vectors); d ends at the first dim past whole vectors.
template <int R, int V, class T>
HWY_INLINE void RowAccumulateBlocks(const float* HWY_RESTRICT pt, std::int64_t ps, const std::byte* const* v_rows,
                                    std::int64_t cols, std::int64_t Ev, std::int64_t& d, float* HWY_RESTRICT ot,
                                    std::int64_t stride) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
  for (; d + V * N <= Ev; d += V * N) RowAccumulateDims<R, V, T>(pt, ps, v_rows, cols, d, ot, stride);
  if constexpr (V > 1) RowAccumulateBlocks<R, V / 2, T>(pt, ps, v_rows, cols, Ev, d, ot, stride);
}

// Oᵀ[d][r] += Σ_{c < cols} pt[c·pt_stride + r] · v_c[d] for R rows and all Ev dims.
template <int R, class T>
HWY_NOINLINE void RowAccumulateFewRows(const float* HWY_RESTRICT pt, std::size_t pt_stride,
                                       const std::byte* const* v_rows, std::int64_t cols, std::int64_t Ev,
                                       float* HWY_RESTRICT ot, std::size_t rows) {
  const std::int64_t stride = static_cast<std::int64_t>(rows), ps = static_cast<std::int64_t>(pt_stride);
  std::int64_t d = 0;
  RowAccumulateBlocks<R, RegisterBlock<R>(), T>(pt, ps, v_rows, cols, Ev, d, ot, stride);
  for (; d < Ev; ++d)  // the dims past whole vectors
    for (int r = 0; r < R; ++r) {
      float sum = 0.0f;
      for (std::int64_t c = 0; c < cols; ++c) sum += pt[c * ps + r] * ToFloat(RowAt<T>(v_rows, c), d);
      ot[d * stride + r] += sum;
    }
}

// f(std::integral_constant<int, R>()) for the run-time row count R = rows, 1 <= rows <=
// kFewRows: the kernels are compiled per row count.
template <int R = 1, class F>
HWY_INLINE void WithRowCount(std::int64_t rows, F f) {
  if constexpr (R == kFewRows) {
    f(std::integral_constant<int, R>());
  } else if (rows == R) {
    f(std::integral_constant<int, R>());
  } else {
    WithRowCount<R + 1>(rows, f);
  }
}

// f(T(), std::integral_constant<int, R>()) for the element type T of dtype and the
// run-time row count R = rows: the kernels are compiled per type and row count.
template <class F>
HWY_INLINE void WithRowKernel(DType dtype, std::int64_t rows, F f) {
  WithRowType(dtype, [&](auto type) { WithRowCount(rows, [&](auto r) { f(type, r); }); });
}

// The two kernels for K or V rows of `dtype` (float32, bfloat16, float16 or int8) and a
// run-time row count 1 <= rows <= kFewRows.
inline void RowScores(DType dtype, std::int64_t rows, const float* q, std::int64_t E, const std::byte* const* k_rows,
                      std::int64_t cols, const float* k_scale, float* st, std::size_t st_stride) {
  WithRowKernel(dtype, rows, [&](auto type, auto r) {
    RowScoresFewRows<decltype(r)::value, decltype(type)>(q, E, k_rows, cols, k_scale, st, st_stride);
  });
}

inline void RowAccumulate(DType dtype, std::int64_t rows, const float* pt, std::size_t pt_stride,
                          const std::byte* const* v_rows, std::int64_t cols, std::int64_t Ev, float* ot,
                          std::size_t ot_rows) {
  WithRowKernel(dtype, rows, [&](auto type, auto r) {
    RowAccumulateFewRows<decltype(r)::value, decltype(type)>(pt, pt_stride, v_rows, cols, Ev, ot, ot_rows);
  });
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
