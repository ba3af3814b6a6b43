// The CPU backward. float64 runs the portable tiled kernel (backward.cpp); float32,
// bfloat16 and float16 run the Highway SIMD kernel (backward_simd.cpp) in float32.
#pragma once

#include "common/backward_problem.h"

namespace sdpa::detail {

void cpu_backward(const BackwardProblem& problem);

// The portable tiled kernel on its own: double for float64 inputs, float otherwise.
// Production runs it for float64 only; tests run it for float32 as a second opinion.
void cpu_backward_tiled(const BackwardProblem& problem);

// The SIMD kernel (float32 arithmetic) for float32, bfloat16 and float16 inputs.
void simd_backward_float32(const BackwardProblem& problem);

}  // namespace sdpa::detail
