// The CPU forward's score modifiers (include/sdpa/options.h: the sliding window and its
// alignment, ALiBi, logit softcapping, with masks and dropout) against the float64 oracle
// by the tolerance rule of DESIGN.md §4, on L, S up to 300 (several 96-key tiles and
// 32-row query subtiles, windows that start in the middle of a tile), E ∈ {1, 7, 64, 96},
// every dtype, GQA, permuted strides, NaN, split keys, and bitwise the same for 1, 2 and
// 3 threads. The rows a window empties come out exactly 0 / −inf.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "testing/expectations.h"
#include "testing/formula.h"
#include "testing/gradients.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The sink of query head h of batch element b, −inf without sinks.
double sink_of(const Inputs& in, std::int64_t b, std::int64_t h) {
  if (!in.options.sinks) return -kInf;
  const std::int64_t heads = in.sinks.shape().back();
  return in.sinks.get(in.sinks.numel() == heads ? h : b * heads + h);
}

// The CPU result against the oracle by the tolerance rule (compare_with_oracle), and the
// rows the window empties exactly 0 / −inf on the CPU too (lse = the sink, with sinks).
void expect_cpu_agrees(const Case& c, std::uint64_t seed) {
  expect_forward_agrees(c, seed);
  SCOPED_TRACE(c.name());
  const Inputs in = make_inputs(c, seed);
  Options cpu = in.options;
  cpu.backend = Backend::cpu;
  const ForwardResult r = forward(in.qv(), in.kv(), in.vv(), cpu, Returns{false, true});
  for (std::int64_t i = 0; i < c.L; ++i) {
    if (!window_row_empty(in.options, c.L, c.S, i)) continue;
    for (std::int64_t b = 0; b < c.batch[0]; ++b)
      for (std::int64_t h = 0; h < c.heads_q; ++h) {
        const double sink = sink_of(in, b, h);
        if (sink == -kInf)
          EXPECT_EQ(r.lse.at({b, h, i}), -kInf) << "row " << i;
        else
          EXPECT_NEAR(r.lse.at({b, h, i}), sink, 1e-6 * std::max(1.0, std::abs(sink))) << "row " << i;
        for (std::int64_t e = 0; e < c.Ev; ++e) EXPECT_EQ(r.output.at({b, h, i, e}), 0.0) << "row " << i;
      }
  }
}

void run_dtype_grid(DType dtype, std::initializer_list<Dims> dims) {
  int n = 0;
  for (const Dims& d : dims)
    for (const Modifiers& m : kModifierGrid) {
      Case c = with(d, m, dtype);
      c.interleaved = n % 2 == 0 && d.B > 0;
      if (n % 3 == 0) c.mask_shape = {c.L, c.S};
      if (m.softcap == 2.0) c.stddev = 3;  // saturate the cap
      expect_cpu_agrees(c, ++n);
    }
}

TEST(CpuForwardModifiers, Float32MatchesOracle) {
  run_dtype_grid(
      DType::float32,
      {{1, 2, 1, 300, 257, 64, 40}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 96}, {1, 2, 2, 65, 97, 1, 1}});
}

// Subtiles of 3 row vectors (48 query rows on AVX-512), which the forward takes when every
// KV head's group of query rows fills them (288 and 384 rows here) and the problem has at
// least 16 tasks of 192 rows (32 here, 16 in the split-key case): every modifier,
// float32 and float16 (promoted tile by tile), dropout, decoding's split keys (S = 4096
// with 24 tasks of the 2-vector size: 2 splits merged), and the same bits for 1, 2 and
// 3 threads.
TEST(CpuForwardModifiers, ThreeVectorSubtilesMatchOracle) {
  run_dtype_grid(DType::float32, {{4, 8, 4, 144, 100, 32, 24}, {8, 8, 2, 96, 97, 7, 7}});
  run_dtype_grid(DType::float16, {{4, 8, 4, 144, 60, 17, 24}});
  Case split = with({1, 8, 8, 288, 4096, 16, 16}, kModifierGrid[4], DType::float32);
  expect_cpu_agrees(split, 30);
  Case c = with({4, 8, 4, 144, 100, 32, 24}, kModifierGrid[3], DType::float32);
  c.dropout_p = 0.2;
  expect_cpu_agrees(c, 31);
  Inputs in = make_inputs(c, 32);
  in.options.backend = Backend::cpu;
  expect_forward_deterministic_across_threads(in);
}

