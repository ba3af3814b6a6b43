// The register-blocked microkernels of the SIMD forward and backward (simd/forward_task-inl.h,
// simd/backward_task-inl.h) and their tile constants. Tiles are held transposed, query rows
// along the vector lanes (a subtile is 1, 2 or 3 vectors of rows), so every product is a
// broadcast of one K, V or weight element against a row of lanes: no horizontal sums.
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_MICROKERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_MICROKERNELS_INL_H_
#undef SDPA_CPU_SIMD_MICROKERNELS_INL_H_
#else
#define SDPA_CPU_SIMD_MICROKERNELS_INL_H_
#endif

#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/simd/bf16_kernels.h"
#include "hwy/highway.h"
#if HWY_ARCH_X86
#include <xmmintrin.h>  // _mm_prefetch (RequestLine)
#endif
// Per-target headers go after highway.h.
#include "cpu/simd/exp2-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocks: (keys × 2 row vectors) accumulators for the score kernel, (dims × 2
// row vectors) for the accumulate kernel — half the rows for decoding, where a KV head's
// group of queries fills few lanes, and half again as many for long query groups on
// AVX-512 (simd/forward.cpp: ThreeVectorsPay). AVX-512 has 32 vector registers, AVX2
// and SSE 16.
constexpr std::size_t kKeyBlock = HWY_MAX_BYTES >= 64 ? 12 : 6;
constexpr std::size_t kValueBlock = HWY_MAX_BYTES >= 64 ? 8 : 4;
// Keys per score block for a subtile of `Vectors` row vectors: 3 vectors leave registers
// for two thirds of the keys (8 on AVX-512: 24 accumulators, 3 Qᵀ loads and 8 broadcasts
// per 24 FMAs, against 2 and 12 for 2 vectors × 12 keys).
template <std::size_t Vectors>
constexpr std::size_t kKeyBlockOf = Vectors >= 3 ? kKeyBlock * 2 / 3 : kKeyBlock;
constexpr std::int64_t kKeyTile = 96;  // keys per step: a multiple of every key block
constexpr std::int64_t kSubtiles = 4;  // subtiles (of 1, 2 or 3 row vectors) that share each K/V tile
static_assert(kKeyTile % kKeyBlock == 0 && kKeyTile % kKeyBlockOf<3> == 0);
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.4426950408889634;

