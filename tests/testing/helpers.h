// Test helpers: random inputs, float64 copies, and the tolerance rule of DESIGN.md §4.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::testing {

using Shape = std::vector<std::int64_t>;

// Normal(0, stddev) values, rounded to `dtype` (so a float64 copy holds exactly what
// the fast path reads).
Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937_64& rng, double stddev = 1.0);
// A bool tensor, each element true with probability `p_true`.
Tensor random_bool(const Shape& shape, std::mt19937_64& rng, double p_true);

// A packed float64 copy of any view (any dtype, any strides).
Tensor to_float64(const TensorView& view);
// The same values in another dtype (rounded).
Tensor convert(const Tensor& tensor, DType dtype);

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

// One comparison of a backend against the float64 oracle.
struct Agreement {
  double output_error = 0, output_tolerance = 0;
  double lse_error = 0, lse_tolerance = 0;
  double weights_error = 0, weights_tolerance = 0;
  bool ok() const {
    return output_error <= output_tolerance && lse_error <= lse_tolerance && weights_error <= weights_tolerance;
  }
  std::string describe() const;
};

// Runs `options.backend` (default: the CPU path) on the views, and the oracle on
// float64 copies of the same values, and compares output, lse and weights under the
// tolerance rule:
//   float64:  1e-10 · max(1, max|oracle|)
//   float32:  1e-5  · max(1, max|oracle|)
//   float16 / bfloat16: max(2 · naive error, 1e-5), where the naive error is that of
//     rounding the oracle's weights to the dtype, multiplying them into V with float32
//     sums, and rounding the result (the steps a naive low-precision attention rounds).
Agreement compare_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                              const Options& options);

}  // namespace sdpa::testing
