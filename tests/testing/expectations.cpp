#include "testing/expectations.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/simd/bf16_kernels.h"
#include "testing/gradients.h"

namespace sdpa::testing {

void expect_forward_agrees(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name() + " seed=" + std::to_string(seed));
  const Inputs in = make_inputs(c, seed);
  const Agreement a = compare_with_oracle(in.qv(), in.kv(), in.vv(), in.options);
  EXPECT_TRUE(a.ok()) << a.describe();
}

void expect_gradients_agree(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name() + " seed=" + std::to_string(seed));
  const Inputs in = make_inputs(c, seed);
  const GradientAgreement a =
      compare_gradients_with_oracle(in.qv(), in.kv(), in.vv(), in.options, c.mask == Case::Mask::additive);
  EXPECT_TRUE(a.ok()) << a.describe();
}

void expect_forward_deterministic_across_threads(const Inputs& in) {
  Options options = in.options;
  std::vector<ForwardResult> results;
  for (int threads : {1, 2, 3}) {
    options.num_threads = threads;
    results.push_back(forward(in.qv(), in.kv(), in.vv(), options, Returns{true, true}));
  }
  for (std::size_t r = 1; r < results.size(); ++r) {
    EXPECT_TRUE(bitwise_equal(results[0].output, results[r].output)) << "threads " << r + 1;
    EXPECT_TRUE(bitwise_equal(results[0].weights, results[r].weights)) << "threads " << r + 1;
    EXPECT_TRUE(bitwise_equal(results[0].lse, results[r].lse)) << "threads " << r + 1;
  }
}

void expect_gradients_deterministic_across_threads(const Inputs& in) {
  const Tensor grad_output = random_grad_output(in.qv(), in.vv(), 3);
  const bool mask_gradient = in.options.mask && in.options.mask->dtype != DType::boolean;
  Options options = in.options;
  std::vector<BackwardResult> results;
  for (int threads : {1, 2, 3}) {
    options.num_threads = threads;
    results.push_back(forward_backward(in.qv(), in.kv(), in.vv(), grad_output.view(), options, mask_gradient));
  }
  for (std::size_t r = 1; r < results.size(); ++r) {
    EXPECT_TRUE(bitwise_equal(results[0].grad_query, results[r].grad_query)) << "threads " << r + 1;
    EXPECT_TRUE(bitwise_equal(results[0].grad_key, results[r].grad_key)) << "threads " << r + 1;
    EXPECT_TRUE(bitwise_equal(results[0].grad_value, results[r].grad_value)) << "threads " << r + 1;
    EXPECT_TRUE(bitwise_equal(results[0].grad_mask, results[r].grad_mask)) << "threads " << r + 1;
  }
}

void for_each_bfloat16_path(const std::function<void()>& body) {
  if (!detail::bf16::supported()) {
    body();
    return;
  }
  struct RestoreTheCpusChoice {
    ~RestoreTheCpusChoice() { detail::bf16::choose_for_test(std::nullopt); }
  } restore;
  for (bool on_vdpbf16ps : {true, false}) {
    SCOPED_TRACE(on_vdpbf16ps ? "bfloat16 on vdpbf16ps" : "bfloat16 widened to float32");
    detail::bf16::choose_for_test(on_vdpbf16ps);
    body();
  }
}

}  // namespace sdpa::testing
