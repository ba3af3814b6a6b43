#include "cpu/simd/int8_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>

#include "cpu/simd/lane_sums.h"

#define SDPA_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace sdpa::detail::int8 {

namespace {

// (GCC 12 flags the self-initialised `_mm512_undefined_*` inside the widening, narrowing
// and reducing intrinsics in this file as maybe uninitialised once they are inlined: its
// bug 105593.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The int32 sums' headroom: a pair adds at most 2 · 32767 · 128 < 2^23, so kMaxKeys / 2
// pairs stay below 2^30 < 2^31; and a score's kMaxQueryDims products of q̂ and k.
static_assert(kMaxKeys / 2 * 2.0 * 32767 * 128 < 2147483648.0, "int32 sums must not overflow");
static_assert(kMaxQueryDims * static_cast<double>(kQueryLargest) * 128 < 2147483648.0, "nor the scores'");

// The weight pairs' stride (pack_weights): R rounded up to a power of two, a dense Sᵀ's
// group (softmax_step-inl.h), so that a dense Sᵀ's pairs come out of one vector whole.
template <int R>
constexpr int kPairStride = static_cast<int>(std::bit_ceil(static_cast<unsigned>(R)));

// pairs[k·kPairStride<R> + r] = (ŵ[r][2k], ŵ[r][2k+1]) as int16 halves (low, high) and
// sigma[r], for the R rows: ŵ = round(w / σ_r), σ_r = max_c |w[r][c]| / 32767 (0 for a
// row of zeros). False when some weight is not finite, or a row's largest is below
// kSmallestLargest but not 0: there 32767 / max would overflow float32 (to +inf, and the
// row's tile would add nothing) or σ be subnormal (0 under a caller's flush-to-zero).
// (Writes 8 int32 from each pair's row 0: up to 8 − R past the last pair's rows; pairs
// holds (kMaxKeys / 2) · kMaxRows, room for that at every R up to kMaxKeys keys.)
constexpr float kSmallestLargest = 0x1p-96f;

// From each row's largest |w| as float bits (a lane a row, the lanes of no row 0): false
// where one is not finite, or below kSmallestLargest but not 0; else σ of the R rows into
// sigma, and lane by lane 32767 / largest (0 for a row of zeros) into *inverse.
template <int R>
SDPA_INT8_TARGET bool weight_scales(__m512i largest_bits, float* sigma, __m512* inverse) {
  __mmask16 bad = _mm512_cmpgt_epi32_mask(largest_bits, _mm512_castps_si512(_mm512_set1_ps(3.4028235e38f)));
  const __m512 largest = _mm512_castsi512_ps(largest_bits);
  const __mmask16 nonzero = _mm512_cmp_ps_mask(largest, _mm512_setzero_ps(), _CMP_GT_OQ);
  bad |= nonzero & _mm512_cmp_ps_mask(largest, _mm512_set1_ps(kSmallestLargest), _CMP_LT_OQ);
  if (bad) return false;
  *inverse = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(32767.0f), largest);
  _mm512_mask_storeu_ps(sigma, static_cast<__mmask16>((1u << R) - 1), _mm512_div_ps(largest, _mm512_set1_ps(32767.0f)));
  return true;
}

template <int R>
SDPA_INT8_TARGET bool pack_weights(const float* wt, std::int64_t wt_stride, std::int64_t cols, std::int32_t* pairs,
                                   float* sigma) {
  constexpr __mmask8 kRows = static_cast<__mmask8>((1u << R) - 1);
  // The largest |w| of each row as its bits: with the sign cleared, float order is the
  // bits' integer order, and inf and every NaN lie above the largest finite float — so
  // one integer max a key finds both (in place of a compare into a mask register and an
  // or through a general register a key).
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  __m256i largest_bits = _mm256_setzero_si256();
  for (std::int64_t c = 0; c < cols; ++c)
    largest_bits = _mm256_max_epi32(
        largest_bits,
        _mm256_and_si256(_mm256_castps_si256(_mm256_maskz_loadu_ps(kRows, wt + c * wt_stride)), magnitude));
  __m512 scales;
  if (!weight_scales<R>(_mm512_zextsi256_si512(largest_bits), sigma, &scales)) return false;
  const __m256 inverse = _mm512_castps512_ps256(scales);
  for (std::int64_t c = 0; c < cols; c += 2) {
    // (cvtps_epi32 rounds to nearest, even, under the default MXCSR.)
    const __m256i even = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskz_loadu_ps(kRows, wt + c * wt_stride), inverse));
    const __m256i odd =
        c + 1 < cols
            ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskz_loadu_ps(kRows, wt + (c + 1) * wt_stride), inverse))
            : _mm256_setzero_si256();
    const __m256i pair = _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(odd, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + (c / 2) * kPairStride<R>), pair);
  }
  return true;
}

