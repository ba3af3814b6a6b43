#include "testing/gradients.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/philox.h"

namespace sdpa::testing {

namespace {

std::int64_t dim(const Shape& s, int from_end) { return s[s.size() - static_cast<std::size_t>(from_end)]; }
std::int64_t heads_of(const Shape& s) { return s.size() >= 3 ? dim(s, 3) : 1; }

}  // namespace

BackwardResult forward_backward(const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& grad_output, const Options& options, bool mask_gradient) {
  const ForwardResult fwd = forward(query, key, value, options, Returns{false, true});
  return backward(BackwardInputs{query, key, value, fwd.output.view(), fwd.lse.view(), grad_output}, options,
                  mask_gradient);
}

Tensor random_grad_output(const TensorView& query, const TensorView& value, std::uint64_t seed) {
  Shape shape(query.shape.begin(), query.shape.end() - 1);
  shape.push_back(value.shape.back());
  std::mt19937_64 rng(seed);
  return random_tensor(query.dtype, shape, rng);
}

bool GradientAgreement::ok() const {
  return std::all_of(entries.begin(), entries.end(), [](const Entry& e) { return e.error <= e.tolerance; });
}

double GradientAgreement::worst_ratio() const {
  double worst = 0;
  for (const Entry& e : entries) {
    const double ratio = e.error / e.tolerance;
    if (!(ratio <= worst)) worst = ratio;  // keeps a NaN
  }
  return worst;
}

std::string GradientAgreement::describe() const {
  std::ostringstream out;
  for (const Entry& e : entries)
    out << e.name << " error " << e.error << " (tolerance " << e.tolerance << ")"
        << (e.error <= e.tolerance ? "" : " FAILS") << "; ";
  return out.str();
}

Tensor sum_to_shape(const Tensor& full, const Shape& shape) {
  const Shape& fs = full.shape();
  Tensor out(DType::float64, shape);
  const std::size_t missing = fs.size() - shape.size();
  Shape index(fs.size(), 0);
  for (std::int64_t flat = 0; flat < full.numel(); ++flat) {
    std::int64_t target = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      target = target * shape[d] + (shape[d] == 1 ? 0 : index[missing + d]);
    out.set(target, out.get(target) + full.get(flat));
    for (std::size_t d = fs.size(); d-- > 0;) {
      if (++index[d] < fs[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

BackwardResult naive_gradients(const Tensor& q64, const Tensor& k64, const Tensor& v64, const Tensor& dout64,
                               const Tensor& probs64, const Options& options, DType dtype) {
  const Shape &qs = q64.shape(), &ks = k64.shape(), &vs = v64.shape();
  const std::int64_t L = dim(qs, 2), E = dim(qs, 1), S = dim(ks, 2), Ev = dim(vs, 1);
  const std::int64_t Hq = heads_of(qs), Hkv = heads_of(ks), group = Hq / Hkv;
  const std::int64_t matrices = L == 0 ? 0 : q64.numel() / (L * E);  // batch · Hq
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(E));
  const detail::DropoutMask dropout(options.dropout_p, options.seed, options.offset);
  const double keep_scale = 1.0 / (1.0 - options.dropout_p);
  auto r = [dtype](double x) { return round_to(dtype, x); };

  BackwardResult g;
  g.grad_query = Tensor(DType::float64, qs);
  g.grad_key = Tensor(DType::float64, ks);
  g.grad_value = Tensor(DType::float64, vs);
  g.grad_mask = Tensor(DType::float64, probs64.shape());
  std::vector<float> dk(static_cast<std::size_t>(k64.numel()), 0.0f), dv(static_cast<std::size_t>(v64.numel()), 0.0f);
  std::vector<double> w(static_cast<std::size_t>(S)), ds(static_cast<std::size_t>(S));
  for (std::int64_t m = 0; m < matrices; ++m) {
    const std::int64_t b = m / Hq, h = m % Hq, kv = b * Hkv + h / group;
    for (std::int64_t i = 0; i < L; ++i) {
      float D = 0;
      std::vector<double> dp(static_cast<std::size_t>(S));
      for (std::int64_t j = 0; j < S; ++j) {
        const double z = options.dropout_p > 0 ? (dropout.keep(b, h, i, j) ? keep_scale : 0.0) : 1.0;
        const double p = r(probs64.get((m * L + i) * S + j));
        float dw = 0;
        for (std::int64_t c = 0; c < Ev; ++c)
          dw +=
              static_cast<float>(dout64.get((m * L + i) * Ev + c)) * static_cast<float>(v64.get((kv * S + j) * Ev + c));
        dp[static_cast<std::size_t>(j)] = r(r(dw) * z);
        w[static_cast<std::size_t>(j)] = r(p * z);
        D += static_cast<float>(p * dp[static_cast<std::size_t>(j)]);
        ds[static_cast<std::size_t>(j)] = p;  // P for now
      }
      const double Dr = r(D);
      for (std::int64_t j = 0; j < S; ++j) {
        const std::size_t js = static_cast<std::size_t>(j);
        ds[js] = r(ds[js] * (dp[js] - Dr));
        g.grad_mask.set((m * L + i) * S + j, ds[js]);
      }
      for (std::int64_t e = 0; e < E; ++e) {
        float sum = 0;
        for (std::int64_t j = 0; j < S; ++j)
          sum +=
              static_cast<float>(ds[static_cast<std::size_t>(j)]) * static_cast<float>(k64.get((kv * S + j) * E + e));
        g.grad_query.set((m * L + i) * E + e, r(scale * sum));
      }
      for (std::int64_t j = 0; j < S; ++j) {
        const std::size_t js = static_cast<std::size_t>(j);
        for (std::int64_t e = 0; e < E; ++e)
          dk[static_cast<std::size_t>((kv * S + j) * E + e)] +=
              static_cast<float>(ds[js]) * static_cast<float>(q64.get((m * L + i) * E + e));
        for (std::int64_t c = 0; c < Ev; ++c)
          dv[static_cast<std::size_t>((kv * S + j) * Ev + c)] +=
              static_cast<float>(w[js]) * static_cast<float>(dout64.get((m * L + i) * Ev + c));
      }
    }
  }
  for (std::int64_t n = 0; n < k64.numel(); ++n) g.grad_key.set(n, r(scale * dk[static_cast<std::size_t>(n)]));
  for (std::int64_t n = 0; n < v64.numel(); ++n) g.grad_value.set(n, r(dv[static_cast<std::size_t>(n)]));
  return g;
}

GradientAgreement agree_gradients_with_oracle(const BackwardResult& got, const TensorView& query, const TensorView& key,
                                              const TensorView& value, const TensorView& grad_output,
                                              const Options& options, bool mask_gradient) {
  const DType dtype = query.dtype;
  // The oracle on float64 copies; a float mask too, so that its gradient is float64.
  const Tensor q64 = to_float64(query), k64 = to_float64(key), v64 = to_float64(value);
  const Tensor dout64 = to_float64(grad_output);
  Tensor mask64;
  Options reference = options;
  reference.backend = Backend::reference;
  if (options.mask && options.mask->dtype != DType::boolean) {
    mask64 = to_float64(*options.mask);
    reference.mask = mask64.view();
  }
  const BackwardResult want =
      forward_backward(q64.view(), k64.view(), v64.view(), dout64.view(), reference, mask_gradient);

  const Tensor* got_grads[] = {&got.grad_query, &got.grad_key, &got.grad_value, &got.grad_mask};
  const Tensor* want_grads[] = {&want.grad_query, &want.grad_key, &want.grad_value, &want.grad_mask};
  const char* names[] = {"grad_query", "grad_key", "grad_value", "grad_mask"};
  BackwardResult naive;
  Tensor naive_mask;
  if (dtype == DType::float16 || dtype == DType::bfloat16) {
    Options no_dropout = reference;
    no_dropout.dropout_p = 0;
    const ForwardResult probs = forward(q64.view(), k64.view(), v64.view(), no_dropout, Returns{true, false});
    naive = naive_gradients(q64, k64, v64, dout64, probs.weights, options, dtype);
    if (mask_gradient) naive_mask = sum_to_shape(naive.grad_mask, options.mask->shape);
  }
  const Tensor* naive_grads[] = {&naive.grad_query, &naive.grad_key, &naive.grad_value, &naive_mask};

  GradientAgreement a;
  for (int n = 0; n < (mask_gradient ? 4 : 3); ++n) {
    GradientAgreement::Entry e;
    e.name = names[n];
    e.error = max_abs_diff(to_float64(got_grads[n]->view()), *want_grads[n]);
    e.tolerance = gradient_tolerance(dtype, *want_grads[n], naive_grads[n]);
    const DType stored = got_grads[n]->dtype();
    if (n == 3 && (stored == DType::float32 || stored == DType::float64))
      e.tolerance = std::max(e.tolerance, gradient_tolerance(stored, *want_grads[n]));
    a.entries.push_back(e);
  }
  // The sinks' gradient is a sum over rows of one dot product dO·O each (src/api/backward.cpp),
  // from O as computed in the dtype: under float32's and float64's rule. For float16 and
  // bfloat16 the rule's naive backward has no sink term, so it is not compared here.
  if (options.sinks && (dtype == DType::float32 || dtype == DType::float64))
    a.entries.push_back({"grad_sinks", max_abs_diff(to_float64(got.grad_sinks.view()), want.grad_sinks),
                         gradient_tolerance(dtype, want.grad_sinks)});
  return a;
}

GradientAgreement compare_gradients_with_oracle(const TensorView& query, const TensorView& key, const TensorView& value,
                                                const Options& options, bool mask_gradient,
                                                std::optional<TensorView> grad_output) {
  Tensor random_dout;
  if (!grad_output) {
    random_dout = random_grad_output(query, value, 1);
    grad_output = random_dout.view();
  }
  Options fast = options;
  if (fast.backend == Backend::automatic) fast.backend = Backend::cpu;
  const BackwardResult got = forward_backward(query, key, value, *grad_output, fast, mask_gradient);
  return agree_gradients_with_oracle(got, query, key, value, *grad_output, options, mask_gradient);
}

Tensor numerical_gradient(Tensor& x, const std::function<double()>& loss, double step) {
  Tensor gradient(DType::float64, x.shape());
  for (std::int64_t n = 0; n < x.numel(); ++n) {
    const double original = x.get(n);
    x.set(n, original + step);
    const double up = loss();
    x.set(n, original - step);
    const double down = loss();
    x.set(n, original);
    gradient.set(n, (up - down) / (2 * step));
  }
  return gradient;
}

double dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (std::int64_t n = 0; n < a.numel(); ++n) sum += a.get(n) * b.get(n);
  return sum;
}

}  // namespace sdpa::testing
