// Issue #7's extensions (include/sdpa/options.h, include/sdpa/sdpa.h): the sliding
// window and its alignment, ALiBi, logit softcapping, packed variable-length batches and
// the paged KV cache.
//
//   1. The oracle against a float64 re-implementation written here straight from the
//      formula of options.h (expected_attention below), never from the library's code.
//   2. The CPU forward against the oracle by the tolerance rule of DESIGN.md §4, on L, S
//      up to 300 (several 96-key tiles and 32-row query subtiles, windows that start in
//      the middle of a tile), E ∈ {1, 7, 64, 96}, every dtype, GQA, permuted strides,
//      NaN, and bitwise the same for 1, 2 and 3 threads.
//   3. The backward: CPU against the oracle, the oracle and the float64 CPU path against
//      central differences, and the float mask's gradient under softcapping (the mask is
//      added after the cap: its gradient is dS, not dS·(1 − tanh²)).
//   4. forward_varlen / backward_varlen against forward() / backward() on each sequence
//      alone, dropout against a padded call, and the rejection of bad cu_seqlens.
//   5. forward_paged against forward() on the same keys held contiguously, and the
//      rejection of bad block tables, seq_lens and pages.
//   6. The validation of the new options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "common/half.h"
#include "common/philox.h"
#include "testing/gradients.h"
#include "testing/helpers.h"
#include "testing/rejection.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- The formula of options.h, written out independently in float64 -----------------

// Unset: the causal alignment when causal is set, else bottom_right.
Alignment alignment_of(const Options& o) {
  if (o.alignment) return *o.alignment;
  return o.causal == Causal::top_left ? Alignment::top_left : Alignment::bottom_right;
}

// d(i): query i's diagonal key.
std::int64_t diagonal(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i) {
  return alignment_of(o) == Alignment::top_left ? i : i + S - L;
}

// Whether query i may see key j under causal and the window (the mask aside):
// d(i) − left <= j <= d(i) + right, −1 unbounded, causal caps right at 0.
bool in_window(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i, std::int64_t j) {
  const std::int64_t d = diagonal(o, L, S, i);
  std::int64_t right = o.window_right;
  if (o.causal != Causal::none) right = right < 0 ? 0 : std::min<std::int64_t>(right, 0);
  if (o.window_left >= 0 && j < d - o.window_left) return false;
  if (right >= 0 && j > d + right) return false;
  return true;
}

// Whether the window and causal leave query i no key at all.
bool window_row_empty(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i) {
  for (std::int64_t j = 0; j < S; ++j)
    if (in_window(o, L, S, i, j)) return false;
  return true;
}

// Element `index` of the full (B, Hq, L, S) tensor that `t` broadcasts to (NumPy rules).
double broadcast_get(const Tensor& t, const Shape& full, const Shape& index) {
  const Shape& s = t.shape();
  const std::size_t missing = full.size() - s.size();
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : index[missing + d]);
  return t.get(flat);
}

struct Expected {
  Tensor output, lse, weights;
};

// Rank-4 Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev), any dtype and strides:
//   s = softcap·tanh(scale·q·k / softcap)  (or scale·q·k)  − slope[h]·|d(i) − j|  + mask
//   −inf outside the window or where a bool mask is false; softmax; dropout; · V.
Expected expected_attention(const TensorView& query, const TensorView& key, const TensorView& value, const Options& o) {
  const Tensor q = to_float64(query), k = to_float64(key), v = to_float64(value);
  const std::int64_t B = q.shape()[0], Hq = q.shape()[1], L = q.shape()[2], E = q.shape()[3];
  const std::int64_t Hkv = k.shape()[1], S = k.shape()[2], Ev = v.shape()[3];
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(E));
  Tensor mask, slopes;
  if (o.mask) mask = to_float64(*o.mask);
  if (o.alibi_slopes) slopes = to_float64(*o.alibi_slopes);
  const bool bool_mask = o.mask && o.mask->dtype == DType::boolean;
  const detail::DropoutMask dropout(o.dropout_p, o.seed, o.offset);
  Expected r{Tensor(DType::float64, {B, Hq, L, Ev}), Tensor(DType::float64, {B, Hq, L}),
             Tensor(DType::float64, {B, Hq, L, S})};
  std::vector<double> s(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kvh = h / (Hq / Hkv);
      const double slope = !o.alibi_slopes ? 0.0 : slopes.numel() == Hq ? slopes.get(h) : slopes.get(b * Hq + h);
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = (b * Hq + h) * L + i;
        const std::int64_t d = diagonal(o, L, S, i);
        bool any_nan = false;
        double top = -kInf;
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
        double sum = 0;
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

// Rows whose expected lse is −inf must come out exactly as output 0, lse −inf, weights 0
// (never NaN, never a tiny number). Returns how many such rows there were.
int expect_empty_rows_exact(const Expected& want, const ForwardResult& got) {
  const std::int64_t rows = want.lse.numel();
  const std::int64_t Ev = rows ? want.output.numel() / rows : 0, S = rows ? want.weights.numel() / rows : 0;
  int empty = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (want.lse.get(r) != -kInf) continue;
    ++empty;
    EXPECT_EQ(got.lse.get(r), -kInf) << "row " << r;
    for (std::int64_t c = 0; c < Ev; ++c) EXPECT_EQ(got.output.get(r * Ev + c), 0.0) << "row " << r;
    if (got.weights.numel()) {
      for (std::int64_t j = 0; j < S; ++j) EXPECT_EQ(got.weights.get(r * S + j), 0.0) << "row " << r;
    }
  }
  return empty;
}

// The oracle (on these views) against expected_attention: 1e-12 relative, and empty rows
// exact. Returns the number of empty rows.
int expect_oracle_matches_formula(const TensorView& q, const TensorView& k, const TensorView& v, Options o) {
  o.backend = Backend::reference;
  const ForwardResult got = forward(q, k, v, o, Returns{true, true});
  const Expected want = expected_attention(q, k, v, o);
  EXPECT_LE(max_abs_diff(to_float64(got.output.view()), want.output), 1e-12 * std::max(1.0, max_abs(want.output)));
  EXPECT_LE(max_abs_diff(to_float64(got.lse.view()), want.lse), 1e-12 * std::max(1.0, max_abs(want.lse)));
  EXPECT_LE(max_abs_diff(to_float64(got.weights.view()), want.weights), 1e-12);
  return expect_empty_rows_exact(want, got);
}

// ---- One case of the extensions' grid and its inputs --------------------------------

struct Ext {
  DType dtype = DType::float64;
  std::int64_t B = 2, Hq = 4, Hkv = 2, L = 7, S = 11, E = 5, Ev = 6;
  std::int64_t left = -1, right = -1;
  Causal causal = Causal::none;
  std::optional<Alignment> alignment;
  enum class Slopes { none, per_head, per_batch_head } slopes = Slopes::none;
  DType slopes_dtype = DType::float32;
  double softcap = 0;
  enum class Mask { none, boolean, additive } mask = Mask::none;
  bool mask_broadcast = false;  // (L, S) rather than (B, Hq, L, S)
  bool interleaved = false;     // (B, L, H, E) buffers viewed as (B, H, L, E)
  double stddev = 1;            // of Q and K: large for saturating the softcap
  double dropout_p = 0;
  int threads = 0;  // options.num_threads

  std::string name() const {
    std::ostringstream out;
    out << dtype_name(dtype) << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " L=" << L << " S=" << S << " E=" << E
        << " Ev=" << Ev << " window=(" << left << ", " << right << ") causal=" << static_cast<int>(causal)
        << " alignment=" << (alignment ? static_cast<int>(*alignment) : -1) << " slopes=" << static_cast<int>(slopes)
        << "/" << dtype_name(slopes_dtype) << " softcap=" << softcap << " mask=" << static_cast<int>(mask)
        << (mask_broadcast ? " (L, S)" : "") << " interleaved=" << interleaved << " stddev=" << stddev
        << " dropout=" << dropout_p;
    return out.str();
  }
};

// ALiBi's geometric slopes 2^(−8(h+1)/Hq), different per batch element when asked.
Tensor alibi_slopes(DType dtype, std::int64_t batch, std::int64_t heads, bool per_batch) {
  Tensor t(dtype, per_batch ? Shape{batch, heads} : Shape{heads});
  for (std::int64_t b = 0; b < (per_batch ? batch : 1); ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      t.set(b * heads + h, std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads)) * (1 + 0.75 * b));
  return t;
}

struct ExtInputs {
  Tensor q, k, v, mask, slopes;
  StridedCopy qs, ks, vs;
  Options options;
  TensorView qv() const { return qs.storage.nbytes() ? qs.view : q.view(); }
  TensorView kv() const { return ks.storage.nbytes() ? ks.view : k.view(); }
  TensorView vv() const { return vs.storage.nbytes() ? vs.view : v.view(); }
};

ExtInputs make_ext(const Ext& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExtInputs in;
  in.q = random_tensor(c.dtype, {c.B, c.Hq, c.L, c.E}, rng, c.stddev);
  in.k = random_tensor(c.dtype, {c.B, c.Hkv, c.S, c.E}, rng, c.stddev);
  in.v = random_tensor(c.dtype, {c.B, c.Hkv, c.S, c.Ev}, rng);
  if (c.interleaved) {
    in.qs = heads_interleaved(in.q);
    in.ks = heads_interleaved(in.k);
    in.vs = heads_interleaved(in.v);
  }
  const Shape mask_shape = c.mask_broadcast ? Shape{c.L, c.S} : Shape{c.B, c.Hq, c.L, c.S};
  if (c.mask == Ext::Mask::boolean) in.mask = random_bool(mask_shape, rng, 0.8);
  if (c.mask == Ext::Mask::additive) {
    in.mask = random_tensor(c.dtype, mask_shape, rng, 1.0);
    std::bernoulli_distribution banned(0.1);
    for (std::int64_t i = 0; i < in.mask.numel(); ++i)
      if (banned(rng)) in.mask.set(i, -kInf);
  }
  if (c.mask != Ext::Mask::none) in.options.mask = in.mask.view();
  if (c.slopes != Ext::Slopes::none) {
    in.slopes = alibi_slopes(c.slopes_dtype, c.B, c.Hq, c.slopes == Ext::Slopes::per_batch_head);
    in.options.alibi_slopes = in.slopes.view();
  }
  in.options.window_left = c.left;
  in.options.window_right = c.right;
  in.options.causal = c.causal;
  in.options.alignment = c.alignment;
  in.options.softcap = c.softcap;
  in.options.dropout_p = c.dropout_p;
  in.options.seed = seed;
  in.options.num_threads = c.threads;
  return in;
}

// Causal and alignment together as the contract allows them: alignment unset or equal
// to causal's.
struct CausalAlignment {
  Causal causal;
  std::optional<Alignment> alignment;
};
const CausalAlignment kCausalAlignments[] = {{Causal::none, std::nullopt},
                                             {Causal::none, Alignment::top_left},
                                             {Causal::none, Alignment::bottom_right},
                                             {Causal::top_left, std::nullopt},
                                             {Causal::top_left, Alignment::top_left},
                                             {Causal::bottom_right, std::nullopt},
                                             {Causal::bottom_right, Alignment::bottom_right}};

// =====================================================================================
// 1. The oracle against the formula
// =====================================================================================

// Every window side in {−1, 0, 1, 3}, both alignments, with and without causal of
// either alignment, L < S and L > S. Rows the window leaves empty (L > S with a top-left
// diagonal past the last key, bottom-right diagonals before the first key) must give
// output 0 and lse −inf exactly, and the grid must contain such rows.
TEST(ReferenceExtensions, WindowMatchesFormulaEverySideAndAlignment) {
  int empty_rows = 0, n = 0;
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 5}})
    for (std::int64_t left : {-1, 0, 1, 3})
      for (std::int64_t right : {-1, 0, 1, 3})
        for (const CausalAlignment& ca : kCausalAlignments) {
          Ext c;
          c.L = L, c.S = S, c.left = left, c.right = right, c.causal = ca.causal, c.alignment = ca.alignment;
          SCOPED_TRACE(c.name());
          const ExtInputs in = make_ext(c, ++n);
          empty_rows += expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
  EXPECT_GT(empty_rows, 100);
}

