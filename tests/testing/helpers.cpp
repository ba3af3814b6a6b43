#include "testing/helpers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace sdpa::testing {

namespace {

// Round-trips a value through `dtype` (what storing it there keeps).
double round_to(DType dtype, double value) {
  Tensor scratch(dtype, {1});
  scratch.set(0, value);
  return scratch.get(0);
}

std::int64_t heads_of(const Shape& shape) { return shape.size() >= 3 ? shape[shape.size() - 3] : 1; }

// The output of a naive low-precision attention, given the exact weights: weights
// rounded to `dtype`, multiplied into V with float32 sums, the result rounded.
Tensor naive_output(const Tensor& weights64, const Tensor& value64, DType dtype, std::int64_t heads_q,
                    std::int64_t heads_kv) {
  const Shape& ws = weights64.shape();
  const Shape& vs = value64.shape();
  const std::int64_t L = ws[ws.size() - 2], S = ws.back(), Ev = vs.back();
  Shape out_shape(ws.begin(), ws.end() - 1);
  out_shape.push_back(Ev);
  Tensor out(DType::float64, out_shape);
  const std::int64_t matrices = L * S == 0 ? 0 : weights64.numel() / (L * S);
  const std::int64_t group = heads_q / heads_kv;
  for (std::int64_t m = 0; m < matrices; ++m) {
    const std::int64_t kv = (m / heads_q) * heads_kv + (m % heads_q) / group;
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t c = 0; c < Ev; ++c) {
        float sum = 0;
        for (std::int64_t j = 0; j < S; ++j)
          sum += static_cast<float>(round_to(dtype, weights64.get((m * L + i) * S + j))) *
                 static_cast<float>(value64.get((kv * S + j) * Ev + c));
        out.set((m * L + i) * Ev + c, round_to(dtype, sum));
      }
  }
  return out;
}

Tensor rounded(const Tensor& t, DType dtype) { return to_float64(convert(t, dtype).view()); }

}  // namespace

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

Tensor convert(const Tensor& tensor, DType dtype) {
  Tensor out(dtype, tensor.shape());
  for (std::int64_t i = 0; i < tensor.numel(); ++i) out.set(i, tensor.get(i));
  return out;
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

std::string Agreement::describe() const {
  std::ostringstream out;
  out << "output error " << output_error << " (tolerance " << output_tolerance << "), lse error " << lse_error
      << " (tolerance " << lse_tolerance << "), weights error " << weights_error << " (tolerance "
      << weights_tolerance << ")";
  return out.str();
}

Agreement compare_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                              const Options& options) {
  const DType dtype = query.dtype;
  Options fast = options;
  if (fast.backend == Backend::automatic) fast.backend = Backend::cpu;
  const ForwardResult plain = forward(query, key, value, fast);
  const ForwardResult full = forward(query, key, value, fast, Returns{true, true});

  const Tensor q64 = to_float64(query), k64 = to_float64(key), v64 = to_float64(value);
  Options oracle_options = options;
  oracle_options.backend = Backend::reference;
  const ForwardResult oracle = forward(q64.view(), k64.view(), v64.view(), oracle_options, Returns{true, true});

  Agreement a;
  // Asking for weights and lse must not change the output by a single bit.
  const Tensor out_plain = to_float64(plain.output.view()), out_full = to_float64(full.output.view());
  for (std::int64_t i = 0; i < out_plain.numel(); ++i) {
    const double x = out_plain.get(i), y = out_full.get(i);
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) a.output_error = std::numeric_limits<double>::infinity();
  }
  a.output_error = std::max(a.output_error, max_abs_diff(out_full, oracle.output));
  a.lse_error = max_abs_diff(to_float64(full.lse.view()), oracle.lse);
  a.weights_error = max_abs_diff(to_float64(full.weights.view()), oracle.weights);

  const double out_scale = std::max(1.0, max_abs(oracle.output));
  const double lse_scale = std::max(1.0, max_abs(oracle.lse));
  if (dtype == DType::float64 || dtype == DType::float32) {
    const double relative = dtype == DType::float64 ? 1e-10 : 1e-5;
    a.output_tolerance = relative * out_scale;
    a.lse_tolerance = relative * lse_scale;
    a.weights_tolerance = relative;
  } else {
    const Tensor naive = naive_output(oracle.weights, v64, dtype, heads_of(query.shape), heads_of(key.shape));
    a.output_tolerance = std::max(2 * max_abs_diff(naive, oracle.output), 1e-5);
    a.weights_tolerance = std::max(2 * max_abs_diff(rounded(oracle.weights, dtype), oracle.weights), 1e-5);
    // lse is computed and stored in float32 from inputs that float32 holds exactly.
    a.lse_tolerance = 1e-5 * lse_scale;
  }
  return a;
}

}  // namespace sdpa::testing
