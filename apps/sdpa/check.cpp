// `sdpa check`: random configurations through the CPU backend and the float64 oracle
// (Backend::reference), compared under DESIGN.md §4's tolerance rule — the test suites'
// own code (tests/testing/tolerance.h), so the CLI and the suites decide alike. Both
// backends see the same values: inputs are rounded to the case's dtype first and the
// oracle gets exact float64 copies of the rounded values, so the difference measured is
// the CPU kernel's own error, not the error of rounding the inputs.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "check_cases.h"
#include "commands.h"
#include "sdpa/sdpa.h"
#include "testing/gradients.h"
#include "testing/tolerance.h"

namespace sdpa::cli {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Calls fn(flat, index) for every element of `shape`, in row-major order.
template <class Fn>
void for_each_index(const Shape& shape, Fn&& fn) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) count *= size;
  Shape index(shape.size(), 0);
  for (std::int64_t flat = 0; flat < count; ++flat) {
    fn(flat, index);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

std::int64_t offset_of(const Shape& index, const Shape& strides) {
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < index.size(); ++d) offset += index[d] * strides[d];
  return offset;
}

// One of Q, K, V: what the CPU backend reads (`view` into `storage`, in the case's
// dtype, maybe strided) and the oracle's packed float64 copy of the same values.
struct Input {
  Tensor storage;
  TensorView view;
  Tensor oracle;
};

// A (…, rows, cols) input. Strided: the buffer is laid out (B, L, H, E + pad) — the
// layout a fused QKV projection produces — and viewed as (B, H, L, E) through strides.
Input make_input(Random& rng, const CaseConfig& c, const Shape& shape) {
  const std::vector<std::size_t> order = !c.strided    ? std::vector<std::size_t>{0, 1, 2, 3}
                                         : c.rank == 4 ? std::vector<std::size_t>{0, 2, 1, 3}
                                                       : std::vector<std::size_t>{1, 0, 2};
  Shape storage_shape;
  for (std::size_t k = 0; k < shape.size(); ++k) storage_shape.push_back(shape[order[k]]);
  if (c.strided) storage_shape.back() += c.pad;
  const Shape storage_strides = contiguous_strides(storage_shape);
  Shape view_strides(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) view_strides[order[k]] = storage_strides[k];

  Input in{Tensor(c.dtype, storage_shape), {}, Tensor(DType::float64, shape)};
  in.view = TensorView{in.storage.data(), c.dtype, shape, view_strides};
  for_each_index(shape, [&](std::int64_t flat, const Shape& index) {
    const std::int64_t at = offset_of(index, view_strides);
    in.storage.set(at, rng.normal());
    in.oracle.set(flat, in.storage.get(at));  // the rounded value: both sides see the same input
  });
  return in;
}

// The mask, its oracle copy (float64 for float masks) and the view the CPU gets.
struct Mask {
  Tensor storage;
  TensorView view;
  Tensor oracle;
};

// A stride-0 view of `mask` with the full target shape: what torch's expand() hands
// to a kernel, the input behind pytorch#191937.
TensorView expanded_view(const Tensor& mask, const Shape& target) {
  const Shape& shape = mask.shape();
  const Shape strides = contiguous_strides(shape);
  Shape expanded(target.size(), 0);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::size_t t = target.size() - shape.size() + d;
    if (shape[d] == target[t]) expanded[t] = strides[d];
  }
  return TensorView{const_cast<void*>(mask.data()), mask.dtype(), target, expanded};
}

Mask make_mask(Random& rng, const CaseConfig& c) {
  Mask m{Tensor(c.mask_dtype, c.mask_shape), {}, {}};
  const bool is_bool = c.mask_kind == MaskKind::boolean;
  const std::int64_t count = m.storage.numel();
  for (std::int64_t i = 0; i < count; ++i) {
    if (is_bool)
      m.storage.set(i, rng.chance(0.75) ? 1.0 : 0.0);
    else
      m.storage.set(i, rng.chance(0.1) ? -kInf : 2.0 * rng.normal());
  }
  const std::int64_t row = c.mask_shape.back();
  if (c.fully_masked_row && count > 0) {
    const std::int64_t r = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(count / row)));
    for (std::int64_t j = 0; j < row; ++j) m.storage.set(r * row + j, is_bool ? 0.0 : -kInf);
  }
  m.oracle = Tensor(is_bool ? DType::boolean : DType::float64, c.mask_shape);
  for (std::int64_t i = 0; i < count; ++i) m.oracle.set(i, m.storage.get(i));
  m.view = c.mask_expanded ? expanded_view(m.storage, c.scores_shape()) : m.storage.view();
  return m;
}