inline std::int64_t RoundUp(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Requests the 64-byte line at `at` into L2 (prefetcht1, not hwy::Prefetch's prefetcht0:
// on the Zen 4 of bench/RESULTS.md a request into L1 holds one of its few miss buffers
// until the line arrives, and with the memory slow a one-thread float32 decode read
// 9.3 GB/s that way against 16–17 into L2). For kernels that request rows among their
// loads (GCC keeps a prefetch builtin there; a loop of nothing but builtins it deleted:
// PrefetchRows in rows-inl.h).
HWY_INLINE void RequestLine(const void* at) {
#if HWY_ARCH_X86
  _mm_prefetch(static_cast<const char*>(at), _MM_HINT_T1);
#else
  hwy::Prefetch(at);
#endif
}

// Floats in a 64-byte line: a row's requests are this many elements apart.
constexpr std::int64_t kLineFloats = 16;

// The online softmax's next reference m (log2 units) for rows whose old reference is
// m_old and whose scores so far peak at m_max (≥ m_old: the old m included) —
// conditional rescaling, as FlashAttention-4 does: a row keeps its
// old m while the max rises by at most 8, so its P are at most 2^8 (far from float32's
// range; l ≤ S · 2^8) and α = 2^0 = 1 leaves Oᵀ as it is. Without it, one of a vector's
// 16 rows found a new max in most key tiles of a long row, and rescaling Oᵀ was a sixth
// of the softmax. Lane by lane, so a row's bits depend on its own scores only; the tiles'
// step and the dense decode step (simd/softmax_step-inl.h) share it, so asking for the
// weights changes no output bit. (An old m of −inf or NaN, or a NaN max:
// the difference is not ≤ 8, so m takes the max, as without the rule.)
HWY_INLINE VF NextReferenceMax(VF m_old, VF m_max) {
  const DF df;
  return hn::IfThenElse(hn::Le(hn::Sub(m_max, m_old), hn::Set(df, 8.0f)), m_old, m_max);
}

// One online-softmax step's bookkeeping, shared by the tiles' step and the dense decode
// step so that both give a row the same bits: the next reference m (NextReferenceMax),
// what the scores subtract (m, or 0 where m is −inf: a row that has seen no key yet,
// where −inf − −inf would be NaN), and α = 2^(m_old − shift), the factor of l and Oᵀ.
struct SoftmaxReference {
  VF m, shift, alpha;
};
HWY_INLINE SoftmaxReference NextReference(VF m_old, VF m_max) {
  const DF df;
  const VF m = NextReferenceMax(m_old, m_max);
  const VF shift = hn::IfThenZeroElse(hn::Eq(m, hn::Set(df, kMinusInf)), m);
  return {m, shift, Exp2(df, hn::Sub(m_old, shift))};
}

// st[c·st_stride + ·] = Σ_e k[c·k_stride + e] · qt[e·rows + ·] for `Keys` keys c and
// a subtile's `Vectors` row vectors (2, 1 for decoding's few rows, 3 for long query
// groups): Sᵀ from K and Qᵀ (broadcast K[c][e] against a Qᵀ row); the backward's dPᵀ
// from V and dOᵀ. Only the first `valid` rows of k are read: a key c ≥ valid reads row
// valid − 1 again (its column is the caller's to overwrite), so the last, partial block
// of a tile needs neither a zero-padded copy of K nor rows past its end.
// kRequest: each row's line `ahead` floats further on (the next tile's row, for the
// forward's Task) is requested as the row's own line starts (Task's key_ahead_,
// TileKernelsRequest).
template <std::size_t Vectors = 2, std::size_t Keys = kKeyBlockOf<Vectors>, bool kRequest = false>
HWY_INLINE void ScoreBlock(const float* HWY_RESTRICT qt, std::size_t rows, std::int64_t E, const float* HWY_RESTRICT k,
                           std::int64_t k_stride, float* HWY_RESTRICT st, std::size_t st_stride,
                           std::size_t valid = Keys, std::int64_t ahead = 0) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const float* key_row[Keys];
  for (std::size_t c = 0; c < Keys; ++c)
    key_row[c] = k + static_cast<std::int64_t>(c < valid ? c : valid - 1) * k_stride;
  VF acc[Vectors][Keys];
  for (std::size_t v = 0; v < Vectors; ++v)
    for (std::size_t c = 0; c < Keys; ++c) acc[v][c] = hn::Zero(df);
  for (std::int64_t e = 0; e < E; ++e) {
    if constexpr (kRequest)
      if (e % kLineFloats == 0)
        for (std::size_t c = 0; c < Keys; ++c) RequestLine(key_row[c] + ahead + e);
    VF q[Vectors];
    for (std::size_t v = 0; v < Vectors; ++v) q[v] = hn::Load(df, qt + e * rows + v * N);
    _Pragma("GCC unroll 16") for (std::size_t c = 0; c < Keys; ++c) {
      const VF key = hn::Set(df, key_row[c][e]);
      for (std::size_t v = 0; v < Vectors; ++v) acc[v][c] = hn::MulAdd(q[v], key, acc[v][c]);
    }
  }
  for (std::size_t c = 0; c < Keys; ++c)
    for (std::size_t v = 0; v < Vectors; ++v) hn::Store(acc[v][c], df, st + c * st_stride + v * N);
}

// Keys in the last, partial block of a tile of `cols` keys (0 if there is none): 4, 8 or
// a whole block, whichever is the first to hold the rest.
template <std::size_t Vectors>
constexpr std::int64_t TailBlock(std::int64_t cols) {
  constexpr auto kKeys = static_cast<std::int64_t>(kKeyBlockOf<Vectors>);
  const std::int64_t rest = cols % kKeys;
  return rest == 0 ? 0 : rest <= 4 ? 4 : rest <= 8 && kKeys > 8 ? 8 : kKeys;
}

// Columns of Sᵀ that ScoreTile writes for a tile of `cols` keys: at least cols, at most
// RoundUp(cols, kKeyBlockOf<Vectors>) (within a tile: kKeyTile, or a decode task's
// kDecodeKeyTile, both multiples of the key blocks).
template <std::size_t Vectors>
constexpr std::int64_t ScoreTileColumns(std::int64_t cols) {
  constexpr auto kKeys = static_cast<std::int64_t>(kKeyBlockOf<Vectors>);
  return cols / kKeys * kKeys + TailBlock<Vectors>(cols);
}

// Sᵀ for keys [0, cols) of a tile (K rows k, k_stride apart) into st, columns st_stride
// apart: whole blocks of kKeyBlockOf<Vectors> keys, then the rest in one block
// (TailBlock) that reads only rows < cols. Columns [cols, ScoreTileColumns(cols)) get
// scores of a repeated row, for the caller to overwrite. ahead ≠ 0: each row's line that
// many floats further on is requested as the kernel reaches the row's own (ScoreBlock).
template <std::size_t Vectors = 2, bool kRequest = false>
HWY_INLINE void ScoreTileBlocks(const float* HWY_RESTRICT qt, std::size_t rows, std::int64_t E,
                                const float* HWY_RESTRICT k, std::int64_t k_stride, std::int64_t cols,
                                float* HWY_RESTRICT st, std::size_t st_stride, std::int64_t ahead) {
  constexpr auto kKeys = static_cast<std::int64_t>(kKeyBlockOf<Vectors>);
  constexpr std::size_t kWhole = kKeyBlockOf<Vectors>;
  std::int64_t c = 0;
  for (; c + kKeys <= cols; c += kKeys)
    ScoreBlock<Vectors, kWhole, kRequest>(qt, rows, E, k + c * k_stride, k_stride, st + c * st_stride, st_stride,
                                          kWhole, ahead);
  const auto rest = static_cast<std::size_t>(cols - c);
  const float* k_rest = k + c * k_stride;
  float* st_rest = st + c * st_stride;
  const std::int64_t tail = TailBlock<Vectors>(cols);
  if (tail == 4)
    ScoreBlock<Vectors, 4, kRequest>(qt, rows, E, k_rest, k_stride, st_rest, st_stride, rest, ahead);
  else if (tail == 8)
    ScoreBlock<Vectors, 8, kRequest>(qt, rows, E, k_rest, k_stride, st_rest, st_stride, rest, ahead);
  else if (tail > 0)
    ScoreBlock<Vectors, kWhole, kRequest>(qt, rows, E, k_rest, k_stride, st_rest, st_stride, rest, ahead);
}
template <std::size_t Vectors = 2>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT qt, std::size_t rows, std::int64_t E, const float* HWY_RESTRICT k,
                          std::int64_t k_stride, std::int64_t cols, float* HWY_RESTRICT st, std::size_t st_stride,
                          std::int64_t ahead = 0) {
  if (ahead != 0)
    ScoreTileBlocks<Vectors, true>(qt, rows, E, k, k_stride, cols, st, st_stride, ahead);
  else
    ScoreTileBlocks<Vectors, false>(qt, rows, E, k, k_stride, cols, st, st_stride, 0);
}