// A window of (0, 0) keeps the diagonal key only: the output is that key's value row,
// whatever the scores (a closed form no softmax error can hide), and with L > S
// top-left the rows past the last key see nothing.
TEST(ReferenceExtensions, DiagonalOnlyWindowCopiesTheDiagonalValue) {
  std::mt19937_64 rng(3);
  const Tensor q = random_tensor(DType::float64, {1, 1, 6, 4}, rng),
               k = random_tensor(DType::float64, {1, 1, 4, 4}, rng),
               v = random_tensor(DType::float64, {1, 1, 4, 3}, rng);
  for (Alignment a : {Alignment::top_left, Alignment::bottom_right}) {
    Options o;
    o.backend = Backend::reference;
    o.window_left = o.window_right = 0;
    o.alignment = a;
    const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    for (std::int64_t i = 0; i < 6; ++i) {
      const std::int64_t d = a == Alignment::top_left ? i : i - 2;
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(r.output.at({0, 0, i, c}), (d >= 0 && d < 4) ? v.at({0, 0, d, c}) : 0.0) << i;
      if (d >= 0 && d < 4) {
        double dot = 0;
        for (std::int64_t e = 0; e < 4; ++e) dot += q.at({0, 0, i, e}) * k.at({0, 0, d, e});
        EXPECT_NEAR(r.lse.at({0, 0, i}), 0.5 * dot, 1e-14) << i;  // one key: lse = its score
      } else {
        EXPECT_EQ(r.lse.at({0, 0, i}), -kInf) << i;
      }
    }
  }
}

// ALiBi slopes (Hq,) and (batch, Hq), float32 and float64, with GQA (4 query heads on 2
// KV heads: the slope follows the query head), both alignments and causal.
TEST(ReferenceExtensions, AlibiMatchesFormulaPerHeadAndPerBatchHead) {
  int n = 0;
  for (auto slopes : {Ext::Slopes::per_head, Ext::Slopes::per_batch_head})
    for (DType slopes_dtype : {DType::float32, DType::float64})
      for (const CausalAlignment& ca : kCausalAlignments)
        for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {11, 5}}) {
          Ext c;
          c.L = L, c.S = S, c.slopes = slopes, c.slopes_dtype = slopes_dtype;
          c.causal = ca.causal, c.alignment = ca.alignment;
          SCOPED_TRACE(c.name());
          const ExtInputs in = make_ext(c, ++n);
          expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
}

// ALiBi with identical keys: every score is the same, so weight_j ∝ exp(−slope·|d(i) − j|)
// exactly; and a bias that depends on the batch (slopes (batch, Hq)) must change the
// batch elements differently.
TEST(ReferenceExtensions, AlibiWithIdenticalKeysGivesGeometricWeights) {
  std::mt19937_64 rng(4);
  const std::int64_t L = 3, S = 6;
  const Tensor q = random_tensor(DType::float64, {2, 2, L, 4}, rng),
               v = random_tensor(DType::float64, {2, 1, S, 2}, rng);
  Tensor k(DType::float64, {2, 1, S, 4});
  for (std::int64_t n = 0; n < k.numel(); ++n) k.set(n, 0.25 * static_cast<double>(n % 4));
  const Tensor slopes = alibi_slopes(DType::float64, 2, 2, true);
  Options o;
  o.backend = Backend::reference;
  o.alibi_slopes = slopes.view();
  const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, false});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < L; ++i) {
        const double slope = slopes.get(b * 2 + h);
        double sum = 0;
        for (std::int64_t j = 0; j < S; ++j) sum += std::exp(-slope * std::abs(static_cast<double>(i + S - L - j)));
        for (std::int64_t j = 0; j < S; ++j)
          EXPECT_NEAR(r.weights.at({b, h, i, j}), std::exp(-slope * std::abs(static_cast<double>(i + S - L - j))) / sum,
                      1e-14);
      }
}

// Slopes (batch..., Hq) with two batch dims, and slopes read through strides: the same
// as the rank-4 problem with the batch dims flattened and packed slopes, on the oracle
// (against the formula) and the CPU (against the oracle).
TEST(ReferenceExtensions, AlibiSlopesWithTwoBatchDimsAndStrides) {
  std::mt19937_64 rng(5);
  const Tensor q = random_tensor(DType::float64, {2, 3, 4, 9, 8}, rng),
               k = random_tensor(DType::float64, {2, 3, 2, 12, 8}, rng),
               v = random_tensor(DType::float64, {2, 3, 2, 12, 5}, rng);
  const Tensor packed_slopes = alibi_slopes(DType::float32, 6, 4, true);  // (6, 4) = the (2, 3, 4) slopes flattened
  Tensor spread(DType::float32, {6, 4, 2});                               // every other float32 holds a slope
  for (std::int64_t n = 0; n < 24; ++n) spread.set(2 * n, packed_slopes.get(n)), spread.set(2 * n + 1, kNaN);
  TensorView strided{spread.data(), DType::float32, {2, 3, 4}, {24, 8, 2}};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    Options o;
    o.backend = backend;
    o.alibi_slopes = strided;
    o.window_left = 5;
    o.alignment = Alignment::top_left;
    const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{false, true});
    TensorView q4 = q.view(), k4 = k.view(), v4 = v.view();
    q4.shape = {6, 4, 9, 8}, k4.shape = {6, 2, 12, 8}, v4.shape = {6, 2, 12, 5};
    q4.strides = k4.strides = v4.strides = {};  // packed
    Options o4 = o;
    o4.alibi_slopes = packed_slopes.view();
    const Expected want = expected_attention(q4, k4, v4, o4);
    const double tolerance = backend == Backend::reference ? 1e-12 : 1e-10;
    TensorView out4 = r.output.view(), lse4 = r.lse.view();
    out4.shape = {6, 4, 9, 5}, lse4.shape = {6, 4, 9};
    out4.strides = lse4.strides = {};
    EXPECT_LE(max_abs_diff(to_float64(out4), want.output), tolerance) << static_cast<int>(backend);
    EXPECT_LE(max_abs_diff(to_float64(lse4), want.lse), tolerance) << static_cast<int>(backend);
  }
  Options o;
  o.alibi_slopes = strided;
  o.softcap = 4;
  const Agreement a = compare_with_oracle(q.view(), k.view(), v.view(), o);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Softcap on scores of ~±100 (stddev 10): tanh saturates, so every score lies within
// ±softcap and a row's weights stay within a factor exp(2·softcap) of each other.
TEST(ReferenceExtensions, SoftcapMatchesFormulaAndBoundsTheScores) {
  int n = 0;
  for (double softcap : {0.5, 5.0, 30.0})
    for (double stddev : {1.0, 10.0}) {
      Ext c;
      c.softcap = softcap, c.stddev = stddev;
      SCOPED_TRACE(c.name());
      const ExtInputs in = make_ext(c, ++n);
      expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
      Options o = in.options;
      o.backend = Backend::reference;
      const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), o, Returns{true, false});
      for (std::int64_t row = 0; row < r.weights.numel() / c.S; ++row) {
        double lo = kInf, hi = 0;
        for (std::int64_t j = 0; j < c.S; ++j) {
          lo = std::min(lo, r.weights.get(row * c.S + j));
          hi = std::max(hi, r.weights.get(row * c.S + j));
        }
        EXPECT_LE(hi / lo, std::exp(2 * softcap) * (1 + 1e-12));
      }
    }
}

// Softcap, ALiBi and the window together, with a float mask (added after the cap and
// the bias) or a bool mask, both alignments, causal, GQA, dropout.
TEST(ReferenceExtensions, AllTogetherWithFloatAndBoolMask) {
  int n = 0;
  for (auto mask : {Ext::Mask::additive, Ext::Mask::boolean})
    for (bool broadcast : {false, true})
      for (const CausalAlignment& ca : kCausalAlignments)
        for (double dropout : {0.0, 0.3}) {
          Ext c;
          c.L = 9, c.S = 13, c.left = 4, c.right = 2;
          c.slopes = n % 2 ? Ext::Slopes::per_head : Ext::Slopes::per_batch_head;
          c.softcap = 2.0, c.stddev = 2.0;
          c.mask = mask, c.mask_broadcast = broadcast;
          c.causal = ca.causal, c.alignment = ca.alignment;
          c.dropout_p = dropout;
          SCOPED_TRACE(c.name());
          const ExtInputs in = make_ext(c, ++n);
          expect_oracle_matches_formula(in.qv(), in.kv(), in.vv(), in.options);
        }
}

// =====================================================================================
// 2. The CPU forward against the oracle
// =====================================================================================

// The CPU result against the oracle by the tolerance rule (compare_with_oracle), and the
// rows the window empties exactly 0 / −inf on the CPU too.
void expect_cpu_agrees(const Ext& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  const ExtInputs in = make_ext(c, seed);
  const Agreement a = compare_with_oracle(in.qv(), in.kv(), in.vv(), in.options);
  EXPECT_TRUE(a.ok()) << a.describe();
  Options cpu = in.options;
  cpu.backend = Backend::cpu;
  const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), cpu, Returns{false, true});
  for (std::int64_t i = 0; i < c.L; ++i) {
    if (!window_row_empty(in.options, c.L, c.S, i)) continue;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        EXPECT_EQ(r.lse.at({b, h, i}), -kInf) << "row " << i;
        for (std::int64_t e = 0; e < c.Ev; ++e) EXPECT_EQ(r.output.at({b, h, i, e}), 0.0) << "row " << i;
      }
  }
}

struct Config {
  std::int64_t left, right;
  Causal causal;
  std::optional<Alignment> alignment;
  Ext::Slopes slopes;
  DType slopes_dtype;
  double softcap;
  Ext::Mask mask;
};

// Windows that start and end in the middle of 96-key tiles and 32-row subtiles, alone
// and with every other feature.
const Config kConfigs[] = {
    {50, 20, Causal::none, std::nullopt, Ext::Slopes::none, DType::float32, 0, Ext::Mask::none},
    {100, -1, Causal::top_left, std::nullopt, Ext::Slopes::none, DType::float32, 0, Ext::Mask::none},
    {3, 1, Causal::none, Alignment::top_left, Ext::Slopes::per_head, DType::float32, 0, Ext::Mask::boolean},
    {-1, 40, Causal::none, Alignment::top_left, Ext::Slopes::per_batch_head, DType::float32, 30, Ext::Mask::none},
    {130, -1, Causal::bottom_right, std::nullopt, Ext::Slopes::per_head, DType::float64, 5, Ext::Mask::additive},
    {0, 0, Causal::none, Alignment::bottom_right, Ext::Slopes::none, DType::float32, 0, Ext::Mask::boolean},
    {-1, -1, Causal::none, std::nullopt, Ext::Slopes::per_batch_head, DType::float64, 0, Ext::Mask::none},
    {-1, -1, Causal::none, std::nullopt, Ext::Slopes::none, DType::float32, 2.0, Ext::Mask::additive},
};

struct Dims {
  std::int64_t B, Hq, Hkv, L, S, E, Ev;
};

Ext with(const Dims& d, const Config& k, DType dtype) {
  Ext c;
  c.dtype = dtype;
  c.B = d.B, c.Hq = d.Hq, c.Hkv = d.Hkv, c.L = d.L, c.S = d.S, c.E = d.E, c.Ev = d.Ev;
  c.left = k.left, c.right = k.right, c.causal = k.causal, c.alignment = k.alignment;
  c.slopes = k.slopes, c.slopes_dtype = k.slopes_dtype, c.softcap = k.softcap, c.mask = k.mask;
  return c;
}

void run_dtype_grid(DType dtype, std::initializer_list<Dims> dims) {
  int n = 0;
  for (const Dims& d : dims)
    for (const Config& k : kConfigs) {
      Ext c = with(d, k, dtype);
      c.interleaved = n % 2 == 0 && d.B > 0;
      c.mask_broadcast = n % 3 == 0;
      if (k.softcap == 2.0) c.stddev = 3;  // saturate the cap
      expect_cpu_agrees(c, ++n);
    }
}

TEST(CpuExtensions, Float32MatchesOracle) {
  run_dtype_grid(
      DType::float32,
      {{1, 2, 1, 300, 257, 64, 40}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 96}, {1, 2, 2, 65, 97, 1, 1}});
}

TEST(CpuExtensions, Float64MatchesOracle) {
  run_dtype_grid(DType::float64, {{1, 2, 1, 300, 257, 64, 40}, {2, 4, 2, 129, 200, 7, 7}, {1, 2, 2, 65, 97, 1, 1}});
}

TEST(CpuExtensions, Bfloat16MatchesOracleByTheToleranceRule) {
  run_dtype_grid(
      DType::bfloat16,
      {{1, 1, 1, 200, 150, 64, 24}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 16}, {1, 2, 2, 65, 97, 1, 1}});
}

TEST(CpuExtensions, Float16MatchesOracleByTheToleranceRule) {
  run_dtype_grid(
      DType::float16,
      {{1, 1, 1, 200, 150, 64, 24}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 16}, {1, 2, 2, 65, 97, 1, 1}});
}

