// A tensor argument of sdpa._core's functions, as it arrives from Python: a torch.Tensor
// read through DLPack's C exchange API, or anything nb::ndarray takes (a DLPack capsule,
// a NumPy array, the buffer protocol). Either way it describes the caller's memory
// (pointer, dtype, device, shape, strides) and nothing is copied.
//
// Why the exchange API: DLPack 1.3 gives a framework's tensor type a capsule,
// `__dlpack_c_exchange_api__`, holding C functions, one of which fills a DLTensor for a
// tensor object without a Python call or a capsule (torch 2.15 offers it). A torch call
// of a small head spent about 0.4 µs a tensor on torch.utils.dlpack.to_dlpack and
// nanobind's import of the capsule (4 to 13 tensors a call; docs/performance.md, "A
// torch tensor read in C"); this reads the same fields in C in ~0.07 µs.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace sdpa_python {

namespace nb = nanobind;

// The C functions a framework's tensor type offers (dlpack.h, DLPackExchangeAPI, as of
// DLPack 1.3); only dltensor_from_py_object_no_sync is called. Later minor versions only
// add fields, so this layout holds for every 1.x from 1.3 on (the version checked).
struct DLPackExchangeAPI {
  std::uint32_t major, minor;  // DLPackExchangeAPIHeader: the version, then
  void* prev_api;              // an older API in a chain (unused)
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  // Fills `out` for `py_object`, an instance of the type that offered the API, without a
  // copy; its pointers stay valid while the object lives unchanged and the GIL is held.
  // 0, or -1 with a Python exception set (sparse, nested, quantized, meta tensors...).
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  void* current_work_stream;
};

// What `object`'s type offers, cached per type:
//   api       its exchange API when the type defines one itself (torch.Tensor); nullptr
//             for anything else — an ndarray, a capsule, and a subclass, whose own
//             __dlpack__ (a FakeTensor's, a wrapper's) is its to honour;
//   writable  whether an object read through it may be written: a DLTensor says nothing
//             of read-only memory, so only torch.Tensor itself is taken for an output
//             (torch's ReadOnlyTensorWrapper offers an API of its own, over memory that
//             must not be written; it goes through nb::ndarray's import, which refuses it).
struct Exchange {
  const DLPackExchangeAPI* api = nullptr;
  bool writable = false;
};
Exchange exchange_of(nb::handle object);

// The argument, read as nb::ndarray's accessors read (as view_over in arrays.h does), within
// the bound function's body, before it releases the GIL. `Flags` are nb::ndarray's, for the
// objects it imports (nb::ro: read-only accepted). Nothing is allocated: an exchanged
// tensor's shape and strides are read where its DLTensor points (into the tensor, which the
// call's arguments hold; the exchange API's pointers are valid until control returns to
// Python), an imported one's from the ndarray, which holds its memory.
template <class... Flags>
class TensorArgument {
 public:
  // Reads `object` in place (no temporaries: a binding built for size copies each struct
  // with `rep movs`, a few hundred cycles an argument); false (and no Python error) when
  // it is no tensor this can read.
  template <class CastFlags>
  bool read(nb::handle object, CastFlags flags, nb::detail::cleanup_list* cleanup) noexcept {
    constexpr bool kReadOnly = (std::is_same_v<Flags, nb::ro> || ...);
    if (const Exchange exchange = exchange_of(object); exchange.api != nullptr && (kReadOnly || exchange.writable)) {
      // (Strides are required from DLPack 1.2 on; a producer that leaves them out is
      // read by the import, which fills them in.)
      is_exchanged_ = exchange.api->dltensor_from_py_object_no_sync(object.ptr(), &exchanged_) == 0 &&
                      (exchanged_.strides != nullptr || exchanged_.ndim == 0);
      if (is_exchanged_) return true;
      PyErr_Clear();  // (a tensor it cannot describe: nb::ndarray's import has its say)
    }
    is_exchanged_ = false;
    nb::detail::make_caster<nb::ndarray<Flags...>> imported;
    if (!imported.from_python(object, flags, cleanup)) return false;
    imported_ = std::move(imported.value);
    return true;
  }

  const void* data() const {
    return is_exchanged_ ? static_cast<const std::byte*>(exchanged_.data) + exchanged_.byte_offset : imported_.data();
  }
  std::size_t ndim() const { return is_exchanged_ ? static_cast<std::size_t>(exchanged_.ndim) : imported_.ndim(); }
  std::int64_t shape(std::size_t d) const {
    return is_exchanged_ ? exchanged_.shape[d] : static_cast<std::int64_t>(imported_.shape(d));
  }
  std::int64_t stride(std::size_t d) const { return is_exchanged_ ? exchanged_.strides[d] : imported_.stride(d); }
  nb::dlpack::dtype dtype() const { return is_exchanged_ ? exchanged_.dtype : imported_.dtype(); }
  std::int32_t device_type() const { return is_exchanged_ ? exchanged_.device.device_type : imported_.device_type(); }

 private:
  nb::ndarray<Flags...> imported_;  // an object nb::ndarray took (empty when exchanged)
  nb::dlpack::dltensor exchanged_;  // a torch.Tensor's fields, from its exchange API
  bool is_exchanged_ = false;
};

}  // namespace sdpa_python

namespace nanobind::detail {

template <class... Flags>
struct type_caster<sdpa_python::TensorArgument<Flags...>> {
  NB_TYPE_CASTER(sdpa_python::TensorArgument<Flags...>, const_name("tensor"))

  // (`flags`' type is nanobind's: uint8_t in 2.x, uint32_t in 3.x.)
  template <class CastFlags>
  bool from_python(handle src, CastFlags flags, cleanup_list* cleanup) noexcept {
    return value.read(src, flags, cleanup);
  }
};

}  // namespace nanobind::detail
