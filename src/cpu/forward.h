// The CPU forward: tiled online softmax (FlashAttention-2, Dao 2023), threads over
// (batch, head, query tile).
#pragma once

#include <string>

#include "common/problem.h"

namespace sdpa::detail {

// The problems of one call: one, or a varlen or paged call's sequences (the same dtype,
// E and Ev).
void cpu_forward(const Problem* problems, std::int64_t count);

// Name of the kernel cpu_forward() runs on this machine (for `sdpa info`).
std::string cpu_kernel_name();

}  // namespace sdpa::detail
