// The backward entry points: validate once, then dispatch to a backend. The pieces of
// the contract that are not kernel work live here: zero gradients where there is
// nothing to compute, the mask gradient's sum over the dims the mask broadcasts, and
// the sinks' gradient (one dot product per row, from the forward's outputs).
#include "sdpa/sdpa.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "api/operands.h"
#include "api/sink_gradients.h"
#include "api/validate.h"
#include "api/varlen.h"
#include "common/element.h"
#include "cpu/dispatch.h"
#include "reference/backward.h"

namespace sdpa {

namespace {

void fill_zero(const TensorView& view) {
  const std::size_t element = dtype_size(view.dtype);
  auto* data = static_cast<std::byte*>(view.data);
  detail::for_each_offset(view.shape, view.effective_strides(), [&](std::int64_t, std::int64_t offset) {
    std::memset(data + offset * static_cast<std::int64_t>(element), 0, element);  // +0.0 in every float dtype
  });
}

// grad_mask[m] = Σ dS[t] over the score positions t that mask element m broadcasts to,
// summed in float64 in row-major order of t: the same order, hence the same bits, for
// any thread count.
void sum_mask_gradient(const Tensor& full, const TensorView& grad_mask, const std::vector<std::int64_t>& target) {
  Tensor sums(DType::float64, grad_mask.shape);
  const std::vector<std::int64_t> into = detail::mask_broadcast_strides(sums.view(), target);
  auto* acc = static_cast<double*>(sums.data());
  // Walk the scores in order; `offset` follows the broadcast strides into `sums`.
  detail::for_each_offset(target, into, [&](std::int64_t flat, std::int64_t offset) { acc[offset] += full.get(flat); });
  auto* out = static_cast<std::byte*>(grad_mask.data);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(grad_mask.dtype));
  detail::for_each_offset(grad_mask.shape, grad_mask.effective_strides(), [&](std::int64_t flat, std::int64_t offset) {
    detail::store_element<double>(out + offset * element, grad_mask.dtype, acc[flat]);
  });
}

// The allocating forms' buffers: dQ, dK, dV shaped as Q, K, V in the query's dtype, and
// the sinks' gradient when there are sinks (their shape and dtype), held by `result`.
BackwardOutputs allocate_gradients(const BackwardInputs& inputs, const Options& options, BackwardResult& result) {
  const DType dtype = inputs.query.dtype;
  result.grad_query = Tensor(dtype, inputs.query.shape);
  result.grad_key = Tensor(dtype, inputs.key.shape);
  result.grad_value = Tensor(dtype, inputs.value.shape);
  BackwardOutputs outputs{result.grad_query.view(), result.grad_key.view(), result.grad_value.view()};
  if (options.sinks) {
    result.grad_sinks = Tensor(options.sinks->dtype, options.sinks->shape);
    outputs.grad_sinks = result.grad_sinks.view();
  }
  return outputs;
}

// Gradients of one problem into `outputs`: all zero when there are no rows or no keys.
void run(const detail::BackwardProblem& problem, const BackwardOutputs& outputs, Backend backend) {
  if (problem.batch * problem.heads_q * problem.L == 0 || problem.S == 0) {
    for (const TensorView* g : {&outputs.grad_query, &outputs.grad_key, &outputs.grad_value}) fill_zero(*g);
    return;
  }
  switch (backend) {
    case Backend::reference:
      detail::reference_backward(problem);
      return;
    case Backend::automatic:
    case Backend::cpu:
      detail::cpu_backward(problem);
      return;
  }
}

}  // namespace

void backward(const BackwardInputs& inputs, const BackwardOutputs& outputs, const Options& options) {
  const detail::CheckedInputs checked = detail::check_backward_inputs(inputs.query, inputs.key, inputs.value, options);
  detail::CheckedBackward call = detail::make_backward_problem(checked, inputs, outputs);
  detail::BackwardProblem& problem = call.problem;

  // Kernels skip what no query sees (causal, fully masked tiles): the mask gradient there
  // is 0, and so is every gradient when there are no rows or no keys.
  Tensor full_mask_gradient;
  if (outputs.grad_mask) {
    if (call.mask_gradient_sums) {
      full_mask_gradient = Tensor(problem.float64 ? DType::float64 : DType::float32, checked.weights_shape);
      problem.grad_mask = detail::make_operand(full_mask_gradient.view(), checked.batch_shape, checked.heads_q);
    } else {
      fill_zero(*outputs.grad_mask);
    }
  }
  run(problem, outputs, options.backend);
  if (call.mask_gradient_sums) sum_mask_gradient(full_mask_gradient, *outputs.grad_mask, checked.weights_shape);
  if (outputs.grad_sinks) {
    std::vector<double> per_matrix(static_cast<std::size_t>(problem.batch * problem.heads_q), 0.0);
    detail::add_sink_gradients(problem, per_matrix.data());
    detail::store_sink_gradients(per_matrix, *outputs.grad_sinks);
  }
}

BackwardResult backward(const BackwardInputs& inputs, const Options& options, bool mask_gradient) {
  detail::check_backward_inputs(inputs.query, inputs.key, inputs.value, options);  // before sizing anything by them
  BackwardResult result;
  BackwardOutputs outputs = allocate_gradients(inputs, options, result);
  if (mask_gradient) {
    // A missing or bool mask is reported by the checks below, naming grad_mask.
    const bool float_mask = options.mask && options.mask->dtype != DType::boolean;
    result.grad_mask = Tensor(float_mask ? options.mask->dtype : inputs.query.dtype,
                              float_mask ? options.mask->shape : std::vector<std::int64_t>{0});
    outputs.grad_mask = result.grad_mask.view();
  }
  backward(inputs, outputs, options);
  return result;
}

void backward_varlen(const BackwardInputs& inputs, const VarlenSequences& sequences, const BackwardOutputs& outputs,
                     const Options& options) {
  const std::vector<detail::SequenceBackward> calls =
      detail::make_varlen_backward_problems(inputs, sequences, outputs, options);
  // Sequence b is query matrices b · Hq + h of the sinks' gradient.
  std::vector<double> sink_gradients(outputs.grad_sinks ? calls.size() * static_cast<std::size_t>(inputs.query.shape[0])
                                                        : 0);
  for (std::size_t b = 0; b < calls.size(); ++b) {
    run(calls[b].problem, calls[b].gradients, options.backend);
    if (outputs.grad_sinks)
      detail::add_sink_gradients(calls[b].problem,
                                 sink_gradients.data() + b * static_cast<std::size_t>(inputs.query.shape[0]));
  }
  if (outputs.grad_sinks) detail::store_sink_gradients(sink_gradients, *outputs.grad_sinks);
}

BackwardResult backward_varlen(const BackwardInputs& inputs, const VarlenSequences& sequences, const Options& options) {
  detail::check_varlen_inputs(inputs.query, inputs.key, inputs.value, sequences, options);  // before sizing by them
  BackwardResult result;
  backward_varlen(inputs, sequences, allocate_gradients(inputs, options, result), options);
  return result;
}

}  // namespace sdpa
