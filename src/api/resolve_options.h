// sdpa::Options checked and resolved into a Problem's scalar fields: the scale, the
// causal/window band and its alignment, ALiBi slopes, sinks, softcap, dropout and threads. A
// new option is checked in check_options and lands in the Problem in resolve_options
// (docs/architecture.md, "Adding an option").
#pragma once

#include <cstdint>
#include <vector>

#include "api/views.h"
#include "common/problem.h"
#include "sdpa/options.h"

namespace sdpa::detail {

// The scalar options, for inputs of `query_dtype` (which sets the compute dtype:
// float64 for float64, float32 for the others). Throws sdpa::Error naming the field.
void check_options(const Options& options, DType query_dtype);

// The per-head tensors, ALiBi slopes and sinks: float32 or float64, shape (Hq,) or
// (batch..., Hq); each sink representable in the compute dtype of `query_dtype`.
void check_per_head_options(const Options& options, const Shape& batch_shape, std::int64_t heads_q, DType query_dtype);
// Their spans and the K/V scales' (Options::key_scale, value_scale), for the overlap
// checks of the outputs.
std::vector<Span> per_head_spans(const Options& options);

// Fills p's option fields from checked `options`; p's sizes (batch, heads_q, L, S, E)
// must be set. `dtype` is the inputs' dtype.
void resolve_options(const Options& options, DType dtype, Problem& p);

}  // namespace sdpa::detail
