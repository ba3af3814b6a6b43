// What both halves of sdpa._core (module.cpp, nn_module.cpp) do to an array argument (an
// nb::ndarray, or a TensorArgument: tensor_argument.h) before the library sees it: map
// its dtype and lay a TensorView over its memory. Each caller words its own errors, so
// these only say what went wrong.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "sdpa/sdpa.h"

namespace sdpa_python {

namespace nb = nanobind;

// sdpa's dtype for a DLPack one; nullopt where sdpa has none.
inline std::optional<sdpa::DType> sdpa_dtype(const nb::dlpack::dtype& dt) {
  using nb::dlpack::dtype_code;
  if (dt.lanes != 1) return std::nullopt;
  const auto code = static_cast<dtype_code>(dt.code);
  if (code == dtype_code::Float && dt.bits == 16) return sdpa::DType::float16;
  if (code == dtype_code::Float && dt.bits == 32) return sdpa::DType::float32;
  if (code == dtype_code::Float && dt.bits == 64) return sdpa::DType::float64;
  if (code == dtype_code::Bfloat && dt.bits == 16) return sdpa::DType::bfloat16;
  if (code == dtype_code::Bool && dt.bits == 8) return sdpa::DType::boolean;
  if (code == dtype_code::Int && dt.bits == 8) return sdpa::DType::int8;  // quantized K/V
  return std::nullopt;
}

// CPU memory, or CUDA pinned host memory (kDLCUDAHost), which the CPU reads directly.
template <class Array>
bool in_host_memory(const Array& a) {
  const int device = a.device_type();
  return device == nb::device::cpu::value || device == nb::device::cuda_host::value;
}

// A view of the caller's memory as `dtype`. DLPack strides are in elements, as TensorView's
// are, and nanobind (or the exchange API's DLTensor) fills them in for compact tensors, so
// every layout maps over unchanged. Made with
// the GIL held: an exchanged tensor's shape and strides are read in place.
template <class Array>
sdpa::TensorView view_over(const Array& a, sdpa::DType dtype) {
  sdpa::TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.dtype = dtype;
  view.shape.resize(a.ndim());
  view.strides.resize(a.ndim());
  bool empty = false;
  for (std::size_t d = 0; d < a.ndim(); ++d) {
    view.shape[d] = static_cast<std::int64_t>(a.shape(d));
    view.strides[d] = a.stride(d);
    empty = empty || view.shape[d] == 0;
  }
  // The strides of a tensor without elements mean nothing, and exporters fill them in
  // freely (NumPy's DLPack gives 0s), which the library's overlap check of outputs takes
  // for overlapping elements; packed strides say the same thing without tripping it.
  if (empty) view.strides.clear();
  return view;
}

}  // namespace sdpa_python