// Left and right edges at every interesting place relative to a 96-key tile and a
// 32-row subtile: just before, on and just after a boundary, both alignments.
TEST(CpuExtensions, WindowEdgesAroundTileBoundaries) {
  int n = 0;
  for (std::int64_t left : {0, 31, 95, 96, 97, 191})
    for (std::int64_t right : {-1, 0, 32, 95})
      for (Alignment a : {Alignment::top_left, Alignment::bottom_right}) {
        Ext c;
        c.dtype = DType::float32;
        c.B = 1, c.Hq = 1, c.Hkv = 1, c.L = 160, c.S = 289, c.E = 16, c.Ev = 8;
        c.left = left, c.right = right, c.alignment = a;
        expect_cpu_agrees(c, ++n);
      }
}

// Every window side in {−1, 0, 1, 3} with causal of either alignment, on the CPU.
TEST(CpuExtensions, SmallWindowsWithCausalMatchOracle) {
  int n = 0;
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {40, 17}})
    for (std::int64_t left : {-1, 0, 1, 3})
      for (std::int64_t right : {-1, 0, 1, 3})
        for (const CausalAlignment& ca : kCausalAlignments) {
          Ext c;
          c.dtype = DType::float32;
          c.L = L, c.S = S, c.left = left, c.right = right, c.causal = ca.causal, c.alignment = ca.alignment;
          c.threads = 1;  // 224 tiny calls: one thread spares them the team start-up (threads: below)
          expect_cpu_agrees(c, ++n);
        }
}

// Softcap on scores of ~±400 in float32 and bfloat16: tanh saturated, nothing overflows.
TEST(CpuExtensions, SoftcapWithLargeScores) {
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (double softcap : {1.0, 30.0}) {
      Ext c;
      c.dtype = dtype;
      c.B = 1, c.L = 70, c.S = 130, c.E = 64, c.Ev = 16;
      c.softcap = softcap, c.stddev = 20;
      expect_cpu_agrees(c, 7);
    }
}

// NaN in Q row 5 reaches every output of row 5 through tanh and the bias; NaN in K row 40
// reaches exactly the rows whose window holds key 40, never the others (a window applied
// as an added −inf would give NaN + −inf = NaN everywhere).
TEST(CpuExtensions, NaNPropagatesInsideTheWindowOnly) {
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (int where = 0; where < 2; ++where) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (where == 0 ? " NaN in Q[5]" : " NaN in K[40]"));
      Ext c;
      c.dtype = dtype;
      c.B = 1, c.Hq = 2, c.Hkv = 1, c.L = 100, c.S = 100, c.E = 16, c.Ev = 8;
      c.left = 3, c.right = 2, c.alignment = Alignment::top_left;
      c.slopes = Ext::Slopes::per_head, c.softcap = 10;
      ExtInputs in = make_ext(c, 11);
      (where == 0 ? in.q : in.k).set(where == 0 ? 5 * 16 + 3 : 40 * 16 + 3, kNaN);
      for (Backend backend : {Backend::reference, Backend::cpu}) {
        Options o = in.options;
        o.backend = backend;
        const ForwardResult r = forward(in.q.view(), in.k.view(), in.v.view(), o, Returns{false, true});
        for (std::int64_t h = 0; h < 2; ++h)
          for (std::int64_t i = 0; i < 100; ++i) {
            const bool sees = where == 0 ? h == 0 && i == 5 : in_window(in.options, 100, 100, i, 40);
            EXPECT_EQ(std::isnan(r.lse.at({0, h, i})), sees) << "backend " << static_cast<int>(backend) << " row " << i;
            for (std::int64_t e = 0; e < 8; ++e)
              EXPECT_EQ(std::isnan(r.output.at({0, h, i, e})), sees)
                  << "backend " << static_cast<int>(backend) << " row " << i;
          }
      }
      const Agreement a = compare_with_oracle(in.q.view(), in.k.view(), in.v.view(), in.options);
      EXPECT_TRUE(a.ok()) << a.describe();
    }
}

void expect_gradients_agree(const Ext& c, std::uint64_t seed);

// Decoding shapes (a few queries, S = 9001) take the split-key path: windows, ALiBi and
// softcap across the split boundaries, forward and backward (whose key chunks split too).
TEST(CpuExtensions, SplitKeyDecodeWithWindowAlibiSoftcap) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (std::int64_t left : {-1, 3000, 5000}) {
      Ext c;
      c.dtype = dtype;
      c.B = 1, c.Hq = 5, c.Hkv = 1, c.L = 3, c.S = 9001, c.E = 16, c.Ev = 24;
      c.left = left, c.right = left < 0 ? -1 : 700;
      c.alignment = Alignment::bottom_right;
      c.slopes = Ext::Slopes::per_head;
      c.softcap = 20;
      if (left == 5000) c.slopes = Ext::Slopes::none, c.softcap = 0, c.right = -1;  // window alone
      expect_cpu_agrees(c, ++n);
      if (dtype == DType::float32) {
        c.L = 2;
        expect_gradients_agree(c, ++n);
      }
    }
}

// Window sides far past the sequence (up to INT64_MAX, where d(i) ± window overflows if
// computed naively) are the unbounded window; L > S bottom-right makes d(i) negative.
TEST(CpuExtensions, HugeWindowsEqualUnbounded) {
  const std::int64_t huge[] = {400, std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::max()};
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (Alignment a : {Alignment::top_left, Alignment::bottom_right})
      for (std::int64_t w : huge) {
        SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " alignment "
                                          << static_cast<int>(a) << " window " << w);
        Ext c;
        c.dtype = DType::float32;
        c.B = 1, c.Hq = 2, c.Hkv = 1, c.L = 150, c.S = 100, c.E = 16, c.Ev = 8;
        c.alignment = a, c.slopes = Ext::Slopes::per_head;
        ExtInputs in = make_ext(c, 17);
        in.options.backend = backend;
        const ForwardResult unbounded = forward(in.qv(), in.kv(), in.vv(), in.options, Returns{false, true});
        for (int side = 0; side < 3; ++side) {
          Options o = in.options;
          if (side != 1) o.window_left = w;
          if (side != 0) o.window_right = w;
          const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), o, Returns{false, true});
          EXPECT_LE(max_abs_diff(to_float64(r.output.view()), to_float64(unbounded.output.view())),
                    1e-6 * std::max(1.0, max_abs(unbounded.output)))
              << "side " << side;
          EXPECT_LE(max_abs_diff(to_float64(r.lse.view()), to_float64(unbounded.lse.view())),
                    1e-6 * std::max(1.0, max_abs(unbounded.lse)))
              << "side " << side;
        }
      }
}

// Empty shapes with every extension on: correctly shaped results, S = 0 gives zero
// output and lse −inf; the backward too.
TEST(CpuExtensions, EmptyShapesWithExtensions) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (const Shape& dims : {Shape{2, 0, 6}, Shape{2, 3, 0}, Shape{0, 3, 6}}) {  // B, L, S
      SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " B=" << dims[0]
                                        << " L=" << dims[1] << " S=" << dims[2]);
      std::mt19937_64 rng(18);
      const Tensor q = random_tensor(DType::float32, {dims[0], 4, dims[1], 8}, rng),
                   k = random_tensor(DType::float32, {dims[0], 2, dims[2], 8}, rng),
                   v = random_tensor(DType::float32, {dims[0], 2, dims[2], 5}, rng),
                   g = random_tensor(DType::float32, {dims[0], 4, dims[1], 5}, rng);
      const Tensor slopes = alibi_slopes(DType::float32, dims[0], 4, true);
      Options o;
      o.backend = backend;
      o.window_left = 2, o.window_right = 1;
      o.alibi_slopes = slopes.view();
      o.softcap = 5;
      const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, true});
      EXPECT_EQ(r.output.shape(), (Shape{dims[0], 4, dims[1], 5}));
      EXPECT_EQ(r.weights.shape(), (Shape{dims[0], 4, dims[1], dims[2]}));
      for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_EQ(r.output.get(n), 0.0);
      for (std::int64_t n = 0; n < r.lse.numel(); ++n) EXPECT_EQ(r.lse.get(n), -kInf);
      const BackwardResult grads = forward_backward(q.view(), k.view(), v.view(), g.view(), o);
      EXPECT_EQ(grads.grad_query.shape(), q.shape());
      EXPECT_EQ(grads.grad_key.shape(), k.shape());
      for (std::int64_t n = 0; n < grads.grad_query.numel(); ++n) EXPECT_EQ(grads.grad_query.get(n), 0.0);
    }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Same inputs and options: bitwise the same output, weights and lse for 1, 2, 3 threads.
TEST(CpuExtensions, BitwiseDeterministicAcrossThreadCounts) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Ext c;
    c.dtype = dtype;
    c.B = 1, c.Hq = 4, c.Hkv = 2, c.L = 130, c.S = 257, c.E = 40, c.Ev = 24;
    c.left = 70, c.right = 10, c.causal = Causal::none;
    c.slopes = Ext::Slopes::per_batch_head, c.softcap = 20, c.mask = Ext::Mask::additive, c.mask_broadcast = true;
    c.dropout_p = 0.2;
    ExtInputs in = make_ext(c, 12);
    in.options.backend = Backend::cpu;
    std::vector<ForwardResult> results;
    for (int threads : {1, 2, 3}) {
      in.options.num_threads = threads;
      results.push_back(forward(in.qv(), in.kv(), in.vv(), in.options, Returns{true, true}));
    }
    for (std::size_t r = 1; r < results.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(results[0].output, results[r].output)) << dtype_name(dtype) << " threads " << r + 1;
      EXPECT_TRUE(bitwise_equal(results[0].weights, results[r].weights)) << dtype_name(dtype) << " threads " << r + 1;
      EXPECT_TRUE(bitwise_equal(results[0].lse, results[r].lse)) << dtype_name(dtype) << " threads " << r + 1;
    }
  }
}

// The allocating and the caller-buffer forms, and `automatic`, give the same bits.
TEST(CpuExtensions, AutomaticBackendIsTheCpuPath) {
  Ext c;
  c.dtype = DType::float32;
  c.L = 50, c.S = 80, c.left = 9, c.right = 5, c.slopes = Ext::Slopes::per_head, c.softcap = 7;
  ExtInputs in = make_ext(c, 13);
  in.options.backend = Backend::cpu;
  const ForwardResult cpu = forward(in.qv(), in.kv(), in.vv(), in.options, Returns{false, true});
  in.options.backend = Backend::automatic;
  const ForwardResult automatic = forward(in.qv(), in.kv(), in.vv(), in.options, Returns{false, true});
  EXPECT_TRUE(bitwise_equal(cpu.output, automatic.output));
  Tensor out(DType::float32, cpu.output.shape()), lse(DType::float32, cpu.lse.shape());
  forward(in.qv(), in.kv(), in.vv(), ForwardOutputs{out.view(), std::nullopt, lse.view()}, in.options);
  EXPECT_TRUE(bitwise_equal(cpu.output, out));
  EXPECT_TRUE(bitwise_equal(cpu.lse, lse));
}

// =====================================================================================
// 3. The backward
// =====================================================================================

void expect_gradients_agree(const Ext& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  const ExtInputs in = make_ext(c, seed);
  const GradientAgreement a =
      compare_gradients_with_oracle(in.qv(), in.kv(), in.vv(), in.options, c.mask == Ext::Mask::additive);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// The CPU gradients against the oracle's. bfloat16 only without softcap: the tolerance
// rule's naive low-precision backward (naive_gradients) knows no tanh.
TEST(CpuExtensionsBackward, MatchesOracle) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64, DType::bfloat16, DType::float16})
    for (const Dims& d : {Dims{2, 4, 2, 129, 200, 7, 7}, Dims{1, 3, 1, 37, 300, 96, 40}, Dims{1, 1, 1, 200, 70, 1, 1}})
      for (const Config& k : kConfigs) {
        if ((dtype == DType::bfloat16 || dtype == DType::float16) && k.softcap > 0) continue;
        if (dtype == DType::float16 && d.S == 300) continue;  // bfloat16 covers the long rows
        if (dtype != DType::float32 && d.E == 1) continue;
        Ext c = with(d, k, dtype);
        c.interleaved = n % 2 == 0;
        c.mask_broadcast = n % 3 == 0;
        if (k.softcap == 2.0) c.stddev = 2;
        expect_gradients_agree(c, ++n);
      }
}

// What storing `x` in `dtype` keeps.
double rounded_to(DType dtype, double x) {
  switch (dtype) {
    case DType::float16:
      return detail::fp16_to_float(detail::float_to_fp16(static_cast<float>(x)));
    case DType::bfloat16:
      return detail::bf16_to_float(detail::float_to_bf16(static_cast<float>(x)));
    case DType::float32:
      return static_cast<float>(x);
    default:
      return x;
  }
}

