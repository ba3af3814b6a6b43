// The log-sum-exp merge of partial attention over disjoint key ranges: how split-key
// decoding (simd/forward.cpp, forward_task-inl.h) puts its splits together, exactly, in float32.
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_LSE_MERGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_LSE_MERGE_INL_H_
#undef SDPA_CPU_SIMD_LSE_MERGE_INL_H_
#else
#define SDPA_CPU_SIMD_LSE_MERGE_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/exp2-inl.h"
#include "cpu/simd/microkernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// The state of one split of the keys for one subtile (`rows` query rows): what the
// online softmax holds before the division by l — the reference max m (rows floats, log2
// units; NextReferenceMax), the sum l (rows), then Oᵀ (max(Ev, 1) × rows).
inline std::int64_t SplitStateFloats(std::size_t rows, std::int64_t Ev) {
  return (2 + std::max<std::int64_t>(Ev, 1)) * static_cast<std::int64_t>(rows);
}

inline void SaveSplitState(const float* m, const float* l, const float* ot, std::size_t rows, std::int64_t Ev,
                           float* state) {
  std::copy_n(m, rows, state);
  std::copy_n(l, rows, state + rows);
  std::copy_n(ot, static_cast<std::size_t>(std::max<std::int64_t>(Ev, 1)) * rows, state + 2 * rows);
}

// The exact log-sum-exp merge of `splits` states (split_stride floats apart) of the same
// rows, in split order, as split-key decoding and ring attention merge partial results:
//   m = max_s m_s,  l = Σ_s 2^(m_s − m)·l_s,  Oᵀ = Σ_s 2^(m_s − m)·Oᵀ_s
// into m, l and ot (Ev × rows), `rows` a whole number of vectors (a subtile's: 1, 2 or 3). Weights are exponents of differences
// to the max, never of a state's lse alone, so nothing overflows; a row no split saw
// (every m_s = −inf) subtracts 0 instead of −inf (−inf − −inf would be NaN) and keeps
// l = 0, which the caller reads as fully masked.
inline void MergeSplitStates(const float* states, std::int64_t splits, std::int64_t split_stride, std::size_t rows,
                             std::int64_t Ev, float* m_out, float* l_out, float* ot) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t lane0 = 0; lane0 < rows; lane0 += N) {
    VF m = hn::Set(df, kMinusInf);
    for (std::int64_t sp = 0; sp < splits; ++sp) m = hn::Max(m, hn::Load(df, states + sp * split_stride + lane0));
    const VF m_use = hn::IfThenZeroElse(hn::Eq(m, hn::Set(df, kMinusInf)), m);
    VF l = hn::Zero(df);
    for (std::int64_t d = 0; d < Ev; ++d) hn::Store(hn::Zero(df), df, ot + d * rows + lane0);
    for (std::int64_t sp = 0; sp < splits; ++sp) {
      const float* state = states + sp * split_stride;
      const VF weight = Exp2(df, hn::Sub(hn::Load(df, state + lane0), m_use));
      l = hn::MulAdd(hn::Load(df, state + rows + lane0), weight, l);
      for (std::int64_t d = 0; d < Ev; ++d) {
        float* at = ot + d * rows + lane0;
        hn::Store(hn::MulAdd(hn::Load(df, state + (2 + d) * rows + lane0), weight, hn::Load(df, at)), df, at);
      }
    }
    hn::Store(m, df, m_out + lane0);
    hn::Store(l, df, l_out + lane0);
  }
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_LSE_MERGE_INL_H_
