// Tensor views as the kernels read them: an Operand per tensor, a stack of (row, column)
// matrices, one per (batch, head), with broadcasting folded into per-matrix offsets.
#pragma once

#include <cstdint>

#include "api/views.h"
#include "common/problem.h"

namespace sdpa::detail {

// The per-(batch, head) element offsets of a view whose dims are
// (batch_shape..., heads, rows, cols), given its (possibly broadcast, 0) strides.
Operand make_operand(const TensorView& view, const Shape& batch_shape, std::int64_t heads, const Shape& strides);

// make_operand with the view's own strides.
Operand make_operand(const TensorView& view, const Shape& batch_shape, std::int64_t heads);

// An lse, (batch..., Hq, L), viewed as (batch..., Hq, L, 1) so that rows are queries.
Operand lse_operand(const TensorView& lse, const Shape& batch_shape, std::int64_t heads_q);

// The strides (in elements of `mask`) that broadcast `mask` to `target` (= (batch...,
// Hq, L, S)): 0 where the mask has size 1 or lacks the dim (NumPy broadcasting,
// right-aligned). An error naming `mask` when it does not broadcast.
Shape mask_broadcast_strides(const TensorView& mask, const Shape& target);

}  // namespace sdpa::detail
