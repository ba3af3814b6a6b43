// Portable tiled backward (FlashAttention-2's, Dao 2023, made deterministic without
// atomics). Per (query tile × key tile), with P recomputed from the log-sum-exp the
// forward returned, so no L×S matrix is ever held:
//   P   = exp(S − lse)              S = C − ALiBi + mask (−inf where masked),
//                                   C = Q Kᵀ · scale, or softcap · tanh(Q Kᵀ · scale / softcap)
//   W   = P ∘ Z                     Z = keep/(1−p), regenerated from the Philox counter
//   dP  = (dO Vᵀ) ∘ Z
//   dS  = P ∘ (dP − D)              D = rowsum(dO ∘ O), once per query row
//   dC  = dS ∘ (1 − tanh²)          with softcap (dmask = dS: the mask is added after the cap)
// and then
//   pass 1, a task per (batch, KV head, key tile), owning those rows of dK and dV:
//       dV += Wᵀ dO,   dK += scale · dSᵀ Q    over every query tile of every query head
//                                             of the GQA group, in a fixed order;
//   pass 2, a task per (batch, query head, query tile), owning those rows of dQ:
//       dQ += scale · dS K                    over every key tile, and dmask = dS.
// Each output element is summed by one task in one order: bitwise the same for any
// thread count. The price is that S and dP are computed twice (7 matrix products where
// FlashAttention's atomics need 5); the SIMD kernel avoids it (simd/backward.cpp).
#include "cpu/portable/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/philox.h"
#include "cpu/portable/score_modifiers.h"
#include "cpu/portable/tiles.h"
#include "cpu/scratch.h"

namespace sdpa::detail {
namespace portable {
namespace {

constexpr std::int64_t kQueryTile = 32;
constexpr std::int64_t kKeyTile = 64;

template <class T>
struct Scratch {
  std::vector<T> q, dout, k, v, lse, D;  // packed tiles; lse and D per query row
  std::vector<T> probs, dscores;         // W and dS (dC with softcap) of a tile (rows × kKeyTile)
  std::vector<T> acc_a, acc_b;           // pass 1: dK, dV of the key tile; pass 2: dQ
  explicit Scratch(const BackwardProblem& p)
      : q(kQueryTile * p.E),
        dout(kQueryTile * p.Ev),
        k(kKeyTile * p.E),
        v(kKeyTile * p.Ev),
        lse(kQueryTile),
        D(kQueryTile),
        probs(kQueryTile * kKeyTile),
        dscores(kQueryTile * kKeyTile),
        acc_a(std::max(kKeyTile, kQueryTile) * p.E),
        acc_b(kKeyTile * p.Ev) {}
};

// Q, dO, lse and D = rowsum(dO ∘ O) (− dlse) of query rows [i0, i0+rows) of matrix qm.
template <class T>
void pack_queries(const BackwardProblem& p, Scratch<T>& s, std::int64_t qm, std::int64_t i0, std::int64_t rows) {
  pack_rows<T>(p.query, qm, i0, rows, p.E, s.q.data());
  pack_rows<T>(p.grad_output, qm, i0, rows, p.Ev, s.dout.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    s.lse[r] = p.lse.load<T>(qm, i0 + r, 0);
    T d = 0;
    for (std::int64_t c = 0; c < p.Ev; ++c) d += s.dout[r * p.Ev + c] * p.output.load<T>(qm, i0 + r, c);
    // A gradient of the returned lse adds P · dlse to dS: D − dlse in dS = P (dP − D).
    if (p.grad_lse.present()) d -= p.grad_lse.load<T>(qm, i0 + r, 0);
    s.D[r] = d;
  }
}

// W and dS of query rows [i0, i0+rows) (packed in s.q, s.dout, s.lse, s.D) against
// keys [j0, j0+cols) (packed in s.k, s.v), into s.probs and s.dscores; the mask
// gradient dS into grad_mask when `store_mask_gradient` (pass 2 only: written once).
template <class T>
void tile_gradients(const BackwardProblem& p, Scratch<T>& s, std::int64_t b, std::int64_t h, std::int64_t i0,
                    std::int64_t rows, std::int64_t j0, std::int64_t cols, bool store_mask_gradient) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  const std::int64_t qm = p.q_matrix(b, h);
  T* probs = s.probs.data();
  T* dscores = s.dscores.data();
  score_tile<T>(s.q.data(), s.k.data(), rows, cols, p.E, static_cast<T>(p.scale), probs, kKeyTile);
  score_tile<T>(s.dout.data(), s.v.data(), rows, cols, p.Ev, T{1}, dscores, kKeyTile);  // dO Vᵀ
  const DropoutMask dropout(p.dropout_p, p.seed, p.offset, p.query_offset, p.key_offset);
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p.dropout_p));
  T keep[kKeyTile];  // Z of one row: keep/(1−p) or 0
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = i0 + r;
    const std::int64_t begin = p.key_begin(i) - j0, end = p.key_end(i) - j0;  // visible: [begin, end)
    const T lse = s.lse[r];
    std::fill(keep, keep + cols, T{1});
    if (p.dropout_p > 0.0)
      dropout.for_each_key(p.first_batch + b, h, i, j0, cols,
                           [&](std::int64_t c, bool kept) { keep[c] = kept ? keep_scale : T{0}; });
    for (std::int64_t c = 0; c < cols; ++c) {
      T tanh_capped;
      const T score = modified_score<T>(p, qm, i, j0 + c, probs[r * kKeyTile + c], c >= begin && c < end,
                                        &tanh_capped);
      // A fully masked row has lse = −inf: P = 0 there, not exp(−inf + inf) = NaN.
      const T prob = lse == kMinusInf ? T{0} : std::exp(score - lse);
      const T dprob = dscores[r * kKeyTile + c] * keep[c];
      probs[r * kKeyTile + c] = prob * keep[c];
      const T dscore = prob == T{0} ? T{0} : prob * (dprob - s.D[r]);
      if (store_mask_gradient) p.grad_mask.store<T>(qm, i, j0 + c, dscore);
      // Softcap's factor leaves a dS of 0 at 0: a masked NaN key's tanh is NaN (as in
      // simd/backward.cpp).
      dscores[r * kKeyTile + c] = dscore == T{0} ? T{0} : dscore * (T{1} - tanh_capped * tanh_capped);
    }
  }
}

