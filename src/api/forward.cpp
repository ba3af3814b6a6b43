// Entry points: validate once, then dispatch to a backend.
#include <cmath>
#include <limits>

#include "api/validate.h"
#include "cpu/forward.h"
#include "reference/attention.h"
#include "sdpa/sdpa.h"

namespace sdpa {

void forward(const TensorView& query, const TensorView& key, const TensorView& value,
             const ForwardOutputs& outputs, const Options& options) {
  const detail::CheckedInputs inputs = detail::check_inputs(query, key, value, options);
  const detail::Problem problem = detail::make_problem(inputs, outputs);
  if (problem.batch * problem.heads_q * problem.L == 0) return;  // no rows to compute
  switch (options.backend) {
    case Backend::reference:
      detail::reference_forward(problem);
      return;
    case Backend::automatic:
    case Backend::cpu:
      detail::cpu_forward(problem);
      return;
  }
}

ForwardResult forward(const TensorView& query, const TensorView& key, const TensorView& value,
                      const Options& options, Returns returns) {
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

}  // namespace sdpa
