// The fast CPU backward's task, for float32, bfloat16 and float16 inputs (float32
// arithmetic), with the forward's layout (simd/forward_task-inl.h): tiles held
// *transposed*, query rows along the vector lanes, scores in log2 units (Q
// pre-multiplied by scale·log2 e).
//
// Per key tile of K, V (read in place) and subtile of query rows, with P recomputed
// from the forward's log-sum-exp (lse2 = lse·log2 e), so no L×S matrix is ever held:
//   Sᵀ[c][r]  = Σ_e K[c][e] · Qᵀ[e][r]              (broadcast K[c][e] against a Qᵀ row)
//   dPᵀ[c][r] = Σ_d V[c][d] · dOᵀ[d][r]             (the same kernel on V and dOᵀ)
//   Pᵀ = 2^(Sᵀ − lse2),  Wᵀ = Pᵀ ∘ Z,  dSᵀ = Pᵀ ∘ (dPᵀ ∘ Z − D)   (lane-wise; D = rowsum(dO ∘ O))
//   (softcap: Sᵀ = C·tanh(Sᵀ/C) before the mask, and dSᵀ ∘= 1 − tanh² after dmask = dSᵀ)
//   dQᵀ[e][r] += Σ_c K[c][e] · dSᵀ[c][r]            (broadcast K[c][e] against a dSᵀ row)
//   dV[c][·]  += Σ_r Wᵀ[c][r]  · dO[r][·]           (broadcast Wᵀ[c][r] against a dO row)
//   dK[c][·]  += Σ_r dSᵀ[c][r] · Q[r][·]            (broadcast dSᵀ[c][r] against a Q row)
// and at the end dQ·scale, dK·scale, dV. Five matrix products, as FlashAttention-2.
//
// bfloat16 Q, K and V on a CPU whose `vdpbf16ps` outruns its FMAs (bf16::chosen,
// simd/bf16_kernels.h; elsewhere widened to float32 as above): the five products
// take bfloat16 operands — Q, K, V and dO as given, P (Wᵀ) and dS rounded to bfloat16 as
// FlashAttention's bf16 backward rounds them — and add in float32; the softmax, dS and D
// stay float32 as above.
//
// Determinism without atomics: a task is (batch, KV head, key chunk). It owns dK and dV
// of its keys, accumulated over every query row of the GQA group (rows flattened over
// (group heads × L), in order), so they are stored once, complete. With one chunk the
// task sees every key, so it owns dQ of the group's rows too: five products. With several
// chunks (few heads, long sequences) the tasks compute dK and dV only, and a second pass
// over query blocks computes dQ, recomputing S and dP: seven products, but no partial dQ
// per chunk to hold (DESIGN.md §5: extra memory O(threads × tile)). Each gradient
// element is summed by one task in the same order however the keys are chunked (see
// schedule_backward in work_split.h): bitwise the same results for any thread count.
//
// This file is how one task computes (`Task`); backward.cpp runs the tasks (the schedule,
// the threads), and the task's memory is simd/backward_scratch-inl.h. Included once per
// Highway target by backward.cpp alone (hence the toggling include guard, Highway's
// convention for per-target headers, and the anonymous namespace: its names are that one
// file's).
#if defined(SDPA_CPU_SIMD_BACKWARD_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_BACKWARD_TASK_INL_H_
#undef SDPA_CPU_SIMD_BACKWARD_TASK_INL_H_
#else
#define SDPA_CPU_SIMD_BACKWARD_TASK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "common/backward_problem.h"
#include "cpu/simd/bf16_kernels.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/backward_scratch-inl.h"
#include "cpu/simd/exp2-inl.h"
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"
#include "cpu/simd/score_modifiers-inl.h"
#include "cpu/simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp): included by backward.cpp alone

using namespace simd;  // NOLINT(google-build-using-namespace): the pieces shared with the forward

constexpr float kInf = std::numeric_limits<float>::infinity();

// One key tile's K and V as the kernels read them: float32 rows, or bfloat16 rows.
struct KeyValueTile {
  const float *k = nullptr, *v = nullptr;
  const std::uint16_t *k16 = nullptr, *v16 = nullptr;
  std::int64_t k_stride = 0, v_stride = 0;
};

