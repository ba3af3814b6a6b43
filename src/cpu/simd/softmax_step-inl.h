// The online softmax's step over a key tile of Sᵀ (FlashAttention-2's recurrence, in
// log2 units: simd/forward_task-inl.h): turns the scores into Pᵀ in place, moves each
// row's reference max m and sum l on, and returns α, the factor of the row's Oᵀ. Two
// layouts, the same bits for a row in both (asking for the weights keeps the first):
//
// - the tiles' (LaneSoftmaxStep): a column (key) a vector, a row a lane;
// - a decode task's dense Sᵀ (DenseSoftmax; the decode row kernels, simd/decode_rows-inl.h,
//   write Sᵀ so when they can). The tiles' layout for R = 4 rows of 16 lanes ran the
//   softmax's exp, max and sums on 12 lanes of nothing: ~18 % of an int8 decode's time on
//   the Cascade Lake Xeon of bench/RESULTS.md, 5–10 % of float32's and bfloat16's. A
//   decode task without the modifiers that work lane by lane (softcap, ALiBi, dropout)
//   and without the weights output writes Sᵀ dense instead: column c of row r at
//   st[c·G + r], G = DenseGroup(R), so a vector holds N/G columns.
//
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_SOFTMAX_STEP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_SOFTMAX_STEP_INL_H_
#undef SDPA_CPU_SIMD_SOFTMAX_STEP_INL_H_
#else
#define SDPA_CPU_SIMD_SOFTMAX_STEP_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/decode_rows-inl.h"  // kFewRows
#include "cpu/simd/exp2-inl.h"
#include "cpu/simd/microkernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// The step over the tiles' Sᵀ (`rows` floats a column) for lanes [lane0, lane0 + N)
// of its columns [0, padded); m and l point at those lanes. The max and the sum over
// the columns run as kPartials chains, column c in chain c mod kPartials: one chain
// would put a 4-cycle max or add per column on the critical path, about as long as
// issuing the column's exp. The chains depend on the column only, so any blocking of the
// rows gives a row the same bits.
HWY_INLINE VF LaneSoftmaxStep(float* HWY_RESTRICT st, std::size_t rows, std::int64_t padded, std::size_t lane0,
                              float* HWY_RESTRICT m, float* HWY_RESTRICT l) {
  const DF df;
  constexpr std::int64_t kPartials = 4;
  static_assert(kPartials == 4, "the chains' starts and final sums below are written out for 4");
  const VF m_old = hn::Load(df, m);
  VF m_part[kPartials] = {m_old, m_old, m_old, m_old};
  std::int64_t c = 0;
  for (; c + kPartials <= padded; c += kPartials)
    for (std::int64_t j = 0; j < kPartials; ++j)
      m_part[j] = hn::Max(m_part[j], hn::Load(df, st + (c + j) * rows + lane0));
  for (; c < padded; ++c) m_part[c % kPartials] = hn::Max(m_part[c % kPartials], hn::Load(df, st + c * rows + lane0));
  const VF m_max = hn::Max(hn::Max(m_part[0], m_part[1]), hn::Max(m_part[2], m_part[3]));
  const auto [m_new, m_use, alpha] = NextReference(m_old, m_max);
  VF sum[kPartials] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
  const auto exponentiate = [&](std::int64_t column, VF& partial) {
    float* at = st + column * rows + lane0;
    const VF prob = Exp2(df, hn::Sub(hn::Load(df, at), m_use));
    hn::Store(prob, df, at);
    partial = hn::Add(partial, prob);
  };
  for (c = 0; c + kPartials <= padded; c += kPartials)
    for (std::int64_t j = 0; j < kPartials; ++j) exponentiate(c + j, sum[j]);
  for (; c < padded; ++c) exponentiate(c, sum[c % kPartials]);
  const VF tile_sum = hn::Add(hn::Add(sum[0], sum[1]), hn::Add(sum[2], sum[3]));
  hn::Store(hn::MulAdd(hn::Load(df, l), alpha, tile_sum), df, l);
  hn::Store(m_new, df, m);
  return alpha;
}

// R rows' group: R rounded up to a power of two, so that a vector holds whole columns.
inline std::int64_t DenseGroup(std::int64_t rows) {
  std::int64_t group = 1;
  while (group < rows) group *= 2;
  return group;
}

// The columns the dense softmax runs over for `cols` keys (those past cols hold −inf):
// whole vectors, and whole quads of columns (the 4 chains of its sums).
inline std::int64_t DenseColumns(std::int64_t cols, std::int64_t group) {
  const auto per_vector = static_cast<std::int64_t>(hn::Lanes(DF())) / group;
  return RoundUp(cols, std::max<std::int64_t>(4, per_vector));
}

