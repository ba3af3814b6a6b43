// The portable tiled kernels: plain C++ loops over packed tiles, in the input's
// precision (double for float64, float otherwise). Production runs them for float64
// only; the tests also run the backward in float32 as a second opinion on the SIMD one.
#pragma once

#include <cstdint>

#include "common/backward_problem.h"
#include "common/problem.h"

namespace sdpa::detail {

// Keys per inner step of the portable forward. Its tiles start at multiples of this
// (from each row's first visible key rounded down), so a resumable call (Problem::carried)
// fed key chunks that start at multiples of it, in order, visits every row's keys in the
// same tiles as one call over all of them: bitwise the same result (src/dist/ordered_forward).
inline constexpr std::int64_t kPortableKeyTile = 64;

// Tiled online softmax (FlashAttention-2), threads over (batch, head, query tile).
void portable_forward(const Problem* problems, std::int64_t count);

// FlashAttention-2's backward made deterministic without atomics (portable/backward.cpp).
void portable_backward(const BackwardProblem& problem);

}  // namespace sdpa::detail
