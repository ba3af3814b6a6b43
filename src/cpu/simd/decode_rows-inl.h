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
// Oᵀ stays in the transposed layout the rest of the forward uses (a dim a row, a query
// row a lane; int8 V's P·V sums its rows row-major over a task's tiles and is added into
// Oᵀ once, AddRowsTransposed); Sᵀ is either that layout's (a key every vector or two of
// rows) or dense (a key every G floats: DenseSoftmaxStep, simd/softmax_step-inl.h),
// st_stride apart.
// float32 decoding took these for the tiles on 2026-11-27 (10–26 % faster on the
// Cascade Lake Xeon of bench/RESULTS.md), bfloat16 and float16 later that day
// (2.0–2.3×). A bfloat16 query scores bfloat16 K on vdpbf16ps instead where
// bf16::chosen() (bf16::row_scores, the same layout: simd/bf16_kernels.h), and int8 K
// on vpdpwssd, the query rounded to int16 (int8::row_scores); its P·V of int8 V runs on
// vpdpwssd too (int8::row_accumulate, simd/int8_kernels.h; AddRowsTransposed below).
// On AVX-512 float32 rows (and bfloat16 and float16 ones for 3 or 4 query rows) are read
// whole, in turn (WholeRows): the loads' order set what the memory gave
// (docs/performance.md, "Whole rows in turn").
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#undef SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#else
#define SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/problem.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"
#include "cpu/simd/sums_of_lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// At most this many query rows take the decode kernels (their accumulators must fit the
// 16 vector registers of AVX2).
constexpr std::int64_t kFewRows = 8;

// Keys per tile of a task whose rows take these kernels: twice the tile kernels'
// kKeyTile. What a decode tile costs besides its keys' arithmetic — the row lists, the
// softmax's reference update and Oᵀ's rescale, the kernels' entry and epilogue (int8:
// its sums to float32) — is paid half as often; the tile kernels keep 96, sized for L1
// and L2 (docs/performance.md, "Decoding").
constexpr std::int64_t kDecodeKeyTile = 2 * kKeyTile;

// The kernels request row c + RowsAhead<T>'s lines while they compute with row c, so the
// row lists they take hold RowsAhead<T> rows past the tile (the next tile's rows, for
// int8 more).
// Requests spread over the arithmetic keep the memory busy while it runs; a burst of
// the next tile's lines at the tile's start (an earlier way) left the two in turn.
// float32, bfloat16 and float16 rows: 96 rows ahead (48 KiB for float32 at E = 128), a
// whole tile when the decode tiles were 96 keys, so that every K (V) row of a tile was
// requested while the tile before computed with its K (V) rows. At 32 rows ahead, a
// tile's K rows past its first 32 were requested only 32 rows before their turn, the V
// phase between having made no K request: an S = 65536 float32 call on the Zen 4, two
// threads, 6 alternating runs, median 26.6 ms at 32, 25.5 at 64, 22.0 at 96, 22.2 at 128
// (bfloat16 15.2 → 14.1 ms; float16, builds alternating, 10.8 → 9.9). int8 rows: 128, 16
// KiB (median 6.3 ms at 64, 5.3 at 128, 96 and 256 no better: docs/performance.md,
// "Decoding"). Since the decode tiles grew to 192 keys (kDecodeKeyTile), 96 is half a
// tile: 192 rows ahead, and int8's 256, were no faster on the Zen 5.
constexpr std::int64_t RowsAheadOf(std::size_t element_bytes) { return element_bytes == 1 ? 128 : 96; }
template <class T>
constexpr std::int64_t RowsAhead() {
  return RowsAheadOf(sizeof(T));
}
constexpr std::int64_t kMaxRowsAhead = std::max({RowsAheadOf(1), RowsAheadOf(2), RowsAheadOf(4)});

