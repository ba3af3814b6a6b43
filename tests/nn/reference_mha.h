// A float64 multi-head attention written out loop by loop from the formulas, sharing no
// code with src/nn/ (projections, RoPE, softmax and heads are all re-derived here): the
// oracle the layer tests compare against.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "sdpa/nn.h"

namespace sdpa::testing {

// What a query (b, h, l) adds to key s: 0, −inf, or any float (a float mask).
using AdditiveMask = std::function<double(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s)>;

// q_in (B, L, E), k_in (B, S, kdim), v_in (B, S, vdim), packed; returns (B, L, E) float64,
// and the weights (B, Hq, L, S) into *weights when given. `causal`: query l sees keys
// s <= l + (S − L) (bottom-right; equal to top-left when L == S). RoPE positions start at
// `position_offset` for both queries and keys.
inline Tensor reference_mha(const nn::MultiHeadAttention& layer, const Tensor& q_in, const Tensor& k_in,
                            const Tensor& v_in, const AdditiveMask& mask, bool causal, std::int64_t position_offset = 0,
                            Tensor* weights = nullptr, std::int64_t key_position_offset = -1) {
  const nn::MultiHeadAttentionConfig& c = layer.config();
  const std::int64_t B = q_in.shape()[0], L = q_in.shape()[1], S = k_in.shape()[1];
  const std::int64_t E = c.embed_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  if (key_position_offset < 0) key_position_offset = position_offset;
  const Tensor none;  // a missing bias reads as 0
  auto param = [&](const Tensor& t, std::int64_t i) { return t.nbytes() == 0 ? 0.0 : t.get(i); };

  // y[b, t, o] = Σ_i x[b, t, i] W[o, i] + bias[o]
  auto project = [&](const Tensor& x, const char* w_name, const char* bias_name, std::int64_t out) {
    const Tensor& w = layer.parameter(w_name);
    const Tensor& bias = c.bias ? layer.parameter(bias_name) : none;
    const std::int64_t T = x.shape()[1], in = x.shape()[2];
    std::vector<double> y(B * T * out);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t o = 0; o < out; ++o) {
          double s = param(bias, o);
          for (std::int64_t i = 0; i < in; ++i) s += x.get((b * T + t) * in + i) * param(w, o * in + i);
          y[(b * T + t) * out + o] = s;
        }
    return y;
  };
  std::vector<double> q = project(q_in, "q_proj.weight", "q_proj.bias", Hq * D);
  std::vector<double> k = project(k_in, "k_proj.weight", "k_proj.bias", Hkv * D);
  const std::vector<double> v = project(v_in, "v_proj.weight", "v_proj.bias", Hkv * D);

  // RoPE: pair i of a head is rotated by p · base^(−2i/d).
  auto rope = [&](std::vector<double>& x, std::int64_t T, std::int64_t H, std::int64_t offset) {
    if (!c.rope) return;
    const std::int64_t d = c.rope->rotary_dim == 0 ? D : c.rope->rotary_dim;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < d / 2; ++i) {
            const bool inter = c.rope->layout == nn::RopeLayout::interleaved;
            double& x1 = x[((b * T + t) * H + h) * D + (inter ? 2 * i : i)];
            double& x2 = x[((b * T + t) * H + h) * D + (inter ? 2 * i + 1 : i + d / 2)];
            const double angle = static_cast<double>(offset + t) * std::pow(c.rope->base, -2.0 * i / d);
            const double r1 = x1 * std::cos(angle) - x2 * std::sin(angle);
            const double r2 = x1 * std::sin(angle) + x2 * std::cos(angle);
            x1 = r1, x2 = r2;
          }
  };
  rope(q, L, Hq, position_offset);
  rope(k, S, Hkv, key_position_offset);

  std::vector<double> attended(B * L * Hq * D, 0.0);
  if (weights != nullptr) *weights = Tensor(DType::float64, {B, Hq, L, S});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t g = h / (Hq / Hkv);
      for (std::int64_t l = 0; l < L; ++l) {
        std::vector<double> s(S);
        double m = -INFINITY;
        for (std::int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < D; ++e)
            dot += q[((b * L + l) * Hq + h) * D + e] * k[((b * S + j) * Hkv + g) * D + e];
          // The config's softcap, ALiBi and window count from the query's diagonal key
          // l + S − L (bottom-right: the layer's alignment with a cache or without causal,
          // and any alignment when L == S).
          const std::int64_t diagonal = l + (S - L);
          double score = dot / std::sqrt(static_cast<double>(D));
          if (c.softcap > 0) score = c.softcap * std::tanh(score / c.softcap);
          if (!c.alibi_slopes.empty())
            score -= c.alibi_slopes[static_cast<std::size_t>(h)] * std::abs(static_cast<double>(diagonal - j));
          s[j] = score + (mask ? mask(b, h, l, j) : 0.0);
          if (causal && j > diagonal) s[j] = -INFINITY;
          if ((c.window_left >= 0 && j < diagonal - c.window_left) || (c.window_right >= 0 && j > diagonal + c.window_right))
            s[j] = -INFINITY;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < S; ++j) sum += (s[j] = m == -INFINITY ? 0.0 : std::exp(s[j] - m));
        for (std::int64_t j = 0; j < S; ++j) {
          const double p = sum == 0 ? 0.0 : s[j] / sum;
          if (weights != nullptr) weights->set(((b * Hq + h) * L + l) * S + j, p);
          for (std::int64_t e = 0; e < D; ++e)
            attended[((b * L + l) * Hq + h) * D + e] += p * v[((b * S + j) * Hkv + g) * D + e];
        }
      }
    }

  const Tensor& wo = layer.parameter("out_proj.weight");
  const Tensor& bo = c.bias ? layer.parameter("out_proj.bias") : none;
  Tensor out(DType::float64, {B, L, E});
  for (std::int64_t r = 0; r < B * L; ++r)
    for (std::int64_t o = 0; o < E; ++o) {
      double s = param(bo, o);
      for (std::int64_t i = 0; i < Hq * D; ++i) s += attended[r * Hq * D + i] * wo.get(o * Hq * D + i);
      out.set(r * E + o, s);
    }
  return out;
}

}  // namespace sdpa::testing
