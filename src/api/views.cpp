#include "api/views.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace sdpa::detail {

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

std::string number_string(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void fail(const std::string& argument, const std::string& message, ErrorKind kind) {
  throw Error(kind, argument, message);
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t product;
  if (__builtin_mul_overflow(a, b, &product))
    fail(argument, "expected sizes whose product fits in 64 bits, got an overflow");
  return product;
}
namespace {

std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t sum;
  if (__builtin_add_overflow(a, b, &sum))
    fail(argument, "expected strides whose offsets fit in 64 bits, got an overflow");
  return sum;
}

}  // namespace

Span check_view(const TensorView& view, const std::string& name) {
  if (!view.strides.empty() && view.strides.size() != view.shape.size())
    fail(name, "expected " + std::to_string(view.shape.size()) + " strides (one per dim of shape " +
                   shape_string(view.shape) + "), got " + std::to_string(view.strides.size()));
  std::int64_t count = 1;
  for (std::int64_t size : view.shape) {
    if (size < 0) fail(name, "expected non-negative sizes, got shape " + shape_string(view.shape));
    count = checked_mul(count, size, name);
  }
  if (count == 0) return {};
  if (view.data == nullptr) fail(name, "expected data for " + std::to_string(count) + " elements, got a null pointer");
  Shape packed;
  const Shape& strides = strides_of(view, packed);
  std::int64_t low = 0, high = 0;  // element offsets of the extreme elements
  for (std::size_t d = 0; d < view.shape.size(); ++d) {
    const std::int64_t reach = checked_mul(view.shape[d] - 1, strides[d], name);
    (reach < 0 ? low : high) = checked_add(reach < 0 ? low : high, reach, name);
  }
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(view.dtype));
  const std::int64_t low_bytes = checked_mul(low, element, name);
  const std::int64_t high_bytes = checked_add(checked_mul(high, element, name), element, name);
  const auto base = reinterpret_cast<std::uintptr_t>(view.data);
  return {base + static_cast<std::uintptr_t>(low_bytes), base + static_cast<std::uintptr_t>(high_bytes)};
}

namespace {

// Outputs are written in parallel: no two elements may share memory. Sufficient test:
// ordered by |stride|, each stride steps past everything the smaller ones reach.
void check_no_self_overlap(const TensorView& view, const std::string& name) {
  if (view.numel() == 0) return;  // nothing is written (NumPy gives empty arrays zero strides)
  Shape packed;
  const Shape& strides = strides_of(view, packed);
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (|stride|, size)
  for (std::size_t d = 0; d < view.shape.size(); ++d)
    if (view.shape[d] > 1) dims.emplace_back(std::abs(strides[d]), view.shape[d]);
  std::sort(dims.begin(), dims.end());
  std::int64_t reach = 1;  // elements covered by the dims so far
  for (auto [stride, size] : dims) {
    if (stride < reach)
      fail(name, "expected an output whose elements do not overlap, got strides " + shape_string(strides) +
                     " for shape " + shape_string(view.shape));
    reach = stride * (size - 1) + reach;
  }
}

// One buffer's dtype, shape and view; returns its span.
Span check_expected(const ExpectedView& e) {
  if (e.view->dtype != e.dtype)
    fail(e.name, std::string("expected dtype ") + dtype_name(e.dtype) + ", got " + dtype_name(e.view->dtype),
         ErrorKind::type);
  if (e.view->shape != *e.shape)
    fail(e.name, "expected shape " + shape_string(*e.shape) + ", got " + shape_string(e.view->shape));
  return check_view(*e.view, e.name);
}

}  // namespace

void check_reads(const std::vector<ExpectedView>& reads, std::vector<Span>& input_spans) {
  for (const ExpectedView& read : reads) input_spans.push_back(check_expected(read));
}

void check_outputs(const std::vector<ExpectedView>& outputs, const std::vector<Span>& input_spans) {
  std::vector<Span> output_spans;
  for (const ExpectedView& o : outputs) {
    const Span span = check_expected(o);
    check_no_self_overlap(*o.view, o.name);
    for (const Span& other : input_spans)
      if (span.overlaps(other)) fail(o.name, "expected a buffer apart from the inputs, got one that overlaps them");
    for (const Span& other : output_spans)
      if (span.overlaps(other)) fail(o.name, "expected a buffer apart from the other outputs, got an overlap");
    output_spans.push_back(span);
  }
}

}  // namespace sdpa::detail
