// A paged KV cache (sdpa::forward_paged): K and V rows read through a block table of
// pages, never gathered; each sequence a Problem of its own (sequences.h).
#pragma once

#include <vector>

#include "api/sequences.h"
#include "common/problem.h"

namespace sdpa::detail {

OutputShapes check_paged_inputs(const TensorView& query, const PagedKV& cache, const Options& options);
std::vector<Problem> make_paged_problems(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                                         const Options& options);

}  // namespace sdpa::detail
