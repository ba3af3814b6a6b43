// The backward task's memory (simd/backward_task-inl.h): each subtile's packed query
// rows, dO, dQ accumulators, lse and D; a block's row-major Q and dO; one key tile's Sᵀ,
// dPᵀ and K / V copies; the key chunk's dK and dV; and what their sizes depend on (a
// thread keeps its scratch between calls: cpu/scratch.h).
//
// Included once per Highway target, by backward_task-inl.h alone (hence the toggling
// include guard, Highway's convention for per-target headers, and the anonymous
// namespace: its names are backward.cpp's).
#if defined(SDPA_CPU_SIMD_BACKWARD_SCRATCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_BACKWARD_SCRATCH_INL_H_
#undef SDPA_CPU_SIMD_BACKWARD_SCRATCH_INL_H_
#else
#define SDPA_CPU_SIMD_BACKWARD_SCRATCH_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/backward_problem.h"
#include "cpu/scratch.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"  // kSubtiles, kKeyTile
#include "cpu/simd/rows-inl.h"          // RowSet

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp): backward.cpp's alone (through backward_task-inl.h)

using namespace simd;  // NOLINT(google-build-using-namespace): the pieces shared with the forward

// Two vectors of query rows, packed for the transposed kernels.
struct Subtile : RowSet {
  hwy::AlignedFreeUniquePtr<float[]> qt, dot, dqt;  // Qᵀ·scale·log2 e (bfloat16: Qᵀ), dOᵀ, dQᵀ accumulators
  hwy::AlignedFreeUniquePtr<float[]> lse2, D;       // per row: lse·log2 e (+inf if fully masked), D
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> qp, dop;  // bfloat16: Q and dO pairs along E, Ev
};

// Everything one thread needs, 64-byte aligned.
struct Scratch {
  std::size_t rows;        // per subtile: 2 vectors
  std::size_t block_rows;  // per block: kSubtiles subtiles
  std::int64_t E_pad, Ev_pad;
  Subtile sub[kSubtiles];
  // Row-major Q and dO of the block (block_rows × E_pad / Ev_pad, zero-padded), read by
  // the dK and dV rank updates.
  hwy::AlignedFreeUniquePtr<float[]> q_rows, do_rows;
  // Sᵀ then Wᵀ, and dPᵀ then dSᵀ, of one key tile for all the block's rows
  // (kKeyTile × block_rows); the dropout factors and the softcap's tanh of one subtile
  // (kKeyTile × rows).
  hwy::AlignedFreeUniquePtr<float[]> st, dpt, zt, tanh_t;
  hwy::AlignedFreeUniquePtr<float[]> k_tile, v_tile, row_buffer, alibi_lanes;
  // dK and dV of the task's key chunk (chunk_keys × E_pad / Ev_pad).
  hwy::AlignedFreeUniquePtr<float[]> dk, dv;
  // bfloat16 path: the block's Q and dO rows in pairs (for dK, dV); Wᵀ and dSᵀ rounded (as
  // st, dpt); one subtile's dS pairs (for dQ); K and V rows; K in pairs of rows (for dQ).
  bool bf16;
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> q_pairs, do_pairs, st16, dpt16, pp, k16, v16, kp;

  Scratch(const BackwardProblem& p, std::int64_t chunk_keys, bool bf16_path)
      : rows(2 * hn::Lanes(DF())), block_rows(kSubtiles * rows), bf16(bf16_path) {
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
    E_pad = RoundUp(p.E, N);
    Ev_pad = std::max<std::int64_t>(RoundUp(p.Ev, N), N);
    const std::int64_t Ev = std::max<std::int64_t>(p.Ev, 1);
    // bfloat16: Qᵀ and dOᵀ get a zero row past an odd width, the partner of its last pair.
    const std::int64_t E_even = RoundUp(p.E, 2), Ev_even = RoundUp(Ev, 2);
    for (Subtile& t : sub) {
      t.qt = allocate_aligned<float>(E_even * rows);
      t.dot = allocate_aligned<float>(Ev_even * rows);
      if (bf16) {
        t.qp = allocate_aligned<std::uint16_t>(E_even * rows);
        t.dop = allocate_aligned<std::uint16_t>(Ev_even * rows);
      }
      t.dqt = allocate_aligned<float>(p.E * rows);
      t.lse2 = allocate_aligned<float>(rows);
      t.D = allocate_aligned<float>(rows);
      t.rows.reserve(rows);
    }
    q_rows = allocate_aligned<float>(block_rows * E_pad);
    do_rows = allocate_aligned<float>(block_rows * Ev_pad);
    st = allocate_aligned<float>(kKeyTile * block_rows);
    dpt = allocate_aligned<float>(kKeyTile * block_rows);
    zt = allocate_aligned<float>(kKeyTile * rows);
    tanh_t = allocate_aligned<float>(p.softcap > 0.0 ? kKeyTile * rows : 1);
    k_tile = allocate_aligned<float>(kKeyTile * p.E);
    v_tile = allocate_aligned<float>(kKeyTile * Ev);
    row_buffer = allocate_aligned<float>(std::max({kKeyTile, p.E, Ev}));
    alibi_lanes = allocate_aligned<float>(2 * rows);
    dk = allocate_aligned<float>(chunk_keys * E_pad);
    dv = allocate_aligned<float>(chunk_keys * Ev_pad);
    if (bf16) {
      q_pairs = allocate_aligned<std::uint16_t>(block_rows * E_pad);
      do_pairs = allocate_aligned<std::uint16_t>(block_rows * Ev_pad);
      st16 = allocate_aligned<std::uint16_t>(kKeyTile * block_rows);
      dpt16 = allocate_aligned<std::uint16_t>(kKeyTile * block_rows);
      pp = allocate_aligned<std::uint16_t>(kKeyTile * rows);
      k16 = allocate_aligned<std::uint16_t>(kKeyTile * E_even);
      v16 = allocate_aligned<std::uint16_t>(kKeyTile * Ev_even);
      kp = allocate_aligned<std::uint16_t>(kKeyTile * E_even);
    }
  }
};

// What Scratch's sizes depend on: a calling thread keeps its last call's scratch for its
// next call with the same (ScratchCache, cpu/scratch.h; as the forward's), unless the
// head dim is above kLargestKeptDim or the key chunk's dK and dV above
// kLargestKeptChunkFloats. Made per call, by the calling thread for every thread, it was
// 2-7% of a small training backward on two threads (B = 16, Hq = 4, L = S = 64, E = 16:
// 0.347 -> 0.324 ms; bench/RESULTS.md, "The backward's scratch").
struct ScratchKey {
  std::int64_t E, Ev, chunk_keys;
  bool softcap, bf16;
  bool operator==(const ScratchKey&) const = default;
};

// Unlike the rest of Scratch, dK and dV grow with the key chunk (up to 16384 keys):
// kept only up to 1 MiB a thread (at E = Ev = 128: a chunk of 960 keys, S <= 960, the
// chunk being whole key tiles), so that a long sequence's backward does not hold
// megabytes per thread after it returns; making them is nothing next to such a call's
// work.
constexpr std::int64_t kLargestKeptChunkFloats = std::int64_t{1} << 18;

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_BACKWARD_SCRATCH_INL_H_
