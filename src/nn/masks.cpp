#include "nn/masks.h"

#include <cmath>
#include <string>
#include <vector>

#include "api/views.h"
#include "common/element.h"
#include "nn/shape_text.h"
#include "sdpa/error.h"

namespace sdpa::nn::detail {
namespace {

using Shape = std::vector<std::int64_t>;

void check_view(const TensorView& v, const char* name) {
  if (!v.strides.empty() && v.strides.size() != v.rank()) {
    throw Error(ErrorKind::value, name,
                "expected one stride per dim, got " + std::to_string(v.strides.size()) + " strides for shape " +
                    shape_text(v.shape));
  }
  if (v.data == nullptr && v.numel() != 0) throw Error(ErrorKind::value, name, "expected data, got a null pointer");
}

// Strides that read `v` broadcast to `target` (NumPy rules, right-aligned): 0 along
// the dims `v` lacks or has as 1.
Shape broadcast_strides(const TensorView& v, const Shape& target, const char* name) {
  const std::size_t vr = v.rank(), tr = target.size();
  if (vr > tr) {
    throw Error(ErrorKind::value, name,
                "expected at most " + std::to_string(tr) + " dims, broadcastable to " + shape_text(target) +
                    ", got shape " + shape_text(v.shape));
  }
  const Shape strides = v.effective_strides();
  Shape out(tr, 0);
  for (std::size_t d = 0; d < vr; ++d) {
    const std::size_t t = tr - vr + d;
    if (v.shape[d] == target[t]) {
      out[t] = target[t] == 1 ? 0 : strides[d];
    } else if (v.shape[d] != 1) {
      throw Error(ErrorKind::value, name,
                  "expected a shape broadcastable to " + shape_text(target) + ", got " + shape_text(v.shape));
    }
  }
  return out;
}

// A mask is bool (takes part or not) or floating point (added); any other dtype — int8
// since quantized K/V brought it — would be read as an additive float mask, a silent
// wrong answer, so it is refused.
void check_mask_dtype(const TensorView& v, const char* name) {
  if (v.dtype != DType::boolean && !sdpa::detail::is_float(v.dtype))
    throw Error(ErrorKind::type, name,
                std::string("expected bool, float16, bfloat16, float32 or float64, got ") + dtype_name(v.dtype));
}

double load(const TensorView& v, std::int64_t offset) {
  return sdpa::detail::load_element<double>(
      static_cast<const std::byte*>(v.data) + offset * static_cast<std::int64_t>(dtype_size(v.dtype)), v.dtype);
}

}  // namespace

MergedMask merge_masks(const std::optional<TensorView>& mask, const std::optional<TensorView>& key_padding,
                       std::int64_t batch, std::int64_t heads, std::int64_t queries, std::int64_t keys, bool batched) {
  MergedMask merged;
  const Shape full = {batch, heads, queries, keys};
  Shape mask_strides;
  if (mask) {
    check_view(*mask, "call.mask");
    check_mask_dtype(*mask, "call.mask");
    // Unbatched calls see the mask against (Hq, L, S); it must not invent a batch dim.
    const Shape target = batched ? full : Shape{heads, queries, keys};
    mask_strides = broadcast_strides(*mask, target, "call.mask");
    if (!batched) mask_strides.insert(mask_strides.begin(), 0);
  }
  if (!key_padding) {
    if (mask) merged.view = *mask;
    return merged;
  }

  const TensorView& pad = *key_padding;
  check_view(pad, "call.key_padding_mask");
  check_mask_dtype(pad, "call.key_padding_mask");
  const Shape pad_shape = batched ? Shape{batch, keys} : Shape{keys};
  if (pad.shape != pad_shape) {
    throw Error(ErrorKind::value, "call.key_padding_mask",
                "expected " + shape_text(pad_shape) + " (batch, keys), got " + shape_text(pad.shape));
  }
  const Shape ps = pad.effective_strides();
  const std::int64_t pad_batch_stride = batched ? ps[0] : 0, pad_key_stride = ps.back();
  const bool pad_bool = pad.dtype == DType::boolean;

  // The padding contribution of key s in batch b, as a float to add: −inf or 0 for bool.
  auto pad_value = [&](std::int64_t b, std::int64_t s) {
    const double v = load(pad, b * pad_batch_stride + s * pad_key_stride);
    return pad_bool ? (v != 0 ? -INFINITY : 0.0) : v;
  };

  if (!mask) {
    merged.storage = Tensor(pad_bool ? DType::boolean : DType::float64, {batch, 1, 1, keys});
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t s = 0; s < keys; ++s) {
        const double v = pad_value(b, s);
        merged.storage.set(b * keys + s, pad_bool ? (v == 0 ? 1.0 : 0.0) : v);
      }
    merged.view = merged.storage.view();
    return merged;
  }

  const bool both_bool = pad_bool && mask->dtype == DType::boolean;
  const std::int64_t mask_heads = mask_strides[1] == 0 ? 1 : heads;
  merged.storage = Tensor(both_bool ? DType::boolean : DType::float64, {batch, mask_heads, queries, keys});
  std::int64_t flat = 0;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < mask_heads; ++h)
      for (std::int64_t l = 0; l < queries; ++l)
        for (std::int64_t s = 0; s < keys; ++s, ++flat) {
          const double m =
              load(*mask, b * mask_strides[0] + h * mask_strides[1] + l * mask_strides[2] + s * mask_strides[3]);
          const double p = pad_value(b, s);
          if (both_bool) {
            merged.storage.set(flat, (m != 0 && p == 0) ? 1.0 : 0.0);
          } else {
            const double additive = mask->dtype == DType::boolean ? (m != 0 ? 0.0 : -INFINITY) : m;
            merged.storage.set(flat, additive + p);
          }
        }
  merged.view = merged.storage.view();
  return merged;
}

}  // namespace sdpa::nn::detail
