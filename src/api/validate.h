// The one place that checks arguments. Everything a kernel receives has passed here.
#pragma once

#include <vector>

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

// Checks query, key, value, the mask and the scalar options; throws sdpa::Error.
CheckedInputs check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                           const Options& options);

// Checks the output buffers against `inputs` and resolves everything into a Problem.
Problem make_problem(const CheckedInputs& inputs, const ForwardOutputs& outputs);

}  // namespace sdpa::detail
