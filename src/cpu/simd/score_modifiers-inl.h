// The score modifiers of the SIMD forward and backward, on a transposed tile
// st[c·stride + r] (keys c, query rows r of a RowSet), in log2 units (scores · log2 e),
// then dropout on the probabilities. The kernels apply softcap, then the mask, then ALiBi
// and the band; the oracle (reference/scores.h) adds ALiBi before the mask — the same
// score up to the rounding of one float addition.
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_SCORE_MODIFIERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_SCORE_MODIFIERS_INL_H_
#undef SDPA_CPU_SIMD_SCORE_MODIFIERS_INL_H_
#else
#define SDPA_CPU_SIMD_SCORE_MODIFIERS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "common/philox.h"
#include "common/problem.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// The score transforms between Sᵀ = Q Kᵀ · scale and the mask, on a transposed tile
// st[c·stride + r] (keys c < cols, query rows r of `set`), in log2 units (scores ·
// log2 e). Logit softcapping: t ← C·tanh(t / C), C = softcap · log2 e, over `cols` keys
// of `vectors` row vectors; when `tanh_out` is given it receives tanh(t / C) (the
// backward's chain rule) with the same layout as st.
inline void Softcap(const Problem& p, float* st, std::size_t stride, std::int64_t cols, std::size_t vectors,
                    float* tanh_out, std::size_t tanh_stride) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF cap = hn::Set(df, static_cast<float>(p.softcap * kLog2e));
  const VF inverse_cap = hn::Set(df, static_cast<float>(1.0 / (p.softcap * kLog2e)));
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::size_t v = 0; v < vectors; ++v) {
      float* at = st + static_cast<std::size_t>(c) * stride + v * N;
      const VF t = hn::Tanh(df, hn::Mul(hn::Load(df, at), inverse_cap));
      if (tanh_out) hn::Store(t, df, tanh_out + static_cast<std::size_t>(c) * tanh_stride + v * N);
      hn::Store(hn::Mul(t, cap), df, at);
    }
}

// ALiBi: t −= slope · log2 e · |d(i) − j| for keys [j0, j0+cols), lane-wise over
// `vectors` row vectors. `lanes` holds, per row, slope · log2 e and then d(i) − j0
// (relative to the tile, so that float holds the distance exactly for any S).
inline void AddAlibi(const Problem& p, const RowSet& set, float* st, std::size_t stride, std::int64_t j0,
                     std::int64_t cols, std::size_t vectors, float* lanes) {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = vectors * N;
  float* slope = lanes;
  float* diagonal = lanes + rows;
  std::fill(lanes, lanes + 2 * rows, 0.0f);  // padding rows: no bias
  for (std::size_t r = 0; r < set.rows.size(); ++r) {
    slope[r] = static_cast<float>(p.alibi_slopes[static_cast<std::size_t>(set.rows[r].matrix)] * kLog2e);
    diagonal[r] = static_cast<float>(set.rows[r].i + p.diagonal_shift - j0);
  }
  for (std::size_t v = 0; v < vectors; ++v) {
    const VF s = hn::Load(df, slope + v * N), d = hn::Load(df, diagonal + v * N);
    for (std::int64_t c = 0; c < cols; ++c) {
      float* at = st + static_cast<std::size_t>(c) * stride + v * N;
      const VF distance = hn::Abs(hn::Sub(d, hn::Set(df, static_cast<float>(c))));
      hn::Store(hn::NegMulAdd(s, distance, hn::Load(df, at)), df, at);
    }
  }
}

// −inf outside each row's [key_begin, key_end) (causal, the sliding window), for keys
// [j0, j0+cols). Only needed when some row's band cuts the range.
inline void ApplyBand(const RowSet& set, float* st, std::size_t stride, std::int64_t j0, std::int64_t cols) {
  if (j0 >= set.max_key_begin && j0 + cols <= set.min_key_end) return;
  for (std::size_t r = 0; r < set.rows.size(); ++r) {
    const std::int64_t begin = std::clamp<std::int64_t>(set.rows[r].key_begin - j0, 0, cols);
    const std::int64_t end = std::clamp<std::int64_t>(set.rows[r].key_end - j0, begin, cols);
    for (std::int64_t c = 0; c < begin; ++c) st[static_cast<std::size_t>(c) * stride + r] = kMinusInf;
    for (std::int64_t c = end; c < cols; ++c) st[static_cast<std::size_t>(c) * stride + r] = kMinusInf;
  }
}

// The mask: t += m · log2 e (a float mask), or −inf where a bool mask is false, for keys
// [j0, j0+cols) of the rows of `set`; `row_buffer` holds one mask row. Returns false when
// every score of the tile is then −inf (the caller skips it).
inline bool ApplyMask(const Problem& p, const RowSet& set, float* st, std::size_t stride, std::int64_t j0,
                      std::int64_t cols, float* row_buffer) {
  const float log2e = static_cast<float>(kLog2e);
  bool any_visible = false;
  for (std::size_t r = 0; r < set.rows.size(); ++r) {
    LoadRow(p.mask, set.rows[r].matrix, set.rows[r].i, j0, cols, row_buffer);
    for (std::int64_t c = 0; c < cols; ++c) {
      float& score = st[static_cast<std::size_t>(c) * stride + r];
      if (p.mask_is_bool) {
        if (row_buffer[c] == 0.0f) score = kMinusInf;
      } else {
        score += row_buffer[c] * log2e;
      }
      any_visible |= score != kMinusInf;
    }
  }
  return any_visible;
}

// Dropout's factors Z: zt[c·stride + r] = keep/(1−p) or 0 for keys [j0, j0+visible) of
// the rows of `set` (batch `batch` of the whole call), drawn from the Philox counter of
// (batch, head, i, j) that every kernel and the oracle share (common/philox.h); 0 for
// keys in [visible, padded) and for padding rows.
inline void DropoutFactors(const Problem& p, std::int64_t batch, const RowSet& set, std::int64_t j0,
                           std::int64_t visible, std::int64_t padded, float* zt, std::size_t stride) {
  const DropoutMask dropout(p.dropout_p, p.seed, p.offset, p.query_offset, p.key_offset);
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p.dropout_p));
  std::fill(zt, zt + static_cast<std::size_t>(padded) * stride, 0.0f);
  for (std::size_t r = 0; r < set.rows.size(); ++r)
    dropout.for_each_key(batch, set.rows[r].head, set.rows[r].i, j0, visible, [&](std::int64_t c, bool kept) {
      zt[static_cast<std::size_t>(c) * stride + r] = kept ? keep_scale : 0.0f;
    });
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_SCORE_MODIFIERS_INL_H_
