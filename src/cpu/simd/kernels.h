// The SIMD kernels (Highway, runtime dispatch over x86 targets) for float32, bfloat16
// and float16 inputs, computed in float32: forward.cpp and backward.cpp, twins built on
// the same per-target pieces (microkernels, rows, score modifiers, split merge).
#pragma once

#include <cstdint>

#include "common/backward_problem.h"
#include "common/problem.h"

namespace sdpa::detail {

// The problems of one call (one, or a varlen or paged call's sequences, sharing dtype, E
// and Ev), in one parallel region.
void simd_forward_float32(const Problem* problems, std::int64_t count);

void simd_backward_float32(const BackwardProblem& problem);

// The Highway target the dispatcher picked on this machine ("AVX3", "AVX2", ...).
const char* simd_target_name();

// Whether bfloat16 products run on vdpbf16ps (the AVX-512 target where bf16::chosen()) or
// on float32 FMAs after widening.
bool simd_bfloat16_on_vdpbf16ps();

}  // namespace sdpa::detail
