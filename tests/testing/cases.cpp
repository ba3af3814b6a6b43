#include "testing/cases.h"

#include <limits>
#include <random>
#include <sstream>

namespace sdpa::testing {

std::string Case::name() const {
  std::ostringstream out;
  out << dtype_name(dtype) << " Hq=" << heads_q << " Hkv=" << heads_kv << " L=" << L << " S=" << S << " E=" << E
      << " Ev=" << Ev << " mask=" << static_cast<int>(mask) << " mask_rank=" << mask_shape.size()
      << " causal=" << static_cast<int>(causal) << " dropout=" << dropout_p << " interleaved=" << interleaved;
  return out.str();
}

Shape shape_of(const Shape& batch, std::int64_t heads, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.insert(s.end(), {heads, rows, cols});
  return s;
}

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.q = random_tensor(c.dtype, shape_of(c.batch, c.heads_q, c.L, c.E), rng);
  in.k = random_tensor(c.dtype, shape_of(c.batch, c.heads_kv, c.S, c.E), rng);
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
  in.options.causal = c.causal;
  in.options.scale = c.scale;
  in.options.dropout_p = c.dropout_p;
  in.options.seed = seed;
  return in;
}

}  // namespace sdpa::testing
