// What the packed (varlen) and paged tests share: a sequence's slopes, and how far the
// same computation may drift between a batched call and a call on one sequence alone.
#pragma once

#include <cstdint>

#include "testing/helpers.h"

namespace sdpa::testing {

// Rows [begin, end) along dim 1 of a packed (heads, total[, dim]) view, as a (1, heads,
// end − begin[, dim]) view of the same memory: one varlen sequence by itself.
TensorView sequence_rows(const TensorView& packed, std::int64_t begin, std::int64_t end);

// Row b of a (batch, Hq) per-head tensor (slopes, sinks) as (Hq,); (Hq,) as it is.
TensorView per_head_of_sequence(const Tensor& slopes, std::int64_t b);

// How far two runs of the same computation may drift: a few units in the last place.
double same_result_tolerance(DType dtype, double magnitude);

}  // namespace sdpa::testing
