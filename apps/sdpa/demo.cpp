// `sdpa demo`: seed 004's verification worked through on its own shapes (batch 2,
// n = 4 queries, m = 6 keys, d_k = 8, d_v = 16): the output and the attention weights
// without a mask and with a causal mask, and how far the CPU path is from the float64
// oracle.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

namespace {

Tensor standard_normal(const std::vector<std::int64_t>& shape, std::mt19937_64& rng) {
  Tensor t(DType::float32, shape);
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

Tensor as_float64(const Tensor& t) {
  Tensor out(DType::float64, t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

// Prints matrix `index` of a rank-3 tensor, at most `max_cols` columns.
void print_matrix(const char* title, const Tensor& t, std::int64_t index, std::int64_t max_cols) {
  const std::int64_t rows = t.shape()[1], cols = t.shape()[2];
  std::printf("%s  [batch %lld, %lld x %lld%s]\n", title, static_cast<long long>(index),
              static_cast<long long>(rows), static_cast<long long>(cols), cols > max_cols ? ", first columns" : "");
  for (std::int64_t i = 0; i < rows; ++i) {
    std::printf("    ");
    for (std::int64_t j = 0; j < std::min(cols, max_cols); ++j) std::printf("%8.4f", t.at({index, i, j}));
    std::printf("\n");
  }
}

double max_error(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a.get(i) - b.get(i)));
  return worst;
}

}  // namespace

int demo_command() {
  const std::int64_t batch = 2, n = 4, m = 6, d_k = 8, d_v = 16;
  std::mt19937_64 rng(42);
  const Tensor Q = standard_normal({batch, n, d_k}, rng);
  const Tensor K = standard_normal({batch, m, d_k}, rng);
  const Tensor V = standard_normal({batch, m, d_v}, rng);
  const Tensor Q64 = as_float64(Q), K64 = as_float64(K), V64 = as_float64(V);

  std::printf("sdpa %s — softmax(Q Kᵀ / sqrt(d_k) + mask) V on seed 004's shapes\n", version());
  std::printf("Q (%lld, %lld, %lld), K (%lld, %lld, %lld), V (%lld, %lld, %lld), float32; scale 1/sqrt(%lld) = %.4f\n\n",
              static_cast<long long>(batch), static_cast<long long>(n), static_cast<long long>(d_k),
              static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(d_k),
              static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(d_v),
              static_cast<long long>(d_k), 1.0 / std::sqrt(static_cast<double>(d_k)));

  bool all_close = true;
  for (Causal causal : {Causal::none, Causal::top_left}) {
    Options options;
    options.causal = causal;
    const ForwardResult fast = forward(Q.view(), K.view(), V.view(), options, Returns{true, false});
    Options reference = options;
    reference.backend = Backend::reference;
    const ForwardResult oracle = forward(Q64.view(), K64.view(), V64.view(), reference, Returns{true, false});

    std::printf("== %s ==\n", causal == Causal::none ? "No mask (encoder)"
                                                     : "Causal mask, top-left: query i sees keys j <= i (decoder)");
    print_matrix("attention weights", fast.weights, 0, m);
    print_matrix("output", fast.output, 0, 8);
    double worst_row_error = 0;
    for (std::int64_t row = 0; row < batch * n; ++row) {
      double sum = 0;
      for (std::int64_t j = 0; j < m; ++j) sum += fast.weights.get(row * m + j);
      worst_row_error = std::max(worst_row_error, std::abs(sum - 1.0));
    }
    const double out_error = max_error(fast.output, oracle.output);
    const double weights_error = max_error(fast.weights, oracle.weights);
    const bool close = out_error <= 1e-5 && weights_error <= 1e-5;
    all_close = all_close && close;
    std::printf("rows of the weights sum to 1 within %.1e\n", worst_row_error);
    std::printf("CPU vs float64 oracle: output max |error| %.2e, weights max |error| %.2e  (%s, tolerance 1e-5)\n\n",
                out_error, weights_error, close ? "agree" : "DISAGREE");
  }
  return all_close ? 0 : 1;
}

}  // namespace sdpa::cli