// naive_gradients (tests/testing/gradients.h) with the softcap's chain rule: a backward
// that rounds to `dtype` after every step, sums in float32, from exact inputs and the
// exact softmax P (no dropout):
//   dP = r(dO Vᵀ),  D = r(Σ P dP),  dS = r(P (dP − D)),  dS' = r(dS (1 − tanh²(scale q·k / cap))),
//   dV = r(Pᵀ dO),  dQ = r(scale dS' K),  dK = r(scale dS'ᵀ Q)
// Rank 4, float64 tensors.
BackwardResult naive_softcap_gradients(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                       const Tensor& probs, double scale, double cap, DType dtype) {
  const std::int64_t B = q.shape()[0], Hq = q.shape()[1], L = q.shape()[2], E = q.shape()[3];
  const std::int64_t Hkv = k.shape()[1], S = k.shape()[2], Ev = v.shape()[3];
  auto r = [dtype](double x) { return rounded_to(dtype, x); };
  BackwardResult g{Tensor(DType::float64, q.shape()), Tensor(DType::float64, k.shape()),
                   Tensor(DType::float64, v.shape()), Tensor()};
  std::vector<float> dk(static_cast<std::size_t>(k.numel())), dv(static_cast<std::size_t>(v.numel()));
  std::vector<double> ds(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kv = b * Hkv + h / (Hq / Hkv);
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = (b * Hq + h) * L + i;
        float D = 0;
        for (std::int64_t j = 0; j < S; ++j) {
          float dw = 0;
          for (std::int64_t c = 0; c < Ev; ++c)
            dw += static_cast<float>(dout.get(row * Ev + c)) * static_cast<float>(v.get((kv * S + j) * Ev + c));
          dp[static_cast<std::size_t>(j)] = r(dw);
          D += static_cast<float>(r(probs.get(row * S + j)) * dp[static_cast<std::size_t>(j)]);
        }
        for (std::int64_t j = 0; j < S; ++j) {
          const double p = r(probs.get(row * S + j));
          double dot = 0;
          for (std::int64_t e = 0; e < E; ++e) dot += q.get(row * E + e) * k.get((kv * S + j) * E + e);
          const double t = std::tanh(scale * dot / cap);
          ds[static_cast<std::size_t>(j)] = r(r(p * (dp[static_cast<std::size_t>(j)] - r(D))) * (1 - t * t));
          for (std::int64_t c = 0; c < Ev; ++c)
            dv[static_cast<std::size_t>((kv * S + j) * Ev + c)] +=
                static_cast<float>(p) * static_cast<float>(dout.get(row * Ev + c));
          for (std::int64_t e = 0; e < E; ++e)
            dk[static_cast<std::size_t>((kv * S + j) * E + e)] +=
                static_cast<float>(ds[static_cast<std::size_t>(j)]) * static_cast<float>(q.get(row * E + e));
        }
        for (std::int64_t e = 0; e < E; ++e) {
          float sum = 0;
          for (std::int64_t j = 0; j < S; ++j)
            sum +=
                static_cast<float>(ds[static_cast<std::size_t>(j)]) * static_cast<float>(k.get((kv * S + j) * E + e));
          g.grad_query.set(row * E + e, r(scale * sum));
        }
      }
    }
  for (std::int64_t n = 0; n < k.numel(); ++n) g.grad_key.set(n, r(scale * dk[static_cast<std::size_t>(n)]));
  for (std::int64_t n = 0; n < v.numel(); ++n) g.grad_value.set(n, r(dv[static_cast<std::size_t>(n)]));
  return g;
}

// Softcap in bfloat16 and float16, with the window and ALiBi: the CPU gradients within 3×
// the error of the naive low-precision backward above (DESIGN.md §4's rule for gradients).
// The naive backward's own float64 limit (dtype float64) must agree with the oracle, so
// the tolerance is not measured against a wrong formula.
TEST(CpuExtensionsBackward, LowPrecisionSoftcapMatchesOracleByTheToleranceRule) {
  int n = 0;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (double cap : {2.0, 30.0}) {
      Ext c;
      c.dtype = dtype;
      c.B = 1, c.Hq = 4, c.Hkv = 2, c.L = 100, c.S = 150, c.E = 32, c.Ev = 16;
      c.left = 60, c.right = 5, c.slopes = Ext::Slopes::per_head, c.softcap = cap, c.stddev = 1.5;
      c.interleaved = n % 2 == 0;
      SCOPED_TRACE(c.name());
      const ExtInputs in = make_ext(c, ++n);
      const Tensor dout = random_grad_output(in.qv(), in.vv(), 5);
      Options cpu = in.options;
      cpu.backend = Backend::cpu;
      const BackwardResult got = forward_backward(in.qv(), in.kv(), in.vv(), dout.view(), cpu);
      const Tensor q64 = to_float64(in.qv()), k64 = to_float64(in.kv()), v64 = to_float64(in.vv()),
                   d64 = to_float64(dout.view());
      Options ref = in.options;
      ref.backend = Backend::reference;
      const BackwardResult want = forward_backward(q64.view(), k64.view(), v64.view(), d64.view(), ref);
      const ForwardResult probs = forward(q64.view(), k64.view(), v64.view(), ref, Returns{true, false});
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
      const BackwardResult exact =
          naive_softcap_gradients(q64, k64, v64, d64, probs.weights, scale, cap, DType::float64);
      const BackwardResult naive = naive_softcap_gradients(q64, k64, v64, d64, probs.weights, scale, cap, dtype);
      const Tensor* g[] = {&got.grad_query, &got.grad_key, &got.grad_value};
      const Tensor* w[] = {&want.grad_query, &want.grad_key, &want.grad_value};
      const Tensor* e[] = {&exact.grad_query, &exact.grad_key, &exact.grad_value};
      const Tensor* nv[] = {&naive.grad_query, &naive.grad_key, &naive.grad_value};
      for (int t = 0; t < 3; ++t) {
        EXPECT_LE(max_abs_diff(*e[t], *w[t]), 1e-5 * std::max(1.0, max_abs(*w[t]))) << "naive formula, gradient " << t;
        const double tolerance = std::max(3 * max_abs_diff(*nv[t], *w[t]), 1e-5);
        EXPECT_LE(max_abs_diff(to_float64(g[t]->view()), *w[t]), tolerance) << "gradient " << t;
      }
    }
}

TEST(CpuExtensionsBackward, SmallWindowsWithCausalMatchOracle) {
  int n = 0;
  for (std::int64_t left : {-1, 0, 1, 3})
    for (std::int64_t right : {-1, 0, 1, 3})
      for (const CausalAlignment& ca : kCausalAlignments) {
        Ext c;
        c.dtype = DType::float32;
        c.L = 40, c.S = 17, c.left = left, c.right = right, c.causal = ca.causal, c.alignment = ca.alignment;
        c.threads = 1;
        c.slopes = n % 2 ? Ext::Slopes::per_head : Ext::Slopes::none;
        expect_gradients_agree(c, ++n);
      }
}

// Dropout replayed under every extension at once.
TEST(CpuExtensionsBackward, DropoutWithEveryExtensionMatchesOracle) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64})
    for (const CausalAlignment& ca : {kCausalAlignments[2], kCausalAlignments[3]}) {
      Ext c;
      c.dtype = dtype;
      c.B = 2, c.Hq = 4, c.Hkv = 2, c.L = 70, c.S = 131, c.E = 24, c.Ev = 16;
      c.left = 30, c.right = 10, c.causal = ca.causal, c.alignment = ca.alignment;
      c.slopes = Ext::Slopes::per_batch_head, c.softcap = 3, c.stddev = 1.5;
      c.mask = Ext::Mask::additive, c.mask_broadcast = true;
      c.dropout_p = 0.3;
      c.interleaved = true;
      expect_gradients_agree(c, ++n);
    }
}

// Rows the window empties: gradient 0 for their queries, never NaN; keys no query sees
// get dK = dV = 0.
TEST(CpuExtensionsBackward, EmptyWindowRowsHaveZeroGradients) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    Ext c;
    c.dtype = DType::float32;
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.L = 70, c.S = 40, c.E = 8, c.Ev = 8;
    c.left = 2, c.right = 0, c.alignment = Alignment::top_left;  // rows i > 41 see nothing; keys 0..39 seen
    c.slopes = Ext::Slopes::per_head, c.softcap = 5;
    ExtInputs in = make_ext(c, 14);
    in.options.backend = backend;
    std::mt19937_64 rng(15);
    const Tensor g = random_tensor(DType::float32, {1, 2, 70, 8}, rng);
    const BackwardResult r = forward_backward(in.qv(), in.kv(), in.vv(), g.view(), in.options);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 42; i < 70; ++i)
        for (std::int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.grad_query.at({0, h, i, e}), 0.0) << i;
    for (const Tensor* t : {&r.grad_query, &r.grad_key, &r.grad_value})
      for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_FALSE(std::isnan(t->get(n)));
    // Window (0, 0) bottom-right with S > L: keys 0 .. S − L − 1 are seen by no query.
    in.options.window_left = in.options.window_right = 0;
    in.options.alignment = Alignment::bottom_right;
    const Tensor q = random_tensor(DType::float32, {1, 2, 10, 8}, rng),
                 g10 = random_tensor(DType::float32, {1, 2, 10, 8}, rng);
    const BackwardResult unseen = forward_backward(q.view(), in.kv(), in.vv(), g10.view(), in.options);
    for (std::int64_t j = 0; j < 30; ++j)
      for (std::int64_t e = 0; e < 8; ++e) {
        EXPECT_EQ(unseen.grad_key.at({0, 0, j, e}), 0.0) << j;
        EXPECT_EQ(unseen.grad_value.at({0, 0, j, e}), 0.0) << j;
      }
    EXPECT_GT(max_abs(unseen.grad_value), 0.0);
  }
}


// GQA, L ≠ S, Ev ≠ E, float64: the window (both alignments), ALiBi (batch, Hq), softcap
// and a float mask with a −inf entry, alone and together, for the oracle and for the
// CPU backend's float64 path.
FiniteDifferenceCase fd_case(std::uint64_t seed, bool window, bool alibi, double softcap, bool mask,
                             std::optional<Alignment> alignment, Causal causal) {
  std::mt19937_64 rng(seed);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {2, 4, 5, 3}, rng, 1.5);
  c.k = random_tensor(DType::float64, {2, 2, 7, 3}, rng, 1.5);
  c.v = random_tensor(DType::float64, {2, 2, 7, 4}, rng);
  c.g = random_tensor(DType::float64, {2, 4, 5, 4}, rng);
  if (window) c.options.window_left = 2, c.options.window_right = 1;
  c.options.alignment = alignment;
  c.options.causal = causal;
  if (alibi) {
    c.slopes = alibi_slopes(DType::float64, 2, 4, true);
    c.options.alibi_slopes = c.slopes.view();
  }
  c.options.softcap = softcap;
  if (mask) {
    c.mask = random_tensor(DType::float64, {4, 5, 7}, rng);
    c.mask.set(9, -kInf);
    c.options.mask = c.mask.view();
  }
  return c;
}

TEST(ReferenceExtensionsBackward, MatchesFiniteDifferences) {
  struct Variant {
    bool window, alibi;
    double softcap;
    bool mask;
    std::optional<Alignment> alignment;
    Causal causal;
  };
  const Variant variants[] = {
      {true, false, 0, false, Alignment::top_left, Causal::none},
      {true, false, 0, false, std::nullopt, Causal::bottom_right},
      {false, true, 0, false, Alignment::top_left, Causal::none},
      {false, true, 0, false, std::nullopt, Causal::none},
      {false, false, 1.5, false, std::nullopt, Causal::none},
      {false, false, 1.5, true, std::nullopt, Causal::none},
      {true, true, 1.5, true, Alignment::bottom_right, Causal::none},
      {true, true, 3.0, true, std::nullopt, Causal::top_left},
  };
  int n = 0;
  for (const Variant& v : variants)
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      SCOPED_TRACE(::testing::Message() << "variant " << n / 2 << " backend " << static_cast<int>(backend));
      fd_case(++n, v.window, v.alibi, v.softcap, v.mask, v.alignment, v.causal).check(backend, 1e-8);
    }
}

