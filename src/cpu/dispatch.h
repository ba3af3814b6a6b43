// The CPU backend's entry points: which kernel runs a problem. float64 runs the portable
// tiled kernels (portable/, accumulating in float64); float32, bfloat16 and float16 run
// the Highway SIMD kernels (simd/, float32 arithmetic, one build per x86 target picked
// at run time).
#pragma once

#include <cstdint>
#include <string>

#include "common/backward_problem.h"
#include "common/problem.h"

namespace sdpa::detail {

// The problems of one call: one, or a varlen or paged call's sequences (the same dtype,
// E and Ev).
void cpu_forward(const Problem* problems, std::int64_t count);

// Whether cpu_forward resumes a problem of this kind from Problem::carried (the portable
// kernel, float64, does; the SIMD kernels do not, and refuse a carried problem).
bool cpu_forward_resumable(bool float64);

void cpu_backward(const BackwardProblem& problem);

// Name of the kernels cpu_forward() runs on this machine (for `sdpa info`).
std::string cpu_kernel_name();

// Whether bfloat16 products run on vdpbf16ps (else widened to float32 FMAs).
bool cpu_bfloat16_on_vdpbf16ps();

}  // namespace sdpa::detail
