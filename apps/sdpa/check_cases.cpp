#include "check_cases.h"

#include <sstream>

namespace sdpa::cli {

namespace {

// The reference oracle is O(L·S·(E+Ev)) per head with a dtype switch per element: cases
// above this many multiply-adds lose heads or batch so that 200 cases stay well under
// 30 s on 2 cores.
constexpr double kWorkBudget = 6e6;

// A shape that broadcasts to `target`: a random suffix of its dims, each either kept
// or 1. Covers (L, S), (1, 1, L, S), (B, 1, 1, S), (Hq, 1, S), (S,), the full shape...
Shape random_broadcast_shape(Random& rng, const Shape& target) {
  const std::size_t rank = target.size();
  const std::size_t mask_rank = rng.chance(0.4) ? rank : 1 + rng.below(rank);
  Shape shape;
  for (std::size_t d = rank - mask_rank; d < rank; ++d) {
    const bool query_or_key_dim = d + 2 >= rank;
    shape.push_back(rng.chance(query_or_key_dim ? 0.8 : 0.5) ? target[d] : 1);
  }
  return shape;
}

// Drops batch and heads until the oracle's work fits the budget.
void fit_work_budget(CaseConfig& c) {
  const auto work = [&] {
    return static_cast<double>(c.B * c.Hq) * static_cast<double>(c.L * c.S) * static_cast<double>(c.E + c.Ev);
  };
  while (work() > kWorkBudget && c.B * c.Hq > 1) {
    if (c.B > 1) {
      c.B = 1;
    } else if (c.Hkv > 1) {
      c.Hq /= c.Hkv;
      c.Hkv = 1;
    } else {
      c.Hq = c.Hq == 5 ? 2 : 1;  // keeps Hq a multiple of Hkv (= 1)
    }
  }
}

}  // namespace

std::uint64_t case_seed(std::uint64_t seed, int index) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(index) + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

CaseConfig random_case(Random& rng) {
  CaseConfig c;
  c.dtype = rng.pick({DType::float32, DType::float64, DType::bfloat16, DType::float16});
  c.rank = rng.chance(0.3) ? 3 : 4;
  const auto length = [&] { return rng.pick<std::int64_t>({0, 1, 3, 17, 33, 64, 65, 129}); };
  const auto head_dim = [&] { return rng.pick<std::int64_t>({1, 8, 40, 64, 80, 111, 128}); };
  c.L = length();
  c.S = length();
  c.E = head_dim();
  c.Ev = rng.chance(0.6) ? c.E : head_dim();
  if (c.rank == 4) {
    c.B = 1 + static_cast<std::int64_t>(rng.below(2));
    c.Hkv = 1 + static_cast<std::int64_t>(rng.below(2));
    c.Hq = c.Hkv * rng.pick<std::int64_t>({1, 2, 5});
  } else {
    c.Hq = c.Hkv = 1 + static_cast<std::int64_t>(rng.below(2));
  }
  fit_work_budget(c);

  const double mask_roll = rng.uniform();
  c.mask_kind = mask_roll < 0.3 ? MaskKind::none : mask_roll < 0.65 ? MaskKind::boolean : MaskKind::additive;
  if (c.mask_kind != MaskKind::none) {
    c.mask_shape = random_broadcast_shape(rng, c.scores_shape());
    c.mask_dtype = c.mask_kind == MaskKind::boolean ? DType::boolean : rng.pick({c.dtype, DType::float32});
    c.mask_expanded = rng.chance(0.2);
    c.fully_masked_row = rng.chance(0.4);
  }
  c.causal = rng.pick({Causal::none, Causal::none, Causal::top_left, Causal::bottom_right});
  if (rng.chance(0.3)) {
    const double default_scale = 1.0 / std::sqrt(static_cast<double>(c.E));
    c.scale = rng.chance(0.5) ? -default_scale : 2.0 * rng.uniform() - 1.0;
  }
  if (rng.chance(0.2)) {
    c.dropout_p = rng.pick({0.1, 0.25, 0.5});
    c.dropout_seed = rng.below(1u << 30);
    c.dropout_offset = rng.below(1000);
  }
  c.strided = rng.chance(0.35);
  c.pad = static_cast<int>(rng.below(4));
  c.want_weights = rng.chance(0.4);
  c.want_lse = rng.chance(0.5);
  if (rng.chance(0.25)) {
    c.window_left = rng.pick<std::int64_t>({-1, 0, 3, 20});
    c.window_right = rng.pick<std::int64_t>({-1, 0, 5});
    if (c.causal == Causal::none && rng.chance(0.5))
      c.alignment = rng.chance(0.5) ? Alignment::top_left : Alignment::bottom_right;
  }
  c.alibi = c.rank == 4 && rng.chance(0.2);
  c.alibi_per_batch = c.alibi && rng.chance(0.5);
  if (rng.chance(0.2)) c.softcap = rng.pick({0.5, 5.0, 30.0});
  c.sinks = c.rank == 4 && rng.chance(0.2);
  c.sinks_per_batch = c.sinks && rng.chance(0.5);
  return c;
}

std::vector<std::string> features(const CaseConfig& c) {
  std::vector<std::string> tags;
  if (c.rank == 3) tags.push_back("rank3");
  if (c.Hq != c.Hkv) tags.push_back("gqa");
  if (c.Ev != c.E) tags.push_back("ev!=e");
  if (c.L == 0 || c.S == 0) tags.push_back("empty");
  if (c.mask_kind == MaskKind::boolean) tags.push_back("bool-mask");
  if (c.mask_kind == MaskKind::additive) tags.push_back("float-mask");
  if (c.mask_expanded) tags.push_back("stride0-mask");
  if (c.fully_masked_row) tags.push_back("masked-row");
  if (c.causal == Causal::top_left) tags.push_back("causal-tl");
  if (c.causal == Causal::bottom_right) tags.push_back("causal-br");
  if (c.scale) tags.push_back("scale");
  if (c.dropout_p > 0.0) tags.push_back("dropout");
  if (c.strided) tags.push_back("strided");
  if (c.window_left >= 0 || c.window_right >= 0) tags.push_back("window");
  if (c.alibi) tags.push_back("alibi");
  if (c.softcap > 0.0) tags.push_back("softcap");
  if (c.sinks) tags.push_back("sinks");
  if (tags.empty()) tags.push_back("plain");
  return tags;
}

std::string shape_string(const Shape& shape) {
  // Appends piecewise: `"," + std::to_string(...)` trips GCC 12's -Wrestrict false
  // positive (GCC PR105329).
  std::string s = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ',';
    s += std::to_string(shape[d]);
  }
  return s + ")";
}

