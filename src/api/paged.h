// A paged KV cache (sdpa::forward_paged): K and V rows read through a block table of
// pages, never gathered; each sequence a Problem of its own (sequences.h).
#pragma once

#include <vector>

#include "api/sequences.h"
#include "common/problem.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

// The whole call checked, giving the output shapes: what the allocating forms size their
// buffers by before the buffer form (make_paged_problems) checks again with them.
OutputShapes check_paged_inputs(const TensorView& query, const PagedKV& cache, const Options& options);
std::vector<Problem> make_paged_problems(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                                         const Options& options);

}  // namespace sdpa::detail
