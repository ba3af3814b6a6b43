// The portable kernels' tiles: rows packed into contiguous buffers in the accumulation
// type, and the two inner products on them — plain loops in the input's precision.
// (The SIMD kernels' counterparts are simd/microkernels-inl.h.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/problem.h"

namespace sdpa::detail::portable {

// dst[r·cols + c] = src[matrix][row0 + r][c] for r < rows, c < cols.
template <class T>
void pack_rows(const Operand& src, std::int64_t matrix, std::int64_t row0, std::int64_t rows, std::int64_t cols,
               T* dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src.load<T>(matrix, row0 + r, c);
}

// The keys a tile of query rows [i0, i0+rows) may see: none before the first row's
// key_begin (rounded down to the grid of `key_tile`, so tiles stay aligned) and none at
// or past the last row's key_end — both grow with i under causal and the window.
struct VisibleKeys {
  std::int64_t start, limit;
};
inline VisibleKeys visible_keys(const Problem& p, std::int64_t i0, std::int64_t rows, std::int64_t key_tile) {
  return {p.key_begin(i0) / key_tile * key_tile, p.key_end(i0 + rows - 1)};
}

// pack_rows for K or V, an int8 one times its rows' scales: the float64 kernel widens
// each tile exactly (8 by 24 significant bits fit in 53).
template <class T>
void pack_kv_rows(const Operand& src, const Operand& scale, std::int64_t matrix, std::int64_t row0, std::int64_t rows,
                  std::int64_t cols, T* dst) {
  pack_rows<T>(src, matrix, row0, rows, cols, dst);
  if (!scale.present()) return;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T s = scale.load<T>(matrix, row0 + r, 0);
    for (std::int64_t c = 0; c < cols; ++c) dst[r * cols + c] *= s;
  }
}

// visit(j0, cols) for each key tile [j0, j0+cols) of `visible`, with its K and V rows of
// KV matrix kvm packed into k and v.
template <class T, class Visit>
void for_each_key_tile(const Problem& p, std::int64_t kvm, VisibleKeys visible, std::int64_t key_tile, T* k, T* v,
                       Visit&& visit) {
  for (std::int64_t j0 = visible.start; j0 < visible.limit; j0 += key_tile) {
    const std::int64_t cols = std::min(key_tile, visible.limit - j0);
    pack_kv_rows<T>(p.key, p.key_scale, kvm, j0, cols, p.E, k);
    pack_kv_rows<T>(p.value, p.value_scale, kvm, j0, cols, p.Ev, v);
    visit(j0, cols);
  }
}

// scores[r·cols_stride + c] = scale · Σ_e q[r·E + e] · k[c·E + e]
template <class T>
void score_tile(const T* q, const T* k, std::int64_t rows, std::int64_t cols, std::int64_t E, T scale, T* scores,
                std::int64_t cols_stride) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* q_row = q + r * E;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T* k_row = k + c * E;
      T dot = 0;
      for (std::int64_t e = 0; e < E; ++e) dot += q_row[e] * k_row[e];
      scores[r * cols_stride + c] = dot * scale;
    }
  }
}

// acc[r·Ev + d] += Σ_c p[r·cols_stride + c] · v[c·Ev + d]
template <class T>
void accumulate_pv(const T* p, const T* v, std::int64_t rows, std::int64_t cols, std::int64_t Ev,
                   std::int64_t cols_stride, T* acc) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* acc_row = acc + r * Ev;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T weight = p[r * cols_stride + c];
      const T* v_row = v + c * Ev;
      for (std::int64_t d = 0; d < Ev; ++d) acc_row[d] += weight * v_row[d];
    }
  }
}

}  // namespace sdpa::detail::portable
