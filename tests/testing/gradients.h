// Test helpers for the backward: running forward + backward, and the gradient tolerance
// rule (DESIGN.md §4, docs/numerics.md "Gradient tolerances").
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "testing/helpers.h"

namespace sdpa::testing {

// forward (for O and lse) then backward with dO = `grad_output`, both on `options`.
BackwardResult forward_backward(const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& grad_output, const Options& options, bool mask_gradient = false);

// A random dO of the output's shape, in the query's dtype.
Tensor random_grad_output(const TensorView& query, const TensorView& value, std::uint64_t seed);

// One comparison of a backend's gradients against the float64 oracle's.
struct GradientAgreement {
  struct Entry {
    std::string name;
    double error = 0, tolerance = 0;
  };
  std::vector<Entry> entries;  // grad_query, grad_key, grad_value[, grad_mask]
  bool ok() const;
  // The largest error / tolerance: above 1 fails, and NaN stays NaN.
  double worst_ratio() const;
  std::string describe() const;
};

// `got`, gradients computed in the query's dtype from these views with dO =
// `grad_output`, against the oracle's on float64 copies of the same values with
// `options` (its float mask copied too), each under the rule (gradient_tolerance,
// tolerance.h): for float16 and bfloat16 the naive error is that of naive_gradients()
// below, a backward that rounds to the dtype after every step as a straightforward
// low-precision implementation does. The mask's gradient, rounded to the mask's dtype,
// is also allowed that dtype's bound when it is float32 or float64.
GradientAgreement agree_gradients_with_oracle(const BackwardResult& got, const TensorView& query, const TensorView& key,
                                              const TensorView& value, const TensorView& grad_output,
                                              const Options& options, bool mask_gradient);

// Runs forward + backward with `options.backend` (default: the CPU path) on the views and
// compares the gradients with the oracle's (agree_gradients_with_oracle).
// `grad_output` defaults to random_grad_output(query, value, 1).
GradientAgreement compare_gradients_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                                                const Options& options, bool mask_gradient = false,
                                                std::optional<TensorView> grad_output = std::nullopt);

// The gradients of a naive backward in `dtype`, from exact (float64) inputs: the exact
// softmax P (before dropout) rounded to the dtype, then every intermediate rounded as
// it is formed, sums in float32:
//   W = r(P∘Z),  dP = r(r(dO Vᵀ)∘Z),  D = r(Σ P dP),  dS = r(P (dP − D)),
//   dV = r(Wᵀ dO),  dK = r(scale dSᵀ Q),  dQ = r(scale dS K)
// grad_mask is dS at full shape (batch..., Hq, L, S), unsummed.
BackwardResult naive_gradients(const Tensor& q64, const Tensor& k64, const Tensor& v64, const Tensor& grad_output64,
                               const Tensor& probabilities64, const Options& options, DType dtype);

// Sums a full (batch..., Hq, L, S) tensor over the dims `shape` broadcasts along
// (NumPy rules), giving a float64 tensor of `shape`.
Tensor sum_to_shape(const Tensor& full, const Shape& shape);

// Central differences (loss(x + h) - loss(x - h)) / 2h for every element of the float64
// tensor `x`, which `loss` reads. Truncation error O(h^2) and cancellation O(eps/h):
// about 1e-10 for h = 1e-5 on the well-scaled problems of the tests.
Tensor numerical_gradient(Tensor& x, const std::function<double()>& loss, double step = 1e-5);

// The sum of a ∘ b over all elements (same shape).
double dot(const Tensor& a, const Tensor& b);

}  // namespace sdpa::testing
