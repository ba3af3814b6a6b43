// A consumer of sdpa::nn: a causal self-attention layer, whose output at a position must
// not depend on any later token (and must on its own). Exits 0 and prints "causal: ok".
#include <sdpa/nn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  sdpa::nn::MultiHeadAttentionConfig config;
  config.embed_dim = 8;
  config.num_heads = 2;
  config.seed = 3;
  const sdpa::nn::MultiHeadAttention layer(config);
  const std::int64_t L = 4, D = 8;
  std::vector<float> x(L * D);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  sdpa::nn::AttentionCall call;
  call.causal = sdpa::Causal::top_left;
  auto run = [&] {
    const sdpa::TensorView view{x.data(), sdpa::DType::float32, {1, L, D}};
    return layer.forward(view, call).output;
  };
  const sdpa::Tensor before = run();
  x[(L - 1) * D] += 1.0f;  // change the last token only
  const sdpa::Tensor after = run();
  for (std::int64_t i = 0; i < L; ++i) {
    bool same = true;
    for (std::int64_t d = 0; d < D; ++d) same = same && before.at({0, i, d}) == after.at({0, i, d});
    if (same != (i < L - 1)) {
      std::printf("causal: position %lld %s\n", static_cast<long long>(i), same ? "did not change" : "changed");
      return 1;
    }
  }
  std::printf("causal: ok\n");
  return 0;
}