// The float mask is added after the cap, so its gradient is dS itself; the chain rule
// through tanh multiplies Q's and K's gradients only. With scores of ~±4 under a cap of
// 1, 1 − tanh² is mostly below 1e-2: a mask gradient scaled by it would lose most of dS.
// For a full-shape mask each row of dS sums to 0 (Σ_j P_j (dP_j − D) = 0); a gradient
// scaled by (1 − tanh²) would not.
TEST(ExtensionsBackward, FloatMaskGradientUnderSoftcapIsDsNotScaledByTanhDerivative) {
  std::mt19937_64 rng(21);
  FiniteDifferenceCase c;
  c.q = random_tensor(DType::float64, {1, 2, 6, 4}, rng, 2.0);
  c.k = random_tensor(DType::float64, {1, 2, 9, 4}, rng, 2.0);
  c.v = random_tensor(DType::float64, {1, 2, 9, 3}, rng);
  c.g = random_tensor(DType::float64, {1, 2, 6, 3}, rng);
  c.mask = random_tensor(DType::float64, {1, 2, 6, 9}, rng);
  c.options.mask = c.mask.view();
  c.options.softcap = 1.0;
  c.check(Backend::reference, 1e-8);
  c.check(Backend::cpu, 1e-8);
  for (DType dtype : {DType::float64, DType::float32}) {
    const Tensor q = convert(c.q, dtype), k = convert(c.k, dtype), v = convert(c.v, dtype), g = convert(c.g, dtype),
                 m = convert(c.mask, dtype);
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      Options o = c.options;
      o.mask = m.view();
      o.backend = backend;
      const BackwardResult r = forward_backward(q.view(), k.view(), v.view(), g.view(), o, true);
      double largest = 0;
      for (std::int64_t row = 0; row < 12; ++row) {
        double sum = 0;
        for (std::int64_t j = 0; j < 9; ++j) {
          sum += r.grad_mask.get(row * 9 + j);
          largest = std::max(largest, std::abs(r.grad_mask.get(row * 9 + j)));
        }
        EXPECT_NEAR(sum, 0.0, dtype == DType::float64 ? 1e-13 : 1e-5) << dtype_name(dtype) << " row " << row;
      }
      EXPECT_GT(largest, 1e-2) << "dS must not vanish";
    }
  }
  const GradientAgreement a =
      compare_gradients_with_oracle(convert(c.q, DType::float32).view(), convert(c.k, DType::float32).view(),
                                    convert(c.v, DType::float32).view(), c.options, true);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Bitwise the same gradients for 1, 2 and 3 threads with every extension on.
TEST(CpuExtensionsBackward, BitwiseDeterministicAcrossThreadCounts) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Ext c;
    c.dtype = dtype;
    c.B = 1, c.Hq = 4, c.Hkv = 2, c.L = 130, c.S = 257, c.E = 40, c.Ev = 24;
    c.left = 70, c.right = 10, c.slopes = Ext::Slopes::per_head, c.softcap = 20;
    c.mask = Ext::Mask::additive, c.mask_broadcast = true, c.dropout_p = 0.2;
    ExtInputs in = make_ext(c, 16);
    in.options.backend = Backend::cpu;
    const Tensor g = random_grad_output(in.qv(), in.vv(), 3);
    std::vector<BackwardResult> results;
    for (int threads : {1, 2, 3}) {
      in.options.num_threads = threads;
      results.push_back(forward_backward(in.qv(), in.kv(), in.vv(), g.view(), in.options, true));
    }
    for (std::size_t r = 1; r < results.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(results[0].grad_query, results[r].grad_query)) << dtype_name(dtype) << " " << r + 1;
      EXPECT_TRUE(bitwise_equal(results[0].grad_key, results[r].grad_key)) << dtype_name(dtype) << " " << r + 1;
      EXPECT_TRUE(bitwise_equal(results[0].grad_value, results[r].grad_value)) << dtype_name(dtype) << " " << r + 1;
      EXPECT_TRUE(bitwise_equal(results[0].grad_mask, results[r].grad_mask)) << dtype_name(dtype) << " " << r + 1;
    }
  }
}

// =====================================================================================
// 4. Packed variable-length batches
// =====================================================================================

// A (total, heads, dim) buffer viewed as (heads, total, dim): FlashAttention's packed
// layout as the API takes it.
struct Packed {
  Tensor storage;
  TensorView view;
};

Packed packed_random(DType dtype, std::int64_t heads, std::int64_t total, std::int64_t dim, std::mt19937_64& rng) {
  Packed p{random_tensor(dtype, {total, heads, dim}, rng), {}};
  p.view = p.storage.view();
  p.view.shape = {heads, total, dim};
  p.view.strides = {dim, heads * dim, 1};
  return p;
}

// Rows [begin, end) along dim 1 of a (heads, total[, dim]) view, as a (1, heads,
// end − begin[, dim]) view of the same memory: one sequence by itself.
TensorView sequence_rows(const TensorView& packed, std::int64_t begin, std::int64_t end) {
  const Shape st = packed.effective_strides();
  TensorView v;
  v.dtype = packed.dtype;
  v.data = static_cast<std::byte*>(packed.data) + begin * st[1] * static_cast<std::int64_t>(dtype_size(packed.dtype));
  v.shape = packed.shape;
  v.shape[1] = end - begin;
  v.shape.insert(v.shape.begin(), 1);
  v.strides = st;
  v.strides.insert(v.strides.begin(), 0);
  return v;
}

// Row b of a (batch, Hq) slopes tensor as (Hq,); (Hq,) slopes as they are.
TensorView slopes_of_sequence(const Tensor& slopes, std::int64_t b) {
  TensorView v = slopes.view();
  if (slopes.shape().size() == 2) {
    const std::int64_t heads = slopes.shape()[1];
    v.data = static_cast<std::byte*>(v.data) + b * heads * static_cast<std::int64_t>(dtype_size(slopes.dtype()));
    v.shape = {heads};
    v.strides = {1};
  }
  return v;
}

// How far two runs of the same computation may drift: a few units in the last place.
double same_result_tolerance(DType dtype, double magnitude) {
  const double m = std::max(1.0, magnitude);
  switch (dtype) {
    case DType::float64:
      return 1e-12 * m;
    case DType::float32:
      return 2e-6 * m;
    default:
      return 8e-3 * m;  // two bfloat16 units
  }
}

// (L_b, S_b): an empty query sequence, a sequence with no keys (zero output, lse −inf),
// L > S, L < S over several key tiles, L = S.
const std::pair<std::int64_t, std::int64_t> kSequenceLengths[] = {{5, 9}, {0, 4}, {1, 0}, {40, 33}, {17, 130}, {3, 3}};

VarlenSequences sequences_of(const std::vector<std::pair<std::int64_t, std::int64_t>>& lengths) {
  VarlenSequences s{{0}, {0}};
  for (auto [L, S] : lengths) {
    s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + L);
    s.cu_seqlens_k.push_back(s.cu_seqlens_k.back() + S);
  }
  return s;
}

struct VarlenInputs {
  Packed q, k, v;
  VarlenSequences seqs;
  Tensor slopes;
  std::int64_t batch = 0;
};

VarlenInputs make_varlen(DType dtype, std::int64_t Hq, std::int64_t Hkv, std::int64_t E, std::int64_t Ev,
                         const std::vector<std::pair<std::int64_t, std::int64_t>>& lengths, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  VarlenInputs in;
  in.seqs = sequences_of(lengths);
  in.batch = static_cast<std::int64_t>(lengths.size());
  in.q = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), E, rng);
  in.k = packed_random(dtype, Hkv, in.seqs.cu_seqlens_k.back(), E, rng);
  in.v = packed_random(dtype, Hkv, in.seqs.cu_seqlens_k.back(), Ev, rng);
  return in;
}

struct VarlenOptions {
  const char* name;
  Causal causal;
  std::optional<Alignment> alignment;
  std::int64_t left, right;
  int slopes;  // 0 none, 1 (Hq,), 2 (batch, Hq)
  double softcap;
};

const VarlenOptions kVarlenOptions[] = {
    {"plain", Causal::none, std::nullopt, -1, -1, 0, 0},
    {"causal top-left", Causal::top_left, std::nullopt, -1, -1, 0, 0},
    {"causal bottom-right", Causal::bottom_right, std::nullopt, -1, -1, 0, 0},
    {"window bottom-right", Causal::none, std::nullopt, 4, 2, 0, 0},
    {"window top-left, alibi (Hq,), softcap", Causal::none, Alignment::top_left, 6, 20, 1, 5},
    {"causal bottom-right, window, alibi (batch, Hq), softcap", Causal::bottom_right, std::nullopt, 8, -1, 2, 30},
};

Options options_of(const VarlenOptions& vo, const Tensor& slopes) {
  Options o;
  o.causal = vo.causal;
  o.alignment = vo.alignment;
  o.window_left = vo.left;
  o.window_right = vo.right;
  o.softcap = vo.softcap;
  if (vo.slopes) o.alibi_slopes = slopes.view();
  return o;
}

TEST(Varlen, EqualsForwardOnEachSequenceAlone) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  int n = 0;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (const VarlenOptions& vo : kVarlenOptions) {
        if (dtype != DType::float32 && backend == Backend::reference) continue;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " " << vo.name);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, ++n);
        in.slopes = alibi_slopes(DType::float32, in.batch, Hq, vo.slopes == 2);
        Options o = options_of(vo, in.slopes);
        o.backend = backend;
        const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        ASSERT_EQ(packed.output.shape(), (Shape{Hq, in.seqs.cu_seqlens_q.back(), Ev}));
        ASSERT_EQ(packed.lse.shape(), (Shape{Hq, in.seqs.cu_seqlens_q.back()}));
        for (std::int64_t b = 0; b < in.batch; ++b) {
          const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
          const std::int64_t k0 = in.seqs.cu_seqlens_k[b], k1 = in.seqs.cu_seqlens_k[b + 1];
          Options ob = o;
          if (vo.slopes) ob.alibi_slopes = slopes_of_sequence(in.slopes, b);
          const ForwardResult alone = forward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                              sequence_rows(in.v.view, k0, k1), ob, Returns{false, true});
          const Tensor want = to_float64(alone.output.view()), want_lse = to_float64(alone.lse.view());
          const Tensor got = to_float64(sequence_rows(packed.output.view(), q0, q1));
          const Tensor got_lse = to_float64(sequence_rows(packed.lse.view(), q0, q1));
          EXPECT_LE(max_abs_diff(got, want), same_result_tolerance(dtype, max_abs(want))) << "sequence " << b;
          EXPECT_LE(max_abs_diff(got_lse, want_lse), same_result_tolerance(DType::float32, max_abs(want_lse)))
              << "sequence " << b;
          if (k1 == k0) {  // no keys: zero output, lse −inf
            for (std::int64_t r = 0; r < got.numel(); ++r) EXPECT_EQ(got.get(r), 0.0) << "sequence " << b;
            for (std::int64_t r = 0; r < got_lse.numel(); ++r) EXPECT_EQ(got_lse.get(r), -kInf) << "sequence " << b;
          }
        }
      }
}

// Against the oracle directly (not only against forward() of the same backend): the
// CPU's packed result for each sequence by the tolerance rule's float32 bound.
TEST(Varlen, CpuMatchesOracleFormulaPerSequence) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  VarlenInputs in = make_varlen(DType::float32, 4, 2, 16, 8, lengths, 77);
  in.slopes = alibi_slopes(DType::float32, in.batch, 4, true);
  Options o = options_of(kVarlenOptions[5], in.slopes);
  o.backend = Backend::cpu;
  const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
  for (std::int64_t b = 0; b < in.batch; ++b) {
    const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
    const std::int64_t k0 = in.seqs.cu_seqlens_k[b], k1 = in.seqs.cu_seqlens_k[b + 1];
    Options ob = o;
    ob.alibi_slopes = slopes_of_sequence(in.slopes, b);
    const Expected want = expected_attention(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                             sequence_rows(in.v.view, k0, k1), ob);
    EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), want.output),
              1e-5 * std::max(1.0, max_abs(want.output)))
        << "sequence " << b;
    EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), want.lse),
              1e-5 * std::max(1.0, max_abs(want.lse)))
        << "sequence " << b;
  }
}

// The padded form of a packed (H, total, D) view: (batch, H, longest, D), sequence b's
// rows at batch element b, zeros after them.
Tensor padded(const TensorView& packed, const std::vector<std::int64_t>& cu, std::int64_t longest) {
  const std::int64_t B = static_cast<std::int64_t>(cu.size()) - 1, H = packed.shape[0], D = packed.shape[2];
  Tensor t(packed.dtype, {B, H, longest, D});
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = cu[b + 1] - cu[b];
    const Tensor rows = to_float64(sequence_rows(packed, cu[b], cu[b + 1]));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < len; ++i)
        for (std::int64_t e = 0; e < D; ++e)
          t.set(((b * H + h) * longest + i) * D + e, rows.get((h * len + i) * D + e));
  }
  return t;
}

// The first `len` rows of batch element b of a packed (B, H, longest[, D]) tensor, as a
// (1, H, len[, D]) float64 tensor.
Tensor unpadded(const Tensor& t, std::int64_t b, std::int64_t len) {
  TensorView v = t.view();
  const Shape st = contiguous_strides(t.shape());
  v.data = static_cast<std::byte*>(v.data) + b * st[0] * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape[0] = 1;
  v.shape[2] = len;
  v.strides = st;
  return to_float64(v);
}

struct PaddedBatch {
  Tensor q, k, v, mask;  // mask (B, 1, 1, Smax): true for each sequence's real keys
  std::int64_t Lmax = 0, Smax = 0;
};

