// The one place that checks a dense call's arguments and resolves them into the Problem
// a kernel is handed (Problem, BackwardProblem). Everything a kernel receives has
// passed here; packed and paged calls (varlen.h, paged.h) check the whole call, then
// each sequence through these. The pieces: views.h (spans, overlap, expected shapes),
// operands.h (views as kernels read them), resolve_options.h (the scalar options).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/views.h"
#include "common/backward_problem.h"
#include "common/problem.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

// The inputs, checked, with the shapes of the outputs they call for.
struct CheckedInputs {
  const TensorView *query, *key, *value;
  const Options* options;
  std::vector<std::int64_t> batch_shape;  // leading dims (empty for rank <= 3)
  std::int64_t heads_q = 1, heads_kv = 1, L = 0, S = 0, E = 0, Ev = 0;
  std::vector<std::int64_t> output_shape, weights_shape, lse_shape;
  DType lse_dtype = DType::float32;
};

// An int8 key or value and its scale (Options::key_scale, value_scale): the scale is
// present exactly when the tensor is int8, float32, of the tensor's shape without its
// last dim (dense (batch..., Hkv, S), packed (Hkv, total_k), paged (pages, Hkv,
// page_size)). Errors name `scale_name`.
void check_kv_scale(const TensorView& tensor, const std::optional<TensorView>& scale, const char* tensor_name,
                    const char* scale_name);

// A query, key or value's dtype: floating point and the query's; a key or value may also
// be int8 (its scale is check_kv_scale's). Errors name `name`.
void check_operand_dtype(const TensorView& view, const char* name, DType query_dtype, bool key_or_value);

// Refuses int8 K/V where `what` (the backward, ring attention) cannot read them.
void check_not_quantized(const TensorView& key, const TensorView& value, const std::string& what);
inline constexpr const char* kBackwardOfInt8 = "the backward (quantized K/V are for inference)";

// Checks query, key, value, the mask and the scalar options; throws sdpa::Error.
CheckedInputs check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                           const Options& options);

// The input side of a Problem: sizes, query/key/value/mask operands, the scalars; no
// outputs. make_problem adds the checked outputs; ring attention (src/dist/) its own
// partial outputs in the accumulation dtype.
Problem resolve_inputs(const CheckedInputs& inputs);

// Checks the output buffers against `inputs` and resolves everything into a Problem.
Problem make_problem(const CheckedInputs& inputs, const ForwardOutputs& outputs);

// A backward call, checked and resolved.
struct CheckedBackward {
  BackwardProblem problem;
  // The mask gradient sums over broadcast dims. problem.grad_mask is then absent: the
  // caller points it at a full-size (weights_shape) scratch (backward.cpp) and sums that into the
  // grad_mask buffer afterwards, in a fixed order.
  bool mask_gradient_sums = false;
};

// check_inputs for a backward: int8 K/V are refused first, for what they are (the
// backward has no int8 path), before check_inputs would ask for their scales.
CheckedInputs check_backward_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                                    const Options& options);

// Checks the backward's read-only tensors (output, lse, grad_output: shapes and dtypes
// as the forward gives them, any strides) and the gradient buffers (shapes and dtypes of
// query, key, value, the mask and the sinks, no overlap), and resolves everything.
// `inputs` must come from check_backward_inputs (or, per sequence, after the packed
// call's check_not_quantized): int8 K/V are not refused here.
CheckedBackward make_backward_problem(const CheckedInputs& inputs, const BackwardInputs& tensors,
                                      const BackwardOutputs& outputs);

// A backward's read-only tensors besides Q, K, V: the forward's output and lse, dO, and
// dlse when given. Any strides (an expanded dO of ones is what autograd hands over for
// a sum), but the shapes and dtypes the forward gives. Adds their spans to `input_spans`.
void check_backward_reads(const BackwardInputs& tensors, const Shape& output_shape, const Shape& lse_shape, DType dtype,
                          DType lse_dtype, std::vector<Span>& input_spans);

// grad_sinks, when given, among the buffers `outs` to check: only with sinks, their
// shape and dtype.
void expect_grad_sinks(const BackwardOutputs& outputs, const Options& options, std::vector<ExpectedView>& outs);

}  // namespace sdpa::detail
