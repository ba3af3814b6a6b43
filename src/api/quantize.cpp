// quantize_kv (sdpa/quantize.h): symmetric int8 per row, checked first like every entry
// point, then one pass per row for its maximum and one for its values.
#include "sdpa/quantize.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "api/views.h"
#include "common/element.h"

namespace sdpa {

namespace {

using detail::Shape;

// Calls visit(x_offset, values_offset, scale_offset) in elements for the first element of
// each row (every index of the leading dims), row-major.
template <class Visit>
void for_each_row(const Shape& leading, const Shape& xs, const Shape& vs, const Shape& ss, Visit visit) {
  std::int64_t rows = 1;
  for (std::int64_t size : leading) rows *= size;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rest = r, xo = 0, vo = 0, so = 0;
    for (std::size_t d = leading.size(); d-- > 0;) {
      const std::int64_t index = rest % leading[d];
      rest /= leading[d];
      xo += index * xs[d];
      vo += index * vs[d];
      so += index * ss[d];
    }
    visit(xo, vo, so);
  }
}

}  // namespace

void quantize_kv(const TensorView& x, const TensorView& values, const TensorView& scale) {
  if (!detail::is_float(x.dtype))
    detail::fail("x", std::string("expected float16, bfloat16, float32 or float64, got ") + dtype_name(x.dtype),
                 ErrorKind::type);
  if (x.rank() < 1) detail::fail("x", "expected rank >= 1 (..., dim), got a scalar");
  const std::vector<detail::Span> inputs{detail::check_view(x, "x")};
  const Shape leading(x.shape.begin(), x.shape.end() - 1);
  detail::check_outputs({{&values, "values", &x.shape, DType::int8}, {&scale, "scale", &leading, DType::float32}},
                        inputs);

  const std::int64_t width = x.shape.back();
  const Shape xs = x.effective_strides(), vs = values.effective_strides(), ss = scale.effective_strides();
  const auto* xp = static_cast<const std::byte*>(x.data);
  const std::int64_t x_size = static_cast<std::int64_t>(dtype_size(x.dtype));
  auto element = [&](std::int64_t xo, std::int64_t e) {
    return detail::load_element<double>(xp + (xo + e * xs.back()) * x_size, x.dtype);
  };
  // Checked before anything is written: a NaN or infinity has no int8 form.
  std::vector<double> maxima;
  for_each_row(leading, xs, vs, ss, [&](std::int64_t xo, std::int64_t, std::int64_t) {
    double max = 0;
    for (std::int64_t e = 0; e < width; ++e) {
      const double v = element(xo, e);
      if (!std::isfinite(v)) detail::fail("x", "expected finite values to quantize, got " + detail::number_string(v));
      max = std::max(max, std::abs(v));
    }
    if (!std::isfinite(static_cast<float>(max / 127)))
      detail::fail("x", "expected |x| <= 127 · float32's largest (the scale is float32), got " +
                            detail::number_string(max));
    maxima.push_back(max);
  });

  std::size_t row = 0;
  for_each_row(leading, xs, vs, ss, [&](std::int64_t xo, std::int64_t vo, std::int64_t so) {
    const double max = maxima[row++];
    float s = static_cast<float>(max / 127);
    // A row so small that max/127 is below float32's least denormal keeps a scale > 0.
    if (s == 0 && max > 0) s = std::numeric_limits<float>::denorm_min();
    detail::store_element<float>(static_cast<std::byte*>(scale.data) + so * 4, DType::float32, s);
    for (std::int64_t e = 0; e < width; ++e) {
      // |x/s| <= 127 up to the rounding of s; store_element rounds to nearest (ties to
      // even) and saturates at ±127.
      const double q = s == 0 ? 0.0 : element(xo, e) / static_cast<double>(s);
      detail::store_element<double>(static_cast<std::byte*>(values.data) + vo + e * vs.back(), DType::int8, q);
    }
  });
}

QuantizedKV quantize_kv(const TensorView& x) {
  if (x.rank() < 1) detail::fail("x", "expected rank >= 1 (..., dim), got a scalar");
  QuantizedKV result{Tensor(DType::int8, x.shape), Tensor(DType::float32, Shape(x.shape.begin(), x.shape.end() - 1))};
  quantize_kv(x, result.values.view(), result.scale.view());
  return result;
}

}  // namespace sdpa
