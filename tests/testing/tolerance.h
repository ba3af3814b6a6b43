// The tolerance rule of DESIGN.md §4, written once: the test suites (compare_with_oracle,
// compare_gradients_with_oracle) and `sdpa check` decide with it. docs/numerics.md
// explains each bound. No GoogleTest here: the CLI links it (sdpa_testing_core).
#pragma once

#include <string>

#include "sdpa/sdpa.h"

namespace sdpa::testing {

// One comparison of a forward result against the float64 oracle's.
struct Agreement {
  double output_error = 0, output_tolerance = 0;
  double lse_error = 0, lse_tolerance = 0;
  double weights_error = 0, weights_tolerance = 0;
  bool ok() const {
    return output_error <= output_tolerance && lse_error <= lse_tolerance && weights_error <= weights_tolerance;
  }
  // The largest error / tolerance of the three: above 1 fails, and NaN stays NaN.
  double worst_ratio() const;
  std::string describe() const;
};

// `got`, a result computed in `dtype`, against `oracle`, the float64 oracle's result (with
// weights) on the same values, whose value tensor is `value64`. The weights and lse are
// compared when `compared` says `got` holds them. Errors are max |got − oracle|; a
// non-finite value must match exactly (the −inf lse of a row that sees no key, NaN where
// an input's NaN reaches), anything else is an infinite error. Tolerances:
//   float64:  1e-10 · max(1, max|oracle|)   (weights 1e-10)
//   float32:  1e-5  · max(1, max|oracle|)   (weights 1e-5)
//   float16 / bfloat16: max(2 · naive error, 1e-5), where the naive error is that of
//     rounding the oracle's weights to the dtype, multiplying them into V with float32
//     sums, and rounding the result (the steps a naive low-precision attention rounds);
//     the weights' naive error is their rounding to the dtype; lse, computed and stored
//     in float32 from inputs float32 holds exactly, 1e-5 · max(1, max|oracle lse|).
Agreement agree_with_oracle(const ForwardResult& got, const ForwardResult& oracle, const Tensor& value64, DType dtype,
                            Returns compared = {true, true});

// The bound on one gradient computed in `dtype` against the oracle's `oracle_gradient`:
//   float64:  1e-9 · max(1, max|oracle|)
//   float32:  1e-4 · max(1, max|oracle|)
//   float16 / bfloat16: max(3 · |naive − oracle|, 1e-5), where `naive` is the gradient of
//     a backward that rounds to the dtype after every step (naive_gradients, gradients.h).
double gradient_tolerance(DType dtype, const Tensor& oracle_gradient, const Tensor* naive = nullptr);

}  // namespace sdpa::testing