// Requests the 64-byte line of row[e] into L2 if e starts one (e: a multiple of the
// lanes): RequestLine, microkernels-inl.h (why L2, not L1).
template <class T>
HWY_INLINE void PrefetchLine(const T* row, std::int64_t e) {
  constexpr std::int64_t kPerLine = 64 / static_cast<std::int64_t>(sizeof(T));
  if (static_cast<std::int64_t>(hn::Lanes(DF())) >= kPerLine || e % kPerLine == 0) RequestLine(row + e);
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

// Keys [c, c + Keys) against R query rows q (row-major, R × E): the scores (times the
// keys' scales, if k_scale: spread = SpreadIndices(R)) into st[(c + k)·st_stride + r].
// k_scale is read up to N − 1 floats past the keys.
template <int R, int Keys, class T, class Spread>
HWY_INLINE void RowScoreKeys(const float* HWY_RESTRICT q, std::int64_t E, const std::byte* const* k_rows,
                             std::int64_t c, const float* k_scale, Spread spread, float* HWY_RESTRICT st,
                             std::size_t st_stride) {
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
      PrefetchLine(RowAt<T>(k_rows, c + k + RowsAhead<T>()), e);
    }
    for (int r = 0; r < R; ++r) {
      const VF qv = hn::LoadU(df, q + r * E + e);
      for (int k = 0; k < Keys; ++k) acc[k * R + r] = hn::MulAdd(qv, x[k], acc[k * R + r]);
    }
  }
  constexpr int kMaxN = static_cast<int>(hn::MaxLanes(DF()));
  HWY_ALIGN float sums[(M + kMaxN - 1) / kMaxN * kMaxN];
  SumsOfLanes<M>(acc, sums);
  if (HWY_UNLIKELY(whole < E))  // the dims past whole vectors
    for (int k = 0; k < Keys; ++k)
      for (int r = 0; r < R; ++r)
        for (std::int64_t e = whole; e < E; ++e) sums[k * R + r] += q[r * E + e] * ToFloat(RowAt<T>(k_rows, c + k), e);
  if (st_stride == static_cast<std::size_t>(R)) {  // a dense Sᵀ: the keys' scores lie in sums' order
    if (k_scale != nullptr)
      for (int i = 0; i < M; i += static_cast<int>(N)) {
        const VF factor = hn::TableLookupLanes(hn::LoadU(df, k_scale + c + i / R), spread);
        hn::Store(hn::Mul(hn::Load(df, sums + i), factor), df, sums + i);
      }
    std::copy(sums, sums + M, st + c * R);
    return;
  }
  // (A scale of 1 leaves a float32 score's bits as they are: no branch per score.)
  for (int k = 0; k < Keys; ++k) {
    const float factor = k_scale != nullptr ? k_scale[c + k] : 1.0f;
    for (int r = 0; r < R; ++r) st[(c + k) * static_cast<std::int64_t>(st_stride) + r] = sums[k * R + r] * factor;
  }
}

// Keys scored together and vectors of dims accumulated per pass over the keys for R rows
// but where WholeRows: as many as keep R times as many accumulators, and the rows'
// vectors, within the vector registers (32 on AVX-512, 16 below).
template <int R>
constexpr int RegisterBlock() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return R <= 2 ? 8 : R <= 4 ? 4 : 2;
#else
  return R <= 4 ? 2 : 1;
#endif
}

