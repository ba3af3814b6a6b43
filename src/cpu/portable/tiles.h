// The portable kernels' tiles: rows packed into contiguous buffers in the accumulation
// type, and the two inner products on them — plain loops in the input's precision.
// (The SIMD kernels' counterparts are simd/microkernels-inl.h.)
#pragma once

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
