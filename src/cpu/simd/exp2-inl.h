// 2^x as a Highway vector function, shared by the forward and backward kernels.
// Included once per target by a file that uses hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_EXP2_INL_H_
#undef SDPA_CPU_EXP2_INL_H_
#else
#define SDPA_CPU_EXP2_INL_H_
#endif

#include <type_traits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// 2^f for f ∈ [−½, ½]: its Taylor polynomial of degree 6 (relative error at most 1.2e-7,
// at f = ±½: about one float32 ulp).
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF Exp2Fraction(DF df, VF f) {
  VF p = hn::Set(df, 1.5403530393381606e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.3333558146428443e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.6181291076284772e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.5504108664821580e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022650695910071e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.9314718055994531e-1f));
  return hn::MulAdd(p, f, hn::Set(df, 1.0f));
}

// 2^x for x ≤ 8 (any x < 128), −inf and NaN — x ≤ 8, not 0: conditional rescaling
// (NextReferenceMax) lets a score exceed its row's reference m by up to 8. x = n + f with
// n = round(x) (to nearest, ties to even), f ∈ [−½, ½]; 2^f by Exp2Fraction, times 2^n.
// x < −125 gives exactly 0 (masked scores are −inf); NaN stays NaN. For −125 ≤ x < 128,
// p · 2^n is a normal float (≥ 2^−125.5), so the product is exact and both forms below
// give the same bits (checked for every float in [−130, 8]).
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF Exp2(DF df, VF x) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same_v<VF, hn::Vec512<float>>) {
    // AVX-512: n by Round (vrndscaleps), p · 2^n by vscalefps under the mask x ≥ −125 (or NaN):
    // 10 instructions where the portable form below takes 14. It is the softmax's
    // largest part, ~9 % of a bfloat16 forward on Zen 4. (−inf: n = −inf, f = NaN, masked
    // to 0.)
    const VF n = hn::Round(x);
    const VF p = Exp2Fraction(df, hn::Sub(x, n));
    const __mmask16 kept = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    return VF{_mm512_maskz_scalef_ps(kept, p.raw, n.raw)};
  }
#endif
  // The rounding uses the 1.5·2^23 trick, so no float→int conversion (whose out-of-range
  // behaviour differs between targets) is needed.
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(df, 12582912.0f);
  const VF t = hn::Add(x, magic);
  const VF n = hn::Sub(t, magic);
  const VF p = Exp2Fraction(df, hn::Sub(x, n));
  // 2^n built as a float (exponent field n + 127) and multiplied in (not added into p's
  // exponent bits: for a NaN x that would shift NaN payload bits into the exponent and
  // turn the NaN into a number).
  const auto biased = hn::Add(hn::Sub(hn::BitCast(di, t), hn::BitCast(di, magic)), hn::Set(di, 127));
  const VF two_to_n = hn::BitCast(df, hn::ShiftLeft<23>(biased));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -125.0f)), hn::Mul(p, two_to_n));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_EXP2_INL_H_
