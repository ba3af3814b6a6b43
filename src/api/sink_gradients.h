// The sinks' gradient, computed from the forward's outputs rather than by a kernel:
// shared by sdpa::backward, backward_varlen and the ring's backward (src/dist/), which
// sums each rank's rows over the ranks before storing.
#pragma once

#include <vector>

#include "common/backward_problem.h"
#include "sdpa/tensor.h"

namespace sdpa::detail {

// Adds dL/dsink of each query matrix of `p` to `per_matrix` (batch · Hq entries), over
// p's L rows. The sink takes probability P_i = exp(sink − lse_i) in row i, and
// ∂lse_i/∂sink = P_i, ∂O_i/∂sink = −P_i·O_i, so dsink = Σ_i P_i (dlse_i − dO_i·O_i): from
// the forward's O and lse, in float64, whichever backend computed them. Reads p.sinks,
// p.output, p.grad_output, p.lse and p.grad_lse (when present).
void add_sink_gradients(const BackwardProblem& p, double* per_matrix);

// grad_sinks from the per-query-matrix sums: (Hq,) sums over the batch, in batch order;
// (batch..., Hq) is one entry per query matrix, in the same row-major order.
void store_sink_gradients(const std::vector<double>& per_matrix, const TensorView& grad_sinks);

}  // namespace sdpa::detail
