// The portable tiled kernels: plain C++ loops over packed tiles, in the input's
// precision (double for float64, float otherwise). Production runs them for float64
// only; the tests also run the backward in float32 as a second opinion on the SIMD one.
#pragma once

#include <cstdint>

#include "common/backward_problem.h"
#include "common/problem.h"

namespace sdpa::detail {

// Tiled online softmax (FlashAttention-2), threads over (batch, head, query tile).
void portable_forward(const Problem* problems, std::int64_t count);

// FlashAttention-2's backward made deterministic without atomics (portable/backward.cpp).
void portable_backward(const BackwardProblem& problem);

}  // namespace sdpa::detail
