#include "testing/tolerance.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "testing/helpers.h"

namespace sdpa::testing {

namespace {

std::int64_t heads_of(const Shape& shape) { return shape.size() >= 3 ? shape[shape.size() - 3] : 1; }

// The output of a naive low-precision attention, given the exact weights: weights
// rounded to `dtype`, multiplied into V with float32 sums, the result rounded.
Tensor naive_output(const Tensor& weights64, const Tensor& value64, DType dtype) {
  const Shape& ws = weights64.shape();
  const Shape& vs = value64.shape();
  const std::int64_t L = ws[ws.size() - 2], S = ws.back(), Ev = vs.back();
  Shape out_shape(ws.begin(), ws.end() - 1);
  out_shape.push_back(Ev);
  Tensor out(DType::float64, out_shape);
  const std::int64_t matrices = L * S == 0 ? 0 : weights64.numel() / (L * S);
  const std::int64_t heads_q = heads_of(ws), heads_kv = heads_of(vs), group = heads_q / heads_kv;
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

bool is_low_precision(DType dtype) { return dtype == DType::float16 || dtype == DType::bfloat16; }

}  // namespace

double Agreement::worst_ratio() const {
  double worst = 0;
  for (const double ratio :
       {output_error / output_tolerance, lse_error / lse_tolerance, weights_error / weights_tolerance})
    if (!(ratio <= worst)) worst = ratio;  // keeps a NaN
  return worst;
}

std::string Agreement::describe() const {
  std::ostringstream out;
  out << "output error " << output_error << " (tolerance " << output_tolerance << "), lse error " << lse_error
      << " (tolerance " << lse_tolerance << "), weights error " << weights_error << " (tolerance " << weights_tolerance
      << ")";
  return out.str();
}

Agreement agree_with_oracle(const ForwardResult& got, const ForwardResult& oracle, const Tensor& value64, DType dtype,
                            Returns compared) {
  Agreement a;
  a.output_error = max_abs_diff(to_float64(got.output.view()), oracle.output);
  if (compared.lse) a.lse_error = max_abs_diff(to_float64(got.lse.view()), oracle.lse);
  if (compared.weights) a.weights_error = max_abs_diff(to_float64(got.weights.view()), oracle.weights);

  const double out_scale = std::max(1.0, max_abs(oracle.output));
  const double lse_scale = std::max(1.0, max_abs(oracle.lse));
  if (!is_low_precision(dtype)) {
    const double relative = dtype == DType::float64 ? 1e-10 : 1e-5;
    a.output_tolerance = relative * out_scale;
    a.lse_tolerance = relative * lse_scale;
    a.weights_tolerance = relative;
  } else {
    a.output_tolerance = std::max(2 * max_abs_diff(naive_output(oracle.weights, value64, dtype), oracle.output), 1e-5);
    a.weights_tolerance = std::max(2 * max_abs_diff(rounded(oracle.weights, dtype), oracle.weights), 1e-5);
    // lse is computed and stored in float32 from inputs that float32 holds exactly.
    a.lse_tolerance = 1e-5 * lse_scale;
  }
  return a;
}

double gradient_tolerance(DType dtype, const Tensor& oracle_gradient, const Tensor* naive) {
  const double scale = std::max(1.0, max_abs(oracle_gradient));
  if (dtype == DType::float64) return 1e-9 * scale;
  if (dtype == DType::float32) return 1e-4 * scale;
  if (!naive) throw std::invalid_argument("gradient_tolerance: a low-precision gradient needs the naive backward's");
  return std::max(3 * max_abs_diff(*naive, oracle_gradient), 1e-5);
}

}  // namespace sdpa::testing