// Word i of a vector of a dense Sᵀ's rounded weights is key i / G's row i mod G; dword t
// of the pairs takes key 2j's and key 2j + 1's of row r, t = j·G + r.
template <int G>
constexpr std::array<std::int16_t, 16> PairWords() {
  std::array<std::int16_t, 16> word{};
  for (int t = 0; t < 8; ++t) {
    word[2 * t] = static_cast<std::int16_t>(2 * (t / G) * G + t % G);
    word[2 * t + 1] = static_cast<std::int16_t>((2 * (t / G) + 1) * G + t % G);
  }
  return word;
}

// pack_weights for a dense Sᵀ (wt_stride = kPairStride<R> = G): a vector holds 16 / G
// keys' G rows, so the max and the rounding take a load a vector, not a key, and a
// vector's pairs come out of one permutation of its rounded words (the one-key loads
// were ~20 % of an int8 decode's P·V in cache). The same products and roundings as
// pack_weights, so the same bits. (Writes 8 int32 a vector: the last may reach a vector
// past the last pair, (kMaxKeys / 2) · kMaxRows at kMaxKeys keys, pairs' size.)
template <int R>
SDPA_INT8_TARGET bool pack_dense_weights(const float* wt, std::int64_t cols, std::int32_t* pairs, float* sigma) {
  constexpr int G = kPairStride<R>, kKeys = 16 / G;
  constexpr __mmask16 kRowLanes = [] {  // lanes i with i mod G < R: the padding rows' are not read
    unsigned mask = 0;
    for (int i = 0; i < 16; ++i) mask |= (i % G < R ? 1u : 0u) << i;
    return static_cast<__mmask16>(mask);
  }();
  const auto lanes = [&](std::int64_t c) {  // the lanes of keys c .. c + kKeys − 1 below cols
    const std::int64_t n = std::min<std::int64_t>(16, (cols - c) * G);
    return static_cast<__mmask16>(kRowLanes & ((1u << n) - 1));
  };
  // |w|'s bits' max, as pack_weights; then each lane the max of its row's lanes (lane i:
  // row i mod G), by rotations of multiples of G.
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i largest_bits = _mm512_setzero_si512();
  for (std::int64_t c = 0; c < cols; c += kKeys)
    largest_bits = _mm512_max_epi32(
        largest_bits, _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(lanes(c), wt + c * G)), magnitude));
  if constexpr (G <= 8)
    largest_bits = _mm512_max_epi32(largest_bits, _mm512_alignr_epi32(largest_bits, largest_bits, 8));
  if constexpr (G <= 4)
    largest_bits = _mm512_max_epi32(largest_bits, _mm512_alignr_epi32(largest_bits, largest_bits, 4));
  if constexpr (G <= 2)
    largest_bits = _mm512_max_epi32(largest_bits, _mm512_alignr_epi32(largest_bits, largest_bits, 2));
  if constexpr (G <= 1)
    largest_bits = _mm512_max_epi32(largest_bits, _mm512_alignr_epi32(largest_bits, largest_bits, 1));
  __m512 inverse;  // lane i: row i mod G's
  if (!weight_scales<R>(largest_bits, sigma, &inverse)) return false;
  alignas(32) static constexpr std::array<std::int16_t, 16> kPairWords = PairWords<G>();
  const __m256i order = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPairWords.data()));
  for (std::int64_t c = 0; c < cols; c += kKeys) {
    // (cvtps_epi32 rounds to nearest, even, under the default MXCSR; |ŵ| <= 32767, so
    // vpmovdw's truncation to the low 16 bits keeps it, as pack_weights' mask does.)
    const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(c), wt + c * G), inverse));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + (c / 2) * G),
                        _mm256_permutexvar_epi16(order, _mm512_cvtepi32_epi16(rounded)));
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
    const __m512i w = _mm512_set1_epi32(pairs[(c / 2) * kPairStride<R> + r]);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = dpwssd(acc[r][v], x[v], w);
  }
}

