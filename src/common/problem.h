// The validated, resolved form of one attention call: what src/api/ hands to a kernel.
// Kernels trust it: every shape, stride and offset here has been checked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
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

  // Paged rows (a paged KV cache, sdpa::forward_paged): row r lives at element
  // head_offset + page_offset[r / page_rows] + (r % page_rows)·row_stride. 0 = not paged.
  std::int64_t page_rows = 0;
  std::vector<std::int64_t> page_offset;

  bool present() const { return data != nullptr; }
  bool paged() const { return page_rows > 0; }
  std::byte* address(std::int64_t matrix, std::int64_t row, std::int64_t col) const {
    std::int64_t element = head_offset[static_cast<std::size_t>(matrix)] + col * col_stride;
    if (paged())
      element += page_offset[static_cast<std::size_t>(row / page_rows)] + (row % page_rows) * row_stride;
    else
      element += row * row_stride;
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

// A resumable call's online-softmax state (the ordered exchange of src/dist/ feeds a
// row's keys in global order, one chunk per call): for row i of query matrix qm, the
// entry at rows + (qm·matrix_stride + i)·(Ev + 2) holds the running max m, the running
// sum l and the Ev un-normalised accumulators, in the accumulation type. A call starts
// from it instead of (−inf, 0, 0) and, when `suspend`, writes it back instead of the
// output and lse (no sink folded); a call with `suspend` false finishes the rows as a
// single call would. Only the portable (float64) kernel takes it.
struct CarriedRows {
  void* rows = nullptr;
  std::int64_t matrix_stride = 0;
  bool suspend = false;
  bool present() const { return rows != nullptr; }
};

struct Problem {
  std::int64_t batch = 0;     // product of the leading (batch) dims
  std::int64_t heads_q = 0;   // Hq
  std::int64_t heads_kv = 0;  // Hkv, divides Hq
  std::int64_t L = 0, S = 0, E = 0, Ev = 0;

  // Matrix index: query-side operands use batch·Hq + h, key/value batch·Hkv + h_kv.
  Operand query, key, value;
  Operand mask;  // absent if data == nullptr; matrices indexed like query
  // int8 K / V: their float32 scales, matrices indexed like key (value), row = key index,
  // col unused (stride 0); absent otherwise. Element j of key row is scale(j) · q.
  Operand key_scale, value_scale;
  bool mask_is_bool = false;

  Operand output;
  Operand weights;  // absent unless asked for
  Operand lse;      // absent unless asked for; row = query index, col unused

  // The band of keys each query sees (causal folded in: it caps window_right at 0):
  // query i sees d(i) − window_left <= j <= d(i) + window_right, d(i) = i + diagonal_shift;
  // −1 = unbounded on that side.
  std::int64_t window_left = -1, window_right = -1;
  std::int64_t diagonal_shift = 0;  // 0 (top-left) or S − L (bottom-right)
  double scale = 1.0;
  double softcap = 0.0;              // > 0: s = softcap · tanh(scale · q·k / softcap)
  std::vector<double> alibi_slopes;  // empty, or one per query matrix (batch · Hq)
  // Attention sinks: empty, or one logit per query matrix that joins the row's softmax
  // denominator (−inf: none). Kernels fold it into the final (max, sum) of each row.
  std::vector<double> sinks;
  // Dropout's batch counter for batch element b is first_batch + b: a varlen sequence
  // or a paged sequence, run as a problem of its own, draws as its batch element.
  std::int64_t first_batch = 0;
  // A shard of a larger problem (ring attention, src/dist/): its query rows and keys
  // start at these indices of the whole one. Dropout counts i and j from them; the band
  // and ALiBi need nothing more, as the shard's diagonal_shift is the whole problem's
  // plus query_offset − key_offset.
  std::int64_t query_offset = 0, key_offset = 0;
  CarriedRows carried;  // absent but in a resumable call (above)
  double dropout_p = 0.0;
  std::uint64_t seed = 0, offset = 0;
  int num_threads = 0;
  bool float64 = false;  // accumulate in double (float64 inputs)

  std::int64_t q_matrix(std::int64_t b, std::int64_t h) const { return b * heads_q + h; }
  std::int64_t kv_matrix(std::int64_t b, std::int64_t h) const {
    return b * heads_kv + h / (heads_q / heads_kv);  // GQA: a group of Hq/Hkv heads shares one
  }
  // Query i sees keys key_begin(i) <= j < key_end(i) (causal and the window); the
  // range is empty for a row they mask entirely.
  std::int64_t key_begin(std::int64_t i) const {
    if (window_left < 0) return 0;
    return std::clamp<std::int64_t>(i + diagonal_shift - window_left, 0, S);
  }
  std::int64_t key_end(std::int64_t i) const {
    if (window_right < 0) return S;
    return std::clamp<std::int64_t>(i + diagonal_shift + window_right + 1, 0, S);
  }
  bool has_alibi() const { return !alibi_slopes.empty(); }
  bool has_sinks() const { return !sinks.empty(); }
  // The sink logit of query matrix qm; −inf (no sink) without sinks.
  double sink(std::int64_t qm) const {
    return has_sinks() ? sinks[static_cast<std::size_t>(qm)] : -std::numeric_limits<double>::infinity();
  }

  // Threads for a kernel: num_threads (0 = `default_threads`), or 1 for a problem so small
  // that waking a thread team costs more than it saves (tens of µs on a loaded machine
  // against a few µs of work). Results do not depend on the thread count.
  int threads(int default_threads) const { return threads_for(work(), num_threads, default_threads); }
  // Multiply-adds of Q Kᵀ and P V.
  double work() const {
    return static_cast<double>(batch * heads_q) * static_cast<double>(L) * static_cast<double>(S) *
           static_cast<double>(E + Ev);
  }
  // The same for `work` multiply-adds in all (a varlen or paged call's sequences).
  static int threads_for(double work, int num_threads, int default_threads) {
    // 2^18 (it was 2^20), measured on the SIMD forward: a (1, 12, 16, 64) float32 call
    // (2^18.6) took 34 µs on one thread and 23 µs on two, calls back to back; two threads
    // were not slower with 2 ms idle gaps between calls (86–89 against 105–111 µs).
    // Under oversubscription a team can wait a scheduler time slice at a barrier
    // (bench/RESULTS.md), as it could above 2^20 before (docs/performance.md, "Threads").
    constexpr double kSerialWork = 1 << 18;
    if (work < kSerialWork) return 1;
    return num_threads > 0 ? num_threads : default_threads;
  }
  // ALiBi's bias for query matrix qm, query i, key j: −slope · |d(i) − j|.
  double alibi_bias(std::int64_t qm, std::int64_t i, std::int64_t j) const {
    const std::int64_t distance = i + diagonal_shift - j;
    return -alibi_slopes[static_cast<std::size_t>(qm)] * static_cast<double>(distance < 0 ? -distance : distance);
  }
};

}  // namespace sdpa::detail
