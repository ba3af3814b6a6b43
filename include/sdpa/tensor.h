// Tensors as sdpa sees them: a non-owning strided view, and a small owning tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace sdpa {

// int8 is for quantized keys and values only (Options::key_scale): value = scale · q.
enum class DType { float16, bfloat16, float32, float64, boolean, int8 };

// Bytes per element of `dtype`.
std::size_t dtype_size(DType dtype);
// "float32", "bool", ... (the names NumPy and PyTorch use).
const char* dtype_name(DType dtype);

// A strided view of memory it does not own. Strides are in elements, not bytes, and
// may be anything: zero (broadcast), negative, or non-contiguous (a (B, L, H, E) buffer
// is a (B, H, L, E) view with permuted strides). Empty `strides` means row-major packed.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides = {};

  std::size_t rank() const { return shape.size(); }
  // Product of the shape; 1 for rank 0. Throws sdpa::Error if it overflows int64.
  std::int64_t numel() const;
  // `strides` if given, else the row-major strides of `shape`.
  std::vector<std::int64_t> effective_strides() const;
};

// Row-major strides (in elements) of `shape`.
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);

namespace detail {
// Tensor's storage. A buffer of 2 MiB or more is mapped on its own, starts on a 2 MiB
// boundary and is offered to the kernel's transparent huge pages before its first touch
// (Linux, madvise MADV_HUGEPAGE: many systems give huge pages only to memory that asks);
// a smaller one, or elsewhere, comes from operator new. Why: a decode streams K and V
// through a new 4 KiB page every 8 float32 rows of E = 128, and on 4 KiB pages each
// costs a TLB walk among the stream's requests (docs/performance.md, "Huge pages").
struct TensorAllocator {
  using value_type = std::byte;
  template <class>
  struct rebind {  // (libstdc++'s vector asks for its own value type, std::byte)
    using other = TensorAllocator;
  };
  std::byte* allocate(std::size_t bytes);  // throws std::bad_alloc
  void deallocate(std::byte* data, std::size_t bytes) noexcept;
  bool operator==(const TensorAllocator&) const = default;
};
}  // namespace detail

// An owning, packed, row-major tensor. Convenience for callers and tests; every entry
// point takes TensorView, so any other storage works as well.
class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given dtype and shape.
  Tensor(DType dtype, std::vector<std::int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  std::size_t nbytes() const { return storage_.size(); }

  // A view of the whole tensor (packed strides).
  TensorView view() const;

  // Element access by flat row-major index, converting to / from double.
  double get(std::int64_t flat_index) const;
  void set(std::int64_t flat_index, double value);
  // Element access by multi-index.
  double at(std::initializer_list<std::int64_t> index) const;

 private:
  DType dtype_ = DType::float32;
  std::vector<std::int64_t> shape_;
  std::vector<std::byte, detail::TensorAllocator> storage_;
};

}  // namespace sdpa
