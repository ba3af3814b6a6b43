// The end of a subtile of the forward (simd/forward_task-inl.h): its running state — Oᵀ
// (a dim a row, a query row a lane), the reference max m (log2 units) and the sum l —
// made into the call's outputs, O = Oᵀᵀ · (1/l) and lse = m·ln2 + ln l, written to the
// output and lse operands a run of consecutive rows at a time where they are float32.
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_STORE_OUTPUTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_STORE_OUTPUTS_INL_H_
#undef SDPA_CPU_SIMD_STORE_OUTPUTS_INL_H_
#else
#define SDPA_CPU_SIMD_STORE_OUTPUTS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/problem.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"
#include "cpu/simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

constexpr double kLn2 = 0.6931471805599453;

// O = Oᵀ · (1 / l) for the subtile's rows (`lanes` lanes of Oᵀ a dim, `Ev` dims, l one
// float a lane), transposed into `output`: straight into a float32 output a run of
// consecutive rows at a time, the row's factor applied as it is transposed
// (TransposeRowsScaled: a pass over Oᵀ first cost as much as the transpose for a small
// head), otherwise through `row_major` (a row of Ev floats per query row). A row no key
// reached (l = 0) gives 0 whatever its lanes of Oᵀ hold (0 · V of a NaN or an infinity):
// where there is one, Oᵀ is scaled lane-wise first, with the select, and transposed as it
// is. A NaN row stays NaN. kMaxLanes: the most lanes a subtile has.
template <std::size_t kMaxLanes>
void StoreOutputRows(const Operand& output, const std::vector<Row>& rows, float* ot, std::size_t lanes, std::size_t Ev,
                     const float* l, float* row_major) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  HWY_ALIGN float inverse[kMaxLanes];
  bool unreached = false;  // (of the subtile's rows: its padding lanes have l = 0 too)
  const std::size_t real = rows.size();
  for (std::size_t lane0 = 0; lane0 < lanes; lane0 += n) {
    const VF sum = hn::Load(df, l + lane0);
    hn::Store(hn::Div(hn::Set(df, 1.0f), sum), df, inverse + lane0);
    if (lane0 < real)
      unreached = unreached || !hn::AllFalse(df, hn::And(hn::Eq(sum, hn::Zero(df)), hn::FirstN(df, real - lane0)));
  }
  if (unreached) {
    for (std::size_t lane0 = 0; lane0 < lanes; lane0 += n) {
      const auto zero = hn::Eq(hn::Load(df, l + lane0), hn::Zero(df));
      const VF factor = hn::Load(df, inverse + lane0);
      for (std::size_t d = 0; d < Ev; ++d) {
        float* at = ot + d * lanes + lane0;
        hn::Store(hn::IfThenZeroElse(zero, hn::Mul(hn::Load(df, at), factor)), df, at);
      }
      hn::Store(hn::Set(df, 1.0f), df, inverse + lane0);  // (scaled already)
    }
  }
  if (FloatRows(output) && output.row_stride > 0) {
    ForEachRun(rows, [&](std::size_t r0, std::size_t r1) {
      const Row& first = rows[r0];
      TransposeRowsScaled(ot + r0, lanes, Ev, r1 - r0,
                          reinterpret_cast<float*>(output.address(first.matrix, first.i, 0)),
                          static_cast<std::size_t>(output.row_stride), inverse + r0);
    });
    return;
  }
  TransposeRowsScaled(ot, lanes, Ev, rows.size(), row_major, Ev, inverse);
  for (std::size_t r = 0; r < rows.size(); ++r)
    StoreRow(output, rows[r].matrix, rows[r].i, 0, static_cast<std::int64_t>(Ev), row_major + r * Ev);
}

// lse = m·ln2 + ln l for the subtile's rows (m and l: `lanes` floats each), into `lse`.
// In double lanes, as the scalar std::log it replaces (a float32 lse rounds once from it):
// a log a row was a sixth of a small training forward's time (B = 16, Hq = 4, L = S = 64,
// E = 16; bench/RESULTS.md, "The lse").
template <std::size_t kMaxLanes>
void StoreLse(const Operand& lse, const std::vector<Row>& rows, const float* m, const float* l, std::size_t lanes) {
  const hn::Repartition<double, DF> dd;
  const hn::Rebind<float, decltype(dd)> df_half;
  HWY_ALIGN double values[kMaxLanes];
  for (std::size_t lane0 = 0; lane0 < lanes; lane0 += hn::Lanes(dd)) {
    const auto sum = hn::PromoteTo(dd, hn::LoadU(df_half, l + lane0));
    const auto max = hn::PromoteTo(dd, hn::LoadU(df_half, m + lane0));
    // Log takes l > 0 only: a row that saw no key has l = 0 and lse −inf, a NaN row l =
    // NaN and lse NaN (l is 1 or more otherwise: the largest score's term is 2^0).
    const auto finite = hn::MulAdd(max, hn::Set(dd, kLn2), hn::Log(dd, sum));
    const auto none = hn::Set(dd, -std::numeric_limits<double>::infinity());
    hn::Store(hn::IfThenElse(hn::IsNaN(sum), sum, hn::IfThenElse(hn::Eq(sum, hn::Zero(dd)), none, finite)), dd,
              values + lane0);
  }
  // A float32 lse (every input dtype but float64) a run of consecutive rows at a time:
  // the generic per-element store was another twentieth of that forward. (Not through
  // FloatRows and a transpose as the output: the lse operand is (rows, 1) with column
  // stride 0, and one float a row needs no transpose.)
  if (lse.dtype == DType::float32 && !lse.paged() && reinterpret_cast<std::uintptr_t>(lse.data) % alignof(float) == 0) {
    ForEachRun(rows, [&](std::size_t r0, std::size_t r1) {
      float* first = reinterpret_cast<float*>(lse.address(rows[r0].matrix, rows[r0].i, 0));
      for (std::size_t r = r0; r < r1; ++r)
        first[static_cast<std::ptrdiff_t>(r - r0) * lse.row_stride] = static_cast<float>(values[r]);
    });
    return;
  }
  for (std::size_t r = 0; r < rows.size(); ++r) lse.store<double>(rows[r].matrix, rows[r].i, 0, values[r]);
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_STORE_OUTPUTS_INL_H_