TEST(CpuForwardModifiers, Float64MatchesOracle) {
  run_dtype_grid(DType::float64, {{1, 2, 1, 300, 257, 64, 40}, {2, 4, 2, 129, 200, 7, 7}, {1, 2, 2, 65, 97, 1, 1}});
}

TEST(CpuForwardModifiers, Bfloat16MatchesOracleByTheToleranceRule) {
  for_each_bfloat16_path([] {
    run_dtype_grid(
        DType::bfloat16,
        {{1, 1, 1, 200, 150, 64, 24}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 16}, {1, 2, 2, 65, 97, 1, 1}});
  });
}

TEST(CpuForwardModifiers, Float16MatchesOracleByTheToleranceRule) {
  run_dtype_grid(
      DType::float16,
      {{1, 1, 1, 200, 150, 64, 24}, {2, 4, 2, 129, 200, 7, 7}, {1, 3, 1, 37, 300, 96, 16}, {1, 2, 2, 65, 97, 1, 1}});
}

// Every window (left, right) of the lists, both alignments, float32, one KV head.
void expect_window_edges_agree(std::int64_t heads_q, std::int64_t L, std::int64_t S, std::vector<std::int64_t> lefts,
                               std::vector<std::int64_t> rights) {
  int n = 0;
  for (std::int64_t left : lefts)
    for (std::int64_t right : rights)
      for (Alignment a : {Alignment::top_left, Alignment::bottom_right}) {
        Case c;
        c.dtype = DType::float32;
        c.batch = {1}, c.heads_q = heads_q, c.heads_kv = 1, c.L = L, c.S = S, c.E = 16, c.Ev = 8;
        c.window_left = left, c.window_right = right, c.alignment = a;
        expect_cpu_agrees(c, ++n);
      }
}

// Left and right edges at every interesting place relative to a 96-key tile and a
// 32-row subtile: just before, on and just after a boundary, both alignments.
TEST(CpuForwardModifiers, WindowEdgesAroundTileBoundaries) {
  expect_window_edges_agree(1, 160, 289, {0, 31, 95, 96, 97, 191}, {-1, 0, 32, 95});
}

// The same for decode rows (4 heads × L = 2 on one KV head: the row kernels) and their
// 192-key tiles, S = 500: the window's edges just before, on and just after the tile
// boundaries 192 and 384 — bottom-right, the diagonal at 498 and 499, left edges at
// 498 − left (115 ± 1 puts them at 382–385, 307 ± 1 at 190–193); top-left, the diagonal
// at 0 and 1, right edges at 190–193.
TEST(CpuForwardModifiers, DecodeWindowEdgesAroundTileBoundaries) {
  expect_window_edges_agree(4, 2, 500, {0, 114, 115, 116, 306, 307, 308}, {-1, 0, 190, 191});
}

// Every window side in {−1, 0, 1, 3} with causal of either alignment, on the CPU.
TEST(CpuForwardModifiers, SmallWindowsWithCausalMatchOracle) {
  int n = 0;
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{7, 11}, {40, 17}})
    for (std::int64_t left : {-1, 0, 1, 3})
      for (std::int64_t right : {-1, 0, 1, 3})
        for (const CausalAlignment& ca : kCausalAlignments) {
          Case c = small_gqa_case();
          c.dtype = DType::float32;
          c.L = L, c.S = S, c.window_left = left, c.window_right = right;
          c.causal = ca.causal, c.alignment = ca.alignment;
          c.num_threads = 1;  // 224 tiny calls: one thread spares them the team start-up (threads: below)
          expect_cpu_agrees(c, ++n);
        }
}