// The online-softmax step over a dense Sᵀ of `columns` columns (DenseColumns) in groups
// of G: turns Sᵀ into Pᵀ in place, updates m and l (the reference max and the sum, row r
// at lane r, as the tiles keep them) and returns α (row r at lane r), Oᵀ's factor. Each row
// gets the bits of the tiles' step (LaneSoftmaxStep): the same reference m, shift
// and α (NextReference), the same Exp2 of the same differences; the max (the same in any
// order, but for NaN: a row with a NaN score is NaN in both, its m may differ); and the
// same sums: column c in chain c mod 4, each chain in column order (read back from Pᵀ a
// quad of columns, 4·G floats, at a time), the chains then added as (0 + 1) + (2 + 3).
template <std::int64_t G>
HWY_INLINE VF DenseSoftmaxStep(float* HWY_RESTRICT st, std::int64_t columns, float* HWY_RESTRICT m,
                               float* HWY_RESTRICT l) {
  const DF df;
  const auto N = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t vectors = columns * G / N;
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN float rows[HWY_MAX_BYTES / sizeof(float)];
  // The tile's max, lane i for row i mod G (4 chains: the max's latency).
  VF part[4];
  for (VF& v : part) v = hn::Set(df, kMinusInf);
  std::int64_t j = 0;
  for (; j + 4 <= vectors; j += 4)
    for (std::int64_t k = 0; k < 4; ++k) part[k] = hn::Max(part[k], hn::Load(df, st + (j + k) * N));
  for (; j < vectors; ++j) part[0] = hn::Max(part[0], hn::Load(df, st + j * N));
  hn::Store(hn::Max(hn::Max(part[0], part[1]), hn::Max(part[2], part[3])), df, lanes);
  const VF m_old = hn::Load(df, m);
  hn::Store(m_old, df, rows);
  for (std::int64_t i = 0; i < N; ++i) rows[i % G] = lanes[i] > rows[i % G] ? lanes[i] : rows[i % G];
  const auto [m_new, m_use, alpha] = NextReference(m_old, hn::Load(df, rows));
  hn::Store(m_use, df, rows);
  for (std::int64_t i = 0; i < N; ++i) lanes[i] = rows[i % G];
  const VF m_spread = hn::Load(df, lanes);  // m_use, lane i for row i mod G
  for (j = 0; j < vectors; ++j) hn::Store(Exp2(df, hn::Sub(hn::Load(df, st + j * N), m_spread)), df, st + j * N);
  // The chains: H vectors of a quad's 4·G floats, chain k of row r at float k·G + r.
  using DQuad = hn::CappedTag<float, 4 * G>;
  const DQuad dq;
  constexpr std::int64_t kQuadLanes = static_cast<std::int64_t>(hn::MaxLanes(DQuad()));
  constexpr std::int64_t H = 4 * G / kQuadLanes;
  hn::Vec<DQuad> sum[H];
  for (auto& v : sum) v = hn::Zero(dq);
  for (std::int64_t q = 0; q < columns / 4; ++q)
    for (std::int64_t h = 0; h < H; ++h) sum[h] = hn::Add(sum[h], hn::Load(dq, st + q * 4 * G + h * kQuadLanes));
  HWY_ALIGN float chains[4 * G];
  for (std::int64_t h = 0; h < H; ++h) hn::Store(sum[h], dq, chains + h * kQuadLanes);
  for (std::int64_t i = 0; i < N; ++i) lanes[i] = 0.0f;
  for (std::int64_t r = 0; r < G; ++r) lanes[r] = (chains[r] + chains[G + r]) + (chains[2 * G + r] + chains[3 * G + r]);
  hn::Store(hn::MulAdd(hn::Load(df, l), alpha, hn::Load(df, lanes)), df, l);
  hn::Store(m_new, df, m);
  return alpha;
}

// f(std::integral_constant<std::int64_t, G>()) for the run-time group G = group, a power
// of two no greater than the lanes or kFewRows.
template <std::int64_t G = 1, class F>
HWY_INLINE auto WithGroup(std::int64_t group, F f) {
  constexpr auto kLargest = std::min(static_cast<std::int64_t>(hn::MaxLanes(DF())), kFewRows);
  if constexpr (G >= kLargest) {
    return f(std::integral_constant<std::int64_t, G>());
  } else {
    if (group == G) return f(std::integral_constant<std::int64_t, G>());
    return WithGroup<G * 2>(group, f);
  }
}

inline VF DenseSoftmax(float* st, std::int64_t columns, std::int64_t group, float* m, float* l) {
  return WithGroup(group, [&](auto g) { return DenseSoftmaxStep<decltype(g)::value>(st, columns, m, l); });
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_SOFTMAX_STEP_INL_H_