class Task {
 public:
  Task(const BackwardProblem& p, Scratch& s) : p_(p), s_(s), n_(hn::Lanes(DF())) {}

  // dK and dV of keys [key_begin, key_end) of KV head `head_kv` of batch `b`, complete;
  // with `query_gradient` (the keys are all of them), dQ of all the group's query rows too.
  void Run(std::int64_t b, std::int64_t head_kv, std::int64_t key_begin, std::int64_t key_end, bool query_gradient) {
    b_ = b;
    kvm_ = b * p_.heads_kv + head_kv;
    key_begin_ = key_begin;
    key_gradients_ = true;
    query_gradient_ = query_gradient;
    const std::int64_t keys = key_end - key_begin;
    std::fill(s_.dk.get(), s_.dk.get() + RoundUp(keys, kKeyTile) * s_.E_pad, 0.0f);
    std::fill(s_.dv.get(), s_.dv.get() + RoundUp(keys, kKeyTile) * s_.Ev_pad, 0.0f);
    const std::int64_t group_rows = (p_.heads_q / p_.heads_kv) * p_.L;
    const std::int64_t block_rows = static_cast<std::int64_t>(s_.block_rows);
    for (std::int64_t row0 = 0; row0 < group_rows; row0 += block_rows) {
      const std::int64_t row_count = std::min(block_rows, group_rows - row0);
      SetRows(head_kv, row0, row_count);
      BlockKeys(key_begin, key_end, row_count);
    }
    StoreKeyGradients(keys);
  }

  // dQ of the flattened group rows [row0, row0 + row_count) (one block) of KV head
  // `head_kv` of batch `b`, over every key: the second pass when keys come in chunks.
  void RunQueries(std::int64_t b, std::int64_t head_kv, std::int64_t row0, std::int64_t row_count) {
    b_ = b;
    kvm_ = b * p_.heads_kv + head_kv;
    key_begin_ = 0;
    key_gradients_ = false;
    query_gradient_ = true;
    SetRows(head_kv, row0, row_count);
    BlockKeys(0, p_.S, row_count);
  }

