// The decode microkernels for a task of few query rows (decoding: Hq/Hkv · L <=
// kFewRows) over float32 or int8 K and V rows of unit column stride (int8: with
// Options::key_scale, value_scale). The forward's usual tiles put query rows along the
// lanes (one vector: 16 lanes on AVX-512), which for 4 rows wastes 3/4 of every FMA and
// costs a broadcast and an FMA per K or V element; here the lanes run along E (scores)
// or Ev (values) instead, so each element costs R/N FMAs (R rows, N lanes), and the rows
// are read (int8: widened in registers) straight from the cache, never into a tile:
//   st[c][r] = s^K_c · Σ_e q[r][e] · k_c[e]          (q pre-scaled by scale · log2(e); no s^K for float32)
//   ot[d][r] += Σ_c pt[c][r] · v_c[d]                 (pt already times s^V_c for int8)
// Results stay in the transposed (Sᵀ, Oᵀ) layout the rest of the forward uses. float32
// decoding took these for the tiles on 2026-11-27: 10–26 % faster on the Cascade Lake Xeon
// of bench/RESULTS.md.
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

#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// At most this many query rows take the decode kernels (their accumulators must fit the
// 16 vector registers of AVX2).
constexpr std::int64_t kFewRows = 8;

// N values of a K or V row at p as float32 lanes (int8: widened, exactly).
HWY_INLINE VF WidenRow(const std::int8_t* HWY_RESTRICT p) {
  const DF df;
  const hn::Rebind<std::int32_t, DF> di;
  const hn::Rebind<std::int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}
HWY_INLINE VF WidenRow(const float* HWY_RESTRICT p) { return hn::LoadU(DF(), p); }

// Keys [c, c + Keys) against R query rows q (row-major, R × E): the scores (times the
// keys' scales, if k_scale) into st[(c + k)·st_stride + r].
template <int R, int Keys, class T>
HWY_INLINE void RowScoreKeys(const float* HWY_RESTRICT q, std::int64_t E, const T* const* k_rows, std::int64_t c,
                             const float* k_scale, float* HWY_RESTRICT st, std::size_t st_stride) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t whole = E / N * N;
  VF acc[Keys][R];
  for (int k = 0; k < Keys; ++k)
    for (int r = 0; r < R; ++r) acc[k][r] = hn::Zero(df);
  for (std::int64_t e = 0; e < whole; e += N) {
    VF x[Keys];
    for (int k = 0; k < Keys; ++k) x[k] = WidenRow(k_rows[c + k] + e);
    for (int r = 0; r < R; ++r) {
      const VF qv = hn::LoadU(df, q + r * E + e);
      for (int k = 0; k < Keys; ++k) acc[k][r] = hn::MulAdd(qv, x[k], acc[k][r]);
    }
  }
  for (int k = 0; k < Keys; ++k)
    for (int r = 0; r < R; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[k][r]));
      for (std::int64_t e = whole; e < E; ++e) sum += q[r * E + e] * static_cast<float>(k_rows[c + k][e]);
      st[(c + k) * static_cast<std::int64_t>(st_stride) + r] = k_scale != nullptr ? sum * k_scale[c + k] : sum;
    }
}

// Sᵀ of keys [0, cols) (k_rows[c]: key c's row, unit stride; k_scale[c] its scale, or
// k_scale null) for R rows: two keys at a time while their accumulators fit the registers.
template <int R, class T>
HWY_NOINLINE void RowScoresFewRows(const float* q, std::int64_t E, const T* const* k_rows, std::int64_t cols,
                                   const float* k_scale, float* st, std::size_t st_stride) {
  constexpr int kPair = R <= 4 ? 2 : 1;
  std::int64_t c = 0;
  for (; c + kPair <= cols; c += kPair) RowScoreKeys<R, kPair, T>(q, E, k_rows, c, k_scale, st, st_stride);
  for (; c < cols; ++c) RowScoreKeys<R, 1, T>(q, E, k_rows, c, k_scale, st, st_stride);
}

// Oᵀ[d][r] += Σ_{c < cols} pt[c·pt_stride + r] · v_c[d] for R rows (v_rows[c]: value c's
// row, unit stride). The accumulators hold R rows × V vectors of dims over all the
// keys, then add into Oᵀ once per tile.
template <int R, class T>
HWY_NOINLINE void RowAccumulateFewRows(const float* HWY_RESTRICT pt, std::size_t pt_stride, const T* const* v_rows,
                                       std::int64_t cols, std::int64_t Ev, float* HWY_RESTRICT ot, std::size_t rows) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  constexpr int V = R <= 4 ? 2 : 1;
  const std::int64_t stride = static_cast<std::int64_t>(rows), ps = static_cast<std::int64_t>(pt_stride);
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  std::int64_t d = 0;
  for (; d + V * N <= Ev; d += V * N) {
    VF acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
    for (std::int64_t c = 0; c < cols; ++c) {
      VF x[V];
      for (int v = 0; v < V; ++v) x[v] = WidenRow(v_rows[c] + d + v * N);
      for (int r = 0; r < R; ++r) {
        const VF p = hn::Set(df, pt[c * ps + r]);
        for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(p, x[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) {
        hn::Store(acc[r][v], df, lanes);
        for (std::int64_t i = 0; i < N; ++i) ot[(d + v * N + i) * stride + r] += lanes[i];
      }
  }
  for (; d < Ev; ++d)  // the dims past whole vectors
    for (int r = 0; r < R; ++r) {
      float sum = 0.0f;
      for (std::int64_t c = 0; c < cols; ++c) sum += pt[c * ps + r] * static_cast<float>(v_rows[c][d]);
      ot[d * stride + r] += sum;
    }
}

// f(std::integral_constant<int, R>()) for the run-time row count R = rows, 1 <= rows <=
// kFewRows: the kernels are compiled per row count.
template <class F>
HWY_INLINE void WithRowCount(std::int64_t rows, F f) {
  static_assert(kFewRows == 8, "the cases below are written out for 8");
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 6:
      return f(std::integral_constant<int, 6>());
    case 7:
      return f(std::integral_constant<int, 7>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

// The two kernels for a run-time row count 1 <= rows <= kFewRows.
template <class T>
inline void RowScores(std::int64_t rows, const float* q, std::int64_t E, const T* const* k_rows, std::int64_t cols,
                      const float* k_scale, float* st, std::size_t st_stride) {
  WithRowCount(rows,
               [&](auto r) { RowScoresFewRows<decltype(r)::value, T>(q, E, k_rows, cols, k_scale, st, st_stride); });
}

template <class T>
inline void RowAccumulate(std::int64_t rows, const float* pt, std::size_t pt_stride, const T* const* v_rows,
                          std::int64_t cols, std::int64_t Ev, float* ot, std::size_t ot_rows) {
  WithRowCount(
      rows, [&](auto r) { RowAccumulateFewRows<decltype(r)::value, T>(pt, pt_stride, v_rows, cols, Ev, ot, ot_rows); });
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
