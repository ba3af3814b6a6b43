// The float64 oracle. Never optimised: it should read like seed 004's
// scaled_dot_product_attention, row by row:
//   scores  = Q Kᵀ · scale            (1) raw scores, (2) scaled
//   scores += mask, −inf where masked (3) mask (bool false, causal → −inf; float added)
//   weights = softmax(scores)         (4) stable softmax: subtract the row maximum
//                                     (4a) an attention sink joins the denominator
//   weights = dropout(weights)        kept weights scaled by 1/(1−p)
//   output  = weights V               (5)
// An int8 K or V is read as scale · q (kv_element), exactly.
#include "reference/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/philox.h"
#include "reference/scores.h"

namespace sdpa::detail {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

}  // namespace

void reference_forward(const Problem& p) {
  const DropoutMask dropout(p.dropout_p, p.seed, p.offset, p.query_offset, p.key_offset);
  const double keep_scale = 1.0 / (1.0 - p.dropout_p);

  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t qm = p.q_matrix(b, h), kvm = p.kv_matrix(b, h);
      for (std::int64_t i = 0; i < p.L; ++i) {
        // (1)-(3): scaled, masked scores of query i against every key.
        const std::vector<double> scores = scaled_masked_scores(p, qm, kvm, i);

        // (4) softmax. A row whose scores are all −inf is fully masked: weights 0,
        // output 0, log-sum-exp −inf (PyTorch >= 2.5, FlashAttention), never NaN; with a
        // sink, weights 0, output 0 and log-sum-exp = sink.
        const auto [row_max, sum, fully_masked] = softmax_normaliser(scores, p.sink(qm));
        if (p.lse.present()) p.lse.store<double>(qm, i, 0, fully_masked ? kMinusInf : row_max + std::log(sum));

        std::vector<double> weights(static_cast<std::size_t>(p.S), 0.0);
        for (std::int64_t j = 0; j < p.S && !fully_masked; ++j) {
          double w = std::exp(scores[static_cast<std::size_t>(j)] - row_max) / sum;
          if (p.dropout_p > 0.0) w = dropout.keep(p.first_batch + b, h, i, j) ? w * keep_scale : 0.0;
          weights[static_cast<std::size_t>(j)] = w;
        }
        if (p.weights.present())
          for (std::int64_t j = 0; j < p.S; ++j)
            p.weights.store<double>(qm, i, j, weights[static_cast<std::size_t>(j)]);

        // (5) output = weights · V (0 for a fully masked row, whatever V holds).
        for (std::int64_t c = 0; c < p.Ev; ++c) {
          double o = 0.0;
          for (std::int64_t j = 0; j < p.S && !fully_masked; ++j)
            o += weights[static_cast<std::size_t>(j)] * kv_element(p.value, p.value_scale, kvm, j, c);
          p.output.store<double>(qm, i, c, o);
        }
      }
    }
  }
}

}  // namespace sdpa::detail