// Whether the kernels read K and V rows of T whole, one after another, for R query rows:
// on AVX-512, float32 rows and 3 rows or more, bfloat16 and float16 rows and 3 or 4 rows
// — the scores a key at a time (ScoreKeys; a bfloat16 query against bfloat16 K where
// bf16::chosen() takes bf16::row_scores instead, which holds the query likewise), the
// P·V in row groups (GroupRows). Steps over a vector of dims of each of 4 keys in turn
// read K from memory at ~35 GB/s where whole rows in turn read ~53 (a stand-alone loop of
// the kernel's shape, two threads, Zen 5: docs/performance.md, "Whole rows in turn"),
// though in the cache they compute faster. With 1 or 2 rows (fewer FMAs a key) a key at
// a time was level or slower. bfloat16 and float16 rows since the 192-key decode tiles
// (with 96-key tiles bfloat16 values in groups were level from memory): on the Zen 5,
// bfloat16 GQA 32/8 from memory +16 % in the host's slower memory phase, 7 % slower in
// its faster one and 6 % in cache; with 8 rows (4 groups, each widening the chunk's
// values again) 5–10 % slower. (Not measured on Intel, where bfloat16 scores take
// ScoreKeys too.)
template <int R, class T>
constexpr bool WholeRows() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return sizeof(T) == 4 ? R >= 3 : R >= 3 && R <= 4;
#else
  return false;
#endif
}

// Keys RowScoresFewRows scores together for R rows of T: one where WholeRows, else
// RegisterBlock<R>().
template <int R, class T>
constexpr int ScoreKeys() {
  return WholeRows<R, T>() ? 1 : RegisterBlock<R>();
}

// Sᵀ of keys [0, cols) (k_rows[c]: key c's row, unit stride; k_scale[c] its scale, or
// k_scale null) for R rows: ScoreKeys<R, T>() keys at a time.
template <int R, class T>
HWY_NOINLINE void RowScoresFewRows(const float* q, std::int64_t E, const std::byte* const* k_rows, std::int64_t cols,
                                   const float* k_scale, float* st, std::size_t st_stride) {
  constexpr int kKeys = ScoreKeys<R, T>();
  const auto spread = SpreadIndices(R);
  std::int64_t c = 0;
  for (; c + kKeys <= cols; c += kKeys) RowScoreKeys<R, kKeys, T>(q, E, k_rows, c, k_scale, spread, st, st_stride);
  for (; c < cols; ++c) RowScoreKeys<R, 1, T>(q, E, k_rows, c, k_scale, spread, st, st_stride);
}

// ot[d·stride + r] += lane d mod N of acc[r][d / N], for R rows and the V·N dims d.
template <int R, int V>
HWY_INLINE void AddTransposed(const VF (&acc)[R][V], float* HWY_RESTRICT ot, std::int64_t stride) {
  const DF df;
  const auto N = static_cast<std::int64_t>(hn::Lanes(df));
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  // 4 rows at a time, by a 4 × 4 transpose in each block: one vector add a dim for the 4
  // rows, where a scalar add per row and dim (a load, an add and a store each) was the
  // kernel's costliest part after its loop. Rows past R add 0 to Oᵀ's padding lanes
  // (rows is a multiple of 4 here).
  const hn::Repartition<double, DF> d64;  // (double: no int/float domain crossing)
  const hn::CappedTag<float, 4> d4;
  for (int r0 = 0; r0 < R; r0 += 4)
    for (int v = 0; v < V; ++v) {
      const auto row = [&](int r) { return r0 + r < R ? acc[r0 + r][v] : hn::Zero(df); };
      const auto t01 = hn::BitCast(d64, hn::InterleaveLower(df, row(0), row(1)));  // per block: dims 0, 1
      const auto t23 = hn::BitCast(d64, hn::InterleaveLower(df, row(2), row(3)));
      const auto u01 = hn::BitCast(d64, hn::InterleaveUpper(df, row(0), row(1)));  // dims 2, 3
      const auto u23 = hn::BitCast(d64, hn::InterleaveUpper(df, row(2), row(3)));
      const VF dims[4] = {
          hn::BitCast(df, hn::InterleaveLower(d64, t01, t23)), hn::BitCast(df, hn::InterleaveUpper(d64, t01, t23)),
          hn::BitCast(df, hn::InterleaveLower(d64, u01, u23)), hn::BitCast(df, hn::InterleaveUpper(d64, u01, u23))};
      for (int m = 0; m < 4; ++m) {  // dims[m], block j: dim 4j + m's 4 rows
        hn::Store(dims[m], df, lanes);
        for (std::int64_t j = 0; j < N / 4; ++j) {
          float* at = ot + (v * N + 4 * j + m) * stride + r0;
          hn::Store(hn::Add(hn::Load(d4, at), hn::Load(d4, lanes + 4 * j)), d4, at);
        }
      }
    }
#else
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      hn::Store(acc[r][v], df, lanes);
      for (std::int64_t i = 0; i < N; ++i) ot[(v * N + i) * stride + r] += lanes[i];
    }
