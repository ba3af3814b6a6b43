// The backward against central differences of the float64 oracle's forward, reported
// through GoogleTest (sdpa_testing, not the CLI's sdpa_testing_core).
#pragma once

#include "testing/gradients.h"

namespace sdpa::testing {

// loss = Σ G ∘ forward(Q, K, V) through the float64 oracle: its gradients are the
// backward's with dO = G. The tensors are float64; `mask`, `slopes` and `sinks` hold what
// options.mask, options.alibi_slopes and options.sinks view, when they are used.
struct FiniteDifferenceCase {
  Tensor q, k, v, mask, slopes, sinks, g;
  Options options;

  double loss() const;
  // Every gradient of the backward on `backend` against central differences of loss(),
  // within `tolerance`; the mask's too when options.mask is a float mask, the sinks' when
  // options.sinks is given.
  void check(Backend backend, double tolerance);
};

}  // namespace sdpa::testing
