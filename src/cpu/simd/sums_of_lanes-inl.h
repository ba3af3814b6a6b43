// The horizontal sums of the decode score kernels (simd/decode_rows-inl.h), whose lanes
// run along E so that each score ends as the sum of one accumulator's lanes:
// SumsOfLanes, a vector of sums at a time, by transposes of 128-bit blocks on x86 (the
// raw-intrinsic kernels' counterpart is lane_sums.h).
//
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_SUMS_OF_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_SUMS_OF_LANES_INL_H_
#undef SDPA_CPU_SIMD_SUMS_OF_LANES_INL_H_
#else
#define SDPA_CPU_SIMD_SUMS_OF_LANES_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"  // DF, VF

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// The sums of four vectors' lanes, four sums in each 128-bit block: block b holds
// [Σ a, Σ b, Σ c, Σ d] over that block's lanes. 9 instructions for 4 vectors, where a
// horizontal sum each costs ~8 (and a dependent chain): the reduction was ~40 % of the
// scores kernel's time on the Cascade Lake Xeon of bench/RESULTS.md.
HWY_INLINE VF BlockSums4(VF a, VF b, VF c, VF d) {
  const DF df;
  const hn::Repartition<double, DF> d64;  // (double, not uint64: no int/float domain crossing)
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));  // a02 b02 a13 b13
  const VF cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));  // c02 d02 c13 d13
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64)),
                 hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64)));
}

// Block g of the result = the sum of v[g]'s blocks, for one vector v[g] per block of D
// (a transpose of blocks: 15 instructions for 16 sums on AVX-512, where folding each
// vector alone took 5 and a store). Halves first, (b0 + b2) + (b1 + b3), as a vector
// folded alone would add them.
template <class D>
HWY_INLINE hn::Vec<D> BlockTotals(D d, const hn::Vec<D>* v) {
  constexpr std::size_t kBlocks = hn::MaxLanes(D()) / 4;
  if constexpr (kBlocks <= 1) {
    return v[0];
  } else {
    const hn::Half<D> dh;
    hn::Vec<hn::Half<D>> folded[kBlocks];  // folded[i]: v[i]'s halves added
    for (std::size_t i = 0; i < kBlocks; i += 2) {
      const auto pair = hn::Add(hn::ConcatLowerLower(d, v[i + 1], v[i]), hn::ConcatUpperUpper(d, v[i + 1], v[i]));
      folded[i] = hn::LowerHalf(dh, pair);
      folded[i + 1] = hn::UpperHalf(dh, pair);
    }
    return hn::Combine(d, BlockTotals(dh, folded + kBlocks / 2), BlockTotals(dh, folded));
  }
}

// The sum of v's 128-bit blocks: halves first, as BlockTotals adds them.
template <class D>
HWY_INLINE auto FoldBlocks(D, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) <= 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return FoldBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// v (4 lanes) in the low lanes of a vector of D, the others 0.
template <class D>
HWY_INLINE hn::Vec<D> ZeroExtendFrom4(D d, hn::Vec<hn::CappedTag<float, 4>> v) {
  if constexpr (hn::MaxLanes(D()) <= 4) {
    return v;
  } else {
    return hn::ZeroExtendVector(d, ZeroExtendFrom4(hn::Half<D>(), v));
  }
}

// sums[i] = Σ lanes of acc[i] for i < M, a vector of sums at a time (sums holds M rounded
// up to whole vectors; the lanes past M get 0).
template <int M>
HWY_INLINE void SumsOfLanes(const VF* acc, float* HWY_RESTRICT sums) {
  const DF df;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF())), kBlocks = N / 4;
  if constexpr (M <= 4 && kBlocks > 1) {  // one vector's blocks: the other vectors' zeros not added
    const auto at = [&](int j) { return j < M ? acc[j] : hn::Zero(df); };
    // (One store of the whole vector: two, zeros then 4 lanes over them, left a
    // caller's reload of the vector waiting on both.)
    hn::Store(ZeroExtendFrom4(df, FoldBlocks(df, BlockSums4(at(0), at(1), at(2), at(3)))), df, sums);
    return;
  }
  for (int i = 0; i < M; i += N) {
    VF blocks[kBlocks];  // blocks[b]: BlockSums4 of acc[i + 4b, i + 4b + 4)
    for (int b = 0; b < kBlocks; ++b) {
      const auto at = [&](int j) { return i + 4 * b + j < M ? acc[i + 4 * b + j] : hn::Zero(df); };
      blocks[b] = BlockSums4(at(0), at(1), at(2), at(3));
    }
    hn::Store(BlockTotals(df, blocks), df, sums + i);
  }
}
#else
template <int M>
HWY_INLINE void SumsOfLanes(const VF* acc, float* HWY_RESTRICT sums) {
  const DF df;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  for (int i = 0; i < M; ++i) sums[i] = hn::GetLane(hn::SumOfLanes(df, acc[i]));
  for (int i = M; i < (M + N - 1) / N * N; ++i) sums[i] = 0.0f;  // as the x86 version's
}
#endif

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_SUMS_OF_LANES_INL_H_
