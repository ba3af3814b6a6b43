// bfloat16 microkernels on `vdpbf16ps` (AVX-512 BF16): each instruction multiplies 16
// pairs of bfloat16 and adds both products into 16 float32 accumulators — twice the
// multiply-adds of a float32 FMA. Highway 1.0.3 does not emit it, so these are raw
// intrinsics, isolated here and called only where the CPU has the instruction.
//
// Layouts (tile of 32 query rows = 2 vectors of 16 lanes, as the float32 kernel):
//   query pairs   qp[p][r][2] = (Q[r][2p], Q[r][2p+1])
//   prob. pairs   pp[c/2][r][2] = (P[r][c], P[r][c+1])          (bfloat16-rounded P)
//   value pairs   vp[c/2][d][2] = (V[c][d], V[c+1][d])
#pragma once

#include <cstdint>

namespace sdpa::detail::bf16 {

constexpr int kRows = 32;      // query rows per tile
constexpr int kKeyBlock = 12;  // keys per score_block call
constexpr int kValueBlock = 8; // value dims per accumulate register block

// True when the CPU has AVX-512 F, BW and BF16.
bool supported();

// st[c][r] = scale · Σ_p dot(qp[p][r], K[c][2p..2p+1]) for 12 keys c; K rows are `pairs`
// bf16 pairs long (even E), k_stride elements apart.
void score_block(const std::uint16_t* qp, std::int64_t pairs, const std::uint16_t* k, std::int64_t k_stride,
                 float scale, float* st);

// pp from the float32 probabilities st[c][r] (c < 2·col_pairs), rounded to bfloat16.
void pack_probabilities(const float* st, std::int64_t col_pairs, std::uint16_t* pp);

// vp from `cols` rows of V (bf16, unit column stride, v_stride apart); a missing odd
// row is zero.
void pack_values(const std::uint16_t* v, std::int64_t v_stride, std::int64_t cols, std::int64_t Ev,
                 std::uint16_t* vp);

// ot[d][r] += Σ_{c/2} dot(pp[c/2][r], vp[c/2][d]) for all Ev value dims.
void accumulate(const std::uint16_t* pp, std::int64_t col_pairs, const std::uint16_t* vp, std::int64_t Ev,
                float* ot);

}  // namespace sdpa::detail::bf16
