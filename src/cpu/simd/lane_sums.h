// The epilogue of the decode score kernels, whose lanes run along E so that each score
// ends as the sum of one accumulator's 16 lanes: those sums, and their store into Sᵀ.
// For bf16_kernels.cpp's float32 accumulators (vdpbf16ps) and int8_kernels.cpp's int32
// ones (vpdpwssd). AVX-512 F only, so that each kernel file's wider target (BF16, VNNI)
// can inline it.
#pragma once

#include <immintrin.h>

#include <cstdint>

#define SDPA_LANE_SUMS_TARGET __attribute__((target("avx512f"), always_inline))

namespace sdpa::detail {

// (GCC 12 flags the self-initialised `_mm512_undefined_*` inside the unpack intrinsics
// as maybe uninitialised once they are inlined: its bug 105593.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// a + b lane by lane: float32 lanes, or int32 ones (kIntegers) held as float32 bits,
// which the shuffles below move unchanged.
template <bool kIntegers>
SDPA_LANE_SUMS_TARGET inline __m512 add_lanes(__m512 a, __m512 b) {
  if constexpr (kIntegers)
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  else
    return _mm512_add_ps(a, b);
}

// Lane i of the result = the sum of at[i]'s 16 lanes: a transpose by blocks, 45
// instructions for 16 sums where a reduction each takes ~6 and a dependent chain.
template <bool kIntegers>
SDPA_LANE_SUMS_TARGET inline __m512 sum_each(const __m512 (&at)[16]) {
  // In each 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] of the vectors 2i (a), 2i+1 (b).
  __m512 pairs[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    pairs[i] = add_lanes<kIntegers>(_mm512_unpacklo_ps(at[2 * i], at[2 * i + 1]),
                                    _mm512_unpackhi_ps(at[2 * i], at[2 * i + 1]));
  // Block k of quads[j]: the sums over block k of at[4j] .. at[4j+3].
  __m512 quads[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512d x = _mm512_castps_pd(pairs[2 * j]), y = _mm512_castps_pd(pairs[2 * j + 1]);
    quads[j] =
        add_lanes<kIntegers>(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // The blocks: (b0 + b2) and (b1 + b3) of two quads side by side, then their sum.
  const __m512 q01 = add_lanes<kIntegers>(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                          _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 q23 = add_lanes<kIntegers>(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                          _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return add_lanes<kIntegers>(_mm512_shuffle_f32x4(q01, q23, 0x88), _mm512_shuffle_f32x4(q01, q23, 0xDD));
}

// Lane i of the result = the sum of acc[i]'s 16 lanes, for i < M <= 16 (0 past M). The
// order of the adds is fixed, so a float32 score's bits are (int32 sums are exact in any
// order). Always inlined: once GCC called it out of line, the 16 accumulators went
// through the stack, 11 % slower a bfloat16 decode call.
template <int M>
SDPA_LANE_SUMS_TARGET inline __m512 lane_sums(const __m512* acc) {
  static_assert(M >= 1 && M <= 16, "one vector of sums");
  __m512 at[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) at[i] = i < M ? acc[i] : _mm512_setzero_ps();
  return sum_each<false>(at);
}
template <int M>
SDPA_LANE_SUMS_TARGET inline __m512i lane_sums(const __m512i* acc) {
  static_assert(M >= 1 && M <= 16, "one vector of sums");
  __m512 at[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) at[i] = i < M ? _mm512_castsi512_ps(acc[i]) : _mm512_setzero_ps();
  return _mm512_castps_si512(sum_each<true>(at));
}

// st[(first + k)·st_stride + r] = scores[k·R + r] for k < Keys, r < R (the lanes in a
// dense Sᵀ's order): one masked store where Sᵀ is dense (st_stride = R).
template <int R, int Keys>
SDPA_LANE_SUMS_TARGET inline void store_score_lanes(__m512 scores, std::int64_t first, float* st,
                                                    std::int64_t st_stride) {
  static_assert(Keys * R <= 16, "one vector of scores");
  if (st_stride == R) {
    _mm512_mask_storeu_ps(st + first * R, static_cast<__mmask16>((1u << (Keys * R)) - 1), scores);
    return;
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, scores);
  for (int k = 0; k < Keys; ++k)
    for (int r = 0; r < R; ++r) st[(first + k) * st_stride + r] = lanes[k * R + r];
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace sdpa::detail