PaddedBatch pad(const VarlenInputs& in) {
  PaddedBatch p;
  for (std::int64_t b = 0; b < in.batch; ++b) {
    p.Lmax = std::max(p.Lmax, in.seqs.cu_seqlens_q[b + 1] - in.seqs.cu_seqlens_q[b]);
    p.Smax = std::max(p.Smax, in.seqs.cu_seqlens_k[b + 1] - in.seqs.cu_seqlens_k[b]);
  }
  p.q = padded(in.q.view, in.seqs.cu_seqlens_q, p.Lmax);
  p.k = padded(in.k.view, in.seqs.cu_seqlens_k, p.Smax);
  p.v = padded(in.v.view, in.seqs.cu_seqlens_k, p.Smax);
  p.mask = Tensor(DType::boolean, {in.batch, 1, 1, p.Smax});
  for (std::int64_t b = 0; b < in.batch; ++b)
    for (std::int64_t j = 0; j < p.Smax; ++j)
      p.mask.set(b * p.Smax + j, j < in.seqs.cu_seqlens_k[b + 1] - in.seqs.cu_seqlens_k[b] ? 1.0 : 0.0);
  return p;
}

// Dropout options for the padded comparison, plain or with top-left causal, a window,
// ALiBi (batch, Hq) and softcap: top-left, so that padding moves no diagonal.
Options dropout_options(Backend backend, int variant, const Tensor& slopes) {
  Options o;
  o.backend = backend;
  o.dropout_p = 0.3;
  o.seed = 1234;
  o.offset = 5;
  if (variant == 1) {
    o.causal = Causal::top_left;
    o.window_left = 7;
    o.alibi_slopes = slopes.view();
    o.softcap = 10;
  }
  return o;
}

// Dropout: sequence b draws as batch element b of a padded (batch, Hq, Lmax, Smax) call
// whose padding keys a bool mask removes (rows < L_b compared).
TEST(Varlen, DropoutDrawsAsThePaddedBatch) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8, B = static_cast<std::int64_t>(lengths.size());
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int variant = 0; variant < 2; ++variant) {
        if (dtype == DType::bfloat16 && backend == Backend::reference) continue;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " variant " << variant);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 31 + variant);
        in.slopes = alibi_slopes(DType::float32, B, Hq, true);
        const Options o = dropout_options(backend, variant, in.slopes);
        const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const PaddedBatch p = pad(in);
        Options po = o;
        po.mask = p.mask.view();
        const ForwardResult padded_result = forward(p.q.view(), p.k.view(), p.v.view(), po, Returns{false, true});
        Options no_dropout = o;
        no_dropout.dropout_p = 0;
        const ForwardResult undropped =
            forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, no_dropout, Returns{false, false});
        EXPECT_GT(max_abs_diff(to_float64(packed.output.view()), to_float64(undropped.output.view())), 1e-2)
            << "dropout changed nothing";
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
          const Tensor want = unpadded(padded_result.output, b, q1 - q0);
          const Tensor want_lse = unpadded(padded_result.lse, b, q1 - q0);
          EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), want),
                    same_result_tolerance(dtype, max_abs(want)))
              << "sequence " << b;
          EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), want_lse),
                    same_result_tolerance(DType::float32, max_abs(want_lse)))
              << "sequence " << b;
        }
      }
}

// backward_varlen replays the forward's dropout: its gradients equal the padded batch's
// (padding rows get dO = 0, so they add nothing to dK, dV).
TEST(Varlen, BackwardWithDropoutMatchesThePaddedBatch) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8, B = static_cast<std::int64_t>(lengths.size());
  for (DType dtype : {DType::float32, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int variant = 0; variant < 2; ++variant) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " variant " << variant);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 35 + variant);
        in.slopes = alibi_slopes(DType::float32, B, Hq, true);
        const Options o = dropout_options(backend, variant, in.slopes);
        std::mt19937_64 rng(variant);
        const Packed dout = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), Ev, rng);
        const ForwardResult fwd = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const BackwardResult grads = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd.output.view(), fwd.lse.view(), dout.view}, in.seqs, o);
        const PaddedBatch p = pad(in);
        const Tensor dout_padded = padded(dout.view, in.seqs.cu_seqlens_q, p.Lmax);
        Options po = o;
        po.mask = p.mask.view();
        const BackwardResult want = forward_backward(p.q.view(), p.k.view(), p.v.view(), dout_padded.view(), po);
        Options no_dropout = o;
        no_dropout.dropout_p = 0;
        const ForwardResult fwd0 =
            forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, no_dropout, Returns{false, true});
        const BackwardResult undropped = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd0.output.view(), fwd0.lse.view(), dout.view}, in.seqs,
            no_dropout);
        EXPECT_GT(max_abs_diff(to_float64(grads.grad_value.view()), to_float64(undropped.grad_value.view())), 1e-2)
            << "dropout changed nothing";
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
          const std::int64_t k0 = in.seqs.cu_seqlens_k[b], k1 = in.seqs.cu_seqlens_k[b + 1];
          const Tensor w[] = {unpadded(want.grad_query, b, q1 - q0), unpadded(want.grad_key, b, k1 - k0),
                              unpadded(want.grad_value, b, k1 - k0)};
          const TensorView got[] = {sequence_rows(grads.grad_query.view(), q0, q1),
                                    sequence_rows(grads.grad_key.view(), k0, k1),
                                    sequence_rows(grads.grad_value.view(), k0, k1)};
          for (int g = 0; g < 3; ++g) {
            const double tolerance = (dtype == DType::float64 ? 1e-11 : 1e-5) * std::max(1.0, max_abs(w[g]));
            EXPECT_LE(max_abs_diff(to_float64(got[g]), w[g]), tolerance) << "sequence " << b << " gradient " << g;
          }
        }
      }
}

// backward_varlen's gradients equal backward() on each sequence alone (dK, dV rows of
// sequence b come from sequence b's queries only).
TEST(Varlen, BackwardEqualsBackwardOnEachSequenceAlone) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int which : {0, 2, 4, 5}) {
        const VarlenOptions& vo = kVarlenOptions[which];
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " " << vo.name);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 40 + ++n);
        in.slopes = alibi_slopes(DType::float64, in.batch, Hq, vo.slopes == 2);
        Options o = options_of(vo, in.slopes);
        o.backend = backend;
        std::mt19937_64 rng(n);
        const Packed dout = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), Ev, rng);
        const ForwardResult fwd = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const BackwardResult grads = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd.output.view(), fwd.lse.view(), dout.view}, in.seqs, o);
        ASSERT_EQ(grads.grad_query.shape(), in.q.view.shape);
        ASSERT_EQ(grads.grad_key.shape(), in.k.view.shape);
        ASSERT_EQ(grads.grad_value.shape(), in.v.view.shape);
        for (std::int64_t b = 0; b < in.batch; ++b) {
          const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
          const std::int64_t k0 = in.seqs.cu_seqlens_k[b], k1 = in.seqs.cu_seqlens_k[b + 1];
          Options ob = o;
          if (vo.slopes) ob.alibi_slopes = slopes_of_sequence(in.slopes, b);
          const BackwardResult alone =
              forward_backward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                               sequence_rows(in.v.view, k0, k1), sequence_rows(dout.view, q0, q1), ob);
          const Tensor* want[] = {&alone.grad_query, &alone.grad_key, &alone.grad_value};
          const TensorView got[] = {sequence_rows(grads.grad_query.view(), q0, q1),
                                    sequence_rows(grads.grad_key.view(), k0, k1),
                                    sequence_rows(grads.grad_value.view(), k0, k1)};
          for (int g = 0; g < 3; ++g) {
            const Tensor w = to_float64(want[g]->view());
            const double tolerance = (dtype == DType::float64 ? 1e-11 : 2e-5) * std::max(1.0, max_abs(w));
            EXPECT_LE(max_abs_diff(to_float64(got[g]), w), tolerance) << "sequence " << b << " gradient " << g;
          }
        }
      }
}

// Long key sequences with a few queries (the shapes the contiguous forward splits over
// keys) packed with short ones.
TEST(Varlen, LongKeySequencesAmongShortOnes) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths = {{2, 5000}, {3, 7}, {1, 3000}, {40, 40}};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    VarlenInputs in = make_varlen(DType::float32, 4, 1, 16, 8, lengths, 80);
    in.slopes = alibi_slopes(DType::float32, in.batch, 4, true);
    Options o = options_of(kVarlenOptions[5], in.slopes);
    o.window_left = 2500;
    o.backend = backend;
    const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
    for (std::int64_t b = 0; b < in.batch; ++b) {
      const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
      const std::int64_t k0 = in.seqs.cu_seqlens_k[b], k1 = in.seqs.cu_seqlens_k[b + 1];
      Options ob = o;
      ob.alibi_slopes = slopes_of_sequence(in.slopes, b);
      ob.backend = Backend::reference;
      const ForwardResult want = forward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                         sequence_rows(in.v.view, k0, k1), ob, Returns{false, true});
      const Tensor w = to_float64(want.output.view()), wl = to_float64(want.lse.view());
      EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), w),
                1e-5 * std::max(1.0, max_abs(w)))
          << "sequence " << b;
      EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), wl),
                1e-5 * std::max(1.0, max_abs(wl)))
          << "sequence " << b;
    }
  }
}

// The caller-buffer forms write (total, H, D) buffers through permuted strides, the same
// bits as the allocating forms.
TEST(Varlen, CallerBuffersWithPermutedStrides) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths(std::begin(kSequenceLengths),
                                                                   std::end(kSequenceLengths));
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    VarlenInputs in = make_varlen(DType::float32, Hq, Hkv, E, Ev, lengths, 85);
    in.slopes = alibi_slopes(DType::float32, in.batch, Hq, false);
    Options o = options_of(kVarlenOptions[4], in.slopes);
    o.backend = backend;
    const std::int64_t total_q = in.seqs.cu_seqlens_q.back(), total_k = in.seqs.cu_seqlens_k.back();
    const ForwardResult want = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
    std::mt19937_64 rng(3);
    Packed out = packed_random(DType::float32, Hq, total_q, Ev, rng);  // (total, H, Ev) storage
    Tensor lse_storage(DType::float32, {total_q, Hq});
    const TensorView lse{lse_storage.data(), DType::float32, {Hq, total_q}, {1, Hq}};
    forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, ForwardOutputs{out.view, std::nullopt, lse}, o);
    EXPECT_EQ(max_abs_diff(to_float64(out.view), to_float64(want.output.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(lse), to_float64(want.lse.view())), 0.0);

    const Packed dout = packed_random(DType::float32, Hq, total_q, Ev, rng);
    const BackwardInputs inputs{in.q.view, in.k.view, in.v.view, want.output.view(), want.lse.view(), dout.view};
    const BackwardResult grads = backward_varlen(inputs, in.seqs, o);
    Packed dq = packed_random(DType::float32, Hq, total_q, E, rng),
           dk = packed_random(DType::float32, Hkv, total_k, E, rng),
           dv = packed_random(DType::float32, Hkv, total_k, Ev, rng);
    backward_varlen(inputs, in.seqs, BackwardOutputs{dq.view, dk.view, dv.view, std::nullopt}, o);
    EXPECT_EQ(max_abs_diff(to_float64(dq.view), to_float64(grads.grad_query.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(dk.view), to_float64(grads.grad_key.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(dv.view), to_float64(grads.grad_value.view())), 0.0);
    EXPECT_GT(max_abs(grads.grad_key), 1e-3);
  }
}

// A batch of no sequences (cu_seqlens {0}), and a batch whose sequences are all empty:
// correctly shaped, empty or zero results, forward and backward.
TEST(Varlen, EmptyBatchAndEmptySequences) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (const auto& lengths : {std::vector<std::pair<std::int64_t, std::int64_t>>{},
                                std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {0, 3}, {2, 0}}}) {
      SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " batch " << lengths.size());
      VarlenInputs in = make_varlen(DType::float32, 2, 1, 4, 3, lengths, 90);
      Options o;
      o.backend = backend;
      o.causal = Causal::bottom_right;
      const ForwardResult r = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
      const std::int64_t total_q = in.seqs.cu_seqlens_q.back();
      EXPECT_EQ(r.output.shape(), (Shape{2, total_q, 3}));
      for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_EQ(r.output.get(n), 0.0);
      for (std::int64_t n = 0; n < r.lse.numel(); ++n) EXPECT_EQ(r.lse.get(n), -kInf);
      std::mt19937_64 rng(1);
      const Tensor dout = random_tensor(DType::float32, {2, total_q, 3}, rng);
      const BackwardResult g = backward_varlen(
          BackwardInputs{in.q.view, in.k.view, in.v.view, r.output.view(), r.lse.view(), dout.view()}, in.seqs, o);
      EXPECT_EQ(g.grad_key.shape(), in.k.view.shape);
      for (const Tensor* t : {&g.grad_query, &g.grad_key, &g.grad_value})
        for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_EQ(t->get(n), 0.0);
    }
}

