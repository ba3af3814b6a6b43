// Symmetric int8 quantization of keys and values, per (token, KV head), as llama.cpp's
// q8_0 and OpenVINO's u8 KV caches store them, in the form forward() and forward_paged()
// read (Options::key_scale, value_scale):
//   scale[..., j] = max_e |x[..., j, e]| / 127,   q[..., j, e] = round(x[..., j, e] / scale)
// with q in [−127, 127] (round to nearest, ties to even); a row of zeros gets scale 0 and
// q = 0. Each element then satisfies |x − scale · q| <= scale / 2 = max|row| / 254 (see
// docs/numerics.md for what that bounds in the attention's output).
#pragma once

#include "sdpa/tensor.h"

namespace sdpa {

// x: float16, bfloat16, float32 or float64, rank >= 1, finite, any strides; its last dim
// is one token's row (E or Ev). values: int8 of x's shape; scale: float32 of x's shape
// without the last dim. Any strides, no overlap with x or each other. Throws sdpa::Error
// naming the argument at fault (a NaN or infinity in x included); on error nothing has
// been written.
void quantize_kv(const TensorView& x, const TensorView& values, const TensorView& scale);

// Allocating form: packed tensors.
struct QuantizedKV {
  Tensor values;  // int8, x's shape
  Tensor scale;   // float32, x's shape without the last dim
};
QuantizedKV quantize_kv(const TensorView& x);

}  // namespace sdpa