 private:
  // The current block's rows against the key tiles of [key_begin, key_end) that some row
  // sees; then its dQ, when this pass computes it (0 when the block sees none of them).
  void BlockKeys(std::int64_t key_begin, std::int64_t key_end, std::int64_t row_count) {
    std::int64_t key_start = p_.S, key_limit = 0;
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      const Subtile& t = s_.sub[g];
      if (t.key_limit > t.key_start) key_start = std::min(key_start, t.key_start);
      key_limit = std::max(key_limit, t.key_limit);
    }
    const std::int64_t end = std::min(key_end, key_limit);
    if (key_start < end) {
      PackBlock();
      for (std::int64_t j0 = FirstTile(key_begin, key_start, kKeyTile); j0 < end; j0 += kKeyTile)
        KeyTile(j0, std::min(kKeyTile, end - j0), row_count);
    } else {
      for (std::int64_t g = 0; g < subtiles_; ++g)
        std::fill(s_.sub[g].dqt.get(), s_.sub[g].dqt.get() + p_.E * s_.rows, 0.0f);
    }
    if (query_gradient_) StoreQueryGradient();
  }

 private:
  // Flattened group rows [row0, row0 + row_count), spread over the subtiles.
  void SetRows(std::int64_t head_kv, std::int64_t row0, std::int64_t row_count) {
    const std::int64_t per_subtile = static_cast<std::int64_t>(s_.rows);
    subtiles_ = (row_count + per_subtile - 1) / per_subtile;
    for (std::int64_t g = 0; g < subtiles_; ++g)
      AssignRows(p_, b_, head_kv, row0 + g * per_subtile, std::min(per_subtile, row_count - g * per_subtile),
                 s_.sub[g]);
  }

  // Qᵀ (scaled to log2 units; bfloat16: unscaled, then in pairs), dOᵀ, lse2 and D per
  // subtile; Q and dO row-major for the block (bfloat16: in pairs of rows too). Padding
  // rows (zero, lse2 = +inf) are the block's last rows: the dK/dV updates stop before them
  // (bfloat16: an odd count's partner row gets weight 0) and their dQ is never stored, so
  // whatever they compute is unused.
  void PackBlock() {
    const float c = static_cast<float>(p_.scale * kLog2e);
    const std::int64_t R = static_cast<std::int64_t>(s_.rows);
    float* buffer = s_.row_buffer.get();
    std::fill(s_.q_rows.get(), s_.q_rows.get() + s_.block_rows * s_.E_pad, 0.0f);
    std::fill(s_.do_rows.get(), s_.do_rows.get() + s_.block_rows * s_.Ev_pad, 0.0f);
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      Subtile& t = s_.sub[g];
      std::fill(t.dqt.get(), t.dqt.get() + p_.E * R, 0.0f);
      std::fill(t.lse2.get(), t.lse2.get() + R, kInf);
      std::fill(t.D.get(), t.D.get() + R, 0.0f);
      for (std::int64_t r = 0; r < static_cast<std::int64_t>(t.rows.size()); ++r) {
        const Row& row = t.rows[r];
        float* q_row = s_.q_rows.get() + (g * R + r) * s_.E_pad;
        LoadRow(p_.query, row.matrix, row.i, 0, p_.E, q_row);
        float* do_row = s_.do_rows.get() + (g * R + r) * s_.Ev_pad;
        LoadRow(p_.grad_output, row.matrix, row.i, 0, p_.Ev, do_row);
        LoadRow(p_.output, row.matrix, row.i, 0, p_.Ev, buffer);
        double d = 0;  // D = dO·O, in float64: one short sum per row
        for (std::int64_t e = 0; e < p_.Ev; ++e) d += static_cast<double>(do_row[e]) * buffer[e];
        // A gradient of the returned lse adds P · dlse to dS: D − dlse in dS = P (dP − D).
        if (p_.grad_lse.present()) d -= p_.grad_lse.load<double>(row.matrix, row.i, 0);
        t.D[r] = static_cast<float>(d);
        const double lse = p_.lse.load<double>(row.matrix, row.i, 0);
        // A fully masked row (lse = −inf) gets +inf: 2^(s − inf) = 0 for every score.
        t.lse2[r] = lse == -std::numeric_limits<double>::infinity() ? kInf : static_cast<float>(lse * kLog2e);
      }
      // Qᵀ and dOᵀ from the zero-padded row-major copies, padding rows included.
      const auto E = static_cast<std::size_t>(p_.E), Ev = static_cast<std::size_t>(p_.Ev);
      Transpose(s_.q_rows.get() + g * R * s_.E_pad, static_cast<std::size_t>(s_.E_pad), s_.rows, E, t.qt.get(),
                s_.rows);
      Transpose(s_.do_rows.get() + g * R * s_.Ev_pad, static_cast<std::size_t>(s_.Ev_pad), s_.rows, Ev, t.dot.get(),
                s_.rows);
      if (s_.bf16) {  // pairs along E and Ev of the unscaled values (score_block scales)
        bf16::pack_along_width(t.qt.get(), p_.E, R, t.qp.get());
        bf16::pack_along_width(t.dot.get(), p_.Ev, R, t.dop.get());
      } else {
        for (std::size_t x = 0; x < E * s_.rows; ++x) t.qt[x] *= c;
      }
    }
    if (s_.bf16) {
      const auto pairs = static_cast<std::int64_t>(s_.block_rows / 2);
      bf16::pack_pairs(s_.q_rows.get(), s_.E_pad, pairs, s_.E_pad, s_.q_pairs.get());
      bf16::pack_pairs(s_.do_rows.get(), s_.Ev_pad, pairs, s_.Ev_pad, s_.do_pairs.get());
    }
  }

  // Keys [j0, j0+cols) of the chunk (the block's rows see none past them).
  void KeyTile(std::int64_t j0, std::int64_t cols, std::int64_t row_count) {
    const std::int64_t padded = RoundUp(cols, kKeyBlock);
    KeyValueTile kv;
    if (s_.bf16) {  // (Ev > 0 there)
      kv.k16 = Bf16Rows(p_.key, kvm_, j0, cols, padded, p_.E, true, s_.k16.get(), &kv.k_stride);
      kv.v16 = Bf16Rows(p_.value, kvm_, j0, cols, padded, p_.Ev, true, s_.v16.get(), &kv.v_stride);
      packed_key_rows_ = 0;
    } else {
      kv.k = KeyValueRows(p_.key, kvm_, j0, cols, padded, p_.E, s_.k_tile.get(), &kv.k_stride);
      kv.v = p_.Ev == 0 ? s_.v_tile.get()  // Ev = 0: dP = 0, and V may have no memory
                        : KeyValueRows(p_.value, kvm_, j0, cols, padded, p_.Ev, s_.v_tile.get(), &kv.v_stride);
    }
    const std::int64_t R = static_cast<std::int64_t>(s_.rows);
    const std::size_t BR = s_.block_rows;
    std::int64_t first_active = -1, last_active = -1;
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      Subtile& t = s_.sub[g];
      const std::int64_t visible = std::min(cols, t.key_limit - j0);
      if (visible <= 0 || j0 + visible <= t.key_start || !Gradients(t, g, j0, visible, padded, kv)) {
        if (key_gradients_) ZeroColumns(g, padded);  // the rank updates below read every row of the block
        continue;
      }
      if (first_active < 0) first_active = g;
      last_active = g;
      // dQᵀ += K ⊗ dSᵀ over the keys these rows see.
      // (bfloat16: the key pairs stop at `visible`; K is packed once for the subtiles that
      // see the same keys.)
      if (query_gradient_) {
        if (s_.bf16)
          bf16::accumulate_keys(s_.dpt.get() + g * R, static_cast<std::int64_t>(BR), visible, cols, kv.k16, kv.k_stride,
                                p_.E, s_.pp.get(), s_.kp.get(), &packed_key_rows_, t.dqt.get());
        else
          simd::Accumulate(s_.dpt.get() + g * R, BR, visible, kv.k, kv.k_stride, p_.E, t.dqt.get(), s_.rows);
      }
    }
    if (first_active < 0 || !key_gradients_) return;
    // dV += Wᵀ ⊗ dO rows, dK += dSᵀ ⊗ Q rows, over the rows of the active subtiles.
    const std::int64_t r0 = first_active * R, r1 = std::min(row_count, (last_active + 1) * R);
    const std::int64_t rank_cols = RoundUp(cols, kRankKeys);
    float* dv = s_.dv.get() + (j0 - key_begin_) * s_.Ev_pad;
    float* dk = s_.dk.get() + (j0 - key_begin_) * s_.E_pad;
    if (s_.bf16) {
      KeyGradientsBf16(r0, r1, rank_cols, dk, dv);
      return;
    }
    for (std::int64_t c = 0; c < rank_cols; c += kRankKeys) {
      RankUpdates(s_.st.get() + c * BR, r0, r1, s_.do_rows.get(), s_.Ev_pad, dv + c * s_.Ev_pad);
      RankUpdates(s_.dpt.get() + c * BR, r0, r1, s_.q_rows.get(), s_.E_pad, dk + c * s_.E_pad);
    }
  }

  // dV += Wᵀ ⊗ dO rows and dK += dSᵀ ⊗ Q rows over rows [r0, r1) on vdpbf16ps, the rows
  // in pairs: Wᵀ and dSᵀ rounded to bfloat16, and an odd r1's partner row (padding, whose
  // Q and dO rows are 0 but whose W or dS may be NaN from a NaN key) given weight 0.
  void KeyGradientsBf16(std::int64_t r0, std::int64_t r1, std::int64_t rank_cols, float* dk, float* dv) {
    const auto BR = static_cast<std::int64_t>(s_.block_rows);
    bf16::round_floats(s_.st.get(), rank_cols * BR, s_.st16.get());
    bf16::round_floats(s_.dpt.get(), rank_cols * BR, s_.dpt16.get());
    if (r1 % 2)
      for (std::int64_t c = 0; c < rank_cols; ++c) s_.st16[c * BR + r1] = s_.dpt16[c * BR + r1] = 0;
    const std::int64_t pair0 = r0 / 2, pair1 = (r1 + 1) / 2;
    for (std::int64_t c = 0; c < rank_cols; c += bf16::kRankKeys) {
      bf16::rank_update(s_.st16.get() + c * BR, BR, pair0, pair1, s_.do_pairs.get(), s_.Ev_pad, dv + c * s_.Ev_pad,
                        s_.Ev_pad);
      bf16::rank_update(s_.dpt16.get() + c * BR, BR, pair0, pair1, s_.q_pairs.get(), s_.E_pad, dk + c * s_.E_pad,
                        s_.E_pad);
    }
  }

  void ZeroColumns(std::int64_t g, std::int64_t padded) {
    const std::size_t R = s_.rows, BR = s_.block_rows;
    for (std::int64_t c = 0; c < padded; ++c) {
      std::fill(s_.st.get() + c * BR + g * R, s_.st.get() + c * BR + (g + 1) * R, 0.0f);
      std::fill(s_.dpt.get() + c * BR + g * R, s_.dpt.get() + c * BR + (g + 1) * R, 0.0f);
    }
  }

  // acc[c][·] += Σ_r wt[c][r] · x[r][·] for kRankKeys keys, over all dims in blocks of
  // 4, 2, 1 vectors.
  void RankUpdates(const float* wt, std::int64_t r0, std::int64_t r1, const float* x, std::int64_t width, float* acc) {
    const std::int64_t N = static_cast<std::int64_t>(n_);
    const std::size_t BR = s_.block_rows, stride = static_cast<std::size_t>(width);
    std::int64_t d = 0;
    for (; d + 4 * N <= width; d += 4 * N) RankUpdate<4>(wt, BR, r0, r1, x + d, stride, acc + d, stride);
    for (; d + 2 * N <= width; d += 2 * N) RankUpdate<2>(wt, BR, r0, r1, x + d, stride, acc + d, stride);
    for (; d < width; d += N) RankUpdate<1>(wt, BR, r0, r1, x + d, stride, acc + d, stride);
  }

  // Wᵀ into st and dSᵀ into dpt for subtile g against keys [j0, j0+padded), of which the
  // first `visible` may be seen. Returns false when the mask hides every one.
  bool Gradients(const Subtile& t, std::int64_t g, std::int64_t j0, std::int64_t visible, std::int64_t padded,
                 const KeyValueTile& kv) {
    const DF df;
    const std::size_t R = s_.rows, BR = s_.block_rows;
    float* st = s_.st.get() + g * R;
    float* dpt = s_.dpt.get() + g * R;
    const float log2_scale = static_cast<float>(p_.scale * kLog2e);
    for (std::int64_t c = 0; c < padded; c += kKeyBlock)
      if (s_.bf16)
        bf16::score_block(t.qp.get(), (p_.E + 1) / 2, kv.k16 + c * kv.k_stride, kv.k_stride, log2_scale, st + c * BR,
                          static_cast<std::int64_t>(BR));
      else
        ScoreBlock(t.qt.get(), R, p_.E, kv.k + c * kv.k_stride, kv.k_stride, st + c * BR, BR);
    const bool softcap = p_.softcap > 0.0;
    if (softcap) Softcap(p_, st, BR, padded, 2, s_.tanh_t.get(), R);
    for (std::int64_t c = visible; c < padded; ++c) std::fill(st + c * BR, st + c * BR + R, kMinusInf);
    if (p_.mask.present() && !ApplyMask(p_, t, st, BR, j0, visible, s_.row_buffer.get())) return false;
    if (p_.has_alibi()) AddAlibi(p_, t, st, BR, j0, visible, 2, s_.alibi_lanes.get());
    ApplyBand(t, st, BR, j0, visible);
    for (std::int64_t c = 0; c < padded; c += kKeyBlock)
      if (s_.bf16)
        bf16::score_block(t.dop.get(), (p_.Ev + 1) / 2, kv.v16 + c * kv.v_stride, kv.v_stride, 1.0f, dpt + c * BR,
                          static_cast<std::int64_t>(BR));
      else
        ScoreBlock(t.dot.get(), R, p_.Ev, kv.v + c * kv.v_stride, kv.v_stride, dpt + c * BR, BR);

    const bool dropping = p_.dropout_p > 0.0;
    if (dropping) DropoutFactors(p_, p_.first_batch + b_, t, j0, visible, padded, s_.zt.get(), R);
    for (std::size_t half = 0; half < 2; ++half) {
      const std::size_t lane0 = half * n_;
      const VF lse2 = hn::Load(df, t.lse2.get() + lane0), D = hn::Load(df, t.D.get() + lane0);
      for (std::int64_t c = 0; c < padded; ++c) {
        float* s_at = st + c * BR + lane0;
        float* dp_at = dpt + c * BR + lane0;
        const VF prob = Exp2(df, hn::Sub(hn::Load(df, s_at), lse2));
        VF dprob = hn::Load(df, dp_at), weight = prob;
        if (dropping) {
          const VF z = hn::Load(df, s_.zt.get() + c * R + lane0);
          dprob = hn::Mul(dprob, z);
          weight = hn::Mul(prob, z);
        }
        // dS = P (dP − D), exactly 0 where P is: a masked key or fully masked row gives
        // no gradient even when dO·V there is infinite.
        const VF dscore = hn::IfThenZeroElse(hn::Eq(prob, hn::Zero(df)), hn::Mul(prob, hn::Sub(dprob, D)));
        hn::Store(weight, df, s_at);
        hn::Store(dscore, df, dp_at);
      }
    }
    if (p_.grad_mask.present())
      for (std::size_t r = 0; r < t.rows.size(); ++r)
        for (std::int64_t c = 0; c < visible; ++c)
          p_.grad_mask.store<float>(t.rows[r].matrix, t.rows[r].i, j0 + c, dpt[c * BR + r]);
    // Softcap's chain rule: d(C·tanh(x/C))/dx = 1 − tanh²; the mask was added after it. A
    // dS of exactly 0 stays 0 (P = 0 at a masked key; elsewhere the factor is finite): a
    // NaN key's tanh is NaN even where the mask hides it, and 0 · NaN would carry it into
    // dK (and into dQ by a bfloat16 key pair).
    if (softcap)
      for (std::size_t half = 0; half < 2; ++half)
        for (std::int64_t c = 0; c < padded; ++c) {
          float* dp_at = dpt + c * BR + half * n_;
          const VF t2 = hn::Load(df, s_.tanh_t.get() + c * R + half * n_);
          const VF dscore = hn::Load(df, dp_at);
          hn::Store(hn::IfThenZeroElse(hn::Eq(dscore, hn::Zero(df)),
                                       hn::Mul(dscore, hn::NegMulAdd(t2, t2, hn::Set(df, 1.0f)))),
                    df, dp_at);
        }
    return true;
  }

  // dQ of the block's rows: scale · dQᵀᵀ into grad_query, through the block's row-major
  // Q copy (read by nothing after this).
  void StoreQueryGradient() {
    const float scale = static_cast<float>(p_.scale);
    float* dq_rows = s_.q_rows.get();
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      const Subtile& t = s_.sub[g];
      Transpose(t.dqt.get(), s_.rows, static_cast<std::size_t>(p_.E), t.rows.size(), dq_rows,
                static_cast<std::size_t>(p_.E));
      for (std::size_t r = 0; r < t.rows.size(); ++r) {
        float* dq_row = dq_rows + r * p_.E;
        for (std::int64_t e = 0; e < p_.E; ++e) dq_row[e] *= scale;
        StoreRow(p_.grad_query, t.rows[r].matrix, t.rows[r].i, 0, p_.E, dq_row);
      }
    }
  }

  void StoreKeyGradients(std::int64_t keys) {
    const float scale = static_cast<float>(p_.scale);
    for (std::int64_t c = 0; c < keys; ++c) {
      const float* dk = s_.dk.get() + c * s_.E_pad;
      const float* dv = s_.dv.get() + c * s_.Ev_pad;
      float* dk_row = s_.row_buffer.get();
      for (std::int64_t e = 0; e < p_.E; ++e) dk_row[e] = dk[e] * scale;
      StoreRow(p_.grad_key, kvm_, key_begin_ + c, 0, p_.E, dk_row);
      StoreRow(p_.grad_value, kvm_, key_begin_ + c, 0, p_.Ev, dv);
    }
  }

  const BackwardProblem& p_;
  Scratch& s_;
  const std::size_t n_;
  std::int64_t b_ = 0, kvm_ = 0, key_begin_ = 0, subtiles_ = 0;
  bool key_gradients_ = true, query_gradient_ = true;  // what this pass computes
  std::int64_t packed_key_rows_ = 0;                   // bfloat16: keys of this tile in kp
};

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_BACKWARD_TASK_INL_H_
