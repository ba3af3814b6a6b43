#include "api/operands.h"

namespace sdpa::detail {

Operand make_operand(const TensorView& view, const Shape& batch_shape, std::int64_t heads, const Shape& strides) {
  Operand op;
  op.data = static_cast<std::byte*>(view.data);
  op.dtype = view.dtype;
  op.element_size = dtype_size(view.dtype);
  const std::size_t nb = batch_shape.size();
  const std::size_t r = strides.size();
  op.row_stride = strides[r - 2];
  op.col_stride = strides[r - 1];
  const std::int64_t head_stride = r == nb + 3 ? strides[r - 3] : 0;  // no head dim: one head
  std::int64_t batch = 1;
  for (std::int64_t size : batch_shape) batch *= size;
  op.head_offset.resize(static_cast<std::size_t>(batch * heads));
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t base = 0, rest = b;
    for (std::size_t d = nb; d-- > 0;) {  // unravel b, row-major over the batch dims
      base += (rest % batch_shape[d]) * strides[d];
      rest /= batch_shape[d];
    }
    for (std::int64_t h = 0; h < heads; ++h)
      op.head_offset[static_cast<std::size_t>(b * heads + h)] = base + h * head_stride;
  }
  return op;
}

Operand make_operand(const TensorView& view, const Shape& batch_shape, std::int64_t heads) {
  Shape packed;
  return make_operand(view, batch_shape, heads, strides_of(view, packed));
}

Operand lse_operand(const TensorView& lse, const Shape& batch_shape, std::int64_t heads_q) {
  Shape strides = lse.effective_strides();
  strides.push_back(0);
  return make_operand(lse, batch_shape, heads_q, strides);
}

Shape mask_broadcast_strides(const TensorView& mask, const Shape& target) {
  const std::size_t mr = mask.shape.size(), tr = target.size();
  if (mr > tr)
    fail("mask", "expected at most " + std::to_string(tr) + " dims, broadcastable to " + shape_string(target) +
                     ", got shape " + shape_string(mask.shape));
  Shape packed;
  const Shape& mask_strides = strides_of(mask, packed);
  Shape strides(tr, 0);
  for (std::size_t d = 0; d < mr; ++d) {
    const std::size_t t = tr - mr + d;
    if (mask.shape[d] == target[t]) {
      strides[t] = target[t] == 1 ? 0 : mask_strides[d];
    } else if (mask.shape[d] != 1) {
      fail("mask", "expected a shape broadcastable to " + shape_string(target) + ", got " + shape_string(mask.shape) +
                       " (dim " + std::to_string(d) + ")");
    }
  }
  return strides;
}

}  // namespace sdpa::detail