// Softcap on scores of ~±400 in float32 and bfloat16: tanh saturated, nothing overflows.
TEST(CpuForwardModifiers, SoftcapWithLargeScores) {
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (double softcap : {1.0, 30.0}) {
      Case c = small_gqa_case();
      c.dtype = dtype;
      c.batch = {1}, c.L = 70, c.S = 130, c.E = 64, c.Ev = 16;
      c.softcap = softcap, c.stddev = 20;
      expect_cpu_agrees(c, 7);
    }
}

// NaN in Q row 5 reaches every output of row 5 through tanh and the bias; NaN in K row 40
// reaches exactly the rows whose window holds key 40, never the others (a window applied
// as an added −inf would give NaN + −inf = NaN everywhere).
TEST(CpuForwardModifiers, NaNPropagatesInsideTheWindowOnly) {
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (int where = 0; where < 2; ++where) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (where == 0 ? " NaN in Q[5]" : " NaN in K[40]"));
      Case c;
      c.dtype = dtype;
      c.batch = {1}, c.heads_q = 2, c.heads_kv = 1, c.L = 100, c.S = 100, c.E = 16, c.Ev = 8;
      c.window_left = 3, c.window_right = 2, c.alignment = Alignment::top_left;
      c.slopes = Case::PerHead::per_head, c.softcap = 10;
      Inputs in = make_inputs(c, 11);
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

// Decoding shapes (a few queries, S = 9001) take the split-key path: windows, ALiBi,
// softcap and sinks across the split boundaries, forward and backward (whose key chunks split too).
TEST(CpuForwardModifiers, SplitKeyDecodeWithWindowAlibiSoftcap) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (std::int64_t left : {-1, 3000, 5000}) {
      Case c;
      c.dtype = dtype;
      c.batch = {1}, c.heads_q = 5, c.heads_kv = 1, c.L = 3, c.S = 9001, c.E = 16, c.Ev = 24;
      c.window_left = left, c.window_right = left < 0 ? -1 : 700;
      c.alignment = Alignment::bottom_right;
      c.slopes = Case::PerHead::per_head;
      c.softcap = 20;
      c.sinks = left < 0 ? Case::PerHead::per_head : Case::PerHead::none;  // added once, after the splits merge
      if (left == 5000) c.slopes = Case::PerHead::none, c.softcap = 0, c.window_right = -1;  // window alone
      expect_cpu_agrees(c, ++n);
      if (dtype == DType::float32) {
        c.L = 2;
        expect_gradients_agree(c, ++n);
      }
    }
}

