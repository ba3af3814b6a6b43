// Helpers for the tests that a call rejects bad input (DESIGN.md §1, "Bad input"): the
// error names the argument, the expected and the actual value, and nothing is written.
#pragma once

#include <functional>
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

// `out` and `lse` as a call's caller buffers, and `weights` too when `with_weights`.
ForwardOutputs caller_buffers(const Tensor& out, const Tensor& lse, const Tensor& weights, bool with_weights);

// A call that must fail: sdpa::Error whose argument() contains `names` and whose message
// starts with it; nothing written to `outputs`.
void expect_rejected_naming(const std::function<void()>& call, const std::string& names,
                            std::initializer_list<const Tensor*> outputs);

}  // namespace sdpa::testing
