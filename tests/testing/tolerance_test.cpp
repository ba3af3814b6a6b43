// The tolerance rule (tolerance.h) the suites and `sdpa check` decide by: the CPU's result
// passes it in every dtype, and it fails a result moved a little past its tolerance, a NaN
// or −inf where the oracle is finite, and a kernel with a bug (a window one key too wide,
// the softcap left out, the ALiBi slopes halved), forward and backward. A rule loose
// enough to pass those would pass a wrong kernel.
#include "testing/tolerance.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "testing/cases.h"
#include "testing/gradients.h"

namespace sdpa::testing {
namespace {

constexpr DType kDtypes[] = {DType::float64, DType::float32, DType::bfloat16, DType::float16};

// Window, ALiBi and a softcap that matters (logits of a few units against a cap of 2),
// GQA, L ≠ S.
Case modifiers_case(DType dtype) {
  Case c;
  c.dtype = dtype;
  c.batch = {2}, c.heads_q = 4, c.heads_kv = 2, c.L = 33, c.S = 47, c.E = 16, c.Ev = 8;
  c.window_left = 5, c.window_right = 3;
  c.slopes = Case::PerHead::per_head;
  c.softcap = 2;
  c.stddev = 2;
  return c;
}

// The case's inputs, the CPU run on `cpu_options` (the case's, or a buggy copy), the
// oracle on the case's own options and float64 copies of the same values.
struct Runs {
  Inputs in;
  Tensor q64, k64, v64;
  ForwardResult got, oracle;
};

Runs run(const Case& c, const std::function<void(Options&)>& bug = nullptr) {
  Runs r{make_inputs(c, 7), {}, {}, {}, {}, {}};
  r.q64 = to_float64(r.in.qv()), r.k64 = to_float64(r.in.kv()), r.v64 = to_float64(r.in.vv());
  Options cpu = r.in.options;
  cpu.backend = Backend::cpu;
  if (bug) bug(cpu);
  r.got = forward(r.in.qv(), r.in.kv(), r.in.vv(), cpu, Returns{true, true});
  Options oracle = r.in.options;
  oracle.backend = Backend::reference;
  r.oracle = forward(r.q64.view(), r.k64.view(), r.v64.view(), oracle, Returns{true, true});
  return r;
}

// A float64 copy of `t` with element `at` moved by `by`.
Tensor moved(const Tensor& t, std::int64_t at, double by) {
  Tensor copy = to_float64(t.view());
  copy.set(at, copy.get(at) + by);
  return copy;
}

TEST(ToleranceRule, TheCpuResultPassesInEveryDtype) {
  for (DType dtype : kDtypes) {
    const Runs r = run(modifiers_case(dtype));
    const Agreement a = agree_with_oracle(r.got, r.oracle, r.v64, dtype);
    EXPECT_TRUE(a.ok()) << dtype_name(dtype) << ": " << a.describe();
    EXPECT_LE(a.worst_ratio(), 1.0) << dtype_name(dtype);
  }
}

// The oracle's own values moved by 1.5 tolerances at one element of the output, the lse
// or the weights: each fails on its own.
TEST(ToleranceRule, AResultMovedPastItsToleranceFails) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Runs r = run(modifiers_case(dtype));
    const Agreement exact = agree_with_oracle(r.oracle, r.oracle, r.v64, dtype);
    ASSERT_TRUE(exact.ok()) << exact.describe();
    ForwardResult wrong{moved(r.oracle.output, 40, 1.5 * exact.output_tolerance), r.oracle.weights, r.oracle.lse};
    Agreement a = agree_with_oracle(wrong, r.oracle, r.v64, dtype);
    EXPECT_FALSE(a.ok()) << a.describe();
    EXPECT_GT(a.worst_ratio(), 1.4);
    wrong = {r.oracle.output, r.oracle.weights, moved(r.oracle.lse, 3, -1.5 * exact.lse_tolerance)};
    a = agree_with_oracle(wrong, r.oracle, r.v64, dtype);
    EXPECT_FALSE(a.ok()) << a.describe();
    wrong = {r.oracle.output, moved(r.oracle.weights, 100, 1.5 * exact.weights_tolerance), r.oracle.lse};
    a = agree_with_oracle(wrong, r.oracle, r.v64, dtype);
    EXPECT_FALSE(a.ok()) << a.describe();
    // Weights that are not compared do not count.
    EXPECT_TRUE(agree_with_oracle(wrong, r.oracle, r.v64, dtype, Returns{false, true}).ok());
  }
}

