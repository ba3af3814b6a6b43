// The pieces the SIMD forward (attention_simd.cpp) and backward (backward_simd.cpp)
// share: tile constants, the two register-blocked microkernels of the transposed layout,
// and row loads and stores that convert dtypes. Included once per Highway target by
// files that use hwy/foreach_target.h (hence the toggling include guard).
#if defined(SDPA_CPU_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_TILES_INL_H_
#undef SDPA_CPU_TILES_INL_H_
#else
#define SDPA_CPU_TILES_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "common/problem.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace tiles {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocks: (keys × 2 row vectors) accumulators for the score kernel, (dims × 2
// row vectors) for the accumulate kernel. AVX-512 has 32 vector registers, AVX2 and SSE 16.
constexpr std::size_t kKeyBlock = HWY_MAX_BYTES >= 64 ? 12 : 6;
constexpr std::size_t kValueBlock = HWY_MAX_BYTES >= 64 ? 8 : 4;
constexpr std::int64_t kKeyTile = 96;  // keys per step: a multiple of both key blocks
constexpr std::int64_t kSubtiles = 4;  // subtiles of 2 row vectors that share each K/V tile
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.4426950408889634;

inline std::int64_t RoundUp(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// st[c·st_stride + ·] = Σ_e k[c·k_stride + e] · qt[e·rows + ·] for kKeyBlock keys c and
// a subtile's 2 row vectors: Sᵀ from K and Qᵀ (broadcast K[c][e] against a Qᵀ row); the
// backward's dPᵀ from V and dOᵀ.
HWY_INLINE void ScoreBlock(const float* HWY_RESTRICT qt, std::size_t rows, std::int64_t E, const float* HWY_RESTRICT k,
                           std::int64_t k_stride, float* HWY_RESTRICT st, std::size_t st_stride) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF acc0[kKeyBlock], acc1[kKeyBlock];
  for (std::size_t c = 0; c < kKeyBlock; ++c) acc0[c] = acc1[c] = hn::Zero(df);
  for (std::int64_t e = 0; e < E; ++e) {
    const VF q0 = hn::Load(df, qt + e * rows), q1 = hn::Load(df, qt + e * rows + N);
    _Pragma("GCC unroll 16") for (std::size_t c = 0; c < kKeyBlock; ++c) {
      const VF key = hn::Set(df, k[static_cast<std::int64_t>(c) * k_stride + e]);
      acc0[c] = hn::MulAdd(q0, key, acc0[c]);
      acc1[c] = hn::MulAdd(q1, key, acc1[c]);
    }
  }
  for (std::size_t c = 0; c < kKeyBlock; ++c) {
    hn::Store(acc0[c], df, st + c * st_stride);
    hn::Store(acc1[c], df, st + c * st_stride + N);
  }
}

// ot[d·rows + ·] += Σ_c v[c·v_stride + d] · pt[c·pt_stride + ·] for `Block` dims d and
// a subtile's 2 row vectors: the forward's Oᵀ += V-broadcast ⊗ Pᵀ; the backward's
// dQᵀ += K-broadcast ⊗ dSᵀ.
template <std::size_t Block>
HWY_INLINE void AccumulateBlock(const float* HWY_RESTRICT pt, std::size_t pt_stride, std::int64_t cols,
                                const float* HWY_RESTRICT v, std::int64_t v_stride, float* HWY_RESTRICT ot,
                                std::size_t rows) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF acc0[Block], acc1[Block];
  for (std::size_t d = 0; d < Block; ++d) {
    acc0[d] = hn::Load(df, ot + d * rows);
    acc1[d] = hn::Load(df, ot + d * rows + N);
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    const VF p0 = hn::Load(df, pt + c * pt_stride), p1 = hn::Load(df, pt + c * pt_stride + N);
    _Pragma("GCC unroll 16") for (std::size_t d = 0; d < Block; ++d) {
      const VF value = hn::Set(df, v[c * v_stride + static_cast<std::int64_t>(d)]);
      acc0[d] = hn::MulAdd(p0, value, acc0[d]);
      acc1[d] = hn::MulAdd(p1, value, acc1[d]);
    }
  }
  for (std::size_t d = 0; d < Block; ++d) {
    hn::Store(acc0[d], df, ot + d * rows);
    hn::Store(acc1[d], df, ot + d * rows + N);
  }
}

