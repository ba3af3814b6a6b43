// Helpers for the tests that a call rejects bad input (DESIGN.md §1, "Bad input"): the
// error names the argument, the expected and the actual value, and nothing is written.
#pragma once

#include <initializer_list>
#include <string>

#include "sdpa/sdpa.h"

namespace sdpa::testing {

// What every output holds before a call that must not write it.
inline constexpr double kSentinel = 7.0;

void fill_with_sentinel(std::initializer_list<Tensor*> tensors);

// A valid forward call (float32, GQA 4:2, L = 5, S = 6, E = 8, Ev = 3) whose outputs hold
// kSentinel: the tests break one thing in it at a time.
struct ValidCall {
  Tensor q, k, v, out, weights, lse;
  Options options;
  ValidCall();
  ForwardOutputs outputs() const { return {out.view(), weights.view(), lse.view()}; }
};
// Whether every element still holds kSentinel.
bool untouched(const Tensor& tensor);

// Expects `error` to be of `kind` and name `argument`, and its message to start with
// "<argument>: " and hold every fragment of `says`.
void expect_error_names(const Error& error, const std::string& argument, std::initializer_list<const char*> says,
                        ErrorKind kind);

}  // namespace sdpa::testing
