// Entry points: validate once, then dispatch to a backend.
#include "sdpa/sdpa.h"

#include <cmath>
#include <limits>
#include <vector>

#include "api/paged.h"
#include "api/sequences.h"
#include "api/validate.h"
#include "api/varlen.h"
#include "cpu/dispatch.h"
#include "reference/attention.h"

namespace sdpa {

namespace {

// The problems of one call: one, or a varlen or paged call's sequences.
void run(const detail::Problem* problems, std::size_t count, Backend backend) {
  switch (backend) {
    case Backend::reference:
      for (std::size_t i = 0; i < count; ++i)
        if (problems[i].batch * problems[i].heads_q * problems[i].L > 0) detail::reference_forward(problems[i]);
      return;
    case Backend::automatic:
    case Backend::cpu:
      detail::cpu_forward(problems, static_cast<std::int64_t>(count));
      return;
  }
}

void run(const std::vector<detail::Problem>& problems, Backend backend) {
  run(problems.data(), problems.size(), backend);
}

// The allocating forms: buffers of the shapes the checks give, then the buffer form.
ForwardResult allocate(const detail::OutputShapes& shapes, Returns returns, ForwardOutputs* outputs) {
  detail::check_no_weights(returns.weights);
  ForwardResult result;
  result.output = Tensor(shapes.output_dtype, shapes.output_shape);
  *outputs = {result.output.view(), std::nullopt, std::nullopt};
  if (returns.lse) {
    result.lse = Tensor(shapes.lse_dtype, shapes.lse_shape);
    outputs->lse = result.lse.view();
  }
  return result;
}

}  // namespace

void forward(const TensorView& query, const TensorView& key, const TensorView& value, const ForwardOutputs& outputs,
             const Options& options) {
  const detail::CheckedInputs inputs = detail::check_inputs(query, key, value, options);
  // (Not a vector of one: a Problem's copy copies its operands' per-matrix offsets.)
  const detail::Problem problem = detail::make_problem(inputs, outputs);
  run(&problem, 1, options.backend);
}

ForwardResult forward(const TensorView& query, const TensorView& key, const TensorView& value, const Options& options,
                      Returns returns) {
  const detail::CheckedInputs inputs = detail::check_inputs(query, key, value, options);
  ForwardResult result;
  result.output = Tensor(query.dtype, inputs.output_shape);
  ForwardOutputs outputs{result.output.view(), std::nullopt, std::nullopt};
  if (returns.weights) {
    result.weights = Tensor(query.dtype, inputs.weights_shape);
    outputs.weights = result.weights.view();
  }
  if (returns.lse) {
    result.lse = Tensor(inputs.lse_dtype, inputs.lse_shape);
    outputs.lse = result.lse.view();
  }
  forward(query, key, value, outputs, options);
  return result;
}

// Packed and paged calls: every sequence checked first, then each a problem of its own
// (no work on padding), all in one parallel region.
void forward_varlen(const TensorView& query, const TensorView& key, const TensorView& value,
                    const VarlenSequences& sequences, const ForwardOutputs& outputs, const Options& options) {
  run(detail::make_varlen_problems(query, key, value, sequences, outputs, options), options.backend);
}

ForwardResult forward_varlen(const TensorView& query, const TensorView& key, const TensorView& value,
                             const VarlenSequences& sequences, const Options& options, Returns returns) {
  ForwardOutputs outputs;
  ForwardResult result =
      allocate(detail::check_varlen_inputs(query, key, value, sequences, options), returns, &outputs);
  forward_varlen(query, key, value, sequences, outputs, options);
  return result;
}

void forward_paged(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                   const Options& options) {
  run(detail::make_paged_problems(query, cache, outputs, options), options.backend);
}

ForwardResult forward_paged(const TensorView& query, const PagedKV& cache, const Options& options, Returns returns) {
  ForwardOutputs outputs;
  ForwardResult result = allocate(detail::check_paged_inputs(query, cache, options), returns, &outputs);
  forward_paged(query, cache, outputs, options);
  return result;
}

}  // namespace sdpa
