// One case of the hostile grid of DESIGN.md §4, and its random inputs, shared by the CPU
// forward and backward tests so that both run the same grid the same way.
#pragma once

#include <cstdint>
#include <optional>
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

  std::string name() const;
};

// (batch..., heads, rows, cols)
Shape shape_of(const Shape& batch, std::int64_t heads, std::int64_t rows, std::int64_t cols);

struct Inputs {
  Tensor q, k, v, mask;
  StridedCopy qs, ks, vs;
  Options options;
  TensorView qv() const { return qs.storage.nbytes() ? qs.view : q.view(); }
  TensorView kv() const { return ks.storage.nbytes() ? ks.view : k.view(); }
  TensorView vv() const { return vs.storage.nbytes() ? vs.view : v.view(); }
};

// Random q, k, v (interleaved when the case asks) and mask for `c`, and the options that
// run it; the same seed gives the same inputs and dropout.
Inputs make_inputs(const Case& c, std::uint64_t seed);

}  // namespace sdpa::testing
