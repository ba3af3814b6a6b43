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
std::string to_string(const Shape& shape);
// A double as a person would write it (1e+39, 0.125), not std::to_string's 39 digits.
std::string to_string(double value);

// Throws sdpa::Error: "<argument>: <message>".
[[noreturn]] void fail(const std::string& argument, const std::string& message, ErrorKind kind = ErrorKind::value);

// a · b and a + b, or an error naming `argument` when they overflow int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument);
std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument);

inline bool is_float(DType dtype) { return dtype != DType::boolean; }

// A byte range [begin, end) covering every element of a view; empty for no elements.
struct Span {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  bool overlaps(const Span& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};

// Checks a view on its own: strides match the rank, sizes are non-negative, the element
// count and every offset fit in 64 bits, data is non-null when there are elements.
// Returns the bytes it spans.
Span check_view(const TensorView& view, const std::string& name);

// Outputs are written in parallel: no two elements may share memory.
void check_no_self_overlap(const TensorView& view, const std::string& name);

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

// Rows [row0, row0 + rows) of a (heads, total, cols) packed view as a (1, heads, rows,
// cols) view: one sequence, as forward() takes it.
TensorView sequence_view(const TensorView& packed, std::int64_t row0, std::int64_t rows);

// Element b of a (batch, ...) view with the batch dim kept at size 1.
TensorView batch_element(const TensorView& view, std::int64_t b);

}  // namespace sdpa::detail
