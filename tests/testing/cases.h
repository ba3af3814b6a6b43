// One case of the hostile grid of DESIGN.md §4, and its random inputs, shared by the
// reference and CPU forward and backward tests so that they run the same grid the same
// way: shapes, dtypes, masks, causal, dropout, and the score modifiers (sliding window
// and its alignment, ALiBi slopes, softcap, sinks).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "testing/helpers.h"

namespace sdpa::testing {

struct Case {
  DType dtype = DType::float32;
  Shape batch = {2};
  std::int64_t heads_q = 2, heads_kv = 2, L = 17, S = 17, E = 8, Ev = 8;
  enum class Mask { none, boolean, additive } mask = Mask::none;
  Shape mask_shape;  // empty: full (batch..., Hq, L, S)
  Causal causal = Causal::none;
  std::optional<double> scale;
  double dropout_p = 0;
  bool interleaved = false;  // (B, L, H, E) buffers viewed as (B, H, L, E)
  double stddev = 1;         // of Q and K: large for large logits, or for saturating the softcap
  // The score modifiers (include/sdpa/options.h).
  std::int64_t window_left = -1, window_right = -1;
  std::optional<Alignment> alignment;
  enum class PerHead { none, per_head, per_batch_head };  // (Hq,) or (batch..., Hq)
  PerHead slopes = PerHead::none;
  DType slopes_dtype = DType::float32;
  double softcap = 0;
  PerHead sinks = PerHead::none;  // float32 logits (sink_logits)
  int num_threads = 0;

  std::string name() const;
};

// The small case the score modifiers' tests start from: float64, B = 2, GQA 4:2, L = 7,
// S = 11, E = 5, Ev = 6.
Case small_gqa_case();

// The awkward-shape grid: L and S each of {1, 3, 17, 113, 127, 129} (small odd lengths,
// and either side of a 128-row block) against E of `dims`. Calls f(L, S, E, n) on the points
// whose running index (from 0, in L, S, E order) is `phase` mod `every`, with n the index
// of the point after it: a sample that still takes every value of each axis, and n a
// seed and a picker for the case's other axes.
template <class F>
void for_sampled_awkward_shapes(std::span<const std::int64_t> dims, int every, int phase, F f) {
  const std::int64_t lengths[] = {1, 3, 17, 113, 127, 129};
  int n = 0;
  for (std::int64_t L : lengths)
    for (std::int64_t S : lengths)
      for (std::int64_t E : dims)
        if (n++ % every == phase) f(L, S, E, n);
}

// (batch..., heads, rows, cols)
Shape shape_of(const Shape& batch, std::int64_t heads, std::int64_t rows, std::int64_t cols);

// ALiBi's geometric slopes 2^(−8(h+1)/Hq): (heads,), or (batch..., heads) different per
// batch element when `per_batch`.
Tensor alibi_slopes(DType dtype, const Shape& batch, std::int64_t heads, bool per_batch);

// Attention sinks of `dtype` for `heads` query heads: (heads,), or (batch..., heads)
// different per batch element when `per_batch`. Logits between −1 and 2, where a sink
// takes a fair share of a row whose scores have unit variance; per batch, batch element
// 1's last head has −inf (no sink).
Tensor sink_logits(DType dtype, const Shape& batch, std::int64_t heads, bool per_batch);

struct Inputs {
  Tensor q, k, v, mask, slopes, sinks;
  StridedCopy qs, ks, vs;
  Options options;
  TensorView qv() const { return qs.storage.nbytes() ? qs.view : q.view(); }
  TensorView kv() const { return ks.storage.nbytes() ? ks.view : k.view(); }
  TensorView vv() const { return vs.storage.nbytes() ? vs.view : v.view(); }
};

// Random q, k, v (interleaved when the case asks) and mask for `c`, the slopes, and the
// options that run it; the same seed gives the same inputs and dropout.
Inputs make_inputs(const Case& c, std::uint64_t seed);

// Causal and alignment together as the contract allows them: alignment unset or equal
// to causal's.
struct CausalAlignment {
  Causal causal;
  std::optional<Alignment> alignment;
};
inline constexpr CausalAlignment kCausalAlignments[] = {{Causal::none, std::nullopt},
                                                        {Causal::none, Alignment::top_left},
                                                        {Causal::none, Alignment::bottom_right},
                                                        {Causal::top_left, std::nullopt},
                                                        {Causal::top_left, Alignment::top_left},
                                                        {Causal::bottom_right, std::nullopt},
                                                        {Causal::bottom_right, Alignment::bottom_right}};

// The score modifiers' grid, run by the CPU forward and backward on the same shapes:
// windows that start and end in the middle of 96-key tiles and 32-row subtiles, alone
// and with every other modifier and mask.
struct Modifiers {
  std::int64_t window_left, window_right;
  Causal causal;
  std::optional<Alignment> alignment;
  Case::PerHead slopes;
  DType slopes_dtype;
  double softcap;
  Case::Mask mask;
  Case::PerHead sinks;
};
extern const Modifiers kModifierGrid[8];

struct Dims {
  std::int64_t B, Hq, Hkv, L, S, E, Ev;
};

// A rank-4 case of `dims` in `dtype` with the modifiers `m`.
Case with(const Dims& dims, const Modifiers& m, DType dtype);

}  // namespace sdpa::testing
