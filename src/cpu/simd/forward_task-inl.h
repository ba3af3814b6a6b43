// The forward's task: one KV head's group of query rows over a range of keys, in
// subtiles of kVectors row vectors (their memory: simd/forward_scratch-inl.h).
// forward.cpp runs the tasks (its dispatch: which blocking, which path, how many
// threads); this file is how each one computes.
//
// Layout trick: every tile is held *transposed*, with query rows along the vector lanes.
//   Sᵀ[c][r] = Σ_e K[c][e] · Qᵀ[e][r]        (QK: broadcast K[c][e], FMA with a Qᵀ row)
//   Oᵀ[d][r] += Σ_c V[c][d] · Pᵀ[c][r]       (PV: broadcast V[c][d], FMA with a Pᵀ row)
// so K and V are read in place, row-major, with no packing, and the softmax of a query
// row — max, exp, sum over keys — runs across registers, lane-wise, with no horizontal
// reduction. The recurrence per key tile (FlashAttention-2, Dao 2023), in log2 units
// (the scores times scale·log2(e): Q pre-multiplied by it for the float32 kernels, the
// sums for the vdpbf16ps ones; a float mask by log2(e)):
//   m' = max(m, max_c t_c), kept at m while that rises by ≤ 8 (NextReferenceMax:
//        conditional rescaling, so m is a reference, not always the max);
//   α = 2^(m − m');  p_c = 2^(t_c − m');
//   l' = α·l + Σ_c p_c;      Oᵀ' = α·Oᵀ + Σ_c V_c ⊗ drop_c·p_c
// and finally O = Oᵀᵀ / l, lse = m·ln2 + ln l. A row with l = 0 saw no key: output 0,
// lse −inf. NaN scores propagate through 2^(NaN) into l and the output. An attention
// sink joins (m, l) before that, as one more logit with no value (FoldSink).
//
// GQA: one task takes the query rows of all the heads that share a KV head (group × L
// rows, flattened), so a K/V tile loaded once serves the whole group — what decoding
// with few queries per head needs.
//
// int8 K/V (quantized caches): each tile widens q to float32 (exact) and the scale
// multiplies the score column (s^K_j) and the weight column (s^V_j).
//
// Decoding: a task of at most kFewRows rows over K and V rows of unit column stride
// (float32, bfloat16, float16, int8) skips the tiles: simd/decode_rows-inl.h reads the
// rows in place with lanes along E and Ev (its sums of products are horizontal; a
// bfloat16 query's scores on vdpbf16ps against bfloat16 K where bf16::chosen(),
// bf16::row_scores, or on vpdpwssd against int8 K, int8::row_scores, and its P·V of int8
// V on vpdpwssd, int8::row_accumulate), and, without lane-by-lane modifiers, runs the
// softmax on a dense Sᵀ (several keys a vector); its key tiles are twice as long
// (kDecodeKeyTile).
//
// Included once per Highway target by forward.cpp alone (hence the toggling include
// guard, Highway's convention for per-target headers, and the anonymous namespace: its
// names are that one file's).
#if defined(SDPA_CPU_SIMD_FORWARD_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_FORWARD_TASK_INL_H_
#undef SDPA_CPU_SIMD_FORWARD_TASK_INL_H_
#else
#define SDPA_CPU_SIMD_FORWARD_TASK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common/half.h"
#include "common/problem.h"
#include "cpu/simd/bf16_kernels.h"
#include "cpu/simd/int8_kernels.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/decode_rows-inl.h"
#include "cpu/simd/exp2-inl.h"
#include "cpu/simd/forward_scratch-inl.h"
#include "cpu/simd/lse_merge-inl.h"
#include "cpu/simd/microkernels-inl.h"
#include "cpu/simd/rows-inl.h"
#include "cpu/simd/score_modifiers-inl.h"
#include "cpu/simd/softmax_step-inl.h"
#include "cpu/simd/store_outputs-inl.h"
#include "cpu/simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace {  // NOLINT(google-build-namespaces, cert-dcl59-cpp): included by forward.cpp alone

using namespace simd;  // NOLINT(google-build-using-namespace): the pieces shared with the backward

static_assert(bf16::kMaxDecodeRows >= kFewRows && int8::kMaxRows >= kFewRows && int8::kMaxKeys >= kDecodeKeyTile,
              "bf16::row_scores, int8::row_scores and row_accumulate take every decode task's rows and tiles");

// K (or V) of one key tile as the microkernels read it: float32 rows, or bfloat16 rows.
struct KeyRows {
  const float* f32 = nullptr;
  const std::uint16_t* bf16 = nullptr;
  std::int64_t stride = 0;
};

