#include "cpu/simd/bf16_kernels.h"

#include <immintrin.h>

#include <atomic>
#include <cstring>

#include "cpu/simd/lane_sums.h"

#define SDPA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace sdpa::detail::bf16 {

namespace {

SDPA_BF16_TARGET inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

SDPA_BF16_TARGET inline __m512bh broadcast_pair(const std::uint16_t* pair) {
  std::int32_t bits;
  std::memcpy(&bits, pair, sizeof bits);
  return as_bh(_mm512_set1_epi32(bits));
}

// The one register block of every product here: for I items i and V vectors v of 16
// lanes, out[i·out_item + 16v + lane] = (Add ? out : 0) + Σ_{s < steps}
// dot(a[s·a_step + 32v + 2·lane ..], b[i·b_item + s·b_step ..]) — a vector of a's pairs
// against one broadcast pair of b — times `scale` when not Add. Scores: a = Q pairs, b = K
// rows; P·V and dQ: a = P (dS) pairs, b = V (K) pairs; dK, dV: a = Q (dO) row pairs,
// b = dSᵀ (Wᵀ).
// kRequest (scores): each item's line `ahead` elements on is requested as the steps reach
// its own (b's rows read along their pairs, a line every 16 steps).
template <int I, int V, bool Add, bool kRequest = false>
SDPA_BF16_TARGET inline void OuterBlock(const std::uint16_t* a, std::int64_t a_step, const std::uint16_t* b,
                                        std::int64_t b_item, std::int64_t b_step, std::int64_t steps, float* out,
                                        std::int64_t out_item, float scale = 1.0f, std::int64_t ahead = 0) {
  // Every loop over the accumulators fully unrolled: GCC otherwise keeps them in a stack
  // array as well, and zeroes, stores and reloads it around the loop on each call (7 %
  // of a 64-step score block on Zen 4). The pragmas' counts bound the block.
  static_assert(I <= 12 && V <= 4, "the unroll pragmas below cover at most 12 items and 4 vectors");
  __m512 acc[I][V];
#pragma GCC unroll 12
  for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = Add ? _mm512_loadu_ps(out + i * out_item + v * 16) : _mm512_setzero_ps();
  for (std::int64_t s = 0; s < steps; ++s) {
    if constexpr (kRequest)
      if (s % 16 == 0)
        for (int i = 0; i < I; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(b + i * b_item + s * b_step + ahead), _MM_HINT_T1);
    __m512bh x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) x[v] = as_bh(_mm512_loadu_si512(a + s * a_step + v * 32));
#pragma GCC unroll 12
    for (int i = 0; i < I; ++i) {
      const __m512bh pair = broadcast_pair(b + i * b_item + s * b_step);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], x[v], pair);
    }
  }
  const __m512 factor = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      if constexpr (Add)
        _mm512_storeu_ps(out + i * out_item + v * 16, acc[i][v]);
      else
        _mm512_storeu_ps(out + i * out_item + v * 16, _mm512_mul_ps(acc[i][v], factor));
}

// One step of row_score_keys: dims [e, e + 32), masked.
template <int R, int Keys>
SDPA_BF16_TARGET inline __attribute__((always_inline)) void score_step(const std::uint16_t* q, std::int64_t E,
                                                                       std::int64_t e, __mmask32 mask,
                                                                       const std::byte* const* k_rows, std::int64_t c,
                                                                       std::int64_t ahead, __m512 (&acc)[Keys * R]) {
  const auto key = [&](std::int64_t i) { return reinterpret_cast<const std::uint16_t*>(k_rows[c + i]); };
  __m512bh qv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) qv[r] = as_bh(_mm512_maskz_loadu_epi16(mask, q + r * E + e));
#pragma GCC unroll 16
  for (int k = 0; k < Keys; ++k) {
    const __m512bh kv = as_bh(_mm512_maskz_loadu_epi16(mask, key(k) + e));
    _mm_prefetch(reinterpret_cast<const char*>(key(k + ahead) + e), _MM_HINT_T1);  // a 64-byte line a step
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[k * R + r] = _mm512_dpbf16_ps(acc[k * R + r], qv[r], kv);
  }
}

