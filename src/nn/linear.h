// The projections of the attention layer: y = x Wᵀ + b, as torch.nn.Linear computes it,
// through the BLAS (OpenBLAS's cblas_sgemm / cblas_dgemm).
#pragma once

#include "sdpa/tensor.h"

namespace sdpa::nn::detail {

// For every row n of `x` (all dims but the last, flattened in row-major order):
//   y[n, o] = sum_i x[n, i] · W[o, i] + b[o]
// x: (..., in), any strides, the dtype of `weight` (float32 or float64). weight: packed
// (out, in). bias: packed (out) or nullptr. y: a packed (rows, out) buffer of that dtype.
// Rows the BLAS can address directly (unit stride along `in`, rows a fixed stride
// apart) are passed as they are; anything else is packed first.
void linear(const TensorView& x, const Tensor& weight, const Tensor* bias, void* y);

}  // namespace sdpa::nn::detail
