// The forward task's memory (simd/forward_task-inl.h): each subtile's query rows and
// running state (m, l, Oᵀ), the tile buffers a thread reuses from task to task, and what
// their sizes depend on (a thread keeps its scratch between calls: cpu/scratch.h).
//
// Included once per Highway target, by forward_task-inl.h alone (hence the toggling
// include guard, Highway's convention for per-target headers, and the anonymous
// namespace: its names are forward.cpp's).
#if defined(SDPA_CPU_SIMD_FORWARD_SCRATCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_FORWARD_SCRATCH_INL_H_
#undef SDPA_CPU_SIMD_FORWARD_SCRATCH_INL_H_
#else
#define SDPA_CPU_SIMD_FORWARD_SCRATCH_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/problem.h"
#include "cpu/scratch.h"
#include "cpu/simd/int8_kernels.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/decode_rows-inl.h"   // kFewRows, kDecodeKeyTile, kMaxRowsAhead
#include "cpu/simd/lse_merge-inl.h"     // SplitStateFloats
#include "cpu/simd/microkernels-inl.h"  // kSubtiles, kKeyTile
#include "cpu/simd/rows-inl.h"          // RowSet

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp): forward.cpp's alone (through forward_task-inl.h)

using namespace simd;  // NOLINT(google-build-using-namespace): the pieces shared with the backward

// One tile of 2 vectors of query rows (1 when decoding, 3 for long query groups on
// AVX-512: see ForwardFloat32) and its running state. A task holds several, so that
// each K/V tile, once loaded into the cache, serves all of them (long sequences would
// otherwise stream K and V from memory once per 32 queries).
struct Subtile : RowSet {
  hwy::AlignedFreeUniquePtr<float[]> qt, ot, m, l;  // Qᵀ (scaled), Oᵀ, reference max and running sum
  // Oᵀ holds nothing yet in this Attend (it stands for 0): the first P·V writes it instead
  // of adding to zeros, so a tile or two of keys (a small head) needs no zero fill and no
  // load of Oᵀ.
  bool ot_fresh = true;
  hwy::AlignedFreeUniquePtr<float[]> q_rows;       // decode rows: Q (scaled) row-major, kFewRows × E
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> q16;  // decode rows on vdpbf16ps: Q (bfloat16, unscaled) row-major
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> qp;   // bfloat16 path: query pairs
  // Decode rows on vpdpwssd (int8 K): Q rounded to int16 (int8::pack_query), rows
  // int8::QueryStride(E) apart, and their scales; q_int16 when that packing took.
  hwy::AlignedFreeUniquePtr<std::int16_t[]> q_hat;
  std::array<float, kFewRows> q_sigma{};
  bool q_int16 = false;
};

// Per-thread scratch, 64-byte aligned. `rows` = kVectors vectors of query rows per subtile.
template <std::size_t kVectors>
struct Scratch {
  std::size_t rows;
  Subtile sub[kSubtiles];
  hwy::AlignedFreeUniquePtr<float[]> st, zt, k_tile, v_tile, row_buffer, alibi_lanes;  // zt: dropout factors
  // A subtile's query or output rows, before or after the transpose; during the key loop,
  // int8::row_accumulate's row-major P·V, summed over a decode task's tiles.
  hwy::AlignedFreeUniquePtr<float[]> row_major;
  hwy::AlignedFreeUniquePtr<float[]> k_scale, v_scale;  // int8 K/V: the key tile's scales
  std::vector<const std::byte*> k_rows, v_rows;  // decode rows: the tile's rows in place (and kMaxRowsAhead more)
  // bfloat16 path: probability pairs, K and V tiles, value pairs.
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> pp, k16, v16, vp;

  Scratch(const Problem& p, bool bf16_path) : rows(kVectors * hn::Lanes(DF())) {
    const std::int64_t E_even = (p.E + 1) / 2 * 2, Ev = std::max<std::int64_t>(p.Ev, 1);
    for (Subtile& t : sub) {
      t.qt = allocate_aligned<float>(E_even * rows);  // (bfloat16: a zero row past an odd E)
      t.ot = allocate_aligned<float>(Ev * rows);
      t.m = allocate_aligned<float>(rows);
      t.l = allocate_aligned<float>(rows);
      if (bf16_path) t.qp = allocate_aligned<std::uint16_t>(E_even * rows);
      // Whatever this call's K: the scratch is kept for later calls with other dtypes.
      t.q_rows = allocate_aligned<float>(kFewRows * p.E);
      t.q16 = allocate_aligned<std::uint16_t>(kFewRows * p.E);
      t.q_hat = allocate_aligned<std::int16_t>(kFewRows * int8::QueryStride(p.E));
      t.rows.reserve(rows);
    }
    // A tile's keys: a decode task's longer tiles (whose K or V may still take the tile
    // kernels: k_tile, v_tile, a tile-layout Sᵀ) or the tile kernels' (kKeyTile, the
    // bfloat16 buffers below).
    static_assert(kDecodeKeyTile >= kKeyTile);
    const std::int64_t tile = kDecodeKeyTile;
    st = allocate_aligned<float>(tile * rows);
    zt = allocate_aligned<float>(p.dropout_p > 0.0 ? tile * rows : 1);
    k_tile = allocate_aligned<float>(tile * p.E);
    v_tile = allocate_aligned<float>(tile * Ev);
    row_buffer = allocate_aligned<float>(std::max({tile, p.E, Ev}));  // a mask, query or output row
    alibi_lanes = allocate_aligned<float>(2 * rows);
    row_major = allocate_aligned<float>(rows * std::max(p.E, Ev));
    // (N more: the decode kernels read a vector of scales from any key of the tile, up
    // to N − 1 past it.)
    const std::size_t scales = tile + hn::Lanes(DF());
    k_scale = allocate_aligned<float>(scales);
    v_scale = allocate_aligned<float>(scales);
    std::fill(k_scale.get(), k_scale.get() + scales, 0.0f);
    std::fill(v_scale.get(), v_scale.get() + scales, 0.0f);
    k_rows.resize(tile + kMaxRowsAhead);
    v_rows.resize(tile + kMaxRowsAhead);
    if (bf16_path) {
      pp = allocate_aligned<std::uint16_t>(kKeyTile * rows);
      k16 = allocate_aligned<std::uint16_t>(kKeyTile * E_even);
      v16 = allocate_aligned<std::uint16_t>(kKeyTile * Ev);
      vp = allocate_aligned<std::uint16_t>(kKeyTile * Ev);
    }
  }
};

// What Scratch's sizes depend on: a calling thread keeps its last call's scratch for its
// next call with the same (ScratchCache, cpu/scratch.h), unless the head dim is above
// kLargestKeptDim.
struct ScratchKey {
  std::int64_t E, Ev;
  bool bf16, int8, dropout;
  bool operator==(const ScratchKey&) const = default;
};

// Floats in one subtile's split state (simd/lse_merge-inl.h).
template <std::size_t kVectors>
std::int64_t StateSize(const Problem& p) {
  return SplitStateFloats(kVectors * hn::Lanes(DF()), p.Ev);
}

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_FORWARD_SCRATCH_INL_H_