#endif
}

// Oᵀ[d·stride + r] += o[r·Ev + d] for R rows and all Ev dims: a row-major result (that of
// int8::row_accumulate) into the transposed layout.
template <int R>
HWY_INLINE void AddRowsTransposed(const float* HWY_RESTRICT o, std::int64_t Ev, float* HWY_RESTRICT ot,
                                  std::int64_t stride) {
  const DF df;
  const auto N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t d = 0;
  for (; d + N <= Ev; d += N) {
    VF acc[R][1];
    for (int r = 0; r < R; ++r) acc[r][0] = hn::LoadU(df, o + r * Ev + d);
    AddTransposed<R, 1>(acc, ot + d * stride, stride);
  }
  for (; d < Ev; ++d)
    for (int r = 0; r < R; ++r) ot[d * stride + r] += o[r * Ev + d];
}

// x[d] *= factor for d < n: a row-major row's rescale (the int8 P·V's rows, summed
// row-major over a decode task's tiles, when the softmax's reference max moves).
HWY_INLINE void ScaleRow(float* HWY_RESTRICT x, std::int64_t n, float factor) {
  const DF df;
  const auto N = static_cast<std::int64_t>(hn::Lanes(df));
  const VF f = hn::Set(df, factor);
  std::int64_t d = 0;
  for (; d + N <= n; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, x + d), f), df, x + d);
  for (; d < n; ++d) x[d] *= factor;
}

// Keys a chunk of RowAccumulateDims reads: a chunk's float32 values (16 KiB at Ev = 128)
// are meant to stay in L1 from one group's pass to the next.
constexpr std::int64_t kChunkKeys = 32;