// ot[d·rows + ·] += Σ_c v[c·v_stride + d] · pt[c·pt_stride + ·] for all `dims` dims:
// whole register blocks, then single dims.
inline void Accumulate(const float* pt, std::size_t pt_stride, std::int64_t cols, const float* v,
                       std::int64_t v_stride, std::int64_t dims, float* ot, std::size_t rows) {
  std::int64_t d = 0;
  for (; d + static_cast<std::int64_t>(kValueBlock) <= dims; d += kValueBlock)
    AccumulateBlock<kValueBlock>(pt, pt_stride, cols, v + d, v_stride, ot + d * rows, rows);
  for (; d < dims; ++d) AccumulateBlock<1>(pt, pt_stride, cols, v + d, v_stride, ot + d * rows, rows);
}

// Elements [col0, col0+count) of row `row` of matrix `matrix`, converted to float32.
// The dtype switch is hoisted out of the loop; contiguous float16/bfloat16 rows convert
// a vector at a time (F16C / shifts).
inline void LoadRow(const Operand& op, std::int64_t matrix, std::int64_t row, std::int64_t col0, std::int64_t count,
                    float* out) {
  if (count <= 0) return;  // an empty row may have no memory behind it
  const std::byte* base = op.address(matrix, row, col0);
  const std::int64_t step = op.col_stride;
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  auto each = [&](auto convert, std::int64_t size) {
    for (std::int64_t c = 0; c < count; ++c) out[c] = convert(base + c * step * size);
  };
  switch (op.dtype) {
    case DType::float32:
      if (step == 1) {  // a contiguous row (paged K/V rows are copied this way)
        std::memcpy(out, base, static_cast<std::size_t>(count) * 4);
        return;
      }
      each([](const std::byte* p) { float v; std::memcpy(&v, p, 4); return v; }, 4);
      return;
    case DType::float64:
      each([](const std::byte* p) { double v; std::memcpy(&v, p, 8); return static_cast<float>(v); }, 8);
      return;
    case DType::boolean:
      each([](const std::byte* p) { return *p != std::byte{0} ? 1.0f : 0.0f; }, 1);
      return;
    case DType::float16:
    case DType::bfloat16: {
      const bool half = op.dtype == DType::float16;
      std::int64_t c = 0;
      if (step == 1) {
        const hn::Rebind<hwy::float16_t, DF> dh;
        const hn::Rebind<hwy::bfloat16_t, DF> db;
        for (; c + N <= count; c += N) {
          const VF v = half ? hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(base) + c))
                            : hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(base) + c));
          hn::StoreU(v, df, out + c);
        }
      }
      for (const std::byte* at = base + c * step * 2; c < count; ++c, at += step * 2) {
        std::uint16_t bits;
        std::memcpy(&bits, at, 2);
        out[c] = half ? fp16_to_float(bits) : bf16_to_float(bits);
      }
      return;
    }
  }
}

// Stores `count` float32 values into row `row` of `op` from column `col0`, rounded to
// its dtype (nearest even), with the dtype switch hoisted out of the loop.
inline void StoreRow(const Operand& op, std::int64_t matrix, std::int64_t row, std::int64_t col0, std::int64_t count,
                     const float* in) {
  if (count <= 0) return;
  std::byte* base = op.address(matrix, row, col0);
  const std::int64_t step = op.col_stride * static_cast<std::int64_t>(op.element_size);
  auto each = [&](auto store) {
    for (std::int64_t c = 0; c < count; ++c) store(base + c * step, in[c]);
  };
  switch (op.dtype) {
    case DType::float32:
      each([](std::byte* p, float v) { std::memcpy(p, &v, 4); });
      return;
    case DType::float64:
      each([](std::byte* p, float v) { const double d = v; std::memcpy(p, &d, 8); });
      return;
    case DType::float16:
      each([](std::byte* p, float v) { const std::uint16_t h = float_to_fp16(v); std::memcpy(p, &h, 2); });
      return;
    case DType::bfloat16:
      each([](std::byte* p, float v) { const std::uint16_t h = float_to_bf16(v); std::memcpy(p, &h, 2); });
      return;
    case DType::boolean:
      return;  // never an output dtype (validated)
  }
}

