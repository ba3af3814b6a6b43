// The oracle backward: gradients in float64, written as the formulas read.
#pragma once

#include "common/backward_problem.h"

namespace sdpa::detail {

// dQ, dK, dV (and dS into grad_mask when present) in float64, from Q, K, V, the mask
// and dO alone: the softmax is recomputed row by row, and O and lse are not read, so
// the oracle checks them too.
void reference_backward(const BackwardProblem& problem);

}  // namespace sdpa::detail
