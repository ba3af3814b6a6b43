// sdpa::Options checked and resolved into a Problem's scalar fields: the scale, the
// causal/window band and its alignment, ALiBi slopes, softcap, dropout and threads. A
// new option is checked in check_options and lands in the Problem in resolve_options
// (docs/architecture.md, "Adding an option").
#pragma once

#include <cstdint>

#include "api/views.h"
#include "common/problem.h"
#include "sdpa/options.h"

namespace sdpa::detail {

// The scalar options, for inputs of `query_dtype` (which sets the compute dtype:
// float64 for float64, float32 for the others). Throws sdpa::Error naming the field.
void check_options(const Options& options, DType query_dtype);

// ALiBi slopes: float32 or float64, shape (Hq,) or (batch..., Hq).
void check_alibi_slopes(const TensorView& slopes, const Shape& batch_shape, std::int64_t heads_q);

// Fills p's option fields from checked `options`; p's sizes (batch, heads_q, L, S, E)
// must be set. `dtype` is the inputs' dtype.
void resolve_options(const Options& options, DType dtype, Problem& p);

}  // namespace sdpa::detail
