// Rotary position embedding (RoFormer, arXiv:2104.09864, eq. 34). The angles are
// computed in double whatever the tensor's dtype: p · θ_i reaches 10^5 and more for long
// contexts, where float32 angles lose the low bits that tell neighbouring positions apart.
#include "sdpa/nn.h"

#include <cmath>
#include <vector>

#include "sdpa/error.h"

namespace sdpa::nn {
namespace {

// Rotates every (..., l, ·) row of x by the angles of position offset + l.
//   a' = a cos − b sin,  b' = a sin + b cos   for each pair (a, b) = (x[first_i], x[second_i])
template <class T>
void rotate(const TensorView& x, std::int64_t offset, const RopeOptions& options, std::int64_t rotary_dim) {
  const std::size_t rank = x.rank();
  const std::int64_t rows = x.shape[rank - 2];
  const std::int64_t pairs = rotary_dim / 2;
  const std::vector<std::int64_t> strides = x.effective_strides();
  const std::int64_t row_stride = strides[rank - 2], col_stride = strides[rank - 1];

  // θ_i = base^(−2i/d); cos and sin of (offset + l) θ_i for every row l.
  std::vector<double> cos_table(static_cast<std::size_t>(rows * pairs)), sin_table(cos_table.size());
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double theta = std::pow(options.base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
    for (std::int64_t l = 0; l < rows; ++l) {
      const double angle = static_cast<double>(offset + l) * theta;
      cos_table[static_cast<std::size_t>(l * pairs + i)] = std::cos(angle);
      sin_table[static_cast<std::size_t>(l * pairs + i)] = std::sin(angle);
    }
  }
  // Channel offsets of the two members of pair i.
  std::vector<std::int64_t> first(static_cast<std::size_t>(pairs)), second(first.size());
  for (std::int64_t i = 0; i < pairs; ++i) {
    const bool interleaved = options.layout == RopeLayout::interleaved;
    first[static_cast<std::size_t>(i)] = (interleaved ? 2 * i : i) * col_stride;
    second[static_cast<std::size_t>(i)] = (interleaved ? 2 * i + 1 : i + pairs) * col_stride;
  }

  // Odometer over the leading dims.
  std::int64_t matrices = 1;
  for (std::size_t d = 0; d + 2 < rank; ++d) matrices *= x.shape[d];
  std::vector<std::int64_t> index(rank >= 2 ? rank - 2 : 0, 0);
  std::int64_t base_offset = 0;
  T* data = static_cast<T*>(x.data);
  for (std::int64_t m = 0; m < matrices; ++m) {
    for (std::int64_t l = 0; l < rows; ++l) {
      T* row = data + base_offset + l * row_stride;
      const double* c = &cos_table[static_cast<std::size_t>(l * pairs)];
      const double* s = &sin_table[static_cast<std::size_t>(l * pairs)];
      for (std::int64_t i = 0; i < pairs; ++i) {
        T& a = row[first[static_cast<std::size_t>(i)]];
        T& b = row[second[static_cast<std::size_t>(i)]];
        const double av = a, bv = b;
        a = static_cast<T>(av * c[i] - bv * s[i]);
        b = static_cast<T>(av * s[i] + bv * c[i]);
      }
    }
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < x.shape[d]) {
        base_offset += strides[d];
        break;
      }
      base_offset -= (x.shape[d] - 1) * strides[d];
      index[d] = 0;
    }
  }
}

}  // namespace

void apply_rope(const TensorView& x, std::int64_t position_offset, const RopeOptions& options) {
  if (x.dtype != DType::float32 && x.dtype != DType::float64) {
    throw Error(ErrorKind::type, "x", std::string("expected float32 or float64, got ") + dtype_name(x.dtype));
  }
  if (x.rank() < 2) {
    throw Error(ErrorKind::value, "x", "expected rank >= 2 (..., L, D), got rank " + std::to_string(x.rank()));
  }
  if (!x.strides.empty() && x.strides.size() != x.rank()) {
    throw Error(ErrorKind::value, "x",
                "expected one stride per dim, got " + std::to_string(x.strides.size()) + " strides for rank " +
                    std::to_string(x.rank()));
  }
  const std::int64_t head_dim = x.shape.back();
  const std::int64_t rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    throw Error(ErrorKind::value, "options.rotary_dim",
                "expected an even number of channels <= the head dim " + std::to_string(head_dim) + ", got " +
                    std::to_string(rotary_dim));
  }
  if (!(options.base > 0) || !std::isfinite(options.base)) {
    throw Error(ErrorKind::value, "options.base", "expected a finite base > 0, got " + std::to_string(options.base));
  }
  // The last row's position, offset + L − 1, must fit in int64 (its sum was signed
  // overflow, undefined behaviour, for offsets near 2^63).
  const std::int64_t rows = x.shape[x.rank() - 2];
  std::int64_t last_position = 0;
  if (rows > 0 && __builtin_add_overflow(position_offset, rows - 1, &last_position)) {
    throw Error(ErrorKind::value, "position_offset",
                "expected an offset whose last position (offset + " + std::to_string(rows - 1) +
                    ") fits in int64, got " + std::to_string(position_offset));
  }
  if (x.numel() == 0 || rotary_dim == 0) return;
  if (x.data == nullptr) throw Error(ErrorKind::value, "x", "expected data, got a null pointer");
  if (x.dtype == DType::float32) {
    rotate<float>(x, position_offset, options, rotary_dim);
  } else {
    rotate<double>(x, position_offset, options, rotary_dim);
  }
}

}  // namespace sdpa::nn
