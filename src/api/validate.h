// The one place that checks arguments. Everything a kernel receives has passed here.
#pragma once

#include <vector>

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

// Checks query, key, value, the mask and the scalar options; throws sdpa::Error.
CheckedInputs check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                           const Options& options);

// Checks the output buffers against `inputs` and resolves everything into a Problem.
Problem make_problem(const CheckedInputs& inputs, const ForwardOutputs& outputs);

// A backward call, checked and resolved.
struct CheckedBackward {
  BackwardProblem problem;
  // The mask gradient sums over broadcast dims. problem.grad_mask is then absent: the
  // caller points it at a full-size scratch (full_scores_operand) and sums that into the
  // grad_mask buffer afterwards, in a fixed order.
  bool mask_gradient_sums = false;
};

// Checks the backward's read-only tensors (output, lse, grad_output: shapes and dtypes
// as the forward gives them, any strides) and the gradient buffers (shapes and dtypes of
// query, key, value and the mask, no overlap), and resolves everything.
CheckedBackward make_backward_problem(const CheckedInputs& inputs, const BackwardInputs& tensors,
                                      const BackwardOutputs& outputs);

// ---- Packed variable-length batches and the paged KV cache -------------------------
// Each is run as one Problem per sequence (Problem::first_batch = its index), built by
// checking the whole call first (so that nothing is written on error), then each
// sequence's views with check_inputs / make_problem.

// The shapes of a varlen or paged call's outputs, once its inputs are checked.
struct OutputShapes {
  std::vector<std::int64_t> output_shape, lse_shape;
  DType output_dtype = DType::float32, lse_dtype = DType::float32;
};

// Varlen and paged calls return no weights (they would be ragged): an error naming
// `weights` when they are asked for, as a buffer or as an allocating call's Returns.
void check_no_weights(bool requested);

OutputShapes check_varlen_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                                 const VarlenSequences& sequences, const Options& options);
std::vector<Problem> make_varlen_problems(const TensorView& query, const TensorView& key, const TensorView& value,
                                          const VarlenSequences& sequences, const ForwardOutputs& outputs,
                                          const Options& options);

// One sequence of a varlen backward: its problem and its slices of the gradient buffers
// (zero-filled by the caller when the sequence has no queries or no keys).
struct SequenceBackward {
  BackwardProblem problem;
  BackwardOutputs gradients;
};
std::vector<SequenceBackward> make_varlen_backward_problems(const BackwardInputs& inputs,
                                                            const VarlenSequences& sequences,
                                                            const BackwardOutputs& outputs, const Options& options);

OutputShapes check_paged_inputs(const TensorView& query, const PagedKV& cache, const Options& options);
std::vector<Problem> make_paged_problems(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                                         const Options& options);

// The operand of a tensor shaped like the scores, (batch..., Hq, L, S), any strides.
Operand full_scores_operand(const TensorView& scores, const CheckedInputs& inputs);

// The strides (in elements of `mask`) that broadcast `mask` to `target`: 0 along the
// dims it lacks or has size 1 in.
std::vector<std::int64_t> mask_broadcast_strides(const TensorView& mask, const std::vector<std::int64_t>& target);

}  // namespace sdpa::detail
