#include "testing/finite_differences.h"

#include <gtest/gtest.h>

namespace sdpa::testing {

double FiniteDifferenceCase::loss() const {
  Options o = options;
  o.backend = Backend::reference;
  return dot(forward(q.view(), k.view(), v.view(), o).output, g);
}

void FiniteDifferenceCase::check(Backend backend, double tolerance) {
  Options o = options;
  o.backend = backend;
  const bool float_mask = options.mask && options.mask->dtype != DType::boolean;
  const BackwardResult got = forward_backward(q.view(), k.view(), v.view(), g.view(), o, float_mask);
  auto f = [this] { return loss(); };
  EXPECT_LE(max_abs_diff(got.grad_query, numerical_gradient(q, f)), tolerance) << "grad_query";
  EXPECT_LE(max_abs_diff(got.grad_key, numerical_gradient(k, f)), tolerance) << "grad_key";
  EXPECT_LE(max_abs_diff(got.grad_value, numerical_gradient(v, f)), tolerance) << "grad_value";
  if (float_mask) {
    EXPECT_LE(max_abs_diff(got.grad_mask, numerical_gradient(mask, f)), tolerance) << "grad_mask";
  }
  if (options.sinks) {
    EXPECT_LE(max_abs_diff(got.grad_sinks, numerical_gradient(sinks, f)), tolerance) << "grad_sinks";
  }
}

}  // namespace sdpa::testing
