#include "testing/sequences.h"

#include <algorithm>
#include <cstddef>

namespace sdpa::testing {

TensorView sequence_rows(const TensorView& packed, std::int64_t begin, std::int64_t end) {
  const Shape st = packed.effective_strides();
  TensorView v;
  v.dtype = packed.dtype;
  v.data = static_cast<std::byte*>(packed.data) + begin * st[1] * static_cast<std::int64_t>(dtype_size(packed.dtype));
  v.shape = packed.shape;
  v.shape[1] = end - begin;
  v.shape.insert(v.shape.begin(), 1);
  v.strides = st;
  v.strides.insert(v.strides.begin(), 0);
  return v;
}

TensorView per_head_of_sequence(const Tensor& slopes, std::int64_t b) {
  TensorView v = slopes.view();
  if (slopes.shape().size() == 2) {
    const std::int64_t heads = slopes.shape()[1];
    v.data = static_cast<std::byte*>(v.data) + b * heads * static_cast<std::int64_t>(dtype_size(slopes.dtype()));
    v.shape = {heads};
    v.strides = {1};
  }
  return v;
}

double same_result_tolerance(DType dtype, double magnitude) {
  const double m = std::max(1.0, magnitude);
  switch (dtype) {
    case DType::float64:
      return 1e-12 * m;
    case DType::float32:
      return 2e-6 * m;
    default:
      return 8e-3 * m;  // two bfloat16 units
  }
}

}  // namespace sdpa::testing
