// Test helpers: random inputs, float64 copies, comparisons, and a backend against the
// float64 oracle under the tolerance rule of DESIGN.md §4 (tolerance.h).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"
#include "testing/tolerance.h"

namespace sdpa::testing {

using Shape = std::vector<std::int64_t>;

// Normal(0, stddev) values, rounded to `dtype` (so a float64 copy holds exactly what
// the fast path reads).
Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937_64& rng, double stddev = 1.0);
// A bool tensor, each element true with probability `p_true`.
Tensor random_bool(const Shape& shape, std::mt19937_64& rng, double p_true);

// A packed float64 copy of any view (any dtype, any strides).
Tensor to_float64(const TensorView& view);
// An int8 K or V and its scale (Options::key_scale: the shape without the last dim) as
// the float64 values they stand for, scale · q, packed; computed here element by element,
// apart from the library.
Tensor dequantized(const TensorView& values, const TensorView& scale);
// The same values in another dtype (rounded).
Tensor convert(const Tensor& tensor, DType dtype);
// What storing `value` in `dtype` keeps (round to nearest even).
double round_to(DType dtype, double value);

// A rank-4 tensor stored as (B, L, H, E) and viewed as (B, H, L, E): the
// non-contiguous layout of a model's fused projection output.
struct StridedCopy {
  Tensor storage;
  TensorView view;
};
StridedCopy heads_interleaved(const Tensor& packed);

// Largest |a − b|; NaN where exactly one of them is NaN, or both at the same index are
// not NaN-equal, makes the result infinite. Same shape required.
double max_abs_diff(const Tensor& a, const Tensor& b);
double max_abs(const Tensor& t);  // ignores NaN and infinities

// The same dtype, shape and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);

// Runs `options.backend` (default: the CPU path) on the views, and the oracle on
// float64 copies of the same values, and compares output, lse and weights under the
// tolerance rule (agree_with_oracle, tolerance.h). Asking for weights and lse must also
// leave the output bit-identical.
Agreement compare_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                              const Options& options);

}  // namespace sdpa::testing