// ot[d·rows + ·] += Σ_c v[c·v_stride + d] · pt[c·pt_stride + ·] for `Block` dims d and
// a subtile's `Vectors` row vectors: the forward's Oᵀ += V-broadcast ⊗ Pᵀ; the backward's
// dQᵀ += K-broadcast ⊗ dSᵀ. With `overwrite`, ot's old values are not read (= instead of
// +=, as if they were +0: the same bits). kRequest: the line `ahead` floats past each
// key's dims is requested as they are read (the next tile's row, for the forward's Task).
template <std::size_t Block, std::size_t Vectors = 2, bool kRequest = false>
HWY_INLINE void AccumulateBlock(const float* HWY_RESTRICT pt, std::size_t pt_stride, std::int64_t cols,
                                const float* HWY_RESTRICT v, std::int64_t v_stride, float* HWY_RESTRICT ot,
                                std::size_t rows, bool overwrite = false, std::int64_t ahead = 0) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF acc[Vectors][Block];
  for (std::size_t d = 0; d < Block; ++d)
    for (std::size_t w = 0; w < Vectors; ++w)
      acc[w][d] = overwrite ? hn::Zero(df) : hn::Load(df, ot + d * rows + w * N);
  for (std::int64_t c = 0; c < cols; ++c) {
    if constexpr (kRequest) RequestLine(v + c * v_stride + ahead);
    VF p[Vectors];
    for (std::size_t w = 0; w < Vectors; ++w) p[w] = hn::Load(df, pt + c * pt_stride + w * N);
    _Pragma("GCC unroll 16") for (std::size_t d = 0; d < Block; ++d) {
      const VF value = hn::Set(df, v[c * v_stride + static_cast<std::int64_t>(d)]);
      for (std::size_t w = 0; w < Vectors; ++w) acc[w][d] = hn::MulAdd(p[w], value, acc[w][d]);
    }
  }
  for (std::size_t d = 0; d < Block; ++d)
    for (std::size_t w = 0; w < Vectors; ++w) hn::Store(acc[w][d], df, ot + d * rows + w * N);
}

