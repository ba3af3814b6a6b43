// bfloat16 microkernels on `vdpbf16ps` (AVX-512 BF16): each instruction multiplies 16
// pairs of bfloat16 and adds both products into 16 float32 accumulators — twice the
// multiply-adds of a float32 FMA. Highway 1.0.3 does not emit it, so these are raw
// intrinsics, isolated here and called only where the CPU has the instruction.
//
// Layouts (tile of 32 query rows = 2 vectors of 16 lanes, as the float32 kernel):
//   query pairs   qp[p][r][2] = (Q[r][2p], Q[r][2p+1])
//   prob. pairs   pp[c/2][r][2] = (P[r][c], P[r][c+1])          (bfloat16-rounded P)
//   value pairs   vp[c/2][d][2] = (V[c][d], V[c+1][d])
// The backward uses the same kernels on its own products (simd/backward_task-inl.h): dPᵀ is a
// score block of V against dO pairs, dQᵀ accumulate_keys of dS against K pairs; and
// rank_update for dK and dV, whose sums run over query rows, with the rows in pairs:
//   row pairs     xp[r/2][d][2] = (X[r][d], X[r+1][d])           (X = Q or dO)
//   weights       wt[c][r]  (bfloat16-rounded Wᵀ or dSᵀ: rows r, r+1 adjacent, a pair)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace sdpa::detail::bf16 {

constexpr int kRows = 32;      // query rows per tile
constexpr int kKeyBlock = 12;  // keys per score_block call
constexpr int kValueBlock = 8; // value dims per accumulate register block

// True when the CPU has AVX-512 F, BW, VL and BF16.
bool supported();

// True when bfloat16 inputs take these kernels: supported() and the CPU's vdpbf16ps
// outruns its float32 FMAs. Otherwise bfloat16 rows are widened to float32, exactly, and
// take the float32 kernels. AMD's cores issue vdpbf16ps at FMA's rate, two products a
// lane: twice the float32 multiply-adds (Zen 4 461 against 228 GFLOP/s, Zen 5 921
// against 489: `sdpa bench`'s probes, bench/RESULTS.md). Intel's issue one every second
// cycle where FMA goes twice a cycle: half the float32 rate (an Emerald Rapids Xeon 154
// against 320 GFLOP/s), and the widened path ran a bfloat16 forward 1.64x, forward +
// backward 1.62x and a decode 1.14x faster there (docs/performance.md). Decided by the
// vendor, not by timing, so that a machine's bits never depend on a timer's noise.
bool chosen();

// For tests: force chosen() to `take` (true only where supported()), so that a machine
// runs both paths; std::nullopt restores the CPU's own choice.
void choose_for_test(std::optional<bool> take);

// st[c·st_stride + r] = scale · Σ_p dot(qp[p][r], K[c][2p..2p+1]) for 12 keys c; K rows
// are `pairs` bf16 pairs long (even E), k_stride elements apart. ahead ≠ 0: each row's
// line that many elements on (the next tile's row) is requested into L2 as the block
// reaches the row's own.
void score_block(const std::uint16_t* qp, std::int64_t pairs, const std::uint16_t* k, std::int64_t k_stride,
                 float scale, float* st, std::int64_t st_stride, std::int64_t ahead = 0);

// out[p][w][2] = (x[2p][w], x[2p+1][w]) rounded to bfloat16, for `pairs` pairs of float32
// rows `stride` apart and w < width (a multiple of 16). pp from Sᵀ's columns (width kRows),
// or a block's query rows in pairs.
void pack_pairs(const float* x, std::int64_t stride, std::int64_t pairs, std::int64_t width, std::uint16_t* out);

// xp[w/2][r][2] = (xt[w][r], xt[w+1][r]) from transposed rows xt (width × rows, rows a
// multiple of 16): Qᵀ or dOᵀ in pairs along E or Ev. An odd width's last pair gets a zero
// partner: xt must have room for a row past it, which this zeroes.
void pack_along_width(float* xt, std::int64_t width, std::int64_t rows, std::uint16_t* xp);

// out[i] = x[i] rounded to bfloat16, for i < n (a multiple of 32).
void round_floats(const float* x, std::int64_t n, std::uint16_t* out);

// vp from `cols` rows of V (bf16, unit column stride, v_stride apart); a missing odd
// row is zero. ahead ≠ 0: each line read requests the line that many elements on.
void pack_values(const std::uint16_t* v, std::int64_t v_stride, std::int64_t cols, std::int64_t Ev, std::uint16_t* vp,
                 std::int64_t ahead = 0);

// ot[d][r] += Σ_{c/2} dot(pp[c/2][r], vp[c/2][d]) for all Ev value dims.
void accumulate(const std::uint16_t* pp, std::int64_t col_pairs, const std::uint16_t* vp, std::int64_t Ev,
                float* ot);

// ot[d][r] += Σ_{c < cols} P[r][c] · V[c][d] for keys [0, cols) of a tile of tile_cols V
// rows (v, v_stride apart), P float32 at pt[c·pt_stride + r] and rounded to bfloat16 in
// pp: P·V, or dQ's dS·K. The key pairs stop at cols: an odd count packs its last key with
// a zero partner, so a key past it (P = 0, V perhaps NaN) adds no 0 · V. V is packed into
// vp only when *packed_rows (the rows vp holds; 0 for none) is not what cols needs, so
// the calls of a tile share one packing (which passes `ahead` to pack_values).
void accumulate_keys(const float* pt, std::int64_t pt_stride, std::int64_t cols, std::int64_t tile_cols,
                     const std::uint16_t* v, std::int64_t v_stride, std::int64_t Ev, std::uint16_t* pp,
                     std::uint16_t* vp, std::int64_t* packed_rows, float* ot, std::int64_t ahead = 0);

constexpr int kRankKeys = 6;  // keys per rank_update call

// acc[c·acc_stride + d] += Σ_{p in [pair0, pair1)} dot(wt[c·wt_stride + 2p..2p+1], xp[p][d])
// for kRankKeys keys c and d < width (a multiple of 16); xp's pairs are 2·width apart.
void rank_update(const std::uint16_t* wt, std::int64_t wt_stride, std::int64_t pair0, std::int64_t pair1,
                 const std::uint16_t* xp, std::int64_t width, float* acc, std::int64_t acc_stride);

// Decoding (a few query rows against K rows read in place: cpu/simd/decode_rows-inl.h):
// st[c·st_stride + r] = scale · Σ_e q[r][e] · K_c[e] for keys c < cols and rows r <
// rows (1 to 8); q row-major (rows × E), K_c = k_rows[c] (unit stride). The lanes run
// along E, so each score ends in a sum of lanes. Requests the lines of k_rows[c + ahead]
// into L2 while it reads k_rows[c] (k_rows holds cols + ahead rows).
constexpr int kMaxDecodeRows = 8;
void row_scores(const std::uint16_t* q, std::int64_t rows, std::int64_t E, const std::byte* const* k_rows,
                std::int64_t cols, std::int64_t ahead, float scale, float* st, std::int64_t st_stride);

}  // namespace sdpa::detail::bf16
