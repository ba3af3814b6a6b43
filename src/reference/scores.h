// The steps of one query row that the oracle's forward and backward both take: the
// scaled, masked scores and the stable softmax's normaliser, written as seed 004 reads.
// Never optimised, like the rest of the oracle.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/problem.h"

namespace sdpa::detail {

// max that propagates NaN: a NaN score must reach the output (pytorch#141128).
inline double nan_max(double a, double b) { return (std::isnan(a) || a > b) ? a : b; }

// Element (row, col) of matrix m of K or V as the formula reads it: an int8 element
// times its row's scale (exact in float64: 8 by 24 significant bits), else the element.
inline double kv_element(const Operand& op, const Operand& scale, std::int64_t m, std::int64_t row, std::int64_t col) {
  const double x = op.load<double>(m, row, col);
  return scale.present() ? scale.load<double>(m, row, 0) * x : x;
}

// The scores of query i (matrix `qm`) against every key (matrix `kvm`):
//   scores  = Q Kᵀ · scale            (1) raw scores, (2) scaled
//   scores  = softcap·tanh(s/softcap) (2a) logit softcapping, when softcap > 0
//   scores −= slope · |d(i) − j|      (2b) ALiBi, when slopes are given
//   scores += mask, −inf where masked (3) mask (bool false, causal, window → −inf; float added)
// `capped`, when given, receives tanh(s/softcap) per key (the backward's chain rule).
inline std::vector<double> scaled_masked_scores(const Problem& p, std::int64_t qm, std::int64_t kvm, std::int64_t i,
                                                std::vector<double>* capped = nullptr) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  std::vector<double> scores(static_cast<std::size_t>(p.S));
  if (capped) capped->assign(static_cast<std::size_t>(p.S), 0.0);
  for (std::int64_t j = 0; j < p.S; ++j) {
    double dot = 0.0;
    for (std::int64_t e = 0; e < p.E; ++e) dot += p.query.load<double>(qm, i, e) * kv_element(p.key, p.key_scale, kvm, j, e);
    double s = dot * p.scale;
    if (p.softcap > 0.0) {
      const double t = std::tanh(s / p.softcap);
      if (capped) (*capped)[static_cast<std::size_t>(j)] = t;
      s = p.softcap * t;
    }
    if (p.has_alibi()) s += p.alibi_bias(qm, i, j);
    if (p.mask.present()) {
      const double m = p.mask.load<double>(qm, i, j);
      if (p.mask_is_bool) {
        if (m == 0.0) s = kMinusInf;  // bool mask: true = takes part
      } else {
        s += m;  // float mask: added
      }
    }
    if (j < p.key_begin(i) || j >= p.key_end(i)) s = kMinusInf;  // causal, window
    scores[static_cast<std::size_t>(j)] = s;
  }
  return scores;
}

// softmax(s)_j = exp(s_j − row_max) / sum, with row_max subtracted for stability. An
// attention sink joins the denominator and takes no weight of its own (4a):
//   row_max = max(sink, max_j s_j),  sum = exp(sink − row_max) + Σ_j exp(s_j − row_max).
// A row whose scores and sink are all −inf is fully masked: sum stays 0 and the caller
// gives weights 0 rather than the NaN of 0/0. (With a finite sink no row is: its keys
// masked, it gets weights 0, output 0 and lse = sink.)
struct SoftmaxNormaliser {
  double row_max;
  double sum;
  bool fully_masked;
};

inline SoftmaxNormaliser softmax_normaliser(const std::vector<double>& scores, double sink) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  SoftmaxNormaliser n{sink, 0.0, false};
  for (double s : scores) n.row_max = nan_max(n.row_max, s);
  n.fully_masked = n.row_max == kMinusInf;
  if (n.fully_masked) return n;
  for (double s : scores) n.sum += std::exp(s - n.row_max);
  if (sink != kMinusInf) n.sum += std::exp(sink - n.row_max);
  return n;
}

}  // namespace sdpa::detail