std::string describe(const CaseConfig& c) {
  std::ostringstream out;
  out << dtype_name(c.dtype) << " q" << shape_string(c.qkv_shape(c.Hq, c.L, c.E)) << " k"
      << shape_string(c.qkv_shape(c.Hkv, c.S, c.E)) << " v" << shape_string(c.qkv_shape(c.Hkv, c.S, c.Ev));
  if (c.mask_kind != MaskKind::none)
    out << " mask=" << dtype_name(c.mask_dtype) << shape_string(c.mask_shape) << (c.mask_expanded ? "[stride0]" : "")
        << (c.fully_masked_row ? "[masked-row]" : "");
  if (c.causal != Causal::none) out << (c.causal == Causal::top_left ? " causal=top-left" : " causal=bottom-right");
  if (c.scale) out << " scale=" << *c.scale;
  if (c.dropout_p > 0.0)
    out << " dropout=" << c.dropout_p << " seed=" << c.dropout_seed << " offset=" << c.dropout_offset;
  if (c.strided) out << " strided(pad=" << c.pad << ")";
  if (c.window_left >= 0 || c.window_right >= 0) out << " window=(" << c.window_left << "," << c.window_right << ")";
  if (c.alignment) out << (*c.alignment == Alignment::top_left ? " align=top-left" : " align=bottom-right");
  if (c.alibi) out << (c.alibi_per_batch ? " alibi(B,Hq)" : " alibi(Hq)");
  if (c.softcap > 0.0) out << " softcap=" << c.softcap;
  if (c.sinks) out << (c.sinks_per_batch ? " sinks(B,Hq)" : " sinks(Hq)");
  if (c.want_weights) out << " +weights";
  if (c.want_lse) out << " +lse";
  return out.str();
}

}  // namespace sdpa::cli