TEST(ToleranceRule, NaNOrMinusInfinityWhereTheOracleIsFiniteFails) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Runs r = run(modifiers_case(dtype));
    Tensor output = to_float64(r.got.output.view());
    output.set(5, std::numeric_limits<double>::quiet_NaN());
    Agreement a = agree_with_oracle({output, r.got.weights, r.got.lse}, r.oracle, r.v64, dtype);
    EXPECT_FALSE(a.ok()) << a.describe();
    EXPECT_FALSE(a.worst_ratio() <= 1.0);
    Tensor lse = to_float64(r.got.lse.view());
    lse.set(2, -std::numeric_limits<double>::infinity());
    a = agree_with_oracle({r.got.output, r.got.weights, lse}, r.oracle, r.v64, dtype);
    EXPECT_FALSE(a.ok()) << a.describe();
  }
}

// Bugs a kernel could have, run on the CPU and compared with the oracle on the right
// options: every dtype's tolerance must see them.
const std::pair<const char*, std::function<void(Options&)>> kBugs[] = {
    {"window one key too wide", [](Options& o) { o.window_left += 1; }},
    {"softcap left out", [](Options& o) { o.softcap = 0; }},
    {"ALiBi slopes halved",
     [](Options& o) {
       static Tensor halved;  // outlives the call it is passed to
       halved = to_float64(*o.alibi_slopes);
       for (std::int64_t h = 0; h < halved.numel(); ++h) halved.set(h, halved.get(h) / 2);
       o.alibi_slopes = halved.view();
     }},
};

TEST(ToleranceRule, AForwardWithABugFails) {
  for (DType dtype : kDtypes)
    for (const auto& [name, bug] : kBugs) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ": " + name);
      const Runs r = run(modifiers_case(dtype), bug);
      const Agreement a = agree_with_oracle(r.got, r.oracle, r.v64, dtype);
      EXPECT_FALSE(a.ok()) << a.describe();
      EXPECT_GT(a.output_error, a.output_tolerance) << "the output alone must show the bug";
    }
}

// The backward (agree_gradients_with_oracle, as `sdpa check --backward` compares): the
// CPU's gradients pass, and a backward whose window is one key too wide fails, in every
// dtype (no softcap here: the naive low-precision backward that sets float16 / bfloat16
// tolerances knows no tanh).
TEST(ToleranceRule, GradientsOfABackwardWithABugFail) {
  for (DType dtype : kDtypes)
    for (bool buggy : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (buggy ? " window one key too wide" : " correct"));
      Case c = modifiers_case(dtype);
      c.softcap = 0;
      const Inputs in = make_inputs(c, 9);
      const Tensor dout = random_grad_output(in.qv(), in.vv(), 3);
      Options cpu = in.options;
      cpu.backend = Backend::cpu;
      if (buggy) cpu.window_left += 1;
      const BackwardResult got = forward_backward(in.qv(), in.kv(), in.vv(), dout.view(), cpu);
      const GradientAgreement a =
          agree_gradients_with_oracle(got, in.qv(), in.kv(), in.vv(), dout.view(), in.options, false);
      const double worst = a.worst_ratio();
      if (buggy) {
        EXPECT_GT(worst, 1.0) << a.describe();
      } else {
        EXPECT_LE(worst, 1.0) << a.describe();
      }
    }
}

}  // namespace
}  // namespace sdpa::testing
