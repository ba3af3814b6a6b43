#include "cpu/simd/int8_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cassert>

#define SDPA_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace sdpa::detail::int8 {

namespace {

// (GCC 12 flags the self-initialised `_mm512_undefined_*` inside the widening intrinsics
// below as maybe uninitialised once they are inlined: its bug 105593.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The int32 sums' headroom: a pair adds at most 2 · 32767 · 128 < 2^23, so kMaxKeys / 2
// pairs stay below 2^30 < 2^31.
static_assert(kMaxKeys / 2 * 2.0 * 32767 * 128 < 2147483648.0, "int32 sums must not overflow");

// pairs[k·kMaxRows + r] = (ŵ[r][2k], ŵ[r][2k+1]) as int16 halves (low, high) and sigma[r],
// for the R rows: ŵ = round(w / σ_r), σ_r = max_c |w[r][c]| / 32767 (0 for a row of
// zeros). False when some weight is not finite, or a row's largest is below
// kSmallestLargest but not 0: there 32767 / max would overflow float32 (to +inf, and the
// row's tile would add nothing) or σ be subnormal (0 under a caller's flush-to-zero).
constexpr float kSmallestLargest = 0x1p-96f;
template <int R>
SDPA_INT8_TARGET bool pack_weights(const float* wt, std::int64_t wt_stride, std::int64_t cols, std::int32_t* pairs,
                                   float* sigma) {
  constexpr __mmask8 kRows = static_cast<__mmask8>((1u << R) - 1);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 largest = _mm256_setzero_ps();
  __mmask8 bad = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const __m256 w = _mm256_and_ps(_mm256_maskz_loadu_ps(kRows, wt + c * wt_stride), magnitude);
    bad |= _mm256_cmp_ps_mask(w, _mm256_set1_ps(3.4028235e38f), _CMP_NLE_UQ);  // inf or NaN
    largest = _mm256_max_ps(largest, w);
  }
  const __mmask8 nonzero = _mm256_cmp_ps_mask(largest, _mm256_setzero_ps(), _CMP_GT_OQ);
  bad |= nonzero & _mm256_cmp_ps_mask(largest, _mm256_set1_ps(kSmallestLargest), _CMP_LT_OQ);
  if (bad) return false;
  const __m256 inverse = _mm256_maskz_div_ps(nonzero, _mm256_set1_ps(32767.0f), largest);
  _mm256_storeu_ps(sigma, _mm256_div_ps(largest, _mm256_set1_ps(32767.0f)));
  for (std::int64_t c = 0; c < cols; c += 2) {
    // (cvtps_epi32 rounds to nearest, even, under the default MXCSR.)
    const __m256i even = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskz_loadu_ps(kRows, wt + c * wt_stride), inverse));
    const __m256i odd =
        c + 1 < cols
            ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskz_loadu_ps(kRows, wt + (c + 1) * wt_stride), inverse))
            : _mm256_setzero_si256();
    const __m256i pair = _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(odd, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + (c / 2) * kMaxRows), pair);
  }
  return true;
}

// acc + vpdpwssd(a, b), in inline assembly on values: with the intrinsic GCC 12 copied
// every accumulator to another register and back around each key pair (32 moves per 16
// products); with assembly on the accumulator array's elements, it kept them in memory
// (0.59 ms a call against 0.34). This way the loop holds them in registers: 0.300 ->
// 0.295 ms a decode call in cache on Zen 4 (docs/performance.md, "Decoding").
SDPA_INT8_TARGET inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "v"(b));  // (AT&T | Intel syntax)
  return acc;
}

// acc[r][·] += the R rows' weights of keys c, c + 1 (Partner; else key c alone) times
// their V dims [d0, d0 + 16·V) (masked by mask[h] a pair of vectors h).
template <int R, int V, bool Partner>
SDPA_INT8_TARGET inline __attribute__((always_inline)) void add_pair(__m512i (&acc)[R][V], const std::int32_t* pairs,
                                                                     const std::byte* const* v_rows, std::int64_t c,
                                                                     std::int64_t ahead, std::int64_t d0,
                                                                     const __mmask32* mask) {
  const auto row = [&](std::int64_t k) { return reinterpret_cast<const std::int8_t*>(v_rows[k]) + d0; };
  // Block j of x[2h] (x[2h+1]): dims 32h + 8j + 0..3 (4..7) of keys c and c + 1 as
  // int16 pairs (unpacklo/hi work within 128-bit blocks; the epilogue reorders).
  __m512i x[V];
#pragma GCC unroll 4
  for (int h = 0; h < V / 2; ++h) {
    const __m512i a = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask[h], row(c) + 32 * h));
    const __m512i b =
        Partner ? _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask[h], row(c + 1) + 32 * h)) : _mm512_setzero_si512();
    if (h % 2 == 0) {  // a request per 64-byte line
      _mm_prefetch(reinterpret_cast<const char*>(row(c + ahead) + 32 * h), _MM_HINT_T1);
      if (Partner) _mm_prefetch(reinterpret_cast<const char*>(row(c + 1 + ahead) + 32 * h), _MM_HINT_T1);
    }
    x[2 * h] = _mm512_unpacklo_epi16(a, b);
    x[2 * h + 1] = _mm512_unpackhi_epi16(a, b);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512i w = _mm512_set1_epi32(pairs[(c / 2) * kMaxRows + r]);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = dpwssd(acc[r][v], x[v], w);
  }
}

