// The EXPECTs the grid's tests share: one Case (cases.h) on the CPU backend against the
// float64 oracle, forward or backward, by the tolerance rule (tolerance.h); the same
// results bit for bit whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>

#include "testing/cases.h"

namespace sdpa::testing {

// Output, weights and lse (compare_with_oracle).
void expect_forward_agrees(const Case& c, std::uint64_t seed = 1);

// dQ, dK, dV, and the mask's gradient whenever there is a float mask
// (compare_gradients_with_oracle).
void expect_gradients_agree(const Case& c, std::uint64_t seed = 1);

// The same forward with 1, 2 and 3 threads (options.num_threads): bitwise the same
// output, weights and lse.
void expect_forward_deterministic_across_threads(const Inputs& in);

// forward_backward with 1, 2 and 3 threads, dO = random_grad_output(…, seed 3), the
// mask's gradient too when the mask is a float mask: bitwise the same gradients.
void expect_gradients_deterministic_across_threads(const Inputs& in);

// Runs `body` once for each arithmetic bfloat16 can take on this CPU — on vdpbf16ps and
// widened to float32 where it has the instruction (detail::bf16::choose_for_test; a
// machine would otherwise run only the one its vendor gets), else once — under a
// SCOPED_TRACE naming it; then restores the CPU's own choice.
void for_each_bfloat16_path(const std::function<void()>& body);

}  // namespace sdpa::testing