template <std::size_t kVectors>
class Task {
 public:
  Task(const Problem& p, Scratch<kVectors>& s, bool bf16_path)
      : p_(p),
        s_(s),
        n_(hn::Lanes(DF())),
        bf16_(bf16_path),
        bf16_row_scores_(Bf16QueryOnAvx512(p) && p.key.dtype == DType::bfloat16 && bf16::chosen()),
        int8_row_scores_(Bf16QueryOnAvx512(p) && p.key.dtype == DType::int8 && p.E <= int8::kMaxQueryDims &&
                         int8::supported()),
        int8_row_values_(Bf16QueryOnAvx512(p) && p.value.dtype == DType::int8 && int8::supported()) {}

  // Query rows [row0, row0 + row_count) of the flattened (group heads × L) rows that
  // share KV head `head_kv` of batch `b`: all keys, then the outputs.
  void Run(std::int64_t b, std::int64_t head_kv, std::int64_t row0, std::int64_t row_count) {
    Attend(b, head_kv, row0, row_count, 0, p_.S);
    for (std::int64_t g = 0; g < subtiles_; ++g) Finish(s_.sub[g]);
  }

  // The running states (m, l, Oᵀ) of those rows over keys [key_begin, key_end) only:
  // one split of a split-KV decode.
  void Attend(std::int64_t b, std::int64_t head_kv, std::int64_t row0, std::int64_t row_count, std::int64_t key_begin,
              std::int64_t key_end) {
    SetRows(b, head_kv, row0, row_count);
    std::int64_t key_start = p_.S, key_limit = 0;
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      Subtile& t = s_.sub[g];
      PackQuery(t);
      t.ot_fresh = true;
      std::fill(t.m.get(), t.m.get() + s_.rows, kMinusInf);
      std::fill(t.l.get(), t.l.get() + s_.rows, 0.0f);
      if (t.key_limit > t.key_start) key_start = std::min(key_start, t.key_start);
      key_limit = std::max(key_limit, t.key_limit);
    }
    // Only the key tiles some row sees (causal, the sliding window).
    const std::int64_t end = std::min(key_end, key_limit);
    // The task's rows are its KV head's whole group (row0 is then 0): no other task reads
    // its K and V rows through the cache, so it requests each next tile (RequestTile).
    const bool whole_group = row_count == p_.heads_q / p_.heads_kv * p_.L;
    const std::int64_t tile = KeyTile();
    for (std::int64_t j0 = FirstTile(key_begin, key_start, tile); j0 < end; j0 += tile) {
      const std::int64_t tile_cols = std::min(tile, end - j0);
      const KeyRows k = LoadKeys(j0, tile_cols, end);
      const std::int64_t next = j0 + tile;
      const bool request = whole_group && next < end;
      // (The tile kernels request row c + tile for each row c, tile = kKeyTile there:
      // only a whole next tile, so that no request passes the task's keys; a partial one
      // takes the burst.)
      const bool whole_next = next + tile <= end;
      key_ahead_ = request && whole_next && few_keys_ == 0 && TileKernelsRequest(p_.key) ? tile * p_.key.row_stride : 0;
      value_ahead_ =
          request && whole_next && few_values_ == 0 && TileKernelsRequest(p_.value) ? tile * p_.value.row_stride : 0;
      if (request) RequestTile(next, std::min(tile, end - next));
      values_loaded_ = false;
      for (std::int64_t g = 0; g < subtiles_; ++g) {
        Subtile& t = s_.sub[g];
        const std::int64_t cols = std::min(tile_cols, t.key_limit - j0);
        if (cols <= 0 || j0 + cols <= t.key_start) continue;
        if (!Scores(t, j0, cols, k)) continue;  // every score of the tile masked
        UpdateSoftmax(t, j0, cols);
        Accumulate(t, j0, cols, tile_cols, end);
      }
    }
    if (row_major_pending_) {       // a decode task's int8 P·V, summed row-major over its tiles
      HWY_DASSERT(subtiles_ == 1);  // (few rows: one subtile)
      AddRowsTransposed(few_values_, s_.row_major.get(), p_.Ev, s_.sub[0].ot.get(), s_.rows);
      row_major_pending_ = false;
    }
    // No visible key reached it (or Ev = 0: P·V wrote nothing): Oᵀ = 0, for Finish and
    // SaveState.
    for (std::int64_t g = 0; g < subtiles_; ++g)
      if (s_.sub[g].ot_fresh || p_.Ev == 0) ZeroOutputs(s_.sub[g]);
  }

  // Merges the split states of the current rows by their log-sum-exp (MergeSplitStates),
  // then stores the outputs. `states` holds, per split, kSubtiles states of StateSize()
  // floats.
  void MergeAndStore(std::int64_t b, std::int64_t head_kv, std::int64_t row0, std::int64_t row_count,
                     const float* states, std::int64_t splits) {
    SetRows(b, head_kv, row0, row_count);
    const std::int64_t state_size = StateSize<kVectors>(p_);
    for (std::int64_t g = 0; g < subtiles_; ++g) {
      Subtile& t = s_.sub[g];
      MergeSplitStates(states + g * state_size, splits, kSubtiles * state_size, s_.rows, p_.Ev, t.m.get(), t.l.get(),
                       t.ot.get());
      if (p_.weights.present()) PackQuery(t);
      Finish(t);
    }
  }

  // Writes the states of the current rows: kSubtiles × StateSize() floats.
  void SaveState(float* state) const {
    for (std::int64_t g = 0; g < subtiles_; ++g, state += StateSize<kVectors>(p_))
      SaveSplitState(s_.sub[g].m.get(), s_.sub[g].l.get(), s_.sub[g].ot.get(), s_.rows, p_.Ev, state);
  }

 private:
  void SetRows(std::int64_t b, std::int64_t head_kv, std::int64_t row0, std::int64_t row_count) {
    b_ = b;
    kvm_ = b * p_.heads_kv + head_kv;
    const std::int64_t per_subtile = static_cast<std::int64_t>(s_.rows);
    subtiles_ = (row_count + per_subtile - 1) / per_subtile;
    // Decoding: the in-place kernels (decode_rows-inl.h) for the rows they read.
    const bool few = row_count <= std::min<std::int64_t>(kFewRows, per_subtile) && !bf16_;
    few_keys_ = few && RowKernelsRead(p_.key) ? row_count : 0;
    few_values_ = few && RowKernelsRead(p_.value) ? row_count : 0;
    // Both read in place, and no step that works lane by lane: the dense Sᵀ.
    const std::int64_t group = DenseGroup(row_count);
    const bool lanewise = p_.softcap > 0.0 || p_.has_alibi() || p_.dropout_p > 0.0 || p_.weights.present();
    dense_group_ = few_keys_ > 0 && few_values_ > 0 && group <= static_cast<std::int64_t>(n_) && !lanewise ? group : 0;
    for (std::int64_t g = 0; g < subtiles_; ++g)
      AssignRows(p_, b, head_kv, row0 + g * per_subtile, std::min(per_subtile, row_count - g * per_subtile), s_.sub[g]);
  }

  // Keys per tile: twice as many for a decode-rows task (kDecodeKeyTile).
  std::int64_t KeyTile() const { return few_keys_ > 0 || few_values_ > 0 ? kDecodeKeyTile : kKeyTile; }

  // Requests the tile of keys [j0, j0 + cols) that the tiles read, in one burst
  // (PrefetchRows): K unless the row kernels read it, or the tile kernels read its rows
  // in place and so request them themselves (key_ahead_); likewise V. And an int8 K's or
  // V's scales, which no kernel requests (RequestScales).
  void RequestTile(std::int64_t j0, std::int64_t cols) const {
    if (few_keys_ == 0 && key_ahead_ == 0) PrefetchRows(p_.key, kvm_, j0, cols, p_.E);
    if (few_values_ == 0 && value_ahead_ == 0) PrefetchRows(p_.value, kvm_, j0, cols, p_.Ev);
    if (p_.key_scale.present()) RequestScales(p_.key_scale, kvm_, j0, cols);
    if (p_.value_scale.present()) RequestScales(p_.value_scale, kvm_, j0, cols);
  }

  // Whether the float32 tile kernels read op's rows in place (KeyValueRows: no copy), so
  // that a row's line of the next tile lies a fixed stride on and they can request it as
  // they read the row's own: requests spread over the arithmetic, where a burst of the
  // whole next tile at the tile's start (768 lines a K or V tile at E = 128) held the
  // core until most of its lines had come (GQA 32/8, L = 4, S = 32768: see
  // docs/performance.md, "Decoding").
  // bfloat16 rows likewise (Bf16Rows in place: K of an even E; its V rows are read once a
  // tile, into pairs, by pack_values).
  bool TileKernelsRequest(const Operand& op) const {
    if (!bf16_) return FloatRows(op);
    return op.dtype == DType::bfloat16 && op.col_stride == 1 && !op.paged() && (&op != &p_.key || p_.E % 2 == 0);
  }

  // The decode row kernels' row pointers: rows [j0, j0 + cols) of op in place, and as
  // many more as its kernels request ahead (RowsAhead): the next rows, or (past this
  // task's keys, which end at `end`) its last.
  void PointRows(const Operand& op, std::int64_t j0, std::int64_t cols, std::int64_t end,
                 std::vector<const std::byte*>& rows) const {
    HWY_DASSERT(j0 < end);  // (rows[there - 1] below)
    const std::int64_t wanted = cols + RowsAheadOf(dtype_size(op.dtype));
    const std::int64_t there = std::min(wanted, end - j0);
    RowWalker(op, kvm_, j0).fill(rows.data(), there);
    for (std::int64_t c = there; c < wanted; ++c) rows[c] = rows[there - 1];
  }

  // Qᵀ[e][r] = q[r][e] · scale · log2(e); rows past the tile are 0. For bfloat16, the
  // pairs qp[e/2][r][2] of the raw values instead (the scale is applied to the scores),
  // packed from Qᵀ unscaled, as the backward packs its Q (bfloat16 → float32 → bfloat16
  // gives the same bits, subnormals aside, which vdpbf16ps reads as zero anyway).
  void PackQuery(Subtile& t) {
    const std::int64_t rows = static_cast<std::int64_t>(t.rows.size());
    const auto E = static_cast<std::size_t>(p_.E);
    float* qt = t.qt.get();
    float* q_rows = s_.row_major.get();
    if (bf16_) {
      for (std::int64_t r = 0; r < rows; ++r)
        LoadRow(p_.query, t.rows[r].matrix, t.rows[r].i, 0, p_.E, q_rows + r * p_.E);
      std::fill(q_rows + rows * p_.E, q_rows + s_.rows * E, 0.0f);  // zero padding lanes compute 0
      Transpose(q_rows, E, s_.rows, E, qt, s_.rows);
      bf16::pack_along_width(qt, p_.E, static_cast<std::int64_t>(s_.rows), t.qp.get());
      return;
    }
    const float c = static_cast<float>(p_.scale * kLog2e);
    if (few_keys_ == 0 && FloatRows(p_.query) && p_.query.row_stride >= 0) {
      // Straight from the input, a run of consecutive rows at a time (no row-major copy:
      // for a small head it cost as much as the transpose).
      ForEachRun(t.rows, [&](std::size_t r0, std::size_t r1) {
        const Row& first = t.rows[r0];
        TransposeScaled(reinterpret_cast<const float*>(p_.query.address(first.matrix, first.i, 0)),
                        static_cast<std::size_t>(p_.query.row_stride), r1 - r0, E, qt + r0, s_.rows, c);
      });
      if (static_cast<std::size_t>(rows) < s_.rows)  // padding lanes compute 0
        for (std::size_t e = 0; e < E; ++e) std::fill(qt + e * s_.rows + rows, qt + (e + 1) * s_.rows, 0.0f);
    } else {
      for (std::int64_t r = 0; r < rows; ++r)
        LoadRow(p_.query, t.rows[r].matrix, t.rows[r].i, 0, p_.E, q_rows + r * p_.E);
      if (few_keys_ > 0) {
        // The decode kernels read Q row-major (decode_rows-inl.h), scaled alike, and
        // nothing reads Qᵀ: no transpose. bf16::row_scores reads the bfloat16 values
        // (widened to float32 exactly by LoadRow: the top half of the bits), and
        // int8::row_scores their int16 rounding (or, where that refuses the rows, the
        // float32 kernels take them); both scale the scores instead.
        t.q_int16 = int8_row_scores_ && int8::pack_query(q_rows, rows, p_.E, t.q_hat.get(), t.q_sigma.data());
        if (t.q_int16) return;
        const std::size_t count = static_cast<std::size_t>(rows) * E;
        if (bf16_row_scores_)
          for (std::size_t x = 0; x < count; ++x) t.q16[x] = static_cast<std::uint16_t>(float_to_bits(q_rows[x]) >> 16);
        else
          for (std::size_t x = 0; x < count; ++x) t.q_rows[x] = q_rows[x] * c;
        return;
      }
      std::fill(q_rows + rows * p_.E, q_rows + s_.rows * E, 0.0f);  // zero padding lanes compute 0
      TransposeScaled(q_rows, E, s_.rows, E, qt, s_.rows, c);
    }
  }

  // Sᵀ's column stride: a vector of rows, or a dense Sᵀ's group.
  std::size_t ScoreStride() const { return dense_group_ > 0 ? static_cast<std::size_t>(dense_group_) : s_.rows; }

  // Columns of Sᵀ that the softmax runs over for a tile of `cols` keys: the bfloat16
  // kernels write whole 12-key blocks, ScoreTile a shorter last block.
  std::int64_t PaddedColumns(std::int64_t cols) const {
    return bf16_ ? RoundUp(cols, bf16::kKeyBlock) : ScoreTileColumns<kVectors>(cols);
  }

  // K rows [j0, j0+cols) (an int8 K widened to float32 q, exactly, and its scales loaded
  // for Scores). bfloat16 rows are padded to whole key blocks; float32 rows are not
  // (ScoreTile reads none past cols), so a contiguous float32 K is read in place. Keys
  // [j0, end) are this task's (PointRows points ahead within them).
  KeyRows LoadKeys(std::int64_t j0, std::int64_t cols, std::int64_t end) {
    const std::int64_t padded = bf16_ ? PaddedColumns(cols) : cols;
    if (p_.key_scale.present()) LoadScales(p_.key_scale, kvm_, j0, cols, s_.k_scale.get());
    KeyRows k;
    if (few_keys_ > 0) {  // read in place by Scores
      PointRows(p_.key, j0, cols, end, s_.k_rows);
      return k;
    }
    if (bf16_)
      k.bf16 = Bf16Rows(p_.key, kvm_, j0, cols, padded, p_.E, true, s_.k16.get(), &k.stride);
    else
      k.f32 = KeyValueRows(p_.key, kvm_, j0, cols, padded, p_.E, s_.k_tile.get(), &k.stride);
    return k;
  }

  // Sᵀ for keys [j0, j0+cols): softcapped, masked, ALiBi-biased; −inf where causal, the
  // window, a bool mask or padding exclude the key. Returns false if every entry is −inf.
  bool Scores(Subtile& t, std::int64_t j0, std::int64_t cols, const KeyRows& k) {
    const std::int64_t padded = dense_group_ > 0 ? DenseColumns(cols, dense_group_) : PaddedColumns(cols);
    const std::size_t stride = ScoreStride();
    float* st = s_.st.get();
    const float scale = static_cast<float>(p_.scale * kLog2e);  // (the vdpbf16ps kernels' factor)
    const float* k_scale = p_.key_scale.present() ? s_.k_scale.get() : nullptr;
    if (few_keys_ > 0) {
      // (int8: scaled by s^K_j in the kernel.) The padding lanes get 0, as Qᵀ's zero rows
      // give: one fill of the tile, not one per column (a call each, ~20 % of an int8
      // decode's kernel time).
      if (static_cast<std::size_t>(few_keys_) < stride) std::fill(st, st + cols * stride, 0.0f);
      const auto st_stride = static_cast<std::int64_t>(stride);
      if (t.q_int16)
        int8::row_scores(t.q_hat.get(), t.q_sigma.data(), few_keys_, p_.E, s_.k_rows.data(), k_scale, cols,
                         RowsAhead<std::int8_t>(), scale, st, st_stride);
      else if (bf16_row_scores_)
        bf16::row_scores(t.q16.get(), few_keys_, p_.E, s_.k_rows.data(), cols, RowsAhead<std::uint16_t>(), scale, st,
                         st_stride);
      else
        RowScores(p_.key.dtype, few_keys_, t.q_rows.get(), p_.E, s_.k_rows.data(), cols, k_scale, st, stride);
    } else if (bf16_) {
      for (std::int64_t c = 0; c < padded; c += bf16::kKeyBlock)
        bf16::score_block(t.qp.get(), (p_.E + 1) / 2, k.bf16 + c * k.stride, k.stride, scale, st + c * s_.rows,
                          static_cast<std::int64_t>(s_.rows), key_ahead_);
    } else {
      ScoreTile<kVectors>(t.qt.get(), s_.rows, p_.E, k.f32, k.stride, cols, st, s_.rows, key_ahead_);
    }
    // int8 K: s_j = scale_k[j] · (q · q_j), the scale once per score, not per element.
    if (k_scale != nullptr && few_keys_ == 0) ScaleColumns(st, s_.rows, cols, k_scale);
    padded_cols_ = padded;
    if (p_.softcap > 0.0) Softcap(p_, st, s_.rows, cols, kVectors, nullptr, 0);
    std::fill(st + cols * stride, st + padded * stride, kMinusInf);  // (the columns lie in a row)

    // (Softcap and ALiBi work lane by lane: never on the dense Sᵀ.)
    bool any_visible = true;
    if (p_.mask.present()) any_visible = ApplyMask(p_, t, st, stride, j0, cols, s_.row_buffer.get());
    if (p_.has_alibi()) AddAlibi(p_, t, st, s_.rows, j0, cols, kVectors, s_.alibi_lanes.get());
    ApplyBand(t, st, stride, j0, cols);
    return any_visible;
  }

  // The online-softmax step: turns Sᵀ into Pᵀ, updates m and l, rescales Oᵀ.
  void UpdateSoftmax(Subtile& t, std::int64_t j0, std::int64_t cols) {
    const DF df;
    // Locals, not members: a vector store may alias anything (the x86 vector types are
    // may_alias), so a bound read through `this` would be reloaded after every store.
    float* st = s_.st.get();
    const std::size_t rows = s_.rows;
    const std::int64_t padded = padded_cols_;
    if (dense_group_ > 0) {  // (no dropout there)
      const VF m_old = hn::Load(df, t.m.get());
      RescaleOutputs(t, 0, m_old, DenseSoftmax(st, padded, dense_group_, t.m.get(), t.l.get()));
      return;
    }
    for (std::size_t lane0 = 0; lane0 < rows; lane0 += n_) {
      const VF m_old = hn::Load(df, t.m.get() + lane0);
      RescaleOutputs(t, lane0, m_old, LaneSoftmaxStep(st, rows, padded, lane0, t.m.get() + lane0, t.l.get() + lane0));
    }
    if (p_.dropout_p > 0.0) ApplyDropout(t, j0, cols);
  }

  // Oᵀ's lanes [lane0, lane0 + N) times α, their rows' factor from a softmax step whose
  // reference max was m_old before it; and the int8 P·V's row-major rows of those lanes
  // (row_major_pending_), which are +0 where a row has seen no key (its weights, all 0,
  // pack to σ = 0), so the early return below holds for them too.
  void RescaleOutputs(Subtile& t, std::size_t lane0, VF m_old, VF alpha) {
    const DF df;
    // Nothing to rescale while Oᵀ is fresh (not written yet), nor where every lane is
    // left as it is: a lane that kept its reference m (α = 1: its max did not rise by
    // more than 8, the usual case after a row's first tiles; x · 1 is x, NaN included),
    // or one that has seen no key yet (m = −inf, after tiles the band hid; and the
    // padding lanes of a dense Sᵀ): Oᵀ holds only +0 there, or NaN from a NaN or infinite
    // value under a zero weight, and α = 0 would leave it so. (α = 0 alone is not enough:
    // 2^x is 0 below −125, so a row whose max rises that far between tiles must still
    // have its Oᵀ zeroed.)
    const auto unseen = hn::And(hn::Eq(m_old, hn::Set(df, kMinusInf)), hn::Eq(alpha, hn::Zero(df)));
    if (t.ot_fresh || hn::AllTrue(df, hn::Or(hn::Eq(alpha, hn::Set(df, 1.0f)), unseen))) return;
    const std::size_t rows = s_.rows, Ev = static_cast<std::size_t>(p_.Ev);  // (not reloaded after each store)
    float* ot = t.ot.get() + lane0;
    for (std::size_t d = 0; d < Ev; ++d) hn::Store(hn::Mul(hn::Load(df, ot + d * rows), alpha), df, ot + d * rows);
    if (row_major_pending_) {  // the int8 P·V's rows (a decode task: its rows lie in lanes 0 .. few_values_)
      HWY_ALIGN float factor[HWY_MAX_BYTES / sizeof(float)];
      hn::Store(alpha, df, factor);
      for (std::int64_t r = static_cast<std::int64_t>(lane0); r < std::min<std::int64_t>(few_values_, lane0 + n_); ++r)
        ScaleRow(s_.row_major.get() + r * p_.Ev, p_.Ev, factor[r - static_cast<std::int64_t>(lane0)]);
    }
  }

  // Pᵀ ← Pᵀ ∘ Z over keys [j0, j0+cols): a kept probability times 1/(1−p), a dropped one
  // 0 (even when it is NaN).
  void ApplyDropout(const Subtile& t, std::int64_t j0, std::int64_t cols) {
    const DF df;
    float* st = s_.st.get();
    const float* zt = s_.zt.get();
    DropoutFactors(p_, p_.first_batch + b_, t, j0, cols, cols, s_.zt.get(), s_.rows);
    for (std::int64_t c = 0; c < cols; ++c)
      for (std::size_t lane0 = 0; lane0 < s_.rows; lane0 += n_) {
        const VF z = hn::Load(df, zt + c * s_.rows + lane0);
        float* at = st + c * s_.rows + lane0;
        hn::Store(hn::IfThenZeroElse(hn::Eq(z, hn::Zero(df)), hn::Mul(hn::Load(df, at), z)), df, at);
      }
  }

  // Oᵀ += V ⊗ Pᵀ over keys [j0, j0+cols) of the key tile [j0, j0+tile_cols), whose V
  // rows are loaded (and, for bfloat16, packed in pairs) once for all subtiles (a decode
  // task's int8 P·V into s_.row_major instead, added into Oᵀ at the end of Attend).
  // bfloat16: P rounded to bfloat16 (as FlashAttention does for its P·V product; l
  // keeps the float32 sum). Keys [j0, end) are this task's.
  void Accumulate(Subtile& t, std::int64_t j0, std::int64_t cols, std::int64_t tile_cols, std::int64_t end) {
    const bool overwrite = std::exchange(t.ot_fresh, false);
    // The decode and bfloat16 kernels only add to Oᵀ.
    if (overwrite && (few_values_ > 0 || bf16_)) ZeroOutputs(t);
    if (few_values_ > 0) {  // decode rows: V read in place
      if (!values_loaded_) {
        if (p_.value_scale.present()) LoadScales(p_.value_scale, kvm_, j0, tile_cols, s_.v_scale.get());
        PointRows(p_.value, j0, tile_cols, end, s_.v_rows);
        values_loaded_ = true;
      }
      if (p_.value_scale.present()) ScaleColumns(s_.st.get(), ScoreStride(), cols, s_.v_scale.get());
      // int8 P·V: few_values_ × Ev, row-major, summed over the task's tiles (rescaled with
      // Oᵀ) and added into Oᵀ once, at the end of Attend — not transposed a tile.
      if (int8_row_values_ &&
          int8::row_accumulate(s_.st.get(), static_cast<std::int64_t>(ScoreStride()), few_values_, s_.v_rows.data(),
                               cols, p_.Ev, RowsAhead<std::int8_t>(), s_.row_major.get(), row_major_pending_)) {
        row_major_pending_ = true;
        return;
      }
      RowAccumulate(p_.value.dtype, few_values_, s_.st.get(), ScoreStride(), s_.v_rows.data(), cols, p_.Ev, t.ot.get(),
                    s_.rows);
      return;
    }
    if (!values_loaded_) {
      if (bf16_)
        values_.bf16 = Bf16Rows(p_.value, kvm_, j0, tile_cols, tile_cols, p_.Ev, false, s_.v16.get(), &values_.stride);
      else
        values_.f32 = KeyValueRows(p_.value, kvm_, j0, tile_cols, tile_cols, p_.Ev, s_.v_tile.get(), &values_.stride);
      if (p_.value_scale.present()) LoadScales(p_.value_scale, kvm_, j0, tile_cols, s_.v_scale.get());
      values_loaded_ = true;
      packed_value_rows_ = 0;
    }
    // int8 V: Oᵀ += q_j ⊗ scale_v[j]·p_j. Scaling Pᵀ in place is safe: l already holds
    // the unscaled sum, and the next subtile recomputes Sᵀ.
    if (p_.value_scale.present()) ScaleColumns(s_.st.get(), s_.rows, cols, s_.v_scale.get());
    if (bf16_) {
      bf16::accumulate_keys(s_.st.get(), bf16::kRows, cols, tile_cols, values_.bf16, values_.stride, p_.Ev, s_.pp.get(),
                            s_.vp.get(), &packed_value_rows_, t.ot.get(), value_ahead_);
      return;
    }
    simd::Accumulate<kVectors>(s_.st.get(), s_.rows, cols, values_.f32, values_.stride, p_.Ev, t.ot.get(), s_.rows,
                               overwrite, value_ahead_);
  }

  void ZeroOutputs(Subtile& t) const {
    std::fill(t.ot.get(), t.ot.get() + std::max<std::int64_t>(p_.Ev, 1) * s_.rows, 0.0f);
  }

  // O = Oᵀᵀ / l and lse = m·ln2 + ln l for the subtile's rows, then the weights if asked.
  void Finish(Subtile& t) {
    if (p_.has_sinks()) FoldSink(t);
    constexpr std::size_t kLanes = kVectors * hn::MaxLanes(DF());
    StoreOutputRows<kLanes>(p_.output, t.rows, t.ot.get(), s_.rows, static_cast<std::size_t>(p_.Ev), t.l.get(),
                            s_.row_major.get());
    if (p_.lse.present()) StoreLse<kLanes>(p_.lse, t.rows, t.m.get(), t.l.get(), s_.rows);
    if (p_.weights.present()) StoreWeights(t);
  }

  // Each row's sink (in log2 units, as m) joins its final state as one more logit whose
  // value row is 0; once per row, after every key tile and any merge of split keys, so
  // a split decode adds it once. A row that saw no key ends with m = sink, l = 1, O = 0.
  void FoldSink(Subtile& t) {
    for (std::size_t r = 0; r < t.rows.size(); ++r) {
      const double sink = p_.sink(t.rows[r].matrix);
      if (sink == -std::numeric_limits<double>::infinity()) continue;  // no sink (and no −inf − −inf)
      const float sink2 = static_cast<float>(sink * kLog2e), m = t.m[r];
      const float m_new = std::isnan(m) || m > sink2 ? m : sink2;
      const float alpha = std::exp2(m - m_new);  // 0 when no key was visible (m = −inf)
      t.l[r] = t.l[r] * alpha + std::exp2(sink2 - m_new);
      t.m[r] = m_new;
      for (std::int64_t d = 0; d < p_.Ev; ++d) t.ot[d * s_.rows + r] *= alpha;
    }
  }

  // The weights, recomputed tile by tile with the final m and l: p = 2^(t − m) / l,
  // after dropout. Keys outside every row's band get 0 (NaN in a NaN row).
  void StoreWeights(Subtile& t) {
    const DF df;
    float* st = s_.st.get();
    for (std::int64_t j0 = 0; j0 < p_.S; j0 += kKeyTile) {
      const std::int64_t cols = std::min(kKeyTile, p_.S - j0);
      const std::int64_t visible = j0 + cols <= t.key_start ? 0 : std::clamp<std::int64_t>(t.key_limit - j0, 0, cols);
      if (visible > 0) {
        Scores(t, j0, visible, LoadKeys(j0, visible, j0 + visible));
        for (std::int64_t c = visible; c < cols; ++c) std::fill(st + c * s_.rows, st + (c + 1) * s_.rows, kMinusInf);
        for (std::size_t v = 0; v < kVectors; ++v) {
          const std::size_t lane0 = v * n_;
          const VF m = hn::Load(df, t.m.get() + lane0), l = hn::Load(df, t.l.get() + lane0);
          const VF m_use = hn::IfThenZeroElse(hn::Eq(m, hn::Set(df, kMinusInf)), m);
          const VF inverse = hn::IfThenZeroElse(hn::Eq(l, hn::Zero(df)), hn::Div(hn::Set(df, 1.0f), l));
          for (std::int64_t c = 0; c < cols; ++c) {
            const VF score = hn::Load(df, st + c * s_.rows + lane0);
            hn::Store(hn::Mul(Exp2(df, hn::Sub(score, m_use)), inverse), df, st + c * s_.rows + lane0);
          }
        }
        if (p_.dropout_p > 0.0) ApplyDropout(t, j0, cols);
      }
      float* weights_row = s_.row_buffer.get();
      for (std::size_t r = 0; r < t.rows.size(); ++r) {
        const Row& row = t.rows[r];
        const float hidden = std::isnan(t.l[r]) ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) weights_row[c] = visible > 0 ? st[c * s_.rows + r] : hidden;
        StoreRow(p_.weights, row.matrix, row.i, j0, cols, weights_row);
      }
    }
  }

  const Problem& p_;
  Scratch<kVectors>& s_;
  const std::size_t n_;
  const bool bf16_;
  // The decode rows' raw-intrinsic kernels take a bfloat16 query on the AVX-512 target
  // only (kBf16KernelsFit): so that the other targets' tests still run their own kernels.
  static bool Bf16QueryOnAvx512(const Problem& p) { return kBf16KernelsFit && p.query.dtype == DType::bfloat16; }

  // Decoding bfloat16 Q against bfloat16 K: the scores on vdpbf16ps (bf16::row_scores),
  // K not widened to float32.
  const bool bf16_row_scores_;
  // … against int8 K (E <= 512): on vpdpwssd, Q rounded to int16 per row
  // (int8::row_scores; float32 for a task whose query has an element that is not finite,
  // or a row's largest below 2^-96). It reads 16 scales from a tile's key on (k_scale
  // holds N more than a tile, N = 16 on the AVX-512 target).
  const bool int8_row_scores_;
  // … and int8 V: P·V on vpdpwssd, the weights rounded to int16 per row and tile
  // (int8::row_accumulate; float32 for a tile with a weight that is not finite, or a row's
  // largest below 2^-96).
  const bool int8_row_values_;
  std::int64_t b_ = 0, kvm_ = 0, subtiles_ = 0, padded_cols_ = 0;
  std::int64_t few_keys_ = 0, few_values_ = 0;  // rows of a decode-rows task (decode_rows-inl.h), else 0
  std::int64_t dense_group_ = 0;                // its dense Sᵀ's group (softmax_step-inl.h), else 0
  KeyRows values_;                              // V rows of the current key tile
  bool values_loaded_ = false;
  bool row_major_pending_ = false;  // s_.row_major holds int8 P·V rows of this Attend, not yet in Oᵀ
  // The current tile's requests of the next one by the tile kernels, in elements of the
  // operand's dtype from a row to its next tile's (0: none; TileKernelsRequest).
  std::int64_t key_ahead_ = 0, value_ahead_ = 0;
  std::int64_t packed_value_rows_ = 0;  // bfloat16: V rows packed in pairs in s_.vp
};

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_FORWARD_TASK_INL_H_
