// sdpa: exact scaled dot-product attention.
//
//   output = softmax(Q Kᵀ · scale + mask) V
//
// with PyTorch's semantics (torch.nn.functional.scaled_dot_product_attention); the
// contract is written out in docs/semantics.md.
#pragma once

#include <optional>
#include <string>

#include "sdpa/error.h"
#include "sdpa/options.h"
#include "sdpa/tensor.h"

namespace sdpa {

// Caller-provided buffers for forward(). Shapes, with Q (..., Hq, L, E),
// K (..., Hkv, S, E), V (..., Hkv, S, Ev):
//   output  (..., Hq, L, Ev)  dtype of the query
//   weights (..., Hq, L, S)   dtype of the query: the weights multiplied into V, after
//                             dropout
//   lse     (..., Hq, L)      float32 (float64 for float64 inputs): log-sum-exp of each
//                             row of scaled, masked scores; -inf for fully masked rows
// Any strides, as long as the elements of one buffer do not overlap.
struct ForwardOutputs {
  TensorView output;
  std::optional<TensorView> weights;
  std::optional<TensorView> lse;
};

// Computes attention into caller buffers. Validates everything first and throws
// sdpa::Error naming the argument at fault; on error nothing has been written.
void forward(const TensorView& query, const TensorView& key, const TensorView& value,
             const ForwardOutputs& outputs, const Options& options = {});

// What the allocating forward() returns. `weights` and `lse` are empty tensors unless
// asked for.
struct ForwardResult {
  Tensor output;
  Tensor weights;
  Tensor lse;
};

// What to return besides the output.
struct Returns {
  bool weights = false;
  bool lse = false;
};

// Allocating form: returns packed tensors.
ForwardResult forward(const TensorView& query, const TensorView& key,
                      const TensorView& value, const Options& options = {},
                      Returns returns = {});

// ---- Backward ----------------------------------------------------------------------
//
// Gradients of a loss through output = softmax(Q Kᵀ · scale + mask) V, given dO:
//   P  = exp(Q Kᵀ · scale + mask − lse)     recomputed, never stored whole
//   W  = P ∘ Z                               Z = keep/(1−p): the forward's dropout mask
//   dV = Wᵀ dO,   dP = (dO Vᵀ) ∘ Z,   D = rowsum(dO ∘ O)
//   dS = P ∘ (dP − D)
//   dQ = scale · dS K,   dK = scale · dSᵀ Q,   dmask = dS (summed over broadcast dims)
// GQA: dK and dV of a KV head sum over the query heads of its group.

// What backward() reads. query, key, value and the options (mask, causal, scale,
// dropout seed and offset) must be those of the forward call; output and lse are what
// it returned (lse as ForwardOutputs::lse: float32, float64 for float64 inputs).
// grad_output is dL/d(output). All read-only, any strides (stride 0 included).
struct BackwardInputs {
  TensorView query, key, value;
  TensorView output;       // (..., Hq, L, Ev), dtype of the query
  TensorView lse;          // (..., Hq, L)
  TensorView grad_output;  // (..., Hq, L, Ev), dtype of the query
};

// Caller-provided buffers for backward(), each the shape and dtype of what it is the
// gradient of. grad_mask only for a floating-point mask: the mask's own shape and dtype,
// the full gradient summed over the dims the mask broadcasts along. Any strides, as long
// as no two elements overlap and no buffer overlaps another or an input.
struct BackwardOutputs {
  TensorView grad_query, grad_key, grad_value;
  std::optional<TensorView> grad_mask;
};

// Computes the gradients into caller buffers. Validates everything first and throws
// sdpa::Error naming the argument at fault; on error nothing has been written. Bitwise
// the same results for any thread count.
void backward(const BackwardInputs& inputs, const BackwardOutputs& outputs, const Options& options = {});

// What the allocating backward() returns; grad_mask is empty unless asked for.
struct BackwardResult {
  Tensor grad_query, grad_key, grad_value, grad_mask;
};

// Allocating form: returns packed tensors. `mask_gradient` asks for grad_mask (a float
// mask must be given).
BackwardResult backward(const BackwardInputs& inputs, const Options& options = {}, bool mask_gradient = false);

// The version string ("0.1.0").
const char* version();

// What the library found on this machine and would run.
struct RuntimeInfo {
  std::string version;
  std::string cpu_features;  // e.g. "avx2 fma avx512f avx512bf16"
  std::string cpu_kernel;    // the CPU forward kernel the dispatcher picks
  int max_threads = 1;       // OpenMP threads available
};
RuntimeInfo runtime_info();

}  // namespace sdpa
