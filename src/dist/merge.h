// The exact merge of attention over disjoint key sets by their log-sum-exp (the ring's
// partial outputs, as split-key decoding merges its splits in src/cpu/simd/lse_merge):
//   lse = m + log(e^(a−m) + e^(b−m)),  O = (e^(a−m)·O_a + e^(b−m)·O_b) / (e^(a−m) + e^(b−m)),
// m = max(a, b). Only differences to the max are exponentiated, so nothing overflows
// whatever the lse (EasyContext #14 took exp of an lse), and it runs in float32 (float64
// for float64) whatever the input dtype: rounding each step's output to bfloat16 makes
// the error grow with the number of ranks (ring-flash-attention #42). The sinks join
// once, after the last merge (fold_sink).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace sdpa::distributed::detail {

// Merges `part` (rows × cols outputs, rows lses) into `acc` in place. A part row with
// lse −inf (it saw no key) changes nothing; a NaN lse propagates.
template <class T>
void merge_rows(T* acc_out, T* acc_lse, const T* part_out, const T* part_lse, std::int64_t rows, std::int64_t cols) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    const T a = acc_lse[r], b = part_lse[r];
    T* out = acc_out + r * cols;
    const T* in = part_out + r * cols;
    if (b == kMinusInf) continue;
    if (a == kMinusInf || std::isnan(b)) {
      for (std::int64_t c = 0; c < cols; ++c) out[c] = in[c];
      acc_lse[r] = b;
      continue;
    }
    const T m = a > b ? a : b;
    const T wa = std::exp(a - m), wb = std::exp(b - m), sum = wa + wb;
    for (std::int64_t c = 0; c < cols; ++c) out[c] = (out[c] * wa + in[c] * wb) / sum;
    acc_lse[r] = m + std::log(sum);
  }
}

// Folds an attention sink into merged rows (rows × cols outputs, rows lses), once, after
// the last merge: the sink is one more logit in each row's softmax, with no value row,
//   m = max(lse, sink),  lse' = m + log(e^(lse−m) + e^(sink−m)),  O' = O · e^(lse−m) / (e^(lse−m) + e^(sink−m)),
// as the single-process kernels fold it (cpu/portable fold_sink, cpu/simd FoldSink). A
// row that saw no key (lse −inf) gets output 0 and lse = sink; a sink of −inf changes
// nothing; NaN or +inf make the row NaN, as a softmax would.
template <class T>
void fold_sink(T* out, T* lse, T sink, std::int64_t rows, std::int64_t cols) {
  if (sink == -std::numeric_limits<T>::infinity()) return;  // no sink (and no −inf − −inf)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T a = lse[r];
    const T m = std::isnan(a) || a > sink ? a : sink;
    const T wa = std::exp(a - m), sum = wa + std::exp(sink - m);  // wa = 0 when no key was seen
    const T keep = wa / sum;
    for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] *= keep;
    lse[r] = m + std::log(sum);
  }
}

}  // namespace sdpa::distributed::detail
