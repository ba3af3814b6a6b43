#include "api/resolve_options.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "common/element.h"

namespace sdpa::detail {

namespace {

// A scale, cap or sink finite in double but not in float32 (1e39) would make every
// float32 score infinite and every output NaN: refused, naming the compute dtype. The
// float32 kernels fold log2(e) into them (exp2 instead of exp), so the bound is
// float32's largest value over log2(e).
void check_fits_float32(const std::string& name, double value, DType query_dtype) {
  const double largest = std::numeric_limits<float>::max() / std::numbers::log2e;
  if (query_dtype != DType::float64 && std::abs(value) > largest)
    fail(name, "expected a number finite in float32, the compute dtype of " + std::string(dtype_name(query_dtype)) +
                   " inputs (|x| <= " + number_string(largest) + ", float32's largest over log2(e)), got " +
                   number_string(value));
}

// One value per query head: float32 or float64, shape (Hq,) or (batch..., Hq).
void check_per_head(const TensorView& view, const char* name, const Shape& batch_shape, std::int64_t heads_q) {
  if (view.dtype != DType::float32 && view.dtype != DType::float64)
    fail(name, std::string("expected float32 or float64, got ") + dtype_name(view.dtype), ErrorKind::type);
  Shape full = batch_shape;
  full.push_back(heads_q);
  if (view.shape != Shape{heads_q} && view.shape != full)
    fail(name, "expected shape (" + std::to_string(heads_q) + ",) or " + shape_string(full) + ", got " +
                   shape_string(view.shape));
  check_view(view, name);
}

// A per-head tensor's value for each query matrix b · Hq + h, whichever of the two shapes
// it has.
std::vector<double> per_query_matrix(const TensorView& view, std::int64_t batch, std::int64_t heads_q) {
  Shape packed;
  const Shape& strides = strides_of(view, packed);
  const bool per_batch = view.rank() > 1;
  std::vector<double> values(static_cast<std::size_t>(batch * heads_q));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads_q; ++h) {
      std::int64_t offset = h * strides.back(), rest = b;
      for (std::size_t d = view.rank() - 1; per_batch && d-- > 0;) {  // unravel b over the batch dims
        offset += (rest % view.shape[d]) * strides[d];
        rest /= view.shape[d];
      }
      values[static_cast<std::size_t>(b * heads_q + h)] = load_element<double>(
          static_cast<const std::byte*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.dtype)),
          view.dtype);
    }
  return values;
}

}  // namespace

void check_options(const Options& options, DType query_dtype) {
  if (options.scale && !std::isfinite(*options.scale))
    fail("options.scale", "expected a finite number, got " + std::to_string(*options.scale));
  if (options.scale) check_fits_float32("options.scale", *options.scale, query_dtype);
  check_fits_float32("options.softcap", options.softcap, query_dtype);
  const double p = options.dropout_p;
  if (!(p >= 0.0 && p < 1.0)) fail("options.dropout_p", "expected a probability in [0, 1), got " + std::to_string(p));
  if (options.num_threads < 0 || options.num_threads > Options::kMaxThreads)
    fail("options.num_threads", "expected an integer in [0, " + std::to_string(Options::kMaxThreads) +
                                    "] (0 = default), got " + std::to_string(options.num_threads));
  if (options.window_left < -1)
    fail("options.window_left", "expected >= 0, or -1 for unbounded, got " + std::to_string(options.window_left));
  if (options.window_right < -1)
    fail("options.window_right", "expected >= 0, or -1 for unbounded, got " + std::to_string(options.window_right));
  if (!(std::isfinite(options.softcap) && options.softcap >= 0.0))
    fail("options.softcap", "expected a finite cap > 0, or 0 for none, got " + std::to_string(options.softcap));
  if (options.alignment && options.causal != Causal::none) {
    const bool causal_bottom_right = options.causal == Causal::bottom_right;
    if ((*options.alignment == Alignment::bottom_right) != causal_bottom_right)
      fail("options.alignment", std::string("expected the causal alignment (") +
                                    (causal_bottom_right ? "bottom_right" : "top_left") + "), got " +
                                    (causal_bottom_right ? "top_left" : "bottom_right"));
  }
}

void check_per_head_options(const Options& options, const Shape& batch_shape, std::int64_t heads_q, DType query_dtype) {
  if (options.alibi_slopes) check_per_head(*options.alibi_slopes, "alibi_slopes", batch_shape, heads_q);
  if (options.sinks) {
    // Any logit (−inf: no sink; NaN and +inf make the row NaN, as in a softmax), as long
    // as the compute dtype holds it.
    check_per_head(*options.sinks, "sinks", batch_shape, heads_q);
    std::int64_t batch = 1;
    for (std::int64_t size : batch_shape) batch *= size;
    for (double sink : per_query_matrix(*options.sinks, options.sinks->rank() > 1 ? batch : 1, heads_q))
      if (std::isfinite(sink)) check_fits_float32("sinks", sink, query_dtype);
  }
}

std::vector<Span> per_head_spans(const Options& options) {
  std::vector<Span> spans;
  if (options.alibi_slopes) spans.push_back(check_view(*options.alibi_slopes, "alibi_slopes"));
  if (options.sinks) spans.push_back(check_view(*options.sinks, "sinks"));
  if (options.key_scale) spans.push_back(check_view(*options.key_scale, "options.key_scale"));
  if (options.value_scale) spans.push_back(check_view(*options.value_scale, "options.value_scale"));
  return spans;
}

void resolve_options(const Options& options, DType dtype, Problem& p) {
  // Causal is the window's right edge at the diagonal, with the causal alignment.
  const bool bottom_right = options.causal != Causal::none
                                ? options.causal == Causal::bottom_right
                                : options.alignment.value_or(Alignment::bottom_right) == Alignment::bottom_right;
  p.diagonal_shift = bottom_right ? p.S - p.L : 0;
  // A side wider than L + S reaches every key: clamped so that i + shift ± side cannot overflow.
  p.window_left = std::min(options.window_left, p.L + p.S);
  p.window_right = std::min(options.window_right, p.L + p.S);
  if (options.causal != Causal::none)
    p.window_right = p.window_right < 0 ? 0 : std::min<std::int64_t>(p.window_right, 0);
  p.softcap = options.softcap;
  if (options.alibi_slopes) p.alibi_slopes = per_query_matrix(*options.alibi_slopes, p.batch, p.heads_q);
  if (options.sinks) p.sinks = per_query_matrix(*options.sinks, p.batch, p.heads_q);
  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p.E));
  p.dropout_p = options.dropout_p;
  p.seed = options.seed;
  p.offset = options.offset;
  p.num_threads = options.num_threads;
  p.float64 = dtype == DType::float64;
}

}  // namespace sdpa::detail