struct CaseResult {
  double output_error = 0.0;  // max |CPU − oracle| over the output
  double worst_ratio = 0.0;   // max over the compared tensors of error / tolerance
  std::string failure;        // an exception's message, if one was thrown
  bool passed() const { return failure.empty() && worst_ratio <= 1.0; }  // NaN fails
};

// A case's per-head tensors: ALiBi slopes and sinks, used when the case says so.
struct PerHead {
  Tensor slopes, sinks;
};

Options make_options(const CaseConfig& c, Backend backend, const std::optional<TensorView>& mask,
                     const PerHead& per_head) {
  Options o;
  o.mask = mask;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.alignment = c.alignment;
  if (c.alibi) o.alibi_slopes = per_head.slopes.view();
  if (c.sinks) o.sinks = per_head.sinks.view();
  o.softcap = c.softcap;
  o.causal = c.causal;
  o.scale = c.scale;
  o.dropout_p = c.dropout_p;
  o.seed = c.dropout_seed;
  o.offset = c.dropout_offset;
  o.backend = backend;
  return o;
}

// bfloat16 and float16 gradients are not compared here: their error has a first-order
// term from O rounded to the dtype (D = rowsum(dO ∘ O), docs/numerics.md) that only a
// naive low-precision backward measures, which the test suites run (the 3× rule of
// DESIGN.md §4, naive_gradients in tests/testing/gradients.h).
bool gradients_compared(DType dtype) { return dtype == DType::float32 || dtype == DType::float64; }

// The CPU's gradients for dO = `grad_output` against the oracle's (with `oracle`: the
// same options, the mask's oracle copy): the worst error / tolerance over dQ, dK, dV and,
// for a float mask given at its own shape, dmask.
double compare_gradients(const Input& q, const Input& k, const Input& v, const Input& grad_output, const Options& cpu,
                         const Options& oracle, bool mask_gradient) {
  const ForwardResult f = forward(q.view, k.view, v.view, cpu, Returns{false, true});
  const BackwardResult got =
      backward({q.view, k.view, v.view, f.output.view(), f.lse.view(), grad_output.view}, cpu, mask_gradient);
  return testing::agree_gradients_with_oracle(got, q.view, k.view, v.view, grad_output.view, oracle, mask_gradient)
      .worst_ratio();
}

CaseResult run_case(Random& rng, const CaseConfig& c, bool check_backward) {
  CaseResult result;
  try {
    const Input q = make_input(rng, c, c.qkv_shape(c.Hq, c.L, c.E));
    const Input k = make_input(rng, c, c.qkv_shape(c.Hkv, c.S, c.E));
    const Input v = make_input(rng, c, c.qkv_shape(c.Hkv, c.S, c.Ev));
    std::optional<Mask> mask;
    if (c.mask_kind != MaskKind::none) mask = make_mask(rng, c);
    const Returns returns{c.want_weights, c.want_lse};
    // ALiBi's geometric slopes 2^(−8h/Hq) scaled by a random factor, so that the bias
    // is large against the scores in some cases and small in others.
    PerHead per_head{Tensor(DType::float32, c.alibi_per_batch ? Shape{c.B, c.Hq} : Shape{c.Hq}),
                     Tensor(DType::float32, c.sinks_per_batch ? Shape{c.B, c.Hq} : Shape{c.Hq})};
    for (std::int64_t n = 0; n < per_head.slopes.numel(); ++n)
      per_head.slopes.set(
          n, std::exp2(-8.0 * static_cast<double>(n % c.Hq + 1) / static_cast<double>(c.Hq)) * 4.0 * rng.uniform());
    // Sink logits in [−2, 4]: from a small share of a row to most of it.
    for (std::int64_t n = 0; n < per_head.sinks.numel(); ++n) per_head.sinks.set(n, -2.0 + 6.0 * rng.uniform());

    const ForwardResult got =
        forward(q.view, k.view, v.view,
                make_options(c, Backend::cpu, mask ? std::optional(mask->view) : std::nullopt, per_head), returns);
    // The oracle's weights always: the low-precision tolerance is measured from them.
    const ForwardResult want =
        forward(q.oracle.view(), k.oracle.view(), v.oracle.view(),
                make_options(c, Backend::reference, mask ? std::optional(mask->oracle.view()) : std::nullopt, per_head),
                Returns{true, true});
    const testing::Agreement agreement = testing::agree_with_oracle(got, want, v.oracle, c.dtype, returns);
    result.output_error = agreement.output_error;
    result.worst_ratio = agreement.worst_ratio();
    if (check_backward && gradients_compared(c.dtype)) {
      const Input grad_output = make_input(rng, c, c.qkv_shape(c.Hq, c.L, c.Ev));
      // A float mask given at its own shape gets its gradient compared too (an expanded
      // stride-0 view would be a gradient of another shape than the oracle's mask).
      const bool mask_gradient = mask && c.mask_kind == MaskKind::additive && !c.mask_expanded;
      const double ratio = compare_gradients(
          q, k, v, grad_output,
          make_options(c, Backend::cpu, mask ? std::optional(mask->view) : std::nullopt, per_head),
          make_options(c, Backend::reference, mask ? std::optional(mask->oracle.view()) : std::nullopt, per_head),
          mask_gradient);
      if (!(ratio <= result.worst_ratio)) result.worst_ratio = ratio;
    }
  } catch (const std::exception& e) {
    result.failure = e.what();
  }
  return result;
}

