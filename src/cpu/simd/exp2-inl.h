// 2^x as a Highway vector function, shared by the forward and backward kernels.
// Included once per target by a file that uses hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_EXP2_INL_H_
#undef SDPA_CPU_EXP2_INL_H_
#else
#define SDPA_CPU_EXP2_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// 2^x for x <= 0, −inf and NaN: x = n + f with n = round(x), f ∈ [−½, ½]; 2^f by its
// Taylor polynomial of degree 6 (relative error at most 1.2e-7, at f = ±½: about one float32 ulp), 2^n
// as a float with exponent field n + 127. The rounding uses the 1.5·2^23 trick, so no float→int
// conversion (whose out-of-range behaviour differs between targets) is needed.
// x < −125 gives exactly 0 (masked scores are −inf); NaN stays NaN.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF Exp2(DF df, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(df, 12582912.0f);
  const VF t = hn::Add(x, magic);
  const VF n = hn::Sub(t, magic);
  const VF f = hn::Sub(x, n);
  VF p = hn::Set(df, 1.5403530393381606e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.3333558146428443e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.6181291076284772e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.5504108664821580e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022650695910071e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.9314718055994531e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  // 2^n built as a float and multiplied in (not added into p's exponent bits: for a NaN x
  // that would shift NaN payload bits into the exponent and turn the NaN into a number).
  const auto biased = hn::Add(hn::Sub(hn::BitCast(di, t), hn::BitCast(di, magic)), hn::Set(di, 127));
  const VF two_to_n = hn::BitCast(df, hn::ShiftLeft<23>(biased));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -125.0f)), hn::Mul(p, two_to_n));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_EXP2_INL_H_