// Keys [c, c + Keys) against R query rows: see row_scores. The R rows' q vectors stay in
// registers and each key's vector is read once per step, so that Keys · R = 16
// accumulators, R q vectors and a key vector fit the 32 registers. Steps: E / 32 when
// the caller knows it (unrolled, unmasked), else 0 (E from the argument, the last step
// masked: its lanes past E read as 0 in both operands, so a key's NaN past E never
// meets them).
template <int R, int Keys, int Steps>
SDPA_BF16_TARGET inline void row_score_keys(const std::uint16_t* q, std::int64_t E, const std::byte* const* k_rows,
                                            std::int64_t c, std::int64_t ahead, float scale, float* st,
                                            std::int64_t st_stride) {
  __m512 acc[Keys * R];
#pragma GCC unroll 16
  for (int i = 0; i < Keys * R; ++i) acc[i] = _mm512_setzero_ps();
  if constexpr (Steps > 0) {
#pragma GCC unroll 8
    for (int step = 0; step < Steps; ++step)
      score_step<R, Keys>(q, 32 * Steps, 32 * step, ~__mmask32{0}, k_rows, c, ahead, acc);
  } else {
    for (std::int64_t e = 0; e < E; e += 32)
      score_step<R, Keys>(q, E, e, E - e >= 32 ? ~__mmask32{0} : (__mmask32{1} << (E - e)) - 1, k_rows, c, ahead, acc);
  }
  store_score_lanes<R, Keys>(_mm512_mul_ps(lane_sums<Keys * R>(acc), _mm512_set1_ps(scale)), c, st, st_stride);
}

// Keys [c, c + Keys) against R query rows whose Steps vectors each stay in registers
// (qv): one key's row read whole after another, where row_score_keys reads a vector of
// each of its keys a step.
template <int R, int Keys, int Steps>
SDPA_BF16_TARGET inline __attribute__((always_inline)) void row_score_keys_whole(const __m512bh (&qv)[R][Steps],
                                                                                 const std::byte* const* k_rows,
                                                                                 std::int64_t c, std::int64_t ahead,
                                                                                 float scale, float* st,
                                                                                 std::int64_t st_stride) {
  const auto key = [&](std::int64_t i) { return reinterpret_cast<const std::uint16_t*>(k_rows[c + i]); };
  __m512 acc[Keys * R];
#pragma GCC unroll 16
  for (int i = 0; i < Keys * R; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int k = 0; k < Keys; ++k)
#pragma GCC unroll 8
    for (int step = 0; step < Steps; ++step) {
      const __m512bh kv = as_bh(_mm512_loadu_si512(key(k) + 32 * step));
      _mm_prefetch(reinterpret_cast<const char*>(key(k + ahead) + 32 * step), _MM_HINT_T1);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[k * R + r] = _mm512_dpbf16_ps(acc[k * R + r], qv[r][step], kv);
    }
  store_score_lanes<R, Keys>(_mm512_mul_ps(lane_sums<Keys * R>(acc), _mm512_set1_ps(scale)), c, st, st_stride);
}

// row_scores for R rows. Up to 4 rows whose vectors fit 16 registers (R · E/32 ≤ 16: E
// up to 128) are loaded once and each key's row read whole in turn, 8 / R keys a block
// (8 or 6 accumulators, blocks of ≥ 2 keys to share a reduction): on the Zen 5, 5-7 %
// faster in cache at 1 and 4 rows than steps over a vector of each of 16 / R keys, and
// level from memory (-2 to +5 %: docs/performance.md, "Whole rows in turn"). Otherwise
// blocks of 16 / R keys, the rows' vectors loaded a step. The last keys one at a time.
template <int R, int Steps>
SDPA_BF16_TARGET void row_scores_steps(const std::uint16_t* q, std::int64_t E, const std::byte* const* k_rows,
                                       std::int64_t cols, std::int64_t ahead, float scale, float* st,
                                       std::int64_t st_stride) {
  if constexpr (Steps > 0 && R * Steps <= 16 && R <= 4) {
    constexpr int kKeys = 8 / R;
    __m512bh qv[R][Steps];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int step = 0; step < Steps; ++step) qv[r][step] = as_bh(_mm512_loadu_si512(q + r * E + 32 * step));
    std::int64_t c = 0;
    for (; c + kKeys <= cols; c += kKeys)
      row_score_keys_whole<R, kKeys, Steps>(qv, k_rows, c, ahead, scale, st, st_stride);
    for (; c < cols; ++c) row_score_keys_whole<R, 1, Steps>(qv, k_rows, c, ahead, scale, st, st_stride);
    return;
  }
  constexpr int kKeys = 16 / R;
  std::int64_t c = 0;
  for (; c + kKeys <= cols; c += kKeys) row_score_keys<R, kKeys, Steps>(q, E, k_rows, c, ahead, scale, st, st_stride);
  for (; c < cols; ++c) row_score_keys<R, 1, Steps>(q, E, k_rows, c, ahead, scale, st, st_stride);
}

