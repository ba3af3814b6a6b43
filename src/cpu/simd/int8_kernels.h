// The int8 K/V decode microkernels on `vpdpwssd` (AVX-512 VNNI): each instruction
// multiplies 16 pairs of int16 and adds both products into 16 int32 accumulators,
// exactly — twice the multiply-adds of a float32 FMA. For a decode task's K and V rows
// read in place (cpu/simd/decode_rows-inl.h), the other operand is rounded to int16
// against its row's largest magnitude: the query for the scores (once per task), the
// weights w = P · s^V (the values' scales folded in) for P·V (once per key tile):
// x ≈ σ_r · x̂, an error of at most σ_r / 2 per element (docs/numerics.md, "Quantized
// K/V"); the int8 side is widened exactly. Raw intrinsics (and the product in inline
// assembly, where GCC 12 copied the accumulators), isolated here and called only where
// the CPU has the instruction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sdpa::detail::int8 {

constexpr int kMaxRows = 8;    // query rows per call
constexpr int kMaxKeys = 256;  // keys per call (the int32 sums' headroom: below)

// True when the CPU has AVX-512 F, BW, VL and VNNI.
bool supported();

// Query rows for row_scores, E <= kMaxQueryDims: q̂[r·QueryStride(E) + e] = round(q[r·E +
// e] / σ_r) for rows r < rows (1 to kMaxRows), zero for E <= e < QueryStride(E), with σ_r
// the least power of two for which max_e |q[r][e]| / σ_r <= kQueryLargest (0 for a row of
// zeros). A power of two, so that the division is exact and only the rounding moves an
// element: not at all where its last bit is at least σ_r — for a bfloat16 query every
// element within a factor 64 of its row's largest — and by at most σ_r / 2 < max_e
// |q[r][e]| / 32767 otherwise (docs/numerics.md, "Quantized K/V"). Returns false, writing
// nothing, when some element is not finite or a row's largest is below 2^-96 but not 0
// (as row_accumulate's weights: the caller keeps float32 for the task).
constexpr std::int64_t kQueryLargest = 32767;
// The head sizes it takes: a score's Σ_e q̂ · k (|k| <= 128) stays below 2^31 (512 ·
// 32767 · 128 = 2^31 - 2^16); a longer head keeps the float32 kernels.
constexpr std::int64_t kMaxQueryDims = 512;
constexpr std::int64_t QueryStride(std::int64_t E) { return (E + 31) / 32 * 32; }
bool pack_query(const float* q, std::int64_t rows, std::int64_t E, std::int16_t* q_hat, float* sigma);

// The decode scores of int8 K rows: st[c·st_stride + r] = scale · σ_r · k_scale[c] ·
// Σ_e q̂[r][e] · K_c[e] for keys c < cols and rows r < rows, q̂ and σ from pack_query
// (the sum exact in int32), K_c = k_rows[c] (int8, unit stride; the dims past E not
// read). k_scale is read up to 15 floats past cols. Requests the lines of k_rows[c +
// ahead] into L2 while it reads k_rows[c] (k_rows holds cols + ahead rows).
void row_scores(const std::int16_t* q_hat, const float* sigma, std::int64_t rows, std::int64_t E,
                const std::byte* const* k_rows, const float* k_scale, std::int64_t cols, std::int64_t ahead,
                float scale, float* st, std::int64_t st_stride);

// out[r·Ev + d] = Σ_{c < cols} w[r][c] · V_c[d] for rows r < rows (1 to kMaxRows), dims
// d < Ev and keys c < cols <= kMaxKeys, w[r][c] = wt[c·wt_stride + r] rounded to int16 as
// above, V_c = v_rows[c] (int8, unit stride; an odd count's last key gets a zero
// partner, row cols is not read); overwrites out, or with `add` adds to it (a task's
// tiles summed row-major, transposed once at its end). Requests the lines of v_rows[c + ahead]
// into L2 while it reads v_rows[c] (v_rows holds cols + ahead pointers). Returns false,
// writing nothing, when some row's weights are not all finite or its largest is below
// 2^-96 but not 0 (the caller keeps float32 for the call: NaN must stay NaN, and σ must
// be a normal float).
bool row_accumulate(const float* wt, std::int64_t wt_stride, std::int64_t rows, const std::byte* const* v_rows,
                    std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out, bool add = false);

}  // namespace sdpa::detail::int8
