// The formula of include/sdpa/options.h written out again in float64, straight from its
// text and never from the library's code: what the oracle's score modifiers (sliding
// window and its alignment, ALiBi, softcap, sinks, masks, dropout) are checked against.
#pragma once

#include <cstdint>

#include "testing/helpers.h"

namespace sdpa::testing {

// Whether query i may see key j under causal and the window (the mask aside):
// d(i) − left <= j <= d(i) + right, with d(i) query i's diagonal key, −1 unbounded,
// causal capping right at 0.
bool in_window(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i, std::int64_t j);

// Whether the window and causal leave query i no key at all.
bool window_row_empty(const Options& o, std::int64_t L, std::int64_t S, std::int64_t i);

struct Expected {
  Tensor output, lse, weights;
};

// Rank-4 Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev), any dtype and strides:
//   s = softcap·tanh(scale·q·k / softcap)  (or scale·q·k)  − slope[h]·|d(i) − j|  + mask
//   −inf outside the window or where a bool mask is false; softmax with the sink's exp in
//   the denominator; dropout; · V.
// A row with no key left: output 0, weights 0, lse −inf (the sink's logit with a sink).
Expected expected_attention(const TensorView& query, const TensorView& key, const TensorView& value, const Options& o);

}  // namespace sdpa::testing
