#include "testing/helpers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/half.h"

namespace sdpa::testing {

Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937_64& rng, double stddev) {
  Tensor t(dtype, shape);
  std::normal_distribution<double> normal(0.0, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

Tensor random_bool(const Shape& shape, std::mt19937_64& rng, double p_true) {
  Tensor t(DType::boolean, shape);
  std::bernoulli_distribution coin(p_true);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, coin(rng) ? 1.0 : 0.0);
  return t;
}

Tensor to_float64(const TensorView& view) {
  Tensor out(DType::float64, view.shape);
  const Shape strides = view.effective_strides();
  const std::size_t element = dtype_size(view.dtype);
  const std::size_t rank = view.shape.size();
  Shape index(rank, 0);
  for (std::int64_t flat = 0; flat < out.numel(); ++flat) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) offset += index[d] * strides[d];
    Tensor one(view.dtype, {1});
    std::copy_n(static_cast<const std::byte*>(view.data) + offset * static_cast<std::int64_t>(element), element,
                static_cast<std::byte*>(one.data()));
    out.set(flat, one.get(0));
    for (std::size_t d = rank; d-- > 0;) {  // next row-major index
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

Tensor dequantized(const TensorView& values, const TensorView& scale) {
  Tensor out = to_float64(values);
  const Tensor s = to_float64(scale);
  const std::int64_t width = values.shape.empty() ? 1 : values.shape.back();
  for (std::int64_t n = 0; n < out.numel(); ++n) out.set(n, out.get(n) * s.get(n / width));
  return out;
}

Tensor convert(const Tensor& tensor, DType dtype) {
  Tensor out(dtype, tensor.shape());
  for (std::int64_t i = 0; i < tensor.numel(); ++i) out.set(i, tensor.get(i));
  return out;
}

double round_to(DType dtype, double value) {
  switch (dtype) {
    case DType::float16:
      return detail::fp16_to_float(detail::float_to_fp16(static_cast<float>(value)));
    case DType::bfloat16:
      return detail::bf16_to_float(detail::float_to_bf16(static_cast<float>(value)));
    case DType::float32:
      return static_cast<float>(value);
    default:
      return value;
  }
}

StridedCopy heads_interleaved(const Tensor& packed) {
  const Shape& s = packed.shape();  // (B, H, L, E)
  StridedCopy copy{Tensor(packed.dtype(), {s[0], s[2], s[1], s[3]}), {}};
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t l = 0; l < s[2]; ++l)
        for (std::int64_t e = 0; e < s[3]; ++e)
          copy.storage.set(((b * s[2] + l) * s[1] + h) * s[3] + e, packed.get(((b * s[1] + h) * s[2] + l) * s[3] + e));
  copy.view = copy.storage.view();
  copy.view.shape = s;
  copy.view.strides = {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1};
  return copy;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (x == y) continue;  // equal infinities
    worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}

double max_abs(const Tensor& t) {
  double largest = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) largest = std::max(largest, std::abs(t.get(i)));
  return largest;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

Agreement compare_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                              const Options& options) {
  const DType dtype = query.dtype;
  Options fast = options;
  if (fast.backend == Backend::automatic) fast.backend = Backend::cpu;
  const ForwardResult plain = forward(query, key, value, fast);
  const ForwardResult full = forward(query, key, value, fast, Returns{true, true});

  // An int8 K or V reaches the oracle dequantized here (scale · q is exact in float64),
  // its scale cleared: the oracle reading the same int8 views and scales as the kernel
  // would share any scale-indexing bug of the library's and hide it.
  const Tensor q64 = to_float64(query);
  const Tensor k64 = options.key_scale ? dequantized(key, *options.key_scale) : to_float64(key);
  const Tensor v64 = options.value_scale ? dequantized(value, *options.value_scale) : to_float64(value);
  Options oracle_options = options;
  oracle_options.backend = Backend::reference;
  oracle_options.key_scale.reset();
  oracle_options.value_scale.reset();
  const ForwardResult oracle = forward(q64.view(), k64.view(), v64.view(), oracle_options, Returns{true, true});

  Agreement a = agree_with_oracle(full, oracle, v64, dtype);
  // Asking for weights and lse must not change the output by a single bit.
  const Tensor out_plain = to_float64(plain.output.view()), out_full = to_float64(full.output.view());
  for (std::int64_t i = 0; i < out_plain.numel(); ++i) {
    const double x = out_plain.get(i), y = out_full.get(i);
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) a.output_error = std::numeric_limits<double>::infinity();
  }
  return a;
}

}  // namespace sdpa::testing
