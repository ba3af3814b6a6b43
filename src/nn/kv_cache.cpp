// The cache stores (B, Hkv, capacity, D): the positions of one (batch, head) are
// contiguous, so the view of the first `length` positions is a plain strided tensor and
// sdpa::forward reads it without a copy. Growing by doubling makes appending T tokens
// one at a time cost O(T) copies in total. An int8 cache keeps its scales the same way,
// (B, Hkv, capacity), and quantizes what it is given straight into its storage.
#include "sdpa/nn.h"

#include <algorithm>
#include <cstring>

#include "sdpa/error.h"
#include "sdpa/quantize.h"

namespace sdpa::nn {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  return text + ")";
}

// Copies `src` (B, H, T, D), any strides, into positions [at, at + T) of `dst`, a packed
// (B, H, capacity, D) tensor.
void copy_in(const TensorView& src, Tensor& dst, std::int64_t at) {
  const std::size_t item = dtype_size(src.dtype);
  const std::vector<std::int64_t> s = src.effective_strides();
  const std::int64_t batch = src.shape[0], heads = src.shape[1], tokens = src.shape[2], dim = src.shape[3];
  const std::int64_t capacity = dst.shape()[2];
  const auto* from = static_cast<const std::byte*>(src.data);
  auto* to = static_cast<std::byte*>(dst.data());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < tokens; ++t) {
        std::byte* row = to + (((b * heads + h) * capacity + at + t) * dim) * static_cast<std::int64_t>(item);
        const std::int64_t base = b * s[0] + h * s[1] + t * s[2];
        if (s[3] == 1) {
          std::memcpy(row, from + base * static_cast<std::int64_t>(item), static_cast<std::size_t>(dim) * item);
        } else {
          for (std::int64_t e = 0; e < dim; ++e)
            std::memcpy(row + e * static_cast<std::int64_t>(item),
                        from + (base + e * s[3]) * static_cast<std::int64_t>(item), item);
        }
      }
}

// Positions [at, at + tokens) of a packed (B, H, capacity, dim) tensor as a view.
TensorView slots(const Tensor& t, std::int64_t at, std::int64_t tokens, std::int64_t dim) {
  const std::int64_t batch = t.shape()[0], heads = t.shape()[1], capacity = t.shape()[2];
  return TensorView{static_cast<std::byte*>(const_cast<void*>(t.data())) +
                        at * dim * static_cast<std::int64_t>(dtype_size(t.dtype())),
                    t.dtype(),
                    {batch, heads, tokens, dim},
                    {heads * capacity * dim, capacity * dim, dim, 1}};
}

// The same for a (B, H, capacity, 1) scale tensor: (B, H, tokens).
TensorView scale_slots(const Tensor& t, std::int64_t at, std::int64_t tokens) {
  const std::int64_t batch = t.shape()[0], heads = t.shape()[1], capacity = t.shape()[2];
  return TensorView{static_cast<float*>(const_cast<void*>(t.data())) + at,
                    DType::float32,
                    {batch, heads, tokens},
                    {heads * capacity, capacity, 1}};
}

// A (B, H, T) scale view as (B, H, T, 1), the shape copy_in takes.
TensorView as_rows(TensorView scale) {
  scale.strides = scale.effective_strides();
  scale.shape.push_back(1);
  scale.strides.push_back(1);
  return scale;
}

}  // namespace

KVCache::KVCache(DType dtype, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                 std::int64_t capacity)
    : dtype_(dtype), batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim), value_dim_(value_dim) {
  if (dtype == DType::boolean)
    throw Error(ErrorKind::type, "dtype", "expected a floating-point dtype or int8 (quantized), got bool");
  for (auto [name, value] :
       {std::pair{"batch", batch}, std::pair{"kv_heads", kv_heads}, std::pair{"head_dim", head_dim},
        std::pair{"value_dim", value_dim}, std::pair{"capacity", capacity}}) {
    if (value < 0) throw Error(ErrorKind::value, name, "expected a size >= 0, got " + std::to_string(value));
  }
  grow(std::max<std::int64_t>(capacity, 1));
}

std::pair<Tensor, Tensor> KVCache::grow(std::int64_t needed) {
  if (needed <= capacity_) return {};
  const std::int64_t capacity = std::max({needed, 2 * capacity_, std::int64_t{16}});
  Tensor keys(dtype_, {batch_, kv_heads_, capacity, head_dim_});
  Tensor values(dtype_, {batch_, kv_heads_, capacity, value_dim_});
  if (length_ > 0) {
    copy_in(this->keys(), keys, 0);
    copy_in(this->values(), values, 0);
  }
  if (dtype_ == DType::int8) {  // the scales, stored (B, Hkv, capacity, 1) for copy_in
    Tensor key_scale(DType::float32, {batch_, kv_heads_, capacity, 1});
    Tensor value_scale(DType::float32, {batch_, kv_heads_, capacity, 1});
    if (length_ > 0) {
      copy_in(as_rows(*this->key_scale()), key_scale, 0);
      copy_in(as_rows(*this->value_scale()), value_scale, 0);
    }
    std::swap(key_scale_, key_scale);
    std::swap(value_scale_, value_scale);
  }
  std::swap(keys_, keys);
  std::swap(values_, values);
  capacity_ = capacity;
  return {std::move(keys), std::move(values)};
}

