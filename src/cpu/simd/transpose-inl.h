// Between the kernels' lane-major tiles (Qᵀ and Oᵀ: element [e][r] at e·rows + r, query
// rows along the vector lanes) and row-major query and output rows. Element by element,
// every access on one side is strided, and for short key ranges that costs as much as
// the arithmetic (L = S = 32: a third of a call went to packing Qᵀ and unpacking Oᵀ).
// On targets with 256-bit vectors, 8 × 8 blocks are transposed in registers instead:
// 32-bit, then 64-bit interleaves within each 128-bit half, then the halves swapped —
// 24 shuffles for 64 elements. Pure data movement: the values are the same bits
// (TransposeScaled: each value times a scale on the way; TransposeRowsScaled: each
// output row times its own — each rounded as a separate pass over the result would
// round it).
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_TRANSPOSE_INL_H_
#undef SDPA_CPU_SIMD_TRANSPOSE_INL_H_
#else
#define SDPA_CPU_SIMD_TRANSPOSE_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // 256-bit vectors
// out[c·out_stride + r] = in[r·in_stride + c] (· scale, if kScaled; · row_scale[c], if
// kRowScaled) for r, c < 8.
template <bool kScaled, bool kRowScaled>
HWY_INLINE void Transpose8x8(const float* HWY_RESTRICT in, std::size_t in_stride, float* HWY_RESTRICT out,
                             std::size_t out_stride, float scale, const float* HWY_RESTRICT row_scale) {
  const hn::FixedTag<float, 8> d;
  const hn::Repartition<double, decltype(d)> dd;
  using V = hn::Vec<decltype(d)>;
  V r[8], t[8], u[8];
  for (std::size_t i = 0; i < 8; ++i) {
    r[i] = hn::LoadU(d, in + i * in_stride);
    if constexpr (kScaled) r[i] = hn::Mul(r[i], hn::Set(d, scale));
  }
  // t[2i] = r2i_0 r2i+1_0 r2i_1 r2i+1_1 | r2i_4 r2i+1_4 r2i_5 r2i+1_5; t[2i+1]: columns 2, 3 | 6, 7.
  for (std::size_t i = 0; i < 8; i += 2) {
    t[i] = hn::InterleaveLower(d, r[i], r[i + 1]);
    t[i + 1] = hn::InterleaveUpper(d, r[i], r[i + 1]);
  }
  // u[c] (c < 4) = rows 0–3 of column c | of column c + 4; u[4 + c]: rows 4–7.
  const auto low_pairs = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  const auto high_pairs = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  for (std::size_t half = 0; half < 8; half += 4) {
    u[half + 0] = low_pairs(t[half + 0], t[half + 2]);
    u[half + 1] = high_pairs(t[half + 0], t[half + 2]);
    u[half + 2] = low_pairs(t[half + 1], t[half + 3]);
    u[half + 3] = high_pairs(t[half + 1], t[half + 3]);
  }
  const auto store = [&](std::size_t c, V row) {
    if constexpr (kRowScaled) row = hn::Mul(row, hn::Set(d, row_scale[c]));
    hn::StoreU(row, d, out + c * out_stride);
  };
  for (std::size_t c = 0; c < 4; ++c) {
    store(c, hn::ConcatLowerLower(d, u[4 + c], u[c]));
    store(c + 4, hn::ConcatUpperUpper(d, u[4 + c], u[c]));
  }
}
#endif

template <bool kScaled, bool kRowScaled = false>
inline void TransposeBlocks(const float* HWY_RESTRICT in, std::size_t in_stride, std::size_t rows, std::size_t cols,
                            float* HWY_RESTRICT out, std::size_t out_stride, float scale,
                            const float* HWY_RESTRICT row_scale = nullptr) {
  const auto value = [&](std::size_t r, std::size_t c) {
    if constexpr (kScaled) return in[r * in_stride + c] * scale;
    if constexpr (kRowScaled) return in[r * in_stride + c] * row_scale[c];
    return in[r * in_stride + c];
  };
  std::size_t r0 = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  for (; r0 + 8 <= rows; r0 += 8) {
    std::size_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8)
      Transpose8x8<kScaled, kRowScaled>(in + r0 * in_stride + c0, in_stride, out + c0 * out_stride + r0, out_stride,
                                        scale, kRowScaled ? row_scale + c0 : nullptr);
    for (; c0 < cols; ++c0)
      for (std::size_t r = r0; r < r0 + 8; ++r) out[c0 * out_stride + r] = value(r, c0);
  }
#endif
  for (; r0 < rows; ++r0)
    for (std::size_t c = 0; c < cols; ++c) out[c * out_stride + r0] = value(r0, c);
}

// out[c·out_stride + r] = in[r·in_stride + c] for r < rows, c < cols.
inline void Transpose(const float* HWY_RESTRICT in, std::size_t in_stride, std::size_t rows, std::size_t cols,
                      float* HWY_RESTRICT out, std::size_t out_stride) {
  TransposeBlocks<false>(in, in_stride, rows, cols, out, out_stride, 1.0f);
}

// out[c·out_stride + r] = in[r·in_stride + c] · row_scale[c]: each row c of the output (a
// column of the input, whose `rows` × `cols` these count) times its own factor — the
// forward's O = Oᵀᵀ · (1 / l) as Oᵀ is transposed out, not a pass over Oᵀ first.
inline void TransposeRowsScaled(const float* HWY_RESTRICT in, std::size_t in_stride, std::size_t rows, std::size_t cols,
                                float* HWY_RESTRICT out, std::size_t out_stride, const float* HWY_RESTRICT row_scale) {
  TransposeBlocks<false, true>(in, in_stride, rows, cols, out, out_stride, 1.0f, row_scale);
}

// out[c·out_stride + r] = in[r·in_stride + c] · scale: the forward packs Qᵀ times
// scale·log2(e) in one pass, not a transpose and then a pass of multiplies over Qᵀ.
inline void TransposeScaled(const float* HWY_RESTRICT in, std::size_t in_stride, std::size_t rows, std::size_t cols,
                            float* HWY_RESTRICT out, std::size_t out_stride, float scale) {
  TransposeBlocks<true>(in, in_stride, rows, cols, out, out_stride, scale);
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_TRANSPOSE_INL_H_