// ot[d·rows + ·] += Σ_c v[c·v_stride + d] · pt[c·pt_stride + ·] for all `dims` dims:
// whole register blocks, then a block of 8 dims, one of 4 and single dims, each if it
// fits. A block of D dims × V vectors fills the registers with accumulators (AVX-512:
// 16 dims for one vector, 12 for two, 8 for three; half on AVX2 and SSE4) because per
// key it issues V loads, D broadcasts and D·V FMAs: at V = 2, 26 instructions per 16
// FMAs with D = 8, 38 per 24 with D = 12, and a core that issues 4 instructions and 2
// FMAs a cycle gets closer to its FMA rate the fewer there are per FMA (bench/RESULTS.md:
// D = 12 made P·V 8 % faster in isolation on a Cascade Lake Xeon, a whole call 1–3.5 %).
template <std::size_t Vectors = 2, bool kRequest = false>
inline void AccumulateDims(const float* pt, std::size_t pt_stride, std::int64_t cols, const float* v,
                           std::int64_t v_stride, std::int64_t dims, float* ot, std::size_t rows, bool overwrite,
                           std::int64_t ahead) {
  constexpr std::size_t kBlock = Vectors == 1 ? 2 * kValueBlock : Vectors == 2 ? kValueBlock * 3 / 2 : kValueBlock;
  std::int64_t d = 0;
  for (; d + static_cast<std::int64_t>(kBlock) <= dims; d += kBlock)
    AccumulateBlock<kBlock, Vectors, kRequest>(pt, pt_stride, cols, v + d, v_stride, ot + d * rows, rows, overwrite,
                                               ahead);
  const auto narrower_block = [&](auto width) {
    constexpr std::size_t kWidth = decltype(width)::value;
    if constexpr (kWidth < kBlock) {
      if (d + static_cast<std::int64_t>(kWidth) > dims) return;
      AccumulateBlock<kWidth, Vectors, kRequest>(pt, pt_stride, cols, v + d, v_stride, ot + d * rows, rows, overwrite,
                                                 ahead);
      d += kWidth;
    }
  };
  narrower_block(std::integral_constant<std::size_t, 8>());
  narrower_block(std::integral_constant<std::size_t, 4>());
  for (; d < dims; ++d)
    AccumulateBlock<1, Vectors, kRequest>(pt, pt_stride, cols, v + d, v_stride, ot + d * rows, rows, overwrite, ahead);
}
// ahead ≠ 0: the line that many floats past each key's dims is requested as they are
// read (AccumulateBlock).
template <std::size_t Vectors = 2>
inline void Accumulate(const float* pt, std::size_t pt_stride, std::int64_t cols, const float* v, std::int64_t v_stride,
                       std::int64_t dims, float* ot, std::size_t rows, bool overwrite = false, std::int64_t ahead = 0) {
  if (ahead != 0)
    AccumulateDims<Vectors, true>(pt, pt_stride, cols, v, v_stride, dims, ot, rows, overwrite, ahead);
  else
    AccumulateDims<Vectors, false>(pt, pt_stride, cols, v, v_stride, dims, ot, rows, overwrite, 0);
}

// The backward's rank updates: dK, dV accumulate kRankKeys keys × up to 4 vectors of
// dims. kKeyTile is a multiple of it.
constexpr std::size_t kRankKeys = HWY_MAX_BYTES >= 64 ? 6 : 3;
static_assert(kKeyTile % kRankKeys == 0);

// Whether this target takes the vdpbf16ps microkernels (simd/bf16_kernels.h, where
// bf16::chosen()) for bfloat16 inputs, forward and backward: they are written for 32-row
// subtiles of 16-lane vectors and their own key blocks, the AVX-512 target's shape.
constexpr bool kBf16KernelsFit = HWY_MAX_BYTES == 64 && kKeyBlock == bf16::kKeyBlock && kRankKeys == bf16::kRankKeys;

// acc[c·acc_stride + v·N + ·] += Σ_{r0 <= r < r1} wt[c·wt_stride + r] · x[r·x_stride + v·N + ·]
// for kRankKeys keys c and `Vectors` vectors v of dims: dV += Wᵀ-broadcast ⊗ dO rows,
// dK += dSᵀ-broadcast ⊗ Q rows. The accumulators stay in registers over the rows.
template <std::size_t Vectors>
HWY_INLINE void RankUpdate(const float* HWY_RESTRICT wt, std::size_t wt_stride, std::int64_t r0, std::int64_t r1,
                           const float* HWY_RESTRICT x, std::size_t x_stride, float* HWY_RESTRICT acc,
                           std::size_t acc_stride) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF a[kRankKeys][Vectors];
  for (std::size_t c = 0; c < kRankKeys; ++c)
    for (std::size_t v = 0; v < Vectors; ++v) a[c][v] = hn::Load(df, acc + c * acc_stride + v * N);
  for (std::int64_t r = r0; r < r1; ++r) {
    VF xv[Vectors];
    for (std::size_t v = 0; v < Vectors; ++v) xv[v] = hn::Load(df, x + r * x_stride + v * N);
    _Pragma("GCC unroll 16") for (std::size_t c = 0; c < kRankKeys; ++c) {
      const VF w = hn::Set(df, wt[c * wt_stride + r]);
      for (std::size_t v = 0; v < Vectors; ++v) a[c][v] = hn::MulAdd(w, xv[v], a[c][v]);
    }
  }
  for (std::size_t c = 0; c < kRankKeys; ++c)
    for (std::size_t v = 0; v < Vectors; ++v) hn::Store(a[c][v], df, acc + c * acc_stride + v * N);
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_MICROKERNELS_INL_H_