// out[r·Ev + d] (with `add`, out plus it) for the dims [d0, d0 + n), n <= 16·V (V even:
// 32 dims a pair of vectors).
template <int R, int V>
SDPA_INT8_TARGET void accumulate_dims(const std::int32_t* pairs, const float* sigma, const std::byte* const* v_rows,
                                      std::int64_t cols, std::int64_t Ev, std::int64_t ahead, std::int64_t d0,
                                      std::int64_t n, float* out, bool add) {
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
        float* at = out + r * Ev + d0 + 32 * h + 16 * half;
        // (Added in one rounding, an FMA: not the product rounded, then the sum.)
        _mm512_mask_storeu_ps(at, store,
                              add ? _mm512_fmadd_ps(dims[half], scale, _mm512_maskz_loadu_ps(store, at))
                                  : _mm512_mul_ps(dims[half], scale));
      }
    }
  }
}

template <int R>
SDPA_INT8_TARGET bool accumulate_rows(const float* wt, std::int64_t wt_stride, const std::byte* const* v_rows,
                                      std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out, bool add) {
  alignas(32) std::int32_t pairs[(kMaxKeys / 2) * kMaxRows];
  alignas(32) float sigma[kMaxRows];
  const bool packed = wt_stride == kPairStride<R> ? pack_dense_weights<R>(wt, cols, pairs, sigma)
                                                  : pack_weights<R>(wt, wt_stride, cols, pairs, sigma);
  if (!packed) return false;
  // As many vectors of dims per pass over the keys as keep 16 accumulators (an even
  // count, at most the 8 of 128 dims), then 4 (64 dims: a shorter head's 4 chains, not
  // 2), then 32 dims a pass, the last masked.
  constexpr int kVectors = std::min(8, 16 / R / 2 * 2);
  std::int64_t d = 0;
  for (; d + 16 * kVectors <= Ev; d += 16 * kVectors)
    accumulate_dims<R, kVectors>(pairs, sigma, v_rows, cols, Ev, ahead, d, 16 * kVectors, out, add);
  if constexpr (kVectors > 4)
    for (; d + 64 <= Ev; d += 64) accumulate_dims<R, 4>(pairs, sigma, v_rows, cols, Ev, ahead, d, 64, out, add);
  for (; d < Ev; d += 32)
    accumulate_dims<R, 2>(pairs, sigma, v_rows, cols, Ev, ahead, d, std::min<std::int64_t>(32, Ev - d), out, add);
  return true;
}

// acc + vpdpwssd(a, the 32 int16 at b), b read by the instruction itself (as dpwssd: for
// the scores where the q̂ vectors, R · E / 32 of them, do not fit the registers beside
// the accumulators: row_scores_steps).
SDPA_INT8_TARGET inline __m512i dpwssd_from(__m512i acc, __m512i a, const std::int16_t* b) {
  // (__m512i_u: b need not be 64-byte aligned.)
  asm("vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "m"(*reinterpret_cast<const __m512i_u*>(b)));
  return acc;
}

// Lane i of a dense Sᵀ's 16 scores of R rows: key i / R's, row i % R's.
template <int R>
constexpr std::array<std::int32_t, 16> KeyOfLane() {
  std::array<std::int32_t, 16> key{};
  for (int i = 0; i < 16; ++i) key[i] = i / R;
  return key;
}
template <int R>
constexpr std::array<std::int32_t, 16> RowOfLane() {
  std::array<std::int32_t, 16> row{};
  for (int i = 0; i < 16; ++i) row[i] = i % R;
  return row;
}

// st[(first + k)·st_stride + r] = sums[k·R + r] · row_factor[k·R + r] · k_scale[first + k]
// for k < Keys (row_factor: scale · σ_r in a dense Sᵀ's order). k_scale: 16 floats from
// first on.
template <int R, int Keys>
SDPA_INT8_TARGET inline __attribute__((always_inline)) void store_scores(__m512i sums, __m512 row_factor,
                                                                         const float* k_scale, std::int64_t first,
                                                                         float* st, std::int64_t st_stride) {
  alignas(64) static constexpr std::array<std::int32_t, 16> kKeyOfLane = KeyOfLane<R>();
  const __m512 key_scale =
      _mm512_permutexvar_ps(_mm512_load_si512(kKeyOfLane.data()), _mm512_loadu_ps(k_scale + first));
  const __m512 scores = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(row_factor, key_scale));
  store_score_lanes<R, Keys>(scores, first, st, st_stride);
}

