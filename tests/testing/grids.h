// The grids that the CPU forward and backward suites both run (tests/cpu/forward_test.cpp,
// backward_test.cpp), each case through the suite's own check against the oracle, so
// that the two passes meet the same shapes: awkward lengths and head dims, long
// sequences, GQA ratios, every mask broadcast shape, the causal alignments with and
// without a mask, every dtype, interleaved strided inputs, odd scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "testing/cases.h"

namespace sdpa::testing {

// One head, B = 1, float32: the awkward-shape grid's points (for_sampled_awkward_shapes:
// `phase` mod `every` of them) with E of {1, 8, 40, 64, 80, 96, 111, 128, 256} and Ev
// either E or another of those.
std::vector<Case> awkward_shape_cases(int every, int phase);

// One head, B = 1, E = 64, Ev = 40: each (L, S) of `lengths`, without causal and causal
// from the bottom right.
std::vector<Case> long_sequence_cases(std::initializer_list<std::pair<std::int64_t, std::int64_t>> lengths);

// Query heads 1, 2, 5 and 27 times 1 or 2 KV heads (L = 9, S = 13, E = 16, Ev = 24, a
// bool mask).
std::vector<Case> gqa_ratio_cases();

// Q (B = 2, Hq = 3, L = 5, E), K/V (2, 3, S = 7, ·): a bool and a float mask of each shape
// that broadcasts to (2, 3, 5, 7), rank 1 to 4.
std::vector<Case> mask_broadcast_cases();

// L against S of 17 / 17, 5 / 70 and 1 / 129 (both ways round) and 200 / 150, under
// both causal alignments, with no mask, a bool one and a float one.
std::vector<Case> causal_alignment_cases();

// float64, float32, bfloat16, float16 at L = 65, S = 129, E = 64, Ev = 40, each mask
// kind, causal or not: the tolerance rule of DESIGN.md §4 per dtype.
std::vector<Case> dtype_cases();

// (B, L, H, E) buffers viewed as (B, H, L, E), GQA 4:2, causal, in float32, bfloat16 and
// float64.
std::vector<Case> interleaved_cases();

// A negative, a zero and a large scale, with a float mask.
std::vector<Case> scale_cases();

// check(cases[i], i + 1) for each case: a seed of its own.
template <class Check>
void check_each(const std::vector<Case>& cases, Check check) {
  for (std::size_t i = 0; i < cases.size(); ++i) check(cases[i], static_cast<std::uint64_t>(i + 1));
}

}  // namespace sdpa::testing