// acc[r][v] += Σ_{c0 <= c < c1} pt[c·ps + r] · v_c[d0 + v·N + lane] for the rows [kFirst,
// R) in groups of G, each group's accumulators in registers over the keys; the first
// group requests the lines of the rows ahead.
template <int R, int G, int kFirst, int V, class T>
HWY_INLINE void AccumulateGroups(VF (&acc)[R][V], const float* HWY_RESTRICT pt, std::int64_t ps,
                                 const std::byte* const* v_rows, std::int64_t c0, std::int64_t c1, std::int64_t d0) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  constexpr int kRows = std::min(G, R - kFirst);
  VF a[kRows][V];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) a[r][v] = acc[kFirst + r][v];
  for (std::int64_t c = c0; c < c1; ++c) {
    VF x[V];
    for (int v = 0; v < V; ++v) {
      x[v] = WidenRow(RowAt<T>(v_rows, c) + d0 + v * N);
      if constexpr (kFirst == 0) PrefetchLine(RowAt<T>(v_rows, c + RowsAhead<T>()), d0 + v * N);
    }
    for (int r = 0; r < kRows; ++r) {
      const VF p = hn::Set(df, pt[c * ps + kFirst + r]);
      for (int v = 0; v < V; ++v) a[r][v] = hn::MulAdd(p, x[v], a[r][v]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) acc[kFirst + r][v] = a[r][v];
  if constexpr (kFirst + G < R) AccumulateGroups<R, G, kFirst + G, V, T>(acc, pt, ps, v_rows, c0, c1, d0);
}

// Rows a group of RowAccumulateDims takes for V vectors of dims: all R, or with kGrouped
// as many as keep 16 accumulators (2 at 8 vectors, 4 at 4, 8 at 2).
template <int R, int V, bool kGrouped>
constexpr int GroupRows() {
  return kGrouped ? std::min(R, 16 / V) : R;
}

// Oᵀ[d][r] += Σ_{c < cols} pt[c·pt_stride + r] · v_c[d] for R rows and the V·N dims
// [d0, d0 + V·N) (v_rows[c]: value c's row, unit stride). The accumulators hold R rows ×
// V vectors of dims over all the keys, then add into Oᵀ once per tile. With groups of
// fewer than R rows the keys go in chunks, every group over one chunk before the next.
template <int R, int V, bool kGrouped, class T>
HWY_INLINE void RowAccumulateDims(const float* HWY_RESTRICT pt, std::int64_t ps, const std::byte* const* v_rows,
                                  std::int64_t cols, std::int64_t d0, float* HWY_RESTRICT ot, std::int64_t stride) {
  constexpr int G = GroupRows<R, V, kGrouped>();
  const DF df;
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  const std::int64_t chunk = G < R ? kChunkKeys : cols;
  for (std::int64_t c0 = 0; c0 < cols; c0 += chunk)
    AccumulateGroups<R, G, 0, V, T>(acc, pt, ps, v_rows, c0, std::min(cols, c0 + chunk), d0);
  AddTransposed<R, V>(acc, ot + d0 * stride, stride);
}

// Oᵀ += … for the dims from d on, in blocks of V vectors, then V/2, …, 1, while whole
// vectors remain (fewer passes over the keys than single vectors where Ev is not a
// multiple of V vectors); d ends at the first dim past whole vectors.
template <int R, int V, bool kGrouped, class T>
HWY_INLINE void RowAccumulateBlocks(const float* HWY_RESTRICT pt, std::int64_t ps, const std::byte* const* v_rows,
                                    std::int64_t cols, std::int64_t Ev, std::int64_t& d, float* HWY_RESTRICT ot,
                                    std::int64_t stride) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
  for (; d + V * N <= Ev; d += V * N) RowAccumulateDims<R, V, kGrouped, T>(pt, ps, v_rows, cols, d, ot, stride);
  if constexpr (V > 1) RowAccumulateBlocks<R, V / 2, kGrouped, T>(pt, ps, v_rows, cols, Ev, d, ot, stride);
}

// Oᵀ[d][r] += Σ_{c < cols} pt[c·pt_stride + r] · v_c[d] for R rows and all Ev dims.
// Where WholeRows, a pass reads each value whole where 16 accumulators allow (8 vectors:
// 2 rows; 4: 4 rows), the rows in groups over each chunk of keys (the later groups read
// the chunk again, meant to come from L1), not all R rows over a part of each value's
// dims a pass: passes over the halves of a tile's values read from memory ~17 % slower
// (a stand-alone loop: docs/performance.md, "Whole rows in turn").
template <int R, class T>
HWY_NOINLINE void RowAccumulateFewRows(const float* HWY_RESTRICT pt, std::size_t pt_stride,
                                       const std::byte* const* v_rows, std::int64_t cols, std::int64_t Ev,
                                       float* HWY_RESTRICT ot, std::size_t rows) {
  const std::int64_t stride = static_cast<std::int64_t>(rows), ps = static_cast<std::int64_t>(pt_stride);
  constexpr bool kGrouped = WholeRows<R, T>();
  constexpr int kVectors = kGrouped ? 8 : RegisterBlock<R>();
  std::int64_t d = 0;
  RowAccumulateBlocks<R, kVectors, kGrouped, T>(pt, ps, v_rows, cols, Ev, d, ot, stride);
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

inline void AddRowsTransposed(std::int64_t rows, const float* o, std::int64_t Ev, float* ot, std::size_t ot_rows) {
  WithRowCount(rows, [&](auto r) {
    AddRowsTransposed<decltype(r)::value>(o, Ev, ot, static_cast<std::int64_t>(ot_rows));
  });
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_DECODE_ROWS_INL_H_
