// The README's C++ example, compiled with the project so that it stays true:
// GQA attention on a (B, S, Hkv, E) key buffer viewed through strides, with a causal
// mask, the weights and the log-sum-exp.
#include <sdpa/sdpa.h>

#include <cstdio>
#include <vector>

int main() {
  const std::int64_t B = 2, Hq = 8, Hkv = 2, L = 5, S = 7, E = 16, Ev = 16;
  std::vector<float> q_data(B * Hq * L * E), k_data(B * S * Hkv * E), v_data(B * Hkv * S * Ev);
  for (std::size_t i = 0; i < q_data.size(); ++i) q_data[i] = 0.01f * static_cast<float>(i % 97);
  for (std::size_t i = 0; i < k_data.size(); ++i) k_data[i] = 0.02f * static_cast<float>(i % 89);
  for (std::size_t i = 0; i < v_data.size(); ++i) v_data[i] = 0.03f * static_cast<float>(i % 83);

  sdpa::TensorView q{q_data.data(), sdpa::DType::float32, {B, Hq, L, E}};  // packed
  sdpa::TensorView k{k_data.data(), sdpa::DType::float32, {B, Hkv, S, E}, {S * Hkv * E, E, Hkv * E, 1}};
  sdpa::TensorView v{v_data.data(), sdpa::DType::float32, {B, Hkv, S, Ev}};
  sdpa::Options options;
  options.causal = sdpa::Causal::bottom_right;  // query i sees keys j <= i + S - L
  const sdpa::ForwardResult r = sdpa::forward(q, k, v, options, {.weights = true, .lse = true});

  std::printf("output (%lld, %lld, %lld, %lld), out[0,0,0,0] = %.6f, lse[0,0,0] = %.6f\n",
              static_cast<long long>(r.output.shape()[0]), static_cast<long long>(r.output.shape()[1]),
              static_cast<long long>(r.output.shape()[2]), static_cast<long long>(r.output.shape()[3]),
              r.output.at({0, 0, 0, 0}), r.lse.at({0, 0, 0}));
  try {
    options.dropout_p = 1.5;  // not a probability
    sdpa::forward(q, k, v, options);
  } catch (const sdpa::Error& e) {
    std::printf("bad input: %s\n", e.what());
  }
  return 0;
}