// Window sides far past the sequence (up to INT64_MAX, where d(i) ± window overflows if
// computed naively) are the unbounded window; L > S bottom-right makes d(i) negative.
TEST(CpuForwardModifiers, HugeWindowsEqualUnbounded) {
  const std::int64_t huge[] = {400, std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::max()};
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (Alignment a : {Alignment::top_left, Alignment::bottom_right})
      for (std::int64_t w : huge) {
        SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " alignment "
                                          << static_cast<int>(a) << " window " << w);
        Case c;
        c.dtype = DType::float32;
        c.batch = {1}, c.heads_q = 2, c.heads_kv = 1, c.L = 150, c.S = 100, c.E = 16, c.Ev = 8;
        c.alignment = a, c.slopes = Case::PerHead::per_head;
        Inputs in = make_inputs(c, 17);
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
// output and lse −inf (the sink, with sinks); the backward too, whose sinks' gradient
// with no lse gradient is 0 (dO·O = 0 on every row).
TEST(CpuForwardModifiers, EmptyShapesWithEveryModifier) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (bool with_sinks : {false, true})
      for (const Shape& dims : {Shape{2, 0, 6}, Shape{2, 3, 0}, Shape{0, 3, 6}}) {  // B, L, S
        SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " B=" << dims[0]
                                          << " L=" << dims[1] << " S=" << dims[2]);
        std::mt19937_64 rng(18);
        const Tensor q = random_tensor(DType::float32, {dims[0], 4, dims[1], 8}, rng),
                     k = random_tensor(DType::float32, {dims[0], 2, dims[2], 8}, rng),
                     v = random_tensor(DType::float32, {dims[0], 2, dims[2], 5}, rng),
                     g = random_tensor(DType::float32, {dims[0], 4, dims[1], 5}, rng);
        const Tensor slopes = alibi_slopes(DType::float32, {dims[0]}, 4, true);
        Options o;
        o.backend = backend;
        o.window_left = 2, o.window_right = 1;
        o.alibi_slopes = slopes.view();
        o.softcap = 5;
        const Tensor sinks = sink_logits(DType::float64, {}, 4, false);
        if (with_sinks) o.sinks = sinks.view();
        const ForwardResult r = forward(q.view(), k.view(), v.view(), o, Returns{true, true});
        EXPECT_EQ(r.output.shape(), (Shape{dims[0], 4, dims[1], 5}));
        EXPECT_EQ(r.weights.shape(), (Shape{dims[0], 4, dims[1], dims[2]}));
        for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_EQ(r.output.get(n), 0.0);
        for (std::int64_t n = 0; n < r.lse.numel(); ++n) {
          if (with_sinks)
            EXPECT_NEAR(r.lse.get(n), sinks.get(n / dims[1] % 4), 1e-6);
          else
            EXPECT_EQ(r.lse.get(n), -kInf);
        }
        const BackwardResult grads = forward_backward(q.view(), k.view(), v.view(), g.view(), o);
        EXPECT_EQ(grads.grad_query.shape(), q.shape());
        EXPECT_EQ(grads.grad_key.shape(), k.shape());
        for (std::int64_t n = 0; n < grads.grad_query.numel(); ++n) EXPECT_EQ(grads.grad_query.get(n), 0.0);
        if (with_sinks) {
          EXPECT_EQ(grads.grad_sinks.shape(), Shape{4});
          for (std::int64_t n = 0; n < 4; ++n) EXPECT_EQ(grads.grad_sinks.get(n), 0.0);
        }
      }
}
// No query heads (Hq = 0 is a multiple of any Hkv) with sinks of shape (0,): empty results
// and an empty sinks' gradient, not a division by the head count.
TEST(CpuForwardModifiers, ZeroQueryHeadsWithSinks) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    const Tensor q(DType::float32, {2, 0, 3, 8}), k(DType::float32, {2, 1, 5, 8}), v(DType::float32, {2, 1, 5, 4}),
        g(DType::float32, {2, 0, 3, 4}), sinks(DType::float32, {0});
    Options o;
    o.backend = backend;
    o.sinks = sinks.view();
    const BackwardResult grads = forward_backward(q.view(), k.view(), v.view(), g.view(), o);
    EXPECT_EQ(grads.grad_sinks.shape(), Shape{0});
    EXPECT_EQ(grads.grad_key.shape(), k.shape());
  }
}

// Same inputs and options: bitwise the same output, weights and lse for 1, 2, 3 threads.
TEST(CpuForwardModifiers, BitwiseDeterministicAcrossThreadCounts) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Case c;
    c.dtype = dtype;
    c.batch = {1}, c.heads_q = 4, c.heads_kv = 2, c.L = 130, c.S = 257, c.E = 40, c.Ev = 24;
    c.window_left = 70, c.window_right = 10, c.causal = Causal::none;
    c.slopes = Case::PerHead::per_batch_head, c.softcap = 20, c.mask = Case::Mask::additive, c.mask_shape = {c.L, c.S};
    c.dropout_p = 0.2;
    Inputs in = make_inputs(c, 12);
    in.options.backend = Backend::cpu;
    SCOPED_TRACE(dtype_name(dtype));
    expect_forward_deterministic_across_threads(in);
  }
}

// The allocating and the caller-buffer forms, and `automatic`, give the same bits.
TEST(CpuForwardModifiers, AutomaticBackendIsTheCpuPath) {
  Case c = small_gqa_case();
  c.dtype = DType::float32;
  c.L = 50, c.S = 80, c.window_left = 9, c.window_right = 5, c.slopes = Case::PerHead::per_head, c.softcap = 7;
  Inputs in = make_inputs(c, 13);
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
}  // namespace
}  // namespace sdpa::testing