// A case's tolerance is measured from its own oracle result (for bfloat16 and float16),
// so a group reports its largest output error and its worst error / tolerance.
struct GroupStats {
  int cases = 0;
  int failures = 0;
  double max_error = 0.0;
  double worst_ratio = 0.0;
};

// Groups print in this order: dtype, then "all", then the features in tag order.
struct GroupKey {
  int dtype_rank;
  int feature_rank;
  std::string dtype, feature;
  bool operator<(const GroupKey& o) const {
    return std::tie(dtype_rank, feature_rank, feature) < std::tie(o.dtype_rank, o.feature_rank, o.feature);
  }
};

int feature_rank(const std::string& feature) {
  static const char* order[] = {"all",       "plain",     "rank3",      "gqa",          "ev!=e",
                                "empty",     "bool-mask", "float-mask", "stride0-mask", "masked-row",
                                "causal-tl", "causal-br", "scale",      "dropout",      "strided",
                                "window",    "alibi",     "softcap",    "sinks"};
  for (int i = 0; i < static_cast<int>(std::size(order)); ++i)
    if (feature == order[i]) return i;
  return static_cast<int>(std::size(order));
}

void record(std::map<GroupKey, GroupStats>& groups, const CaseConfig& c, const CaseResult& r) {
  std::vector<std::string> tags = features(c);
  tags.insert(tags.begin(), "all");
  for (const std::string& tag : tags) {
    GroupStats& g = groups[GroupKey{static_cast<int>(c.dtype), feature_rank(tag), dtype_name(c.dtype), tag}];
    ++g.cases;
    if (!r.passed()) ++g.failures;
    // std::max would drop a NaN error; keep it visible.
    const double error = r.failure.empty() ? r.output_error : kInf;
    if (!(error <= g.max_error)) g.max_error = error;
    const double ratio = r.failure.empty() ? r.worst_ratio : kInf;
    if (!(ratio <= g.worst_ratio)) g.worst_ratio = ratio;
  }
}

void print_table(const std::map<GroupKey, GroupStats>& groups) {
  std::printf("%-9s %-13s %6s %12s %12s  %s\n", "dtype", "feature", "cases", "max err", "err/tol", "result");
  for (const auto& [key, g] : groups)
    std::printf("%-9s %-13s %6d %12.3e %12.3g  %s\n", key.dtype.c_str(), key.feature.c_str(), g.cases, g.max_error,
                g.worst_ratio, g.failures == 0 ? "PASS" : "FAIL");
}

}  // namespace

int check_command(const CheckArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  std::map<GroupKey, GroupStats> groups;
  int failures = 0;
  for (int i = 0; i < args.cases; ++i) {
    Random rng(case_seed(args.seed, i));
    const CaseConfig config = random_case(rng);
    const CaseResult result = run_case(rng, config, args.backward);
    record(groups, config, result);
    if (!result.passed()) ++failures;
    if (args.verbose || !result.passed()) {
      std::printf("case %d: %s: output err %.3e, worst err/tol %.3g%s%s  %s\n", i, describe(config).c_str(),
                  result.output_error, result.worst_ratio,
                  result.failure.empty() ? "" : ", error: ", result.failure.c_str(), result.passed() ? "ok" : "FAIL");
    }
  }
  print_table(groups);
  if (args.backward) std::printf("gradients compared in the float32 and float64 cases\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %d cases, %d failed (seed %llu, %.1f s)\n", failures == 0 ? "PASS" : "FAIL", args.cases, failures,
              static_cast<unsigned long long>(args.seed), seconds);
  return failures == 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace sdpa::cli