// A query row of a task: which (matrix, head, i) it is and which keys it sees:
// [key_begin, key_end) (causal and the sliding window).
struct Row {
  std::int64_t matrix, head, i, key_begin, key_end;
};

// The query rows of one subtile (the rest of its lanes are padding).
struct RowSet {
  std::vector<Row> rows;
  std::int64_t key_start = 0;      // no row sees a key before it
  std::int64_t key_limit = 0;      // no row sees a key at or past it
  std::int64_t max_key_begin = 0;  // every row sees the keys in [max_key_begin, min_key_end)
  std::int64_t min_key_end = 0;
};

// Fills `set` with rows [first, first + count) of the flattened (group heads × L) query
// rows that share KV head `head_kv` of batch `b` (GQA: a KV head serves Hq/Hkv query
// heads). Works for the forward's and the backward's problem alike.
template <class AnyProblem>
void AssignRows(const AnyProblem& p, std::int64_t b, std::int64_t head_kv, std::int64_t first, std::int64_t count,
                RowSet& set) {
  const std::int64_t group = p.heads_q / p.heads_kv;
  set.rows.clear();
  set.key_start = p.S;
  set.key_limit = 0;
  set.max_key_begin = 0;
  set.min_key_end = p.S;
  for (std::int64_t flat = first; flat < first + count; ++flat) {
    const std::int64_t head = head_kv * group + flat / p.L, i = flat % p.L;
    const Row row{p.q_matrix(b, head), head, i, p.key_begin(i), p.key_end(i)};
    if (row.key_begin >= row.key_end) {  // sees no key (the window or causal hides all)
      set.rows.push_back({row.matrix, head, i, 0, 0});
      set.max_key_begin = p.S;
      set.min_key_end = 0;
      continue;
    }
    set.rows.push_back(row);
    set.key_start = std::min(set.key_start, row.key_begin);
    set.key_limit = std::max(set.key_limit, row.key_end);
    set.max_key_begin = std::max(set.max_key_begin, row.key_begin);
    set.min_key_end = std::min(set.min_key_end, row.key_end);
  }
  if (set.key_limit == 0) set.key_start = 0;  // no row sees anything: an empty range
}

// The first key tile to visit for rows that see nothing before `key_start`, in a loop
// that starts at `begin` and steps by kKeyTile (tiles stay on that grid).
inline std::int64_t FirstTile(std::int64_t begin, std::int64_t key_start) {
  return key_start <= begin ? begin : begin + (key_start - begin) / kKeyTile * kKeyTile;
}

// The score transforms between Sᵀ = Q Kᵀ · scale and the mask, on a transposed tile
// st[c·stride + r] (keys c < cols, query rows r of `set`), in log2 units (scores ·
// log2 e). Logit softcapping: t ← C·tanh(t / C), C = softcap · log2 e, over `cols` keys
// of `vectors` row vectors; when `tanh_out` is given it receives tanh(t / C) (the
// backward's chain rule) with the same layout as st.
inline void Softcap(const Problem& p, float* st, std::size_t stride, std::int64_t cols, std::size_t vectors,
                    float* tanh_out, std::size_t tanh_stride) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF cap = hn::Set(df, static_cast<float>(p.softcap * kLog2e));
  const VF inverse_cap = hn::Set(df, static_cast<float>(1.0 / (p.softcap * kLog2e)));
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::size_t v = 0; v < vectors; ++v) {
      float* at = st + static_cast<std::size_t>(c) * stride + v * N;
      const VF t = hn::Tanh(df, hn::Mul(hn::Load(df, at), inverse_cap));
      if (tanh_out) hn::Store(t, df, tanh_out + static_cast<std::size_t>(c) * tanh_stride + v * N);
      hn::Store(hn::Mul(t, cap), df, at);
    }
}