// out[r·Ev + d] for the dims [d0, d0 + n), n <= 16·V (V even: 32 dims a pair of vectors).
template <int R, int V>
SDPA_INT8_TARGET void accumulate_dims(const std::int32_t* pairs, const float* sigma, const std::byte* const* v_rows,
                                      std::int64_t cols, std::int64_t Ev, std::int64_t ahead, std::int64_t d0,
                                      std::int64_t n, float* out) {
  static_assert(V % 2 == 0 && V <= 8 && R <= kMaxRows, "the unroll pragmas below cover these");
  __mmask32 mask[V / 2];
  for (int h = 0; h < V / 2; ++h) {
    const std::int64_t left = n - 32 * h;
    mask[h] = left >= 32 ? ~__mmask32{0} : left > 0 ? (__mmask32{1} << left) - 1 : 0;
  }
  __m512i acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_si512();
  // Whole pairs, then a last odd key against zeros: no branch on a partner in the loop.
  std::int64_t c = 0;
  for (; c + 1 < cols; c += 2) add_pair<R, V, true>(acc, pairs, v_rows, c, ahead, d0, mask);
  if (c < cols) add_pair<R, V, false>(acc, pairs, v_rows, c, ahead, d0, mask);
  // Dims in order: 4 lanes of the low vector, 4 of the high one, block by block.
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(sigma[r]);
#pragma GCC unroll 4
    for (int h = 0; h < V / 2; ++h) {
      const __m512 low = _mm512_cvtepi32_ps(acc[r][2 * h]), high = _mm512_cvtepi32_ps(acc[r][2 * h + 1]);
      const __m512 dims[2] = {_mm512_permutex2var_ps(low, first, high), _mm512_permutex2var_ps(low, second, high)};
      for (int half = 0; half < 2; ++half) {
        const std::int64_t left = n - 32 * h - 16 * half;
        if (left <= 0) break;
        const __mmask16 store = left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
        _mm512_mask_storeu_ps(out + r * Ev + d0 + 32 * h + 16 * half, store, _mm512_mul_ps(dims[half], scale));
      }
    }
  }
}

template <int R>
SDPA_INT8_TARGET bool accumulate_rows(const float* wt, std::int64_t wt_stride, const std::byte* const* v_rows,
                                      std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out) {
  alignas(32) std::int32_t pairs[(kMaxKeys / 2) * kMaxRows];
  alignas(32) float sigma[kMaxRows];
  if (!pack_weights<R>(wt, wt_stride, cols, pairs, sigma)) return false;
  // As many vectors of dims per pass over the keys as keep 16 accumulators (an even
  // count, at most the 8 of 128 dims), then 4 (64 dims: a shorter head's 4 chains, not
  // 2), then 32 dims a pass, the last masked.
  constexpr int kVectors = std::min(8, 16 / R / 2 * 2);
  std::int64_t d = 0;
  for (; d + 16 * kVectors <= Ev; d += 16 * kVectors)
    accumulate_dims<R, kVectors>(pairs, sigma, v_rows, cols, Ev, ahead, d, 16 * kVectors, out);
  if constexpr (kVectors > 4)
    for (; d + 64 <= Ev; d += 64) accumulate_dims<R, 4>(pairs, sigma, v_rows, cols, Ev, ahead, d, 64, out);
  for (; d < Ev; d += 32)
    accumulate_dims<R, 2>(pairs, sigma, v_rows, cols, Ev, ahead, d, std::min<std::int64_t>(32, Ev - d), out);
  return true;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

bool supported() {
  static const bool has = [] {  // (asked by every forward task)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

bool row_accumulate(const float* wt, std::int64_t wt_stride, std::int64_t rows, const std::byte* const* v_rows,
                    std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out) {
  using Kernel =
      bool (*)(const float*, std::int64_t, const std::byte* const*, std::int64_t, std::int64_t, std::int64_t, float*);
  static constexpr Kernel kernels[kMaxRows] = {accumulate_rows<1>, accumulate_rows<2>, accumulate_rows<3>,
                                               accumulate_rows<4>, accumulate_rows<5>, accumulate_rows<6>,
                                               accumulate_rows<7>, accumulate_rows<8>};
  assert(rows >= 1 && rows <= kMaxRows && cols <= kMaxKeys);  // (the stack buffers' sizes)
  return kernels[rows - 1](wt, wt_stride, v_rows, cols, Ev, ahead, out);
}

}  // namespace sdpa::detail::int8
