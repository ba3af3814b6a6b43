// Tiled forward with the online-softmax recurrence (Milakov & Gimelshein 2018;
// FlashAttention-2). For each query row, over key tiles t:
//   m_t   = max(m_{t−1}, max_j s_j)                  running maximum
//   α     = exp(m_{t−1} − m_t)                       rescales what came before
//   l_t   = α·l_{t−1} + Σ_j exp(s_j − m_t)           running sum (before dropout)
//   acc_t = α·acc_{t−1} + Σ_j drop_j·exp(s_j − m_t)·v_j
// and at the end  O = acc / l,  lse = m + log l, after an attention sink, when given,
// joins (m, l) as one more term with no value.
// No L×S buffer: the extra memory is a few tiles per thread. When the weights are
// asked for, a second pass recomputes the scores with the final (m, l).
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

constexpr std::int64_t kQueryTile = 32;  // rows of Q per task
constexpr std::int64_t kKeyTile = kPortableKeyTile;  // keys per inner step

// Max that propagates NaN (pytorch#141128: NaN must reach the output).
template <class T>
T nan_max(T a, T b) {
  return (a != a || a > b) ? a : b;
}

// Per-thread scratch: packed tiles in the accumulation type.
template <class T>
struct Scratch {
  std::vector<T> q, k, v, scores, acc, row_max, row_sum;
  explicit Scratch(const Problem& p)
      : q(kQueryTile * p.E),
        k(kKeyTile * p.E),
        v(kKeyTile * p.Ev),
        scores(kQueryTile * kKeyTile),
        acc(kQueryTile * p.Ev),
        row_max(kQueryTile),
        row_sum(kQueryTile) {}
};

// Scores of query rows [i0, i0+rows) against keys [j0, j0+cols): scaled, softcapped,
// ALiBi-biased, masked; −inf where causal, the window or a bool mask excludes the key.
template <class T>
void masked_scores(const Problem& p, Scratch<T>& s, std::int64_t qm, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols) {
  score_tile<T>(s.q.data(), s.k.data(), rows, cols, p.E, static_cast<T>(p.scale), s.scores.data(), kKeyTile);
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = s.scores.data() + r * kKeyTile;
    const std::int64_t begin = p.key_begin(i0 + r) - j0, end = p.key_end(i0 + r) - j0;  // visible: [begin, end)
    for (std::int64_t c = 0; c < cols; ++c)
      row[c] = modified_score<T>(p, qm, i0 + r, j0 + c, row[c], c >= begin && c < end);
  }
}

// Multiplies the probabilities of row i by the dropout decision: kept → ·1/(1−p),
// dropped → 0.
template <class T>
void apply_dropout(const DropoutMask& dropout, T keep_scale, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::int64_t j0, std::int64_t cols, T* probabilities) {
  dropout.for_each_key(b, h, i, j0, cols, [&](std::int64_t c, bool kept) {
    probabilities[c] = kept ? probabilities[c] * keep_scale : T{0};
  });
}

// Folds an attention sink into a row's final state: the sink is one more logit, in the
// sum and the maximum, whose value row is 0. Afterwards m is finite (sink or larger),
// so a row whose keys were all masked gives output 0 and lse = sink.
template <class T>
void fold_sink(T sink, T& row_max, T& row_sum, T* acc, std::int64_t Ev) {
  if (sink == -std::numeric_limits<T>::infinity()) return;  // no sink (and no −inf − −inf)
  const T new_max = nan_max(row_max, sink);
  const T alpha = std::exp(row_max - new_max);  // 0 when no key was visible (m = −inf)
  row_sum = row_sum * alpha + std::exp(sink - new_max);
  row_max = new_max;
  for (std::int64_t d = 0; d < Ev; ++d) acc[d] *= alpha;
}

