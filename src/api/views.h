// What every check of a tensor view needs: error messages in the library's form, the
// bytes a view spans and whether two views overlap, the expected shape and dtype of a
// buffer, and the slices of a view that packed and paged calls hand to the dense checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa::detail {

using Shape = std::vector<std::int64_t>;

// (2, 3) and (5,), as NumPy prints shapes.
std::string shape_string(const Shape& shape);
// A double as a person would write it (1e+39, 0.125), not std::to_string's 39 digits.
std::string number_string(double value);

// Throws sdpa::Error: "<argument>: <message>". Every check of the library reports this
// way — "<argument>: expected <what>, got <what>" — and no check writes anything, so a
// call either passes every check or changes nothing.
[[noreturn]] void fail(const std::string& argument, const std::string& message, ErrorKind kind = ErrorKind::value);

// a · b, or an error naming `argument` when it overflows int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument);

// The floating dtypes, listed: a dtype added later is not taken for one by default.
inline bool is_float(DType dtype) {
  return dtype == DType::float16 || dtype == DType::bfloat16 || dtype == DType::float32 || dtype == DType::float64;
}

// A byte range [begin, end) covering every element of a view; empty for no elements.
struct Span {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  bool overlaps(const Span& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};

// `view`'s strides: its own, or, when it gives none, the row-major strides of its shape,
// made in `packed`. What TensorView::effective_strides() says, without copying the view's
// own: the checks read each tensor's strides several times, and those copies were a
// quarter of a small call's heap allocations (docs/performance.md, "What is left of a
// small call from Python").
inline const Shape& strides_of(const TensorView& view, Shape& packed) {
  if (!view.strides.empty()) return view.strides;
  packed = contiguous_strides(view.shape);
  return packed;
}

// Checks a view on its own: strides match the rank, sizes are non-negative, the element
// count and every offset fit in 64 bits, data is non-null when there are elements.
// Returns the bytes it spans.
Span check_view(const TensorView& view, const std::string& name);

// A buffer and the shape and dtype it must have.
struct ExpectedView {
  const TensorView* view;
  const char* name;
  const Shape* shape;
  DType dtype;
};

// Tensors read besides the inputs (a backward's output, lse, dO): dtype, shape and view
// checked, any strides; their spans are added to `input_spans`.
void check_reads(const std::vector<ExpectedView>& reads, std::vector<Span>& input_spans);

// Output buffers: dtype, shape and view checked, no two elements sharing memory, and no
// overlap with an input (`input_spans`) or another output.
void check_outputs(const std::vector<ExpectedView>& outputs, const std::vector<Span>& input_spans);

// Visits every element of a view of `shape` and `strides` in row-major order of its
// shape, with its element offset (backward.cpp's zero fills and sums, the sinks' gradient).
template <class Visit>
void for_each_offset(const Shape& shape, const Shape& strides, Visit visit) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) count *= size;
  Shape index(shape.size(), 0);
  std::int64_t offset = 0;
  for (std::int64_t flat = 0; flat < count; ++flat) {
    visit(flat, offset);
    for (std::size_t d = shape.size(); d-- > 0;) {  // next row-major index, offset kept in step
      offset += strides[d];
      if (++index[d] < shape[d]) break;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace sdpa::detail