// One step of row_score_keys: K dims [e, e + 32), those past the mask read as 0 (q̂ is 0
// there too: pack_query pads its rows). product(acc, kv, r, e): acc plus row r's q̂
// dims [e, e + 32) times the key's kv (vpdpwssd).
template <int R, int Keys, bool Full, class Product>
SDPA_INT8_TARGET inline __attribute__((always_inline)) void score_step(std::int64_t e, __mmask32 mask,
                                                                       const std::byte* const* k_rows, std::int64_t c,
                                                                       std::int64_t ahead, __m512i (&acc)[Keys * R],
                                                                       Product product) {
  const auto key = [&](std::int64_t i) { return reinterpret_cast<const std::int8_t*>(k_rows[c + i]) + e; };
#pragma GCC unroll 16
  for (int k = 0; k < Keys; ++k) {
    const __m256i bytes =
        Full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key(k))) : _mm256_maskz_loadu_epi8(mask, key(k));
    const __m512i kv = _mm512_cvtepi8_epi16(bytes);                                             // exact
    if (e % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(key(k + ahead)), _MM_HINT_T1);  // a line's first
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[k * R + r] = product(acc[k * R + r], kv, r, e);
  }
}

// Keys [c, c + Keys) against R query rows: Keys · R <= 16 accumulators of int32 (a key's
// vector read once per step), summed exactly across lanes. Steps: E / 32 when the caller
// knows it (unrolled, unmasked), else 0 (E from the argument, the last step masked).
template <int R, int Keys, int Steps, class Product>
SDPA_INT8_TARGET inline __attribute__((always_inline)) void row_score_keys(
    std::int64_t E, const std::byte* const* k_rows, std::int64_t c, std::int64_t ahead, __m512 row_factor,
    const float* k_scale, float* st, std::int64_t st_stride, Product product) {
  __m512i acc[Keys * R];
#pragma GCC unroll 16
  for (int i = 0; i < Keys * R; ++i) acc[i] = _mm512_setzero_si512();
  if constexpr (Steps > 0) {
#pragma GCC unroll 8
    for (int step = 0; step < Steps; ++step)
      score_step<R, Keys, true>(32 * step, ~__mmask32{0}, k_rows, c, ahead, acc, product);
  } else {
    for (std::int64_t e = 0; e < E; e += 32)
      score_step<R, Keys, false>(e, E - e >= 32 ? ~__mmask32{0} : (__mmask32{1} << (E - e)) - 1, k_rows, c, ahead, acc,
                                 product);
  }
  store_scores<R, Keys>(lane_sums<Keys * R>(acc), row_factor, k_scale, c, st, st_stride);
}

// row_score_keys with q̂ read from memory by each vpdpwssd: out of line (inlined into
// the loop over the keys, GCC hoisted the addresses of a block's q̂ vectors, 32 for 8
// rows at E = 128, and kept them on the stack: 7 % slower).
template <int R, int Keys, int Steps>
SDPA_INT8_TARGET __attribute__((noinline)) void row_score_keys_from(const std::int16_t* q_hat, std::int64_t E,
                                                                    const std::byte* const* k_rows, std::int64_t c,
                                                                    std::int64_t ahead, __m512 row_factor,
                                                                    const float* k_scale, float* st,
                                                                    std::int64_t st_stride) {
  const std::int64_t q_stride = Steps > 0 ? 32 * Steps : QueryStride(E);
  row_score_keys<R, Keys, Steps>(E, k_rows, c, ahead, row_factor, k_scale, st, st_stride,
                                 [&](__m512i acc, __m512i kv, int r, std::int64_t e)
                                     SDPA_INT8_TARGET { return dpwssd_from(acc, kv, q_hat + r * q_stride + e); });
}

