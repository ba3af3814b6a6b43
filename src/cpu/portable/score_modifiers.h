// What turns the scaled product c = q·k·scale into the score the softmax sees, for the
// portable forward and backward alike, in the order the oracle (reference/scores.h)
// applies it:
//   softcap     C·tanh(c / C)                       (Gemma 2; before everything else)
//   ALiBi       − slope_h · |i + shift − j|          (Press et al. 2022)
//   mask        + m (float), or −inf where a bool mask is false
//   band        −inf outside [key_begin(i), key_end(i)): causal and the sliding window
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/problem.h"

namespace sdpa::detail::portable {

// The score of query row i (of query matrix qm) against key j, from c = `scaled`.
// `in_band`: j lies in [key_begin(i), key_end(i)). `tanh_of_cap` receives tanh(c / C)
// (0 without softcap): the backward's chain rule, d(C·tanh(c/C))/dc = 1 − tanh².
template <class T>
T modified_score(const Problem& p, std::int64_t qm, std::int64_t i, std::int64_t j, T scaled, bool in_band,
                 T* tanh_of_cap = nullptr) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  T score = scaled;
  T t = 0;
  if (p.softcap > 0.0) {
    const T cap = static_cast<T>(p.softcap);
    t = std::tanh(score / cap);
    score = cap * t;
  }
  if (tanh_of_cap) *tanh_of_cap = t;
  if (p.has_alibi()) score += static_cast<T>(p.alibi_bias(qm, i, j));
  if (p.mask.present()) {
    const T m = p.mask.load<T>(qm, i, j);
    if (p.mask_is_bool) {
      if (m == T{0}) score = kMinusInf;
    } else {
      score += m;
    }
  }
  return in_band ? score : kMinusInf;
}

}  // namespace sdpa::detail::portable