void KVCache::append(const TensorView& keys, const TensorView& values) {
  auto check = [&](const TensorView& v, const char* name, std::int64_t dim) {
    if (dtype_ == DType::int8 && (v.dtype == DType::boolean || v.dtype == DType::int8)) {
      throw Error(ErrorKind::type, name,
                  std::string("expected floating-point keys and values to quantize into the int8 cache, got ") +
                      dtype_name(v.dtype));
    }
    if (v.dtype != dtype_ && dtype_ != DType::int8) {
      throw Error(ErrorKind::type, name,
                  std::string("expected the cache's dtype ") + dtype_name(dtype_) + ", got " + dtype_name(v.dtype));
    }
    if (v.rank() != 4 || v.shape[0] != batch_ || v.shape[1] != kv_heads_ || v.shape[3] != dim) {
      throw Error(ErrorKind::value, name,
                  "expected (" + std::to_string(batch_) + ", " + std::to_string(kv_heads_) + ", T, " +
                      std::to_string(dim) + "), got " + shape_text(v.shape));
    }
    if (!v.strides.empty() && v.strides.size() != 4) {
      throw Error(ErrorKind::value, name, "expected 4 strides, got " + std::to_string(v.strides.size()));
    }
    if (v.shape[2] < 0)
      throw Error(ErrorKind::value, name, "expected T >= 0 positions, got " + std::to_string(v.shape[2]));
    if (v.data == nullptr && v.numel() != 0) throw Error(ErrorKind::value, name, "expected data, got a null pointer");
  };
  check(keys, "keys", head_dim_);
  check(values, "values", value_dim_);
  if (keys.shape[2] != values.shape[2]) {
    throw Error(ErrorKind::value, "values",
                "expected as many positions as the keys (" + std::to_string(keys.shape[2]) + "), got " +
                    std::to_string(values.shape[2]));
  }
  const std::int64_t tokens = keys.shape[2];
  // `keys` and `values` may view the cache itself (appending its own contents): the
  // replaced storage stays alive until they have been copied.
  const std::pair<Tensor, Tensor> previous = grow(length_ + tokens);
  if (dtype_ == DType::int8) {
    // Quantized straight into the new positions; a NaN or infinity is refused before
    // the length moves, so the cache still holds what it held.
    auto quantize = [&](const TensorView& x, const TensorView& out, const TensorView& scale, const char* name) {
      try {
        quantize_kv(x, out, scale);
      } catch (const Error& error) {
        // quantize_kv calls its input x; this call's caller passed it as keys or values.
        if (error.argument() != "x") throw;
        throw Error(error.kind(), name, error.message());
      }
    };
    quantize(keys, slots(keys_, length_, tokens, head_dim_), scale_slots(key_scale_, length_, tokens), "keys");
    quantize(values, slots(values_, length_, tokens, value_dim_), scale_slots(value_scale_, length_, tokens), "values");
  } else {
    copy_in(keys, keys_, length_);
    copy_in(values, values_, length_);
  }
  length_ += tokens;
}

void KVCache::truncate(std::int64_t length) {
  if (length < 0 || length > length_) {
    throw Error(ErrorKind::value, "length",
                "expected 0 <= length <= " + std::to_string(length_) + ", got " + std::to_string(length));
  }
  length_ = length;
}

TensorView KVCache::keys() const {
  return TensorView{const_cast<void*>(keys_.data()),
                    dtype_,
                    {batch_, kv_heads_, length_, head_dim_},
                    {kv_heads_ * capacity_ * head_dim_, capacity_ * head_dim_, head_dim_, 1}};
}

TensorView KVCache::values() const {
  return TensorView{const_cast<void*>(values_.data()),
                    dtype_,
                    {batch_, kv_heads_, length_, value_dim_},
                    {kv_heads_ * capacity_ * value_dim_, capacity_ * value_dim_, value_dim_, 1}};
}

std::optional<TensorView> KVCache::key_scale() const {
  if (dtype_ != DType::int8) return std::nullopt;
  return scale_slots(key_scale_, 0, length_);
}

std::optional<TensorView> KVCache::value_scale() const {
  if (dtype_ != DType::int8) return std::nullopt;
  return scale_slots(value_scale_, 0, length_);
}

}  // namespace sdpa::nn