// The common head sizes (64, 128) with their steps known: unrolled and unmasked, 7-9 %
// faster a decode call in cache on Zen 4 (docs/performance.md, "Decoding").
template <int R>
SDPA_BF16_TARGET void row_scores_for(const std::uint16_t* q, std::int64_t E, const std::byte* const* k_rows,
                                     std::int64_t cols, std::int64_t ahead, float scale, float* st,
                                     std::int64_t st_stride) {
  if (E == 128)
    row_scores_steps<R, 4>(q, E, k_rows, cols, ahead, scale, st, st_stride);
  else if (E == 64)
    row_scores_steps<R, 2>(q, E, k_rows, cols, ahead, scale, st, st_stride);
  else
    row_scores_steps<R, 0>(q, E, k_rows, cols, ahead, scale, st, st_stride);
}

}  // namespace

bool supported() {
  static const bool has = [] {  // (asked by every forward and backward call, and task)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

namespace {
// -1: the CPU's own choice; 0 or 1: a test's (choose_for_test).
std::atomic<int> forced_choice{-1};
}  // namespace

bool chosen() {
  // (supported() runs first: its __builtin_cpu_init is what __builtin_cpu_is reads.)
  static const bool fast = supported() && __builtin_cpu_is("amd");
  const int forced = forced_choice.load(std::memory_order_relaxed);
  return forced < 0 ? fast : forced == 1 && supported();
}

void choose_for_test(std::optional<bool> take) { forced_choice.store(take ? int{*take} : -1); }

SDPA_BF16_TARGET void score_block(const std::uint16_t* qp, std::int64_t pairs, const std::uint16_t* k,
                                  std::int64_t k_stride, float scale, float* st, std::int64_t st_stride,
                                  std::int64_t ahead) {
  if (ahead != 0)
    OuterBlock<kKeyBlock, 2, false, true>(qp, 2 * kRows, k, k_stride, 2, pairs, st, st_stride, scale, ahead);
  else
    OuterBlock<kKeyBlock, 2, false>(qp, 2 * kRows, k, k_stride, 2, pairs, st, st_stride, scale);
}

SDPA_BF16_TARGET void pack_pairs(const float* x, std::int64_t stride, std::int64_t pairs, std::int64_t width,
                                 std::uint16_t* out) {
  // cvtne2ps_pbh(b, a) puts bf16(a) in the low 16 lanes and bf16(b) in the high 16;
  // the permutation interleaves them into (x[2p][w], x[2p+1][w]) pairs.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (std::int64_t p = 0; p < pairs; ++p)
    for (std::int64_t w = 0; w < width; w += 16) {
      const __m512 even = _mm512_loadu_ps(x + (2 * p) * stride + w);
      const __m512 odd = _mm512_loadu_ps(x + (2 * p + 1) * stride + w);
      const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
      _mm512_storeu_si512(out + p * 2 * width + 2 * w, _mm512_permutexvar_epi16(interleave, packed));
    }
}

void pack_along_width(float* xt, std::int64_t width, std::int64_t rows, std::uint16_t* xp) {
  if (width % 2) std::memset(xt + width * rows, 0, static_cast<std::size_t>(rows) * sizeof(float));
  pack_pairs(xt, rows, (width + 1) / 2, rows, xp);
}

SDPA_BF16_TARGET void round_floats(const float* x, std::int64_t n, std::uint16_t* out) {
  for (std::int64_t i = 0; i < n; i += 32) {
    const __m512i packed =
        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
    _mm512_storeu_si512(out + i, packed);
  }
}

SDPA_BF16_TARGET void pack_values(const std::uint16_t* v, std::int64_t v_stride, std::int64_t cols, std::int64_t Ev,
                                  std::uint16_t* vp, std::int64_t ahead) {
  // permutex2var picks from (a, b) with index bit 5 choosing b: low and high halves of
  // the interleave (a0 b0 a1 b1 ... a31 b31).
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (std::int64_t c = 0; c < cols; c += 2) {
    const std::uint16_t* a = v + c * v_stride;
    const std::uint16_t* b = c + 1 < cols ? v + (c + 1) * v_stride : nullptr;
    std::uint16_t* out = vp + (c / 2) * 2 * Ev;
    for (std::int64_t d = 0; d < Ev; d += 32) {
      const std::int64_t n = Ev - d < 32 ? Ev - d : 32;
      const __mmask32 in_mask = n == 32 ? 0xffffffffu : ((1u << n) - 1);
      const __m512i va = _mm512_maskz_loadu_epi16(in_mask, a + d);
      const __m512i vb = b ? _mm512_maskz_loadu_epi16(in_mask, b + d) : _mm512_setzero_si512();
      if (ahead != 0) {
        _mm_prefetch(reinterpret_cast<const char*>(a + d + ahead), _MM_HINT_T1);
        if (b) _mm_prefetch(reinterpret_cast<const char*>(b + d + ahead), _MM_HINT_T1);
      }
      const __m512i lo = _mm512_permutex2var_epi16(va, low, vb), hi = _mm512_permutex2var_epi16(va, high, vb);
      const std::int64_t lo_n = n < 16 ? 2 * n : 32, hi_n = n > 16 ? 2 * (n - 16) : 0;
      _mm512_mask_storeu_epi16(out + 2 * d, lo_n == 32 ? 0xffffffffu : ((1u << lo_n) - 1), lo);
      if (hi_n > 0) _mm512_mask_storeu_epi16(out + 2 * d + 32, hi_n == 32 ? 0xffffffffu : ((1u << hi_n) - 1), hi);
    }
  }
}

SDPA_BF16_TARGET void accumulate(const std::uint16_t* pp, std::int64_t col_pairs, const std::uint16_t* vp,
                                 std::int64_t Ev, float* ot) {
  std::int64_t d = 0;
  for (; d + kValueBlock <= Ev; d += kValueBlock)
    OuterBlock<kValueBlock, 2, true>(pp, 2 * kRows, vp + 2 * d, 2, 2 * Ev, col_pairs, ot + d * kRows, kRows);
  for (; d < Ev; ++d) OuterBlock<1, 2, true>(pp, 2 * kRows, vp + 2 * d, 2, 2 * Ev, col_pairs, ot + d * kRows, kRows);
}

void accumulate_keys(const float* pt, std::int64_t pt_stride, std::int64_t cols, std::int64_t tile_cols,
                     const std::uint16_t* v, std::int64_t v_stride, std::int64_t Ev, std::uint16_t* pp,
                     std::uint16_t* vp, std::int64_t* packed_rows, float* ot, std::int64_t ahead) {
  const std::int64_t pack_rows = cols % 2 ? cols : tile_cols;
  if (*packed_rows != pack_rows) {
    pack_values(v, v_stride, pack_rows, Ev, vp, ahead);
    *packed_rows = pack_rows;
  }
  const std::int64_t pairs = (cols + 1) / 2;
  pack_pairs(pt, pt_stride, pairs, kRows, pp);
  accumulate(pp, pairs, vp, Ev, ot);
}

SDPA_BF16_TARGET void rank_update(const std::uint16_t* wt, std::int64_t wt_stride, std::int64_t pair0,
                                  std::int64_t pair1, const std::uint16_t* xp, std::int64_t width, float* acc,
                                  std::int64_t acc_stride) {
  // 4 vectors of dims × 6 keys: 24 accumulators, 4 loads and 6 broadcasts per 24 products.
  const std::uint16_t* x = xp + pair0 * 2 * width;
  const std::uint16_t* w = wt + 2 * pair0;
  const std::int64_t steps = pair1 - pair0;
  std::int64_t d = 0;
  for (; d + 64 <= width; d += 64)
    OuterBlock<kRankKeys, 4, true>(x + 2 * d, 2 * width, w, wt_stride, 2, steps, acc + d, acc_stride);
  for (; d + 32 <= width; d += 32)
    OuterBlock<kRankKeys, 2, true>(x + 2 * d, 2 * width, w, wt_stride, 2, steps, acc + d, acc_stride);
  for (; d < width; d += 16)
    OuterBlock<kRankKeys, 1, true>(x + 2 * d, 2 * width, w, wt_stride, 2, steps, acc + d, acc_stride);
}

void row_scores(const std::uint16_t* q, std::int64_t rows, std::int64_t E, const std::byte* const* k_rows,
                std::int64_t cols, std::int64_t ahead, float scale, float* st, std::int64_t st_stride) {
  using Kernel = void (*)(const std::uint16_t*, std::int64_t, const std::byte* const*, std::int64_t, std::int64_t,
                          float, float*, std::int64_t);
  static constexpr Kernel kernels[kMaxDecodeRows] = {row_scores_for<1>, row_scores_for<2>, row_scores_for<3>,
                                                     row_scores_for<4>, row_scores_for<5>, row_scores_for<6>,
                                                     row_scores_for<7>, row_scores_for<8>};
  kernels[rows - 1](q, E, k_rows, cols, ahead, scale, st, st_stride);
}

}  // namespace sdpa::detail::bf16
