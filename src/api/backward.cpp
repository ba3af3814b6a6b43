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
#include "api/validate.h"
#include "api/varlen.h"
#include "common/element.h"
#include "cpu/dispatch.h"
#include "reference/backward.h"

namespace sdpa {

namespace {

// Visits every element of `view` in row-major order of its shape, with its element offset.
template <class Visit>
void for_each_offset(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides, Visit visit) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) count *= size;
  std::vector<std::int64_t> index(shape.size(), 0);
  std::int64_t offset = 0;
  for (std::int64_t flat = 0; flat < count; ++flat) {
    visit(flat, offset);
    for (std::size_t d = shape.size(); d-- > 0;) {  // next row-major index, offset kept in step
      offset += strides[d];
      if (++index[d] < shape[d]) break;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

void fill_zero(const TensorView& view) {
  const std::size_t element = dtype_size(view.dtype);
  auto* data = static_cast<std::byte*>(view.data);
  for_each_offset(view.shape, view.effective_strides(), [&](std::int64_t, std::int64_t offset) {
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
  for_each_offset(target, into, [&](std::int64_t flat, std::int64_t offset) { acc[offset] += full.get(flat); });
  auto* out = static_cast<std::byte*>(grad_mask.data);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(grad_mask.dtype));
  for_each_offset(grad_mask.shape, grad_mask.effective_strides(), [&](std::int64_t flat, std::int64_t offset) {
    detail::store_element<double>(out + offset * element, grad_mask.dtype, acc[flat]);
  });
}

// Adds dL/dsink of each query matrix of `p` to `per_matrix` (batch · Hq entries). The
// sink takes probability P_i = exp(sink − lse_i) in row i, and ∂lse_i/∂sink = P_i,
// ∂O_i/∂sink = −P_i·O_i, so dsink = Σ_i P_i (dlse_i − dO_i·O_i): from the forward's O and
// lse, in float64, whichever backend computed them.
void add_sink_gradients(const detail::BackwardProblem& p, double* per_matrix) {
  for (std::int64_t qm = 0; qm < p.batch * p.heads_q; ++qm) {
    const double sink = p.sinks[static_cast<std::size_t>(qm)];
    if (sink == -std::numeric_limits<double>::infinity()) continue;  // no sink: P = 0 (not exp(−inf + inf))
    double sum = 0.0;
    for (std::int64_t i = 0; i < p.L; ++i) {
      double d = p.grad_lse.present() ? p.grad_lse.load<double>(qm, i, 0) : 0.0;
      for (std::int64_t c = 0; c < p.Ev; ++c)
        d -= p.grad_output.load<double>(qm, i, c) * p.output.load<double>(qm, i, c);
      sum += std::exp(sink - p.lse.load<double>(qm, i, 0)) * d;
    }
    per_matrix[qm] += sum;
  }
}

// grad_sinks from the per-query-matrix sums: (Hq,) sums over the batch, in batch order;
// (batch..., Hq) is one entry per query matrix, in the same row-major order.
void store_sink_gradients(const std::vector<double>& per_matrix, const TensorView& grad_sinks) {
  if (grad_sinks.numel() == 0) return;  // no heads (Hq = 0) or no batch: nothing to store
  const std::int64_t heads_q = grad_sinks.shape.back();
  const std::int64_t batch = static_cast<std::int64_t>(per_matrix.size()) / heads_q;
  auto* out = static_cast<std::byte*>(grad_sinks.data);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(grad_sinks.dtype));
  for_each_offset(grad_sinks.shape, grad_sinks.effective_strides(), [&](std::int64_t flat, std::int64_t offset) {
    double value = 0.0;
    if (grad_sinks.rank() == 1)
      for (std::int64_t b = 0; b < batch; ++b) value += per_matrix[static_cast<std::size_t>(b * heads_q + flat)];
    else
      value = per_matrix[static_cast<std::size_t>(flat)];
    detail::store_element<double>(out + offset * element, grad_sinks.dtype, value);
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
  const detail::CheckedInputs checked = detail::check_inputs(inputs.query, inputs.key, inputs.value, options);
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
    add_sink_gradients(problem, per_matrix.data());
    store_sink_gradients(per_matrix, *outputs.grad_sinks);
  }
}

BackwardResult backward(const BackwardInputs& inputs, const Options& options, bool mask_gradient) {
  detail::check_inputs(inputs.query, inputs.key, inputs.value, options);  // before sizing anything by them
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
      add_sink_gradients(calls[b].problem, sink_gradients.data() + b * static_cast<std::size_t>(inputs.query.shape[0]));
  }
  if (outputs.grad_sinks) store_sink_gradients(sink_gradients, *outputs.grad_sinks);
}

BackwardResult backward_varlen(const BackwardInputs& inputs, const VarlenSequences& sequences, const Options& options) {
  detail::check_varlen_inputs(inputs.query, inputs.key, inputs.value, sequences, options);  // before sizing by them
  BackwardResult result;
  backward_varlen(inputs, sequences, allocate_gradients(inputs, options, result), options);
  return result;
}

}  // namespace sdpa
