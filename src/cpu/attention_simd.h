// The SIMD forward (Highway, runtime dispatch over x86 targets) for float32, bfloat16
// and float16 inputs, computed in float32.
#pragma once

#include "common/problem.h"

namespace sdpa::detail {

void simd_forward_float32(const Problem& problem);

// The Highway target the dispatcher picked on this machine ("AVX3", "AVX2", ...).
const char* simd_target_name();

}  // namespace sdpa::detail
