// The oracle: attention in float64, written as the formula reads, one row at a time.
#pragma once

#include "common/problem.h"

namespace sdpa::detail {

// softmax(Q Kᵀ · scale + mask) V in float64, with the contract's edge cases spelled out.
void reference_forward(const Problem& problem);

}  // namespace sdpa::detail
