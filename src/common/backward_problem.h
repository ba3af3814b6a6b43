// The validated, resolved form of one backward call: what src/api/ hands to a backward
// kernel. As with Problem, kernels trust it.
#pragma once

#include "common/problem.h"

namespace sdpa::detail {

// The forward's Problem, with its `output` and `lse` read (O and the log-sum-exp the
// forward returned) instead of written, plus the gradients.
struct BackwardProblem : Problem {
  Operand grad_output;  // dO, matrices indexed like the query
  Operand grad_lse;     // absent unless given; like lse (row = query index, col unused)
  Operand grad_query;   // written: matrices like the query
  Operand grad_key;     // written: matrices like the key
  Operand grad_value;   // written: matrices like the value
  // Absent unless asked for. dS at (b·Hq + h, i, j): each element is written exactly
  // once, by whichever task computes that score, and elements of tiles a kernel skips
  // (causal, fully masked) are left as they are: src/api/ zero-fills it first, and when
  // the mask broadcasts it points at a full-size scratch that src/api/ sums afterwards.
  Operand grad_mask;
};

}  // namespace sdpa::detail
