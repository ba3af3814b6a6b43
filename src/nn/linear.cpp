// BLAS ints are 32-bit in Debian's OpenBLAS (no ILP64 interface), so row counts are fed
// in chunks and any leading dimension or width beyond INT_MAX is refused up front.
#include "nn/linear.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "sdpa/error.h"

namespace sdpa::nn::detail {
namespace {

constexpr std::int64_t kMaxRowsPerCall = std::int64_t{1} << 30;

// A set of rows as the BLAS sees them: `blocks` groups (found by walking `outer_shape`
// with `outer_strides`) of `rows` rows each, `ld` elements apart.
struct RowLayout {
  std::vector<std::int64_t> outer_shape, outer_strides;
  std::int64_t rows = 1;
  std::int64_t ld = 0;
};

// Merges the leading dims of `x` into as few (count, stride) pairs as possible; the
// innermost becomes the GEMM's M dimension with leading dimension ld.
bool row_layout(const TensorView& x, std::int64_t in, RowLayout& layout) {
  const std::vector<std::int64_t> strides = x.effective_strides();
  const std::size_t rank = x.rank();
  if (in > 1 && strides[rank - 1] != 1) return false;
  std::vector<std::int64_t> shape, stride;
  for (std::size_t d = 0; d + 1 < rank; ++d) {
    if (x.shape[d] == 1) continue;  // a size-1 dim has no stride that matters
    if (strides[d] < 0) return false;
    if (!shape.empty() && stride.back() == strides[d] * x.shape[d]) {
      shape.back() *= x.shape[d];
      stride.back() = strides[d];
    } else {
      shape.push_back(x.shape[d]);
      stride.push_back(strides[d]);
    }
  }
  if (shape.empty()) {
    layout.rows = 1;
    layout.ld = std::max<std::int64_t>(in, 1);
  } else {
    layout.rows = shape.back();
    layout.ld = stride.back();
    shape.pop_back();
    stride.pop_back();
    // The GEMM reads `in` elements of each row: rows must not overlap, and ld must fit.
    if (layout.ld < in || layout.ld > INT_MAX) return false;
  }
  layout.outer_shape = std::move(shape);
  layout.outer_strides = std::move(stride);
  return true;
}

// C (m, n) = A (m, k; lda) · Bᵀ where B is (n, k) packed; beta = 1 keeps C's bias.
template <class T>
void gemm_abt(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b, T beta, T* c) {
  for (std::int64_t start = 0; start < m; start += kMaxRowsPerCall) {
    const int rows = static_cast<int>(std::min(kMaxRowsPerCall, m - start));
    if constexpr (sizeof(T) == 4) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, static_cast<int>(n), static_cast<int>(k), 1.0f,
                  a + start * lda, static_cast<int>(lda), b, static_cast<int>(k), beta, c + start * n,
                  static_cast<int>(n));
    } else {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, static_cast<int>(n), static_cast<int>(k), 1.0,
                  a + start * lda, static_cast<int>(lda), b, static_cast<int>(k), beta, c + start * n,
                  static_cast<int>(n));
    }
  }
}

template <class T>
void linear_typed(const TensorView& x, const Tensor& weight, const Tensor* bias, T* y) {
  const std::int64_t out = weight.shape()[0], in = weight.shape()[1];
  std::int64_t total_rows = 1;
  for (std::size_t d = 0; d + 1 < x.rank(); ++d) total_rows *= x.shape[d];  // the caller checked x.numel()
  if (total_rows == 0 || out == 0) return;
  // Bias first, then the GEMM accumulates on top of it (beta = 1).
  const T* b = bias != nullptr ? static_cast<const T*>(bias->data()) : nullptr;
  for (std::int64_t r = 0; r < total_rows; ++r) {
    if (b != nullptr) {
      std::memcpy(y + r * out, b, static_cast<std::size_t>(out) * sizeof(T));
    } else {
      std::fill(y + r * out, y + (r + 1) * out, T(0));
    }
  }
  if (in == 0) return;
  const T* w = static_cast<const T*>(weight.data());

  RowLayout layout;
  std::vector<T> packed;
  const T* base = static_cast<const T*>(x.data);
  if (!row_layout(x, in, layout)) {
    // Gather into a packed (rows, in) copy with an odometer over the multi-index.
    packed.resize(static_cast<std::size_t>(total_rows * in));
    const std::vector<std::int64_t> strides = x.effective_strides();
    std::vector<std::int64_t> index(x.rank(), 0);
    std::int64_t offset = 0;
    for (std::int64_t i = 0; i < total_rows * in; ++i) {
      packed[static_cast<std::size_t>(i)] = base[offset];
      for (std::size_t d = x.rank(); d-- > 0;) {
        if (++index[d] < x.shape[d]) {
          offset += strides[d];
          break;
        }
        offset -= (x.shape[d] - 1) * strides[d];
        index[d] = 0;
      }
    }
    base = packed.data();
    layout.outer_shape.clear();
    layout.outer_strides.clear();
    layout.rows = total_rows;
    layout.ld = in;
  }

  // One GEMM per block of rows.
  std::vector<std::int64_t> index(layout.outer_shape.size(), 0);
  std::int64_t offset = 0;
  for (std::int64_t block = 0, blocks = total_rows / layout.rows; block < blocks; ++block) {
    gemm_abt<T>(layout.rows, out, in, base + offset, layout.ld, w, T(1), y + block * layout.rows * out);
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < layout.outer_shape[d]) {
        offset += layout.outer_strides[d];
        break;
      }
      offset -= (layout.outer_shape[d] - 1) * layout.outer_strides[d];
      index[d] = 0;
    }
  }
}

}  // namespace

void linear(const TensorView& x, const Tensor& weight, const Tensor* bias, void* y) {
  const std::int64_t out = weight.shape()[0], in = weight.shape()[1];
  if (out > INT_MAX || in > INT_MAX) {
    throw Error(ErrorKind::value, "weight",
                "expected projection sizes below 2^31 (the BLAS's int), got " + std::to_string(out) + " x " +
                    std::to_string(in));
  }
  if (weight.dtype() == DType::float32) {
    linear_typed<float>(x, weight, bias, static_cast<float*>(y));
  } else {
    linear_typed<double>(x, weight, bias, static_cast<double*>(y));
  }
}

}  // namespace sdpa::nn::detail