// A call that must fail: sdpa::Error whose argument() contains `names` and whose message
// starts with it; nothing written to `outputs`.
void expect_rejected_naming(const std::function<void()>& call, const std::string& names,
                            std::initializer_list<const Tensor*> outputs) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error naming " << names;
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find(names), std::string::npos) << "argument() = " << e.argument() << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(e.argument() + ": ", 0), 0u) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than sdpa::Error: " << e.what();
  }
  for (const Tensor* t : outputs) EXPECT_TRUE(untouched(*t)) << "an output was written (" << names << ")";
}

struct VarlenCall {
  Tensor q, k, v, out, lse, weights, mask;
  VarlenSequences seqs{{0, 2, 6}, {0, 5, 8}};
  Options options;
};

VarlenCall valid_varlen_call() {
  std::mt19937_64 rng(1);
  VarlenCall c;
  c.q = random_tensor(DType::float32, {2, 6, 4}, rng);
  c.k = random_tensor(DType::float32, {1, 8, 4}, rng);
  c.v = random_tensor(DType::float32, {1, 8, 3}, rng);
  c.out = Tensor(DType::float32, {2, 6, 3});
  c.lse = Tensor(DType::float32, {2, 6});
  c.weights = Tensor(DType::float32, {2, 6, 8});
  c.mask = Tensor(DType::boolean, {6, 8});
  fill_with_sentinel({&c.out, &c.lse});
  return c;
}

void expect_varlen_rejected(const VarlenCall& c, const std::string& names, bool with_weights = false) {
  expect_rejected_naming(
      [&] {
        forward_varlen(
            c.q.view(), c.k.view(), c.v.view(), c.seqs,
            ForwardOutputs{c.out.view(), with_weights ? std::optional<TensorView>(c.weights.view()) : std::nullopt,
                           c.lse.view()},
            c.options);
      },
      names, {&c.out, &c.lse});
}

TEST(VarlenValidation, ValidCallIsAccepted) {
  VarlenCall c = valid_varlen_call();
  forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, ForwardOutputs{c.out.view(), std::nullopt, c.lse.view()},
                 c.options);
  EXPECT_FALSE(untouched(c.out));
  EXPECT_FALSE(untouched(c.lse));
}

TEST(VarlenValidation, BadCuSeqlensAreRejectedNamingThem) {
  VarlenCall c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {1, 2, 6};  // does not start at 0
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {1, 5, 8};
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs = {{0, 4, 2, 6}, {0, 3, 5, 8}};  // decreasing
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs = {{0, 2, 4, 6}, {0, 6, 5, 8}};
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {0, 2, 5};  // does not end at total_q = 6
  expect_varlen_rejected(c, "cu_seqlens_q");
  c.seqs.cu_seqlens_q = {0, 2, 7};
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {0, 5, 9};  // past total_k = 8
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {0, 3, 5, 8};  // 3 sequences of keys for 2 of queries
  expect_varlen_rejected(c, "cu_seqlens");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {};  // not even batch + 1 = 1 entry
  expect_varlen_rejected(c, "cu_seqlens_q");
}

TEST(VarlenValidation, MaskWeightsAndSlopesShapeAreRejected) {
  VarlenCall c = valid_varlen_call();
  c.options.mask = c.mask.view();
  expect_varlen_rejected(c, "mask");
  c = valid_varlen_call();
  expect_varlen_rejected(c, "weights", true);
  c = valid_varlen_call();
  const Tensor slopes(DType::float32, {3, 2});  // (batch, Hq) with batch 2 expected
  c.options.alibi_slopes = slopes.view();
  expect_varlen_rejected(c, "alibi_slopes");
  c = valid_varlen_call();
  Returns weights;
  weights.weights = true;
  expect_rejected_naming([&] { forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, c.options, weights); },
                         "weights", {});
}

TEST(VarlenValidation, BackwardRejectsBadCuSeqlensAndWritesNothing) {
  VarlenCall c = valid_varlen_call();
  forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, ForwardOutputs{c.out.view(), std::nullopt, c.lse.view()},
                 c.options);
  std::mt19937_64 rng(2);
  const Tensor dout = random_tensor(DType::float32, {2, 6, 3}, rng);
  Tensor dq(DType::float32, {2, 6, 4}), dk(DType::float32, {1, 8, 4}), dv(DType::float32, {1, 8, 3});
  const BackwardInputs inputs{c.q.view(), c.k.view(), c.v.view(), c.out.view(), c.lse.view(), dout.view()};
  const BackwardOutputs outputs{dq.view(), dk.view(), dv.view(), std::nullopt};
  for (const VarlenSequences& bad : {VarlenSequences{{0, 2, 6}, {0, 5, 7}}, VarlenSequences{{0, 3, 2, 6}, {0, 1, 5, 8}},
                                     VarlenSequences{{1, 2, 6}, {0, 5, 8}}}) {
    fill_with_sentinel({&dq, &dk, &dv});
    expect_rejected_naming([&] { backward_varlen(inputs, bad, outputs, c.options); }, "cu_seqlens", {&dq, &dk, &dv});
  }
  fill_with_sentinel({&dq, &dk, &dv});
  backward_varlen(inputs, c.seqs, outputs, c.options);
  EXPECT_FALSE(untouched(dq));
}

// =====================================================================================
// 5. Paged KV cache
// =====================================================================================

struct Paged {
  Tensor q;        // (B, Hq, L, E)
  StridedCopy qs;  // the query stored (B, L, Hq, E), when asked
  TensorView query() const { return qs.storage.nbytes() ? qs.view : q.view(); }
  std::vector<Tensor> keys, values;  // per sequence (1, Hkv, S_b, E / Ev), contiguous
  Tensor key_storage, value_storage;
  Tensor slopes;
  PagedKV cache;
};

// The pages of a (pages, Hkv, page, dim) cache: packed, or stored token-major as
// (pages, page, Hkv, dim) and viewed through permuted strides.
TensorView pages_view(Tensor& storage, std::int64_t pages, std::int64_t heads, std::int64_t page, std::int64_t dim,
                      bool token_major) {
  TensorView v = storage.view();
  v.shape = {pages, heads, page, dim};
  v.strides = token_major ? Shape{page * heads * dim, dim, heads * dim, 1} : contiguous_strides(v.shape);
  return v;
}

// Builds each sequence's contiguous K/V, then scatters them into shuffled pages. Rows
// past a sequence's end and pages no sequence uses hold `poison`; block table entries past
// a sequence's last page point at a poison page.
Paged make_paged(DType dtype, const std::vector<std::int64_t>& seq_lens, std::int64_t page, bool token_major,
                 std::int64_t Hq, std::int64_t Hkv, std::int64_t L, std::int64_t E, std::int64_t Ev, double poison,
                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Paged p;
  const std::int64_t B = static_cast<std::int64_t>(seq_lens.size());
  p.q = random_tensor(dtype, {B, Hq, L, E}, rng);
  std::int64_t used = 0, most = 0;
  for (std::int64_t S : seq_lens) {
    p.keys.push_back(random_tensor(dtype, {1, Hkv, S, E}, rng));
    p.values.push_back(random_tensor(dtype, {1, Hkv, S, Ev}, rng));
    used += (S + page - 1) / page;
    most = std::max(most, (S + page - 1) / page);
  }
  const std::int64_t pages = used + 2, bps = most + 1;
  std::vector<std::int64_t> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const std::int64_t poison_page = order[static_cast<std::size_t>(used)];
  p.key_storage = Tensor(dtype, token_major ? Shape{pages, page, Hkv, E} : Shape{pages, Hkv, page, E});
  p.value_storage = Tensor(dtype, token_major ? Shape{pages, page, Hkv, Ev} : Shape{pages, Hkv, page, Ev});
  for (std::int64_t n = 0; n < p.key_storage.numel(); ++n) p.key_storage.set(n, poison);
  for (std::int64_t n = 0; n < p.value_storage.numel(); ++n) p.value_storage.set(n, poison);
  p.cache.key_pages = pages_view(p.key_storage, pages, Hkv, page, E, token_major);
  p.cache.value_pages = pages_view(p.value_storage, pages, Hkv, page, Ev, token_major);
  p.cache.blocks_per_sequence = bps;
  p.cache.seq_lens = seq_lens;
  p.cache.block_table.assign(static_cast<std::size_t>(B * bps), poison_page);
  std::int64_t next = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t blk = 0; blk < (seq_lens[b] + page - 1) / page; ++blk)
      p.cache.block_table[static_cast<std::size_t>(b * bps + blk)] = order[static_cast<std::size_t>(next++)];
  auto scatter = [&](const Tensor& seq, Tensor& storage, std::int64_t dim, std::int64_t b) {
    const std::int64_t S = seq_lens[b];
    const Shape st = pages_view(storage, pages, Hkv, page, dim, token_major).strides;
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t j = 0; j < S; ++j) {
        const std::int64_t pg = p.cache.block_table[static_cast<std::size_t>(b * bps + j / page)];
        for (std::int64_t e = 0; e < dim; ++e)
          storage.set(pg * st[0] + h * st[1] + (j % page) * st[2] + e, seq.get((h * S + j) * dim + e));
      }
  };
  for (std::int64_t b = 0; b < B; ++b) {
    scatter(p.keys[static_cast<std::size_t>(b)], p.key_storage, E, b);
    scatter(p.values[static_cast<std::size_t>(b)], p.value_storage, Ev, b);
  }
  return p;
}

// Batch element b of a (B, ...) packed tensor as a (1, ...) view.
TensorView batch_element(const Tensor& t, std::int64_t b) {
  TensorView v = t.view();
  const std::int64_t per = t.numel() / t.shape()[0];
  v.data = static_cast<std::byte*>(v.data) + b * per * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape[0] = 1;
  return v;
}

// forward_paged against forward() on each sequence's contiguous K/V, and the sequence of
// length 0 against zeros / −inf.
void expect_paged_matches(Paged& p, const Options& o, DType dtype, std::int64_t Ev) {
  const ForwardResult paged = forward_paged(p.query(), p.cache, o, Returns{false, true});
  const std::int64_t B = p.q.shape()[0];
  ASSERT_EQ(paged.output.shape(), (Shape{B, p.q.shape()[1], p.q.shape()[2], Ev}));
  ASSERT_EQ(paged.lse.shape(), (Shape{B, p.q.shape()[1], p.q.shape()[2]}));
  for (std::int64_t b = 0; b < B; ++b) {
    Options ob = o;
    if (o.alibi_slopes) ob.alibi_slopes = slopes_of_sequence(p.slopes, b);
    const ForwardResult alone = forward(batch_element(p.q, b), p.keys[static_cast<std::size_t>(b)].view(),
                                        p.values[static_cast<std::size_t>(b)].view(), ob, Returns{false, true});
    const Tensor want = to_float64(alone.output.view()), want_lse = to_float64(alone.lse.view());
    const Tensor got = to_float64(batch_element(paged.output, b)), got_lse = to_float64(batch_element(paged.lse, b));
    EXPECT_LE(max_abs_diff(got, want), same_result_tolerance(dtype, max_abs(want))) << "sequence " << b;
    EXPECT_LE(max_abs_diff(got_lse, want_lse), same_result_tolerance(DType::float32, max_abs(want_lse)))
        << "sequence " << b;
    if (p.cache.seq_lens[static_cast<std::size_t>(b)] == 0) {
      for (std::int64_t n = 0; n < got.numel(); ++n) EXPECT_EQ(got.get(n), 0.0) << "sequence " << b;
      for (std::int64_t n = 0; n < got_lse.numel(); ++n) EXPECT_EQ(got_lse.get(n), -kInf) << "sequence " << b;
    }
  }
}

TEST(Paged, EqualsForwardOnTheContiguousCache) {
  const std::vector<std::int64_t> seq_lens = {0, 1, 7, 16, 45, 130};
  const std::int64_t Hq = 4, Hkv = 2, E = 32, Ev = 16;
  int n = 0;
  for (std::int64_t page : {1, 3, 16, 100})
    for (bool token_major : {false, true})
      for (Backend backend : {Backend::reference, Backend::cpu})
        for (int variant = 0; variant < 3; ++variant) {
          const std::int64_t L = variant == 0 ? 1 : 4;
          SCOPED_TRACE(::testing::Message() << "page " << page << " token-major " << token_major << " backend "
                                            << static_cast<int>(backend) << " variant " << variant);
          // A finite poison: a kernel that reads a key past the sequence's end or an
          // unused page gets a score of ~±1e3 and a visibly wrong output.
          Paged p = make_paged(DType::float32, seq_lens, page, token_major, Hq, Hkv, L, E, Ev, 300.0, ++n);
          Options o;
          o.backend = backend;
          if (variant == 1) o.causal = Causal::bottom_right;  // the L queries are the sequence's last
          if (variant == 2) {
            o.causal = Causal::bottom_right;
            o.window_left = 20;
            p.slopes = alibi_slopes(DType::float32, 6, Hq, true);
            o.alibi_slopes = p.slopes.view();
            o.softcap = 30;
          }
          expect_paged_matches(p, o, DType::float32, Ev);
        }
}

