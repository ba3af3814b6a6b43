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