// row_scores for R rows: blocks of keys, then the last keys one at a time; the common
// head sizes (64, 128) with their steps known: unrolled and unmasked. q̂ is held in
// registers (R · Steps vectors) where it leaves room for blocks of two keys or more (32
// registers: q̂, Keys · R sums, a key's vector and the compiler's few), so that a
// vpdpwssd reads no memory: from memory, a block of 4 rows × 4 keys at E = 128 made 64
// q̂ loads beside its 16 of K, and the loads, not the products, set its pace (Zen 5: two
// 512-bit loads a cycle, two vpdpwssd) — an int8 decode in cache 4–13 % faster held
// (bench/RESULTS.md). Elsewhere blocks of 16 / R keys read q̂ from memory.
template <int R, int Steps>
constexpr int kHeldKeys = Steps > 0 && (R * Steps) <= 16 ? std::min(16 / R, (29 - R * Steps) / R) : 0;
template <int R, int Steps>
SDPA_INT8_TARGET void row_scores_steps(const std::int16_t* q_hat, std::int64_t E, const std::byte* const* k_rows,
                                       std::int64_t cols, std::int64_t ahead, __m512 row_factor, const float* k_scale,
                                       float* st, std::int64_t st_stride) {
  std::int64_t c = 0;
  if constexpr (kHeldKeys<R, Steps> >= 2) {
    __m512i q[R * Steps];  // q[r·Steps + step]: row r's dims [32·step, 32·step + 32)
#pragma GCC unroll 16
    for (int i = 0; i < R * Steps; ++i) q[i] = _mm512_loadu_si512(q_hat + 32 * i);
    const auto held = [&](__m512i acc, __m512i kv, int r, std::int64_t e)
                          SDPA_INT8_TARGET { return dpwssd(acc, kv, q[r * Steps + e / 32]); };
    constexpr int kKeys = kHeldKeys<R, Steps>;
    for (; c + kKeys <= cols; c += kKeys)
      row_score_keys<R, kKeys, Steps>(E, k_rows, c, ahead, row_factor, k_scale, st, st_stride, held);
    for (; c < cols; ++c) row_score_keys<R, 1, Steps>(E, k_rows, c, ahead, row_factor, k_scale, st, st_stride, held);
  } else {
    constexpr int kKeys = 16 / R;
    for (; c + kKeys <= cols; c += kKeys)
      row_score_keys_from<R, kKeys, Steps>(q_hat, E, k_rows, c, ahead, row_factor, k_scale, st, st_stride);
    for (; c < cols; ++c)
      row_score_keys_from<R, 1, Steps>(q_hat, E, k_rows, c, ahead, row_factor, k_scale, st, st_stride);
  }
}

template <int R>
SDPA_INT8_TARGET void row_scores_for(const std::int16_t* q_hat, const float* sigma, std::int64_t E,
                                     const std::byte* const* k_rows, const float* k_scale, std::int64_t cols,
                                     std::int64_t ahead, float scale, float* st, std::int64_t st_stride) {
  alignas(64) static constexpr std::array<std::int32_t, 16> kRowOfLane = RowOfLane<R>();
  const __m512 row_factor = _mm512_mul_ps(
      _mm512_set1_ps(scale),
      _mm512_permutexvar_ps(_mm512_load_si512(kRowOfLane.data()), _mm512_maskz_loadu_ps((1u << R) - 1, sigma)));
  if (E == 128)
    row_scores_steps<R, 4>(q_hat, E, k_rows, cols, ahead, row_factor, k_scale, st, st_stride);
  else if (E == 64)
    row_scores_steps<R, 2>(q_hat, E, k_rows, cols, ahead, row_factor, k_scale, st, st_stride);
  else
    row_scores_steps<R, 0>(q_hat, E, k_rows, cols, ahead, row_factor, k_scale, st, st_stride);
}

}  // namespace

