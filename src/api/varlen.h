// Packed variable-length batches (sdpa::forward_varlen, backward_varlen): sequences
// packed along the sequence dim, (heads, total, dim), split by cu_seqlens; each sequence
// a Problem of its own (sequences.h).
#pragma once

#include <vector>

#include "api/sequences.h"
#include "common/backward_problem.h"
#include "common/problem.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

// The whole call checked, giving the output shapes: what the allocating forms size their
// buffers by before the buffer form (make_varlen_problems) checks again with them.
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

}  // namespace sdpa::detail
