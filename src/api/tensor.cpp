#include "sdpa/tensor.h"

#include <cstdint>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "common/element.h"
#include "sdpa/error.h"

namespace sdpa {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::boolean:
    case DType::int8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::boolean: return "bool";
    case DType::int8: return "int8";
  }
  return "unknown";
}

namespace detail {

#if defined(__linux__)
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
// The whole huge pages a buffer of `bytes` spans (bytes < SIZE_MAX − kHugePage).
std::size_t huge_page_span(std::size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
}  // namespace
#endif

std::byte* TensorAllocator::allocate(std::size_t bytes) {
#if defined(__linux__)
  if (bytes >= kHugePage) {
    if (bytes > SIZE_MAX / 2) throw std::bad_alloc();
    // Mapped with a huge page's slack, then trimmed to start on a huge page's boundary:
    // the kernel gives a huge page only to a whole aligned 2 MiB of a region.
    const std::size_t length = huge_page_span(bytes), mapped_length = length + kHugePage;
    void* mapped = mmap(nullptr, mapped_length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    const auto first = reinterpret_cast<std::uintptr_t>(mapped);
    const std::uintptr_t start = (first + kHugePage - 1) / kHugePage * kHugePage, end = start + length;
    if (start > first) munmap(mapped, start - first);
    if (first + mapped_length > end) munmap(reinterpret_cast<void*>(end), first + mapped_length - end);
    // A hint: where huge pages are off (or this kernel has none), the buffer keeps 4 KiB pages.
    madvise(reinterpret_cast<void*>(start), length, MADV_HUGEPAGE);
    return reinterpret_cast<std::byte*>(start);
  }
#endif
  return static_cast<std::byte*>(::operator new(bytes));
}

void TensorAllocator::deallocate(std::byte* data, std::size_t bytes) noexcept {
#if defined(__linux__)
  if (bytes >= kHugePage) {
    munmap(data, huge_page_span(bytes));
    return;
  }
#endif
  ::operator delete(data);
}

}  // namespace detail

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t step = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = step;
    step *= shape[d] > 0 ? shape[d] : 1;
  }
  return strides;
}

static std::int64_t checked_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) {
    if (size < 0) throw Error(ErrorKind::value, "shape", "expected non-negative sizes, got " + std::to_string(size));
    if (__builtin_mul_overflow(count, size, &count))
      throw Error(ErrorKind::value, "shape", "expected an element count that fits in 64 bits, got an overflow");
  }
  return count;
}

std::int64_t TensorView::numel() const { return checked_numel(shape); }

std::vector<std::int64_t> TensorView::effective_strides() const {
  return strides.empty() ? contiguous_strides(shape) : strides;
}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  const std::int64_t count = checked_numel(shape_);
  std::int64_t bytes;
  if (__builtin_mul_overflow(count, static_cast<std::int64_t>(dtype_size(dtype)), &bytes))
    throw Error(ErrorKind::value, "shape", "expected a byte count that fits in 64 bits, got an overflow");
  storage_.assign(static_cast<std::size_t>(bytes), std::byte{0});
}

std::int64_t Tensor::numel() const { return checked_numel(shape_); }

TensorView Tensor::view() const {
  return TensorView{const_cast<std::byte*>(storage_.data()), dtype_, shape_, contiguous_strides(shape_)};
}

double Tensor::get(std::int64_t flat_index) const {
  return detail::load_element<double>(storage_.data() + flat_index * static_cast<std::int64_t>(dtype_size(dtype_)),
                                      dtype_);
}

void Tensor::set(std::int64_t flat_index, double value) {
  detail::store_element<double>(storage_.data() + flat_index * static_cast<std::int64_t>(dtype_size(dtype_)), dtype_,
                                value);
}

double Tensor::at(std::initializer_list<std::int64_t> index) const {
  const std::vector<std::int64_t> strides = contiguous_strides(shape_);
  std::int64_t flat = 0;
  std::size_t d = 0;
  for (std::int64_t i : index) flat += i * strides[d++];
  return get(flat);
}

}  // namespace sdpa