bool supported() {
  static const bool has = [] {  // (asked by every forward task)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

SDPA_INT8_TARGET bool pack_query(const float* q, std::int64_t rows, std::int64_t E, std::int16_t* q_hat, float* sigma) {
  assert(rows >= 1 && rows <= kMaxRows && E <= kMaxQueryDims);
  const auto lanes = [E](std::int64_t e) {  // the dims [e, e + 16) below E
    return E - e >= 16 ? __mmask16{0xffff} : E > e ? static_cast<__mmask16>((1u << (E - e)) - 1) : __mmask16{0};
  };
  float scale[kMaxRows];
  for (std::int64_t r = 0; r < rows; ++r) {
    __m512 most = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (std::int64_t e = 0; e < E; e += 16) {
      const __m512 x = _mm512_abs_ps(_mm512_maskz_loadu_ps(lanes(e), q + r * E + e));
      bad |= _mm512_cmp_ps_mask(x, _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ);  // inf or NaN
      most = _mm512_max_ps(most, x);
    }
    const float row_most = _mm512_reduce_max_ps(most);
    if (bad || (row_most > 0.0f && row_most < kSmallestLargest)) return false;
    scale[r] = 0.0f;  // a row of zeros
    if (row_most == 0.0f) continue;
    // row_most in [2^(x-1), 2^x): over 2^(x-15) it is in [2^14, 2^15) (exact: a power of
    // two), above kQueryLargest = 2^15 - 1 only when its 15 leading bits are ones and
    // more follow; then σ doubles.
    int x = 0;
    std::frexp(row_most, &x);
    scale[r] = std::ldexp(1.0f, x - 15);
    if (row_most / scale[r] > static_cast<float>(kQueryLargest)) scale[r] *= 2.0f;
  }
  const std::int64_t stride = QueryStride(E);
  for (std::int64_t r = 0; r < rows; ++r) {
    sigma[r] = scale[r];
    const __m512 inverse = _mm512_set1_ps(scale[r] > 0.0f ? 1.0f / scale[r] : 0.0f);  // (exact: a power of two)
    // (Rounded to nearest, even, whatever the caller's MXCSR; |q̂| <= 32767 fits int16.)
    // Lanes past E load as 0: the row's padding.
    for (std::int64_t e = 0; e < stride; e += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(e), q + r * E + e), inverse);
      const __m512i rounded = _mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q_hat + r * stride + e), _mm512_cvtepi32_epi16(rounded));
    }
  }
  return true;
}

void row_scores(const std::int16_t* q_hat, const float* sigma, std::int64_t rows, std::int64_t E,
                const std::byte* const* k_rows, const float* k_scale, std::int64_t cols, std::int64_t ahead,
                float scale, float* st, std::int64_t st_stride) {
  using Kernel = void (*)(const std::int16_t*, const float*, std::int64_t, const std::byte* const*, const float*,
                          std::int64_t, std::int64_t, float, float*, std::int64_t);
  static constexpr Kernel kernels[kMaxRows] = {row_scores_for<1>, row_scores_for<2>, row_scores_for<3>,
                                               row_scores_for<4>, row_scores_for<5>, row_scores_for<6>,
                                               row_scores_for<7>, row_scores_for<8>};
  assert(rows >= 1 && rows <= kMaxRows);
  kernels[rows - 1](q_hat, sigma, E, k_rows, k_scale, cols, ahead, scale, st, st_stride);
}

bool row_accumulate(const float* wt, std::int64_t wt_stride, std::int64_t rows, const std::byte* const* v_rows,
                    std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out, bool add) {
  using Kernel = bool (*)(const float*, std::int64_t, const std::byte* const*, std::int64_t, std::int64_t, std::int64_t,
                          float*, bool);
  static constexpr Kernel kernels[kMaxRows] = {accumulate_rows<1>, accumulate_rows<2>, accumulate_rows<3>,
                                               accumulate_rows<4>, accumulate_rows<5>, accumulate_rows<6>,
                                               accumulate_rows<7>, accumulate_rows<8>};
  assert(rows >= 1 && rows <= kMaxRows && cols <= kMaxKeys);  // (the stack buffers' sizes)
  return kernels[rows - 1](wt, wt_stride, v_rows, cols, Ev, ahead, out, add);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sdpa::detail::int8