// ALiBi: t −= slope · log2 e · |d(i) − j| for keys [j0, j0+cols), lane-wise over
// `vectors` row vectors. `lanes` holds, per row, slope · log2 e and then d(i) − j0
// (relative to the tile, so that float holds the distance exactly for any S).
inline void AddAlibi(const Problem& p, const RowSet& set, float* st, std::size_t stride, std::int64_t j0,
                     std::int64_t cols, std::size_t vectors, float* lanes) {
  const DF df;
  const std::size_t N = hn::Lanes(df), rows = vectors * N;
  float* slope = lanes;
  float* diagonal = lanes + rows;
  std::fill(lanes, lanes + 2 * rows, 0.0f);  // padding rows: no bias
  for (std::size_t r = 0; r < set.rows.size(); ++r) {
    slope[r] = static_cast<float>(p.alibi_slopes[static_cast<std::size_t>(set.rows[r].matrix)] * kLog2e);
    diagonal[r] = static_cast<float>(set.rows[r].i + p.diagonal_shift - j0);
  }
  for (std::size_t v = 0; v < vectors; ++v) {
    const VF s = hn::Load(df, slope + v * N), d = hn::Load(df, diagonal + v * N);
    for (std::int64_t c = 0; c < cols; ++c) {
      float* at = st + static_cast<std::size_t>(c) * stride + v * N;
      const VF distance = hn::Abs(hn::Sub(d, hn::Set(df, static_cast<float>(c))));
      hn::Store(hn::NegMulAdd(s, distance, hn::Load(df, at)), df, at);
    }
  }
}

// −inf outside each row's [key_begin, key_end) (causal, the sliding window), for keys
// [j0, j0+cols). Only needed when some row's band cuts the range.
inline void ApplyBand(const RowSet& set, float* st, std::size_t stride, std::int64_t j0, std::int64_t cols) {
  if (j0 >= set.max_key_begin && j0 + cols <= set.min_key_end) return;
  for (std::size_t r = 0; r < set.rows.size(); ++r) {
    const std::int64_t begin = std::clamp<std::int64_t>(set.rows[r].key_begin - j0, 0, cols);
    const std::int64_t end = std::clamp<std::int64_t>(set.rows[r].key_end - j0, begin, cols);
    for (std::int64_t c = 0; c < begin; ++c) st[static_cast<std::size_t>(c) * stride + r] = kMinusInf;
    for (std::int64_t c = end; c < cols; ++c) st[static_cast<std::size_t>(c) * stride + r] = kMinusInf;
  }
}

// Rows [j0, j0+cols) of K or V as float32 with unit column stride: the input itself
// when it already is (no copy; the kernels read it through float pointers, so it must be
// float-aligned), else converted into `tile`, zero-padded to `padded` rows so that whole
// register blocks can run over it.
inline const float* KeyValueRows(const Operand& op, std::int64_t matrix, std::int64_t j0, std::int64_t cols,
                                 std::int64_t padded, std::int64_t width, float* tile, std::int64_t* stride) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0; };
  if (op.dtype == DType::float32 && op.col_stride == 1 && !op.paged() && cols == padded && aligned(op.data) &&
      aligned(op.address(matrix, j0, 0))) {
    *stride = op.row_stride;
    return reinterpret_cast<const float*>(op.address(matrix, j0, 0));
  }
  for (std::int64_t c = 0; c < cols; ++c) LoadRow(op, matrix, j0 + c, 0, width, tile + c * width);
  std::fill(tile + cols * width, tile + padded * width, 0.0f);
  *stride = width;
  return tile;
}

}  // namespace tiles
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_TILES_INL_H_
