// The int8 V decode microkernel on `vpdpwssd` (AVX-512 VNNI): each instruction multiplies
// 16 pairs of int16 and adds both products into 16 int32 accumulators, exactly — twice
// the multiply-adds of a float32 FMA. For a decode task's P·V with int8 V rows read in
// place (cpu/simd/decode_rows-inl.h), the weights w = P · s^V (the values' scales
// folded in) are rounded to int16 against the largest |w| of each row over the call's
// keys: w ≈ σ_r · ŵ, |ŵ| <= 32767, an error of at most σ_r / 2 per weight
// (docs/numerics.md, "Quantized K/V"). Raw intrinsics (and the product in inline
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

// out[r·Ev + d] = Σ_{c < cols} w[r][c] · V_c[d] for rows r < rows (1 to kMaxRows), dims
// d < Ev and keys c < cols <= kMaxKeys, w[r][c] = wt[c·wt_stride + r] rounded to int16 as
// above, V_c = v_rows[c] (int8, unit stride; an odd count's last key gets a zero
// partner, row cols is not read); overwrites out. Requests the lines of v_rows[c + ahead]
// into L2 while it reads v_rows[c] (v_rows holds cols + ahead pointers). Returns false,
// writing nothing, when some row's weights are not all finite or its largest is below
// 2^-96 but not 0 (the caller keeps float32 for the call: NaN must stay NaN, and σ must
// be a normal float).
bool row_accumulate(const float* wt, std::int64_t wt_stride, std::int64_t rows, const std::byte* const* v_rows,
                    std::int64_t cols, std::int64_t Ev, std::int64_t ahead, float* out);

}  // namespace sdpa::detail::int8
