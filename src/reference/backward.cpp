// The float64 oracle backward. Never optimised: one query row at a time, the chain rule
// through each step of reference_forward (src/reference/attention.cpp):
//   c_j  = scale · q·k_j, or softcap · tanh(scale · q·k_j / softcap)
//   s_j  = c_j − ALiBi_j + mask_j, −inf where masked       (scores)
//   P_j  = exp(s_j − max) / Σ exp(s − max)                  (softmax; 0 if fully masked;
//                                                             a sink joins the Σ)
//   W_j  = P_j · Z_j,  Z_j = keep_j / (1 − p)               (dropout)
//   o    = Σ_j W_j v_j                                      (output)
// backwards, for dL/do given:
//   dW_j = dL/do · v_j          dV_j += W_j · dL/do
//   dP_j = dW_j · Z_j
//   dS_j = P_j (dP_j − Σ_k P_k dP_k)                        (softmax Jacobian)
//   dC_j = dS_j · (1 − tanh²) with softcap, else dS_j       (dmask_j = dS_j: added after the cap)
//   dq   = scale · Σ_j dC_j k_j      dK_j += scale · dC_j q
// Σ_k P_k dP_k is the D = rowsum(dO ∘ O) of FlashAttention, computed here from its
// definition rather than from O. A gradient of the returned lse adds P_j · dlse to dS_j
// (∂lse/∂s_j = P_j): D becomes D − dlse. With a sink nothing here changes (it has no
// value, so D = Σ_k P_k dP_k still); its own gradient is src/api/backward.cpp's.
#include "reference/backward.h"

#include <cmath>
#include <vector>

#include "common/philox.h"
#include "reference/scores.h"

namespace sdpa::detail {

void reference_backward(const BackwardProblem& p) {
  const DropoutMask dropout(p.dropout_p, p.seed, p.offset, p.query_offset, p.key_offset);
  const double keep_scale = 1.0 / (1.0 - p.dropout_p);
  const std::size_t S = static_cast<std::size_t>(p.S);
  std::vector<double> probs(S), keep(S), dprobs(S), dscores(S), capped(S), dq(static_cast<std::size_t>(p.E));
  // dK and dV of every KV matrix, summed over the query heads that read it.
  const std::size_t kv_matrices = static_cast<std::size_t>(p.batch * p.heads_kv);
  std::vector<double> dk(kv_matrices * S * static_cast<std::size_t>(p.E), 0.0);
  std::vector<double> dv(kv_matrices * S * static_cast<std::size_t>(p.Ev), 0.0);
  auto dk_at = [&](std::int64_t m, std::int64_t j, std::int64_t e) -> double& {
    return dk[(static_cast<std::size_t>(m) * S + static_cast<std::size_t>(j)) * static_cast<std::size_t>(p.E) +
              static_cast<std::size_t>(e)];
  };
  auto dv_at = [&](std::int64_t m, std::int64_t j, std::int64_t c) -> double& {
    return dv[(static_cast<std::size_t>(m) * S + static_cast<std::size_t>(j)) * static_cast<std::size_t>(p.Ev) +
              static_cast<std::size_t>(c)];
  };

  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t qm = p.q_matrix(b, h), kvm = p.kv_matrix(b, h);
      for (std::int64_t i = 0; i < p.L; ++i) {
        // Scores and softmax, as the forward; a fully masked row has P = 0 and so every gradient 0.
        const std::vector<double> scores = scaled_masked_scores(p, qm, kvm, i, &capped);
        const auto [row_max, sum, fully_masked] = softmax_normaliser(scores, p.sink(qm));
        for (std::size_t j = 0; j < S; ++j) {
          probs[j] = fully_masked ? 0.0 : std::exp(scores[j] - row_max) / sum;
          keep[j] = p.dropout_p > 0.0
                        ? (dropout.keep(p.first_batch + b, h, i, static_cast<std::int64_t>(j)) ? keep_scale : 0.0)
                        : 1.0;
        }

        // dW_j = dO_i · v_j,  dP_j = dW_j Z_j,  D = Σ_j P_j dP_j.
        double D = 0.0;
        for (std::int64_t j = 0; j < p.S; ++j) {
          double dw = 0.0;
          for (std::int64_t c = 0; c < p.Ev; ++c)
            dw += p.grad_output.load<double>(qm, i, c) * p.value.load<double>(kvm, j, c);
          dprobs[static_cast<std::size_t>(j)] = dw * keep[static_cast<std::size_t>(j)];
          D += probs[static_cast<std::size_t>(j)] * dprobs[static_cast<std::size_t>(j)];
        }
        if (p.grad_lse.present()) D -= p.grad_lse.load<double>(qm, i, 0);
        for (std::size_t j = 0; j < S; ++j) dscores[j] = fully_masked ? 0.0 : probs[j] * (dprobs[j] - D);

        // dq = scale Σ_j dS_j k_j;  dK_j += scale dS_j q;  dV_j += W_j dO_i;  dmask = dS.
        std::fill(dq.begin(), dq.end(), 0.0);
        for (std::int64_t j = 0; j < p.S; ++j) {
          const double t = capped[static_cast<std::size_t>(j)];  // 0 without softcap
          const double ds = dscores[static_cast<std::size_t>(j)] * (1.0 - t * t);
          const double w = probs[static_cast<std::size_t>(j)] * keep[static_cast<std::size_t>(j)];
          if (fully_masked) continue;  // P = 0: nothing flows (and 0 · NaN must not appear)
          for (std::int64_t e = 0; e < p.E; ++e) {
            dq[static_cast<std::size_t>(e)] += p.scale * ds * p.key.load<double>(kvm, j, e);
            dk_at(kvm, j, e) += p.scale * ds * p.query.load<double>(qm, i, e);
          }
          for (std::int64_t c = 0; c < p.Ev; ++c) dv_at(kvm, j, c) += w * p.grad_output.load<double>(qm, i, c);
        }
        for (std::int64_t e = 0; e < p.E; ++e) p.grad_query.store<double>(qm, i, e, dq[static_cast<std::size_t>(e)]);
        if (p.grad_mask.present())
          for (std::int64_t j = 0; j < p.S; ++j)
            p.grad_mask.store<double>(qm, i, j, dscores[static_cast<std::size_t>(j)]);
      }
    }
  }
  for (std::int64_t m = 0; m < p.batch * p.heads_kv; ++m)
    for (std::int64_t j = 0; j < p.S; ++j) {
      for (std::int64_t e = 0; e < p.E; ++e) p.grad_key.store<double>(m, j, e, dk_at(m, j, e));
      for (std::int64_t c = 0; c < p.Ev; ++c) p.grad_value.store<double>(m, j, c, dv_at(m, j, c));
    }
}

}  // namespace sdpa::detail