// Pass 1: dK and dV of keys [j0, j0+cols) of KV matrix (b, head_kv).
template <class T>
void key_tile(const BackwardProblem& p, Scratch<T>& s, std::int64_t b, std::int64_t head_kv, std::int64_t j0) {
  const std::int64_t kvm = b * p.heads_kv + head_kv;
  const std::int64_t cols = std::min(kKeyTile, p.S - j0);
  const std::int64_t group = p.heads_q / p.heads_kv;
  pack_rows<T>(p.key, kvm, j0, cols, p.E, s.k.data());
  pack_rows<T>(p.value, kvm, j0, cols, p.Ev, s.v.data());
  T* dk = s.acc_a.data();
  T* dv = s.acc_b.data();
  std::fill(dk, dk + cols * p.E, T{0});
  std::fill(dv, dv + cols * p.Ev, T{0});
  for (std::int64_t h = head_kv * group; h < (head_kv + 1) * group; ++h) {
    const std::int64_t qm = p.q_matrix(b, h);
    for (std::int64_t i0 = 0; i0 < p.L; i0 += kQueryTile) {
      const std::int64_t rows = std::min(kQueryTile, p.L - i0);
      // Causal, window: no row of the tile sees these keys.
      if (p.key_end(i0 + rows - 1) <= j0 || p.key_begin(i0) >= j0 + cols) continue;
      pack_queries(p, s, qm, i0, rows);
      tile_gradients(p, s, b, h, i0, rows, j0, cols, false);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          const T w = s.probs[r * kKeyTile + c], ds = s.dscores[r * kKeyTile + c];
          for (std::int64_t d = 0; d < p.Ev; ++d) dv[c * p.Ev + d] += w * s.dout[r * p.Ev + d];
          for (std::int64_t e = 0; e < p.E; ++e) dk[c * p.E + e] += ds * s.q[r * p.E + e];
        }
    }
  }
  const T scale = static_cast<T>(p.scale);
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t e = 0; e < p.E; ++e) p.grad_key.store<T>(kvm, j0 + c, e, dk[c * p.E + e] * scale);
    for (std::int64_t d = 0; d < p.Ev; ++d) p.grad_value.store<T>(kvm, j0 + c, d, dv[c * p.Ev + d]);
  }
}

// Pass 2: dQ (and dmask) of query rows [i0, i0+rows) of query matrix (b, h).
template <class T>
void query_tile(const BackwardProblem& p, Scratch<T>& s, std::int64_t b, std::int64_t h, std::int64_t i0) {
  const std::int64_t qm = p.q_matrix(b, h), kvm = p.kv_matrix(b, h);
  const std::int64_t rows = std::min(kQueryTile, p.L - i0);
  T* dq = s.acc_a.data();
  std::fill(dq, dq + rows * p.E, T{0});
  pack_queries(p, s, qm, i0, rows);
  for_each_key_tile<T>(p, kvm, visible_keys(p, i0, rows, kKeyTile), kKeyTile, s.k.data(), s.v.data(),
                       [&](std::int64_t j0, std::int64_t cols) {
                         tile_gradients(p, s, b, h, i0, rows, j0, cols, p.grad_mask.present());
                         accumulate_pv<T>(s.dscores.data(), s.k.data(), rows, cols, p.E, kKeyTile, dq);
                       });
  const T scale = static_cast<T>(p.scale);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t e = 0; e < p.E; ++e) p.grad_query.store<T>(qm, i0 + r, e, dq[r * p.E + e] * scale);
}

template <class T>
void run(const BackwardProblem& p) {
  const int threads = p.threads(omp_get_max_threads());
  const std::int64_t key_tiles = (p.S + kKeyTile - 1) / kKeyTile;
  const std::int64_t query_tiles = (p.L + kQueryTile - 1) / kQueryTile;
  const std::int64_t key_tasks = p.batch * p.heads_kv * key_tiles;
  const std::int64_t query_tasks = p.batch * p.heads_q * query_tiles;
  const bool parallel = key_tasks + query_tasks > 2;
  const auto scratch_of_thread = scratch_per_thread<Scratch<T>>(parallel ? threads : 1, p);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    Scratch<T>& scratch = *scratch_of_thread[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < key_tasks; ++t)
      key_tile(p, scratch, t / (p.heads_kv * key_tiles), (t / key_tiles) % p.heads_kv, (t % key_tiles) * kKeyTile);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < query_tasks; ++t)
      query_tile(p, scratch, t / (p.heads_q * query_tiles), (t / query_tiles) % p.heads_q,
                 (t % query_tiles) * kQueryTile);
  }
}

}  // namespace
}  // namespace portable

void portable_backward(const BackwardProblem& problem) {
  if (problem.float64)
    portable::run<double>(problem);
  else
    portable::run<float>(problem);
}

}  // namespace sdpa::detail
