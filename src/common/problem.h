// The validated, resolved form of one attention call: what src/api/ hands to a kernel.
// Kernels trust it: every shape, stride and offset here has been checked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/element.h"
#include "sdpa/options.h"
#include "sdpa/tensor.h"

namespace sdpa::detail {

// One tensor seen as a stack of (row, column) matrices, one per (batch, head).
// Broadcasting and arbitrary batch strides are folded into `head_offset`.
struct Operand {
  std::byte* data = nullptr;
  DType dtype = DType::float32;
  std::size_t element_size = 4;
  std::vector<std::int64_t> head_offset;  // element offset of matrix (batch, head)
  std::int64_t row_stride = 0;            // elements between rows (L or S index)
  std::int64_t col_stride = 0;            // elements between columns (E, Ev or S index)

  bool present() const { return data != nullptr; }
  std::byte* address(std::int64_t matrix, std::int64_t row, std::int64_t col) const {
    const std::int64_t element = head_offset[static_cast<std::size_t>(matrix)] +
                                 row * row_stride + col * col_stride;
    return data + element * static_cast<std::int64_t>(element_size);
  }
  template <class T>
  T load(std::int64_t matrix, std::int64_t row, std::int64_t col) const {
    return load_element<T>(address(matrix, row, col), dtype);
  }
  template <class T>
  void store(std::int64_t matrix, std::int64_t row, std::int64_t col, T value) const {
    store_element<T>(address(matrix, row, col), dtype, value);
  }
};

struct Problem {
  std::int64_t batch = 0;     // product of the leading (batch) dims
  std::int64_t heads_q = 0;   // Hq
  std::int64_t heads_kv = 0;  // Hkv, divides Hq
  std::int64_t L = 0, S = 0, E = 0, Ev = 0;

  // Matrix index: query-side operands use batch·Hq + h, key/value batch·Hkv + h_kv.
  Operand query, key, value;
  Operand mask;  // absent if data == nullptr; matrices indexed like query
  bool mask_is_bool = false;

  Operand output;
  Operand weights;  // absent unless asked for
  Operand lse;      // absent unless asked for; row = query index, col unused

  Causal causal = Causal::none;
  double scale = 1.0;
  double dropout_p = 0.0;
  std::uint64_t seed = 0, offset = 0;
  int num_threads = 0;
  bool float64 = false;  // accumulate in double (float64 inputs)

  std::int64_t q_matrix(std::int64_t b, std::int64_t h) const { return b * heads_q + h; }
  std::int64_t kv_matrix(std::int64_t b, std::int64_t h) const {
    return b * heads_kv + h / (heads_q / heads_kv);  // GQA: a group of Hq/Hkv heads shares one
  }
  // Causal: query i sees keys j < key_end(i). Without causal, all S keys.
  std::int64_t key_end(std::int64_t i) const {
    if (causal == Causal::none) return S;
    const std::int64_t shift = causal == Causal::bottom_right ? S - L : 0;
    return std::clamp<std::int64_t>(i + 1 + shift, 0, S);
  }
};

}  // namespace sdpa::detail