TEST(Paged, LowPrecisionAndPerHeadSlopes) {
  const std::vector<std::int64_t> seq_lens = {33, 0, 200, 5};
  int n = 0;
  for (DType dtype : {DType::bfloat16, DType::float16, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (bool token_major : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " backend " << static_cast<int>(backend)
                                          << " token-major " << token_major);
        Paged p = make_paged(dtype, seq_lens, 16, token_major, 6, 2, 3, 64, 24, 300.0, 50 + ++n);
        if (token_major) p.qs = heads_interleaved(p.q);  // a (B, L, Hq, E) query buffer
        p.slopes = alibi_slopes(DType::float64, 4, 6, false);
        Options o;
        o.backend = backend;
        o.causal = Causal::bottom_right;
        o.alibi_slopes = p.slopes.view();
        o.window_left = 50;
        expect_paged_matches(p, o, dtype, 24);
      }
}

// A long sequence (S = 5000, the length where the contiguous forward splits the keys)
// among short ones.
TEST(Paged, LongSequenceAmongShortOnes) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    Paged p = make_paged(DType::float32, {5000, 3, 2500}, 16, true, 4, 1, 1, 16, 8, 300.0, 70);
    p.slopes = alibi_slopes(DType::float32, 3, 4, true);
    Options o;
    o.backend = backend;
    o.alibi_slopes = p.slopes.view();
    o.window_left = 3000;
    o.softcap = 15;
    expect_paged_matches(p, o, DType::float32, 8);
  }
}

// Keys past seq_lens[b] and block table entries past a sequence's last page are not
// read: NaN there changes nothing, and −1 entries there are accepted.
TEST(Paged, RowsPastTheEndAndUnusedPagesAreNotRead) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (std::int64_t page : {3, 16}) {
      SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " page " << page);
      Paged p = make_paged(DType::float32, {5, 0, 17, 40}, page, false, 2, 1, 2, 8, 8, kNaN, 60);
      Options o;
      o.backend = backend;
      expect_paged_matches(p, o, DType::float32, 8);
      const ForwardResult r = forward_paged(p.q.view(), p.cache, o);
      for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_FALSE(std::isnan(r.output.get(n))) << n;
      // Being unread, entries past a sequence's last page may be anything, −1 included.
      PagedKV padded_table = p.cache;
      for (std::int64_t b = 0; b < 4; ++b)
        for (std::int64_t blk = (p.cache.seq_lens[b] + page - 1) / page; blk < p.cache.blocks_per_sequence; ++blk)
          padded_table.block_table[static_cast<std::size_t>(b * p.cache.blocks_per_sequence + blk)] = -1;
      const ForwardResult minus_one = forward_paged(p.q.view(), padded_table, o);
      EXPECT_TRUE(bitwise_equal(r.output, minus_one.output));
    }
}

struct PagedCall {
  Tensor q, key_pages, value_pages, out, lse, weights, mask;
  PagedKV cache;
  Options options;
};

// B = 2, Hq = 2, Hkv = 1, L = 1, E = 4, Ev = 3; 5 pages of 4 rows, 2 blocks per sequence.
PagedCall valid_paged_call() {
  std::mt19937_64 rng(1);
  PagedCall c;
  c.q = random_tensor(DType::float32, {2, 2, 1, 4}, rng);
  c.key_pages = random_tensor(DType::float32, {5, 1, 4, 4}, rng);
  c.value_pages = random_tensor(DType::float32, {5, 1, 4, 3}, rng);
  c.out = Tensor(DType::float32, {2, 2, 1, 3});
  c.lse = Tensor(DType::float32, {2, 2, 1});
  c.weights = Tensor(DType::float32, {2, 2, 1, 8});
  c.mask = Tensor(DType::boolean, {1, 8});
  c.cache.key_pages = c.key_pages.view();
  c.cache.value_pages = c.value_pages.view();
  c.cache.block_table = {3, 1, 4, 0};
  c.cache.blocks_per_sequence = 2;
  c.cache.seq_lens = {5, 3};
  fill_with_sentinel({&c.out, &c.lse});
  return c;
}

void expect_paged_rejected(const PagedCall& c, const std::string& names, bool with_weights = false) {
  expect_rejected_naming(
      [&] {
        forward_paged(
            c.q.view(), c.cache,
            ForwardOutputs{c.out.view(), with_weights ? std::optional<TensorView>(c.weights.view()) : std::nullopt,
                           c.lse.view()},
            c.options);
      },
      names, {&c.out, &c.lse});
}

TEST(PagedValidation, ValidCallIsAccepted) {
  PagedCall c = valid_paged_call();
  forward_paged(c.q.view(), c.cache, ForwardOutputs{c.out.view(), std::nullopt, c.lse.view()}, c.options);
  EXPECT_FALSE(untouched(c.out));
  EXPECT_FALSE(untouched(c.lse));
}

TEST(PagedValidation, BadBlockTablesAndSeqLensAreRejected) {
  PagedCall c = valid_paged_call();
  c.cache.block_table[1] = 5;  // sequence 0's second page: only pages 0..4 exist
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table[0] = -1;
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table = {3, 1, 4};  // batch · blocks_per_sequence = 4 entries expected
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table = {3, 1, 4, 0, 2};
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.seq_lens = {9, 3};  // more than 2 blocks of 4
  expect_paged_rejected(c, "seq_lens");
  c = valid_paged_call();
  c.cache.seq_lens = {5, -1};
  expect_paged_rejected(c, "seq_lens");
  c = valid_paged_call();
  c.cache.seq_lens = {5};  // one per batch element expected
  expect_paged_rejected(c, "seq_lens");
}

TEST(PagedValidation, MaskWeightsAndMismatchedPagesAreRejected) {
  PagedCall c = valid_paged_call();
  c.options.mask = c.mask.view();
  expect_paged_rejected(c, "mask");
  c = valid_paged_call();
  expect_paged_rejected(c, "weights", true);
  Returns weights;
  weights.weights = true;
  expect_rejected_naming([&] { forward_paged(c.q.view(), c.cache, c.options, weights); }, "weights", {});
  const Tensor wrong_page_size(DType::float32, {5, 1, 3, 3}), wrong_pages(DType::float32, {4, 1, 4, 3}),
      wrong_heads(DType::float32, {5, 2, 4, 3}), wrong_dim(DType::float32, {5, 1, 4, 5});
  for (const Tensor* value_pages : {&wrong_page_size, &wrong_pages, &wrong_heads}) {
    c = valid_paged_call();
    c.cache.value_pages = value_pages->view();
    expect_paged_rejected(c, "value_pages");
  }
  c = valid_paged_call();
  c.cache.key_pages = wrong_dim.view();  // E = 5, the query's is 4
  expect_paged_rejected(c, "key_pages");
  c = valid_paged_call();
  const Tensor key64 = convert(c.key_pages, DType::float64);
  c.cache.key_pages = key64.view();
  expect_paged_rejected(c, "key_pages");
  c = valid_paged_call();
  const Tensor slopes(DType::float32, {3, 2});  // (batch, Hq) with batch 2 expected
  c.options.alibi_slopes = slopes.view();
  expect_paged_rejected(c, "alibi_slopes");
}

// =====================================================================================
// 6. Validation of the new options
// =====================================================================================

using Call = ValidCall;

Call valid_call() { return {}; }

// `argument` exactly, as validation_test.cpp checks options.dropout_p; the slopes, a
// tensor like the mask (named "mask"), may be named with or without "options.".
void expect_rejected(const Call& c, const std::string& argument, ErrorKind kind = ErrorKind::value) {
  try {
    forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);
    ADD_FAILURE() << "accepted; expected an error naming " << argument;
  } catch (const Error& e) {
    if (argument == "alibi_slopes" && e.argument() == "options.alibi_slopes") {
      expect_error_names(e, "options.alibi_slopes", {}, kind);
    } else {
      expect_error_names(e, argument, {}, kind);
    }
  }
  EXPECT_TRUE(untouched(c.out) && untouched(c.weights) && untouched(c.lse)) << "an output was written";
}

TEST(ExtensionsValidation, ValidExtremesAreAccepted) {
  Call c = valid_call();
  c.options.window_left = 0, c.options.window_right = 0;
  c.options.softcap = 1e-3;
  const Tensor slopes(DType::float64, {2, 4});
  c.options.alibi_slopes = slopes.view();
  c.options.causal = Causal::bottom_right;
  c.options.alignment = Alignment::bottom_right;
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);
  EXPECT_FALSE(untouched(c.out));
}

TEST(ExtensionsValidation, WindowBelowMinusOne) {
  for (std::int64_t w : {-2, -100}) {
    Call c = valid_call();
    c.options.window_left = w;
    expect_rejected(c, "options.window_left");
    c = valid_call();
    c.options.window_right = w;
    expect_rejected(c, "options.window_right");
  }
}

TEST(ExtensionsValidation, SoftcapNegativeOrNotFinite) {
  for (double cap : {-1.0, -1e-9, kNaN, kInf, -kInf}) {
    Call c = valid_call();
    c.options.softcap = cap;
    expect_rejected(c, "options.softcap");
  }
}

TEST(ExtensionsValidation, AlibiSlopesOfTheWrongShapeOrDtype) {
  for (const Shape& shape : {Shape{3}, Shape{5}, Shape{3, 4}, Shape{2, 3}, Shape{2, 4, 1}, Shape{}}) {
    Call c = valid_call();
    const Tensor slopes(DType::float32, shape);
    c.options.alibi_slopes = slopes.view();
    SCOPED_TRACE(shape.size());
    expect_rejected(c, "alibi_slopes");
  }
  for (DType dtype : {DType::boolean, DType::float16, DType::bfloat16}) {
    Call c = valid_call();
    const Tensor slopes(dtype, {4});
    c.options.alibi_slopes = slopes.view();
    SCOPED_TRACE(dtype_name(dtype));
    expect_rejected(c, "alibi_slopes", ErrorKind::type);
  }
  Call c = valid_call();
  TensorView null_slopes{nullptr, DType::float32, {4}, {}};
  c.options.alibi_slopes = null_slopes;
  expect_rejected(c, "alibi_slopes");
}

TEST(ExtensionsValidation, AlignmentConflictingWithCausal) {
  Call c = valid_call();
  c.options.causal = Causal::top_left;
  c.options.alignment = Alignment::bottom_right;
  expect_rejected(c, "options.alignment");
  c = valid_call();
  c.options.causal = Causal::bottom_right;
  c.options.alignment = Alignment::top_left;
  expect_rejected(c, "options.alignment");
}

// backward() validates the same options and writes no gradient.
TEST(ExtensionsValidation, BackwardRejectsTheSameOptions) {
  Call c = valid_call();
  const ForwardResult fwd = forward(c.q.view(), c.k.view(), c.v.view(), c.options, Returns{false, true});
  std::mt19937_64 rng(3);
  const Tensor dout = random_tensor(DType::float32, {2, 4, 5, 3}, rng);
  Tensor dq(DType::float32, {2, 4, 5, 8}), dk(DType::float32, {2, 2, 6, 8}), dv(DType::float32, {2, 2, 6, 3});
  const Tensor bad_slopes(DType::boolean, {4});
  for (int n = 0; n < 4; ++n) {
    Options o;
    std::string argument;
    if (n == 0) o.window_left = -3, argument = "options.window_left";
    if (n == 1) o.softcap = kNaN, argument = "options.softcap";
    if (n == 2) o.alibi_slopes = bad_slopes.view(), argument = "alibi_slopes";
    if (n == 3) o.causal = Causal::top_left, o.alignment = Alignment::bottom_right, argument = "options.alignment";
    fill_with_sentinel({&dq, &dk, &dv});
    try {
      backward(BackwardInputs{c.q.view(), c.k.view(), c.v.view(), fwd.output.view(), fwd.lse.view(), dout.view()},
               BackwardOutputs{dq.view(), dk.view(), dv.view(), std::nullopt}, o);
      ADD_FAILURE() << "accepted; expected an error naming " << argument;
    } catch (const Error& e) {
      EXPECT_NE(e.argument().find(argument), std::string::npos) << e.what();
    }
    EXPECT_TRUE(untouched(dq) && untouched(dk) && untouched(dv)) << argument;
  }
}

}  // namespace
}  // namespace sdpa::testing