template <class T>
void query_tile(const Problem& p, Scratch<T>& s, std::int64_t b, std::int64_t h, std::int64_t i0) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  const std::int64_t qm = p.q_matrix(b, h), kvm = p.kv_matrix(b, h);
  const std::int64_t rows = std::min(kQueryTile, p.L - i0);
  const bool dropping = p.dropout_p > 0.0;
  const DropoutMask dropout(p.dropout_p, p.seed, p.offset, p.query_offset, p.key_offset);
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p.dropout_p));

  pack_rows<T>(p.query, qm, i0, rows, p.E, s.q.data());
  // A resumed row's entry: (m, l, acc[Ev]) of the keys of the calls before (problem.h).
  T* const carried = p.carried.present()
                         ? static_cast<T*>(p.carried.rows) + (qm * p.carried.matrix_stride + i0) * (p.Ev + 2)
                         : nullptr;
  if (carried) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* entry = carried + r * (p.Ev + 2);
      s.row_max[r] = entry[0];
      s.row_sum[r] = entry[1];
      std::copy(entry + 2, entry + 2 + p.Ev, s.acc.begin() + r * p.Ev);
    }
  } else {
    std::fill(s.acc.begin(), s.acc.begin() + rows * p.Ev, T{0});
    std::fill(s.row_max.begin(), s.row_max.end(), kMinusInf);
    std::fill(s.row_sum.begin(), s.row_sum.end(), T{0});
  }

  const VisibleKeys visible = visible_keys(p, i0, rows, kKeyTile);
  for_each_key_tile<T>(p, kvm, visible, kKeyTile, s.k.data(), s.v.data(), [&](std::int64_t j0, std::int64_t cols) {
    masked_scores(p, s, qm, i0, rows, j0, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = s.scores.data() + r * kKeyTile;
      T tile_max = kMinusInf;
      for (std::int64_t c = 0; c < cols; ++c) tile_max = nan_max(tile_max, row[c]);
      const T new_max = nan_max(s.row_max[r], tile_max);
      if (new_max == kMinusInf) {  // every key so far masked: nothing to add
        std::fill(row, row + cols, T{0});
        continue;
      }
      const T alpha = std::exp(s.row_max[r] - new_max);  // exp(−inf) = 0 on the first visible tile
      T tile_sum = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        row[c] = std::exp(row[c] - new_max);
        tile_sum += row[c];
      }
      s.row_sum[r] = s.row_sum[r] * alpha + tile_sum;
      s.row_max[r] = new_max;
      T* acc_row = s.acc.data() + r * p.Ev;
      for (std::int64_t d = 0; d < p.Ev; ++d) acc_row[d] *= alpha;
      if (dropping) apply_dropout(dropout, keep_scale, p.first_batch + b, h, i0 + r, j0, cols, row);
    }
    accumulate_pv<T>(s.scores.data(), s.v.data(), rows, cols, p.Ev, kKeyTile, s.acc.data());
  });

  if (carried && p.carried.suspend) {  // more keys to come: the state, un-normalised
    for (std::int64_t r = 0; r < rows; ++r) {
      T* entry = carried + r * (p.Ev + 2);
      entry[0] = s.row_max[r];
      entry[1] = s.row_sum[r];
      std::copy(s.acc.begin() + r * p.Ev, s.acc.begin() + (r + 1) * p.Ev, entry + 2);
    }
    return;
  }

  if (p.has_sinks())
    for (std::int64_t r = 0; r < rows; ++r)
      fold_sink(static_cast<T>(p.sink(qm)), s.row_max[r], s.row_sum[r], s.acc.data() + r * p.Ev, p.Ev);

  // O = acc / l, lse = m + log l; a fully masked row (m = −inf) gives 0 and −inf.
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool fully_masked = s.row_max[r] == kMinusInf;
    const T inverse_sum = fully_masked ? T{0} : T{1} / s.row_sum[r];
    for (std::int64_t d = 0; d < p.Ev; ++d)
      p.output.store<T>(qm, i0 + r, d, fully_masked ? T{0} : s.acc[r * p.Ev + d] * inverse_sum);
    if (p.lse.present())
      p.lse.store<T>(qm, i0 + r, 0, fully_masked ? kMinusInf : s.row_max[r] + std::log(s.row_sum[r]));
  }

  if (!p.weights.present()) return;
  // Second pass for the weights: exp(s − m) / l, after dropout; 0 outside the visible keys.
  for (std::int64_t j0 = 0; j0 < p.S; j0 += kKeyTile) {
    const std::int64_t cols = std::min(kKeyTile, p.S - j0);
    const bool seen = j0 >= visible.start && j0 < visible.limit;
    if (seen) {
      pack_kv_rows<T>(p.key, p.key_scale, kvm, j0, cols, p.E, s.k.data());
      masked_scores(p, s, qm, i0, rows, j0, cols);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = s.scores.data() + r * kKeyTile;
      const bool fully_masked = s.row_max[r] == kMinusInf;
      if (fully_masked) {
        std::fill(row, row + cols, T{0});
      } else if (!seen) {
        // Causally masked keys: exp(−inf − m) is 0, or NaN when m is (a NaN row is
        // NaN throughout, as in PyTorch's softmax).
        std::fill(row, row + cols, std::exp(kMinusInf - s.row_max[r]));
      } else {
        const T inverse_sum = T{1} / s.row_sum[r];
        for (std::int64_t c = 0; c < cols; ++c) row[c] = std::exp(row[c] - s.row_max[r]) * inverse_sum;
        if (dropping) apply_dropout(dropout, keep_scale, p.first_batch + b, h, i0 + r, j0, cols, row);
      }
      for (std::int64_t c = 0; c < cols; ++c) p.weights.store<T>(qm, i0 + r, j0 + c, row[c]);
    }
  }
}

template <class T>
void run(const Problem& p) {
  const std::int64_t tiles_per_head = (p.L + kQueryTile - 1) / kQueryTile;
  const std::int64_t tasks = p.batch * p.heads_q * tiles_per_head;
  // Each task owns its query rows of every output, and its result does not depend on
  // which thread runs it: bitwise the same for any thread count.
  const int threads = p.threads(omp_get_max_threads());
  const auto scratch_of_thread = scratch_per_thread<Scratch<T>>(tasks > 1 ? threads : 1, p);
#pragma omp parallel num_threads(threads) if (tasks > 1)
  {
    Scratch<T>& scratch = *scratch_of_thread[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t tile = task % tiles_per_head;
      const std::int64_t head = (task / tiles_per_head) % p.heads_q;
      const std::int64_t batch = task / (tiles_per_head * p.heads_q);
      query_tile(p, scratch, batch, head, tile * kQueryTile);
    }
  }
}

}  // namespace
}  // namespace portable

void portable_forward(const Problem* problems, std::int64_t count) {
  for (std::int64_t n = 0; n < count; ++n) {
    const Problem& p = problems[n];
    if (p.batch * p.heads_q * p.L == 0) continue;  // no rows
    if (p.float64)
      portable::run<double>(p);
    else
      portable::run<float>(p);
  }
}

}  // namespace sdpa::detail
