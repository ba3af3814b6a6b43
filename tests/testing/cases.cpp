#include "testing/cases.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

namespace sdpa::testing {

std::string Case::name() const {
  std::ostringstream out;
  out << dtype_name(dtype) << " batch=(";
  for (std::int64_t size : batch) out << size << ",";
  out << ") Hq=" << heads_q << " Hkv=" << heads_kv << " L=" << L << " S=" << S << " E=" << E << " Ev=" << Ev
      << " mask=" << static_cast<int>(mask) << " mask_rank=" << mask_shape.size()
      << " causal=" << static_cast<int>(causal) << " dropout=" << dropout_p << " interleaved=" << interleaved;
  if (scale) out << " scale=" << *scale;
  if (stddev != 1) out << " stddev=" << stddev;
  if (window_left >= 0 || window_right >= 0) out << " window=(" << window_left << ", " << window_right << ")";
  if (alignment) out << " alignment=" << static_cast<int>(*alignment);
  if (slopes != PerHead::none) out << " slopes=" << static_cast<int>(slopes) << "/" << dtype_name(slopes_dtype);
  if (softcap > 0) out << " softcap=" << softcap;
  if (sinks != PerHead::none) out << " sinks=" << static_cast<int>(sinks);
  if (num_threads) out << " threads=" << num_threads;
  return out.str();
}

Case small_gqa_case() {
  Case c;
  c.dtype = DType::float64;
  c.batch = {2};
  c.heads_q = 4, c.heads_kv = 2, c.L = 7, c.S = 11, c.E = 5, c.Ev = 6;
  return c;
}

Shape shape_of(const Shape& batch, std::int64_t heads, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.insert(s.end(), {heads, rows, cols});
  return s;
}

Tensor alibi_slopes(DType dtype, const Shape& batch, std::int64_t heads, bool per_batch) {
  Shape shape = per_batch ? batch : Shape{};
  shape.push_back(heads);
  Tensor t(dtype, shape);
  for (std::int64_t b = 0; b < t.numel() / heads; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      t.set(b * heads + h, std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads)) * (1 + 0.75 * b));
  return t;
}

Tensor sink_logits(DType dtype, const Shape& batch, std::int64_t heads, bool per_batch) {
  Shape shape = per_batch ? batch : Shape{};
  shape.push_back(heads);
  Tensor t(dtype, shape);
  for (std::int64_t b = 0; b < t.numel() / heads; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      t.set(b * heads + h, b == 1 && h == heads - 1 ? -std::numeric_limits<double>::infinity()
                                                    : -1.0 + 3.0 * static_cast<double>((h + 2 * b) % 5) / 4.0);
  return t;
}

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.q = random_tensor(c.dtype, shape_of(c.batch, c.heads_q, c.L, c.E), rng, c.stddev);
  in.k = random_tensor(c.dtype, shape_of(c.batch, c.heads_kv, c.S, c.E), rng, c.stddev);
  in.v = random_tensor(c.dtype, shape_of(c.batch, c.heads_kv, c.S, c.Ev), rng);
  if (c.interleaved) {
    in.qs = heads_interleaved(in.q);
    in.ks = heads_interleaved(in.k);
    in.vs = heads_interleaved(in.v);
  }
  const Shape mask_shape = c.mask_shape.empty() ? shape_of(c.batch, c.heads_q, c.L, c.S) : c.mask_shape;
  if (c.mask == Case::Mask::boolean) in.mask = random_bool(mask_shape, rng, 0.7);
  if (c.mask == Case::Mask::additive) {
    in.mask = random_tensor(c.dtype, mask_shape, rng, 2.0);
    std::bernoulli_distribution banned(0.2);  // −inf entries remove positions
    for (std::int64_t i = 0; i < in.mask.numel(); ++i)
      if (banned(rng)) in.mask.set(i, -std::numeric_limits<double>::infinity());
  }
  if (c.mask != Case::Mask::none) in.options.mask = in.mask.view();
  if (c.slopes != Case::PerHead::none) {
    in.slopes = alibi_slopes(c.slopes_dtype, c.batch, c.heads_q, c.slopes == Case::PerHead::per_batch_head);
    in.options.alibi_slopes = in.slopes.view();
  }
  if (c.sinks != Case::PerHead::none) {
    in.sinks = sink_logits(DType::float32, c.batch, c.heads_q, c.sinks == Case::PerHead::per_batch_head);
    in.options.sinks = in.sinks.view();
  }
  in.options.causal = c.causal;
  in.options.alignment = c.alignment;
  in.options.window_left = c.window_left;
  in.options.window_right = c.window_right;
  in.options.softcap = c.softcap;
  in.options.scale = c.scale;
  in.options.dropout_p = c.dropout_p;
  in.options.seed = seed;
  in.options.num_threads = c.num_threads;
  return in;
}

const Modifiers kModifierGrid[8] = {
    {50, 20, Causal::none, std::nullopt, Case::PerHead::none, DType::float32, 0, Case::Mask::none, Case::PerHead::none},
    {100, -1, Causal::top_left, std::nullopt, Case::PerHead::none, DType::float32, 0, Case::Mask::none,
     Case::PerHead::per_head},
    {3, 1, Causal::none, Alignment::top_left, Case::PerHead::per_head, DType::float32, 0, Case::Mask::boolean,
     Case::PerHead::per_batch_head},
    {-1, 40, Causal::none, Alignment::top_left, Case::PerHead::per_batch_head, DType::float32, 30, Case::Mask::none,
     Case::PerHead::none},
    {130, -1, Causal::bottom_right, std::nullopt, Case::PerHead::per_head, DType::float64, 5, Case::Mask::additive,
     Case::PerHead::per_head},
    {0, 0, Causal::none, Alignment::bottom_right, Case::PerHead::none, DType::float32, 0, Case::Mask::boolean,
     Case::PerHead::none},
    {-1, -1, Causal::none, std::nullopt, Case::PerHead::per_batch_head, DType::float64, 0, Case::Mask::none,
     Case::PerHead::per_batch_head},
    {-1, -1, Causal::none, std::nullopt, Case::PerHead::none, DType::float32, 2.0, Case::Mask::additive,
     Case::PerHead::none},
};

Case with(const Dims& dims, const Modifiers& m, DType dtype) {
  Case c;
  c.dtype = dtype;
  c.batch = {dims.B};
  c.heads_q = dims.Hq, c.heads_kv = dims.Hkv, c.L = dims.L, c.S = dims.S, c.E = dims.E, c.Ev = dims.Ev;
  c.window_left = m.window_left, c.window_right = m.window_right, c.causal = m.causal, c.alignment = m.alignment;
  c.slopes = m.slopes, c.slopes_dtype = m.slopes_dtype, c.softcap = m.softcap, c.mask = m.mask, c.sinks = m.sinks;
  return c;
}

}  // namespace sdpa::testing
