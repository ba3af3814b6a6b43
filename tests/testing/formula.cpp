#include "testing/formula.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/philox.h"

namespace sdpa::testing {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Unset: the causal alignment when causal is set, else bottom_right.
Alignment alignment_of(const Options& o) {
  if (o.alignment) return *o.alignment;
  return o.causal == Causal::top_left ? Alignment::top_left : Alignment::bottom_right;
}

// d(i): query i's diagonal key.
std::int64_t diagonal(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i) {
  return alignment_of(o) == Alignment::top_left ? i : i + S - L;
}

// Element `index` of the full (B, Hq, L, S) tensor that `t` broadcasts to (NumPy rules).
double broadcast_get(const Tensor& t, const Shape& full, const Shape& index) {
  const Shape& s = t.shape();
  const std::size_t missing = full.size() - s.size();
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : index[missing + d]);
  return t.get(flat);
}

}  // namespace

bool in_window(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i, std::int64_t j) {
  const std::int64_t d = diagonal(o, L, S, i);
  std::int64_t right = o.window_right;
  if (o.causal != Causal::none) right = right < 0 ? 0 : std::min<std::int64_t>(right, 0);
  if (o.window_left >= 0 && j < d - o.window_left) return false;
  if (right >= 0 && j > d + right) return false;
  return true;
}

bool window_row_empty(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i) {
  for (std::int64_t j = 0; j < S; ++j)
    if (in_window(o, L, S, i, j)) return false;
  return true;
}

Expected expected_attention(const TensorView& query, const TensorView& key, const TensorView& value, const Options& o) {
  const Tensor q = to_float64(query), k = to_float64(key), v = to_float64(value);
  const std::int64_t B = q.shape()[0], Hq = q.shape()[1], L = q.shape()[2], E = q.shape()[3];
  const std::int64_t Hkv = k.shape()[1], S = k.shape()[2], Ev = v.shape()[3];
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(E));
  Tensor mask, slopes, sinks;
  if (o.mask) mask = to_float64(*o.mask);
  if (o.alibi_slopes) slopes = to_float64(*o.alibi_slopes);
  if (o.sinks) sinks = to_float64(*o.sinks);
  const bool bool_mask = o.mask && o.mask->dtype == DType::boolean;
  const detail::DropoutMask dropout(o.dropout_p, o.seed, o.offset);
  Expected r{Tensor(DType::float64, {B, Hq, L, Ev}), Tensor(DType::float64, {B, Hq, L}),
             Tensor(DType::float64, {B, Hq, L, S})};
  std::vector<double> s(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kvh = h / (Hq / Hkv);
      const double slope = !o.alibi_slopes ? 0.0 : slopes.numel() == Hq ? slopes.get(h) : slopes.get(b * Hq + h);
      // The sink: one more logit in the denominator, with no value.
      const double sink = !o.sinks ? -kInf : sinks.numel() == Hq ? sinks.get(h) : sinks.get(b * Hq + h);
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = (b * Hq + h) * L + i;
        const std::int64_t d = diagonal(o, L, S, i);
        bool any_nan = std::isnan(sink);
        double top = std::isnan(sink) ? -kInf : sink;
        for (std::int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < E; ++e) dot += q.get(row * E + e) * k.get(((b * Hkv + kvh) * S + j) * E + e);
          double x = scale * dot;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          if (o.alibi_slopes) x -= slope * std::abs(static_cast<double>(d - j));
          if (o.mask) {
            const double m = broadcast_get(mask, {B, Hq, L, S}, {b, h, i, j});
            if (bool_mask) {
              if (m == 0) x = -kInf;
            } else {
              x += m;
            }
          }
          if (!in_window(o, L, S, i, j)) x = -kInf;
          s[static_cast<std::size_t>(j)] = x;
          if (std::isnan(x))
            any_nan = true;
          else
            top = std::max(top, x);
        }
        if (any_nan) top = kNaN;
        if (top == -kInf) {  // nothing to see: output 0, lse −inf, weights 0
          r.lse.set(row, -kInf);
          continue;
        }
        double sum = sink == -kInf ? 0.0 : std::exp(sink - top);
        for (double x : s) sum += std::exp(x - top);
        r.lse.set(row, top + std::log(sum));
        for (std::int64_t j = 0; j < S; ++j) {
          double w = std::exp(s[static_cast<std::size_t>(j)] - top) / sum;
          if (o.dropout_p > 0) w = dropout.keep(b, h, i, j) ? w / (1 - o.dropout_p) : 0.0;
          r.weights.set(row * S + j, w);
        }
        for (std::int64_t c = 0; c < Ev; ++c) {
          double out = 0;
          for (std::int64_t j = 0; j < S; ++j)
            out += r.weights.get(row * S + j) * v.get(((b * Hkv + kvh) * S + j) * Ev + c);
          r.output.set(row * Ev + c, out);
        }
      }
    }
  return r;
}

}  // namespace sdpa::testing
