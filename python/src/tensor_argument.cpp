#include "tensor_argument.h"

#include <array>

namespace sdpa_python {

namespace {

// The API `type` defines itself, or nullptr: a capsule named "dlpack_exchange_api" of
// major version 1, minor 3 or later, with the function this module calls.
const DLPackExchangeAPI* own_api_of(PyTypeObject* type) {
  const nb::handle type_object(reinterpret_cast<PyObject*>(type));
  const nb::object api = nb::getattr(type_object, "__dlpack_c_exchange_api__", nb::none());
  if (api.is_none() || !PyCapsule_IsValid(api.ptr(), "dlpack_exchange_api")) return nullptr;
  // Inherited (a subclass of torch.Tensor) is not the type's own: the base's API takes the
  // base's objects only (DLPack: "Must have the same type as the one the DLPackExchangeAPI
  // was discovered from").
  if (type->tp_base != nullptr) {
    const nb::handle base(reinterpret_cast<PyObject*>(type->tp_base));
    if (nb::getattr(base, "__dlpack_c_exchange_api__", nb::none()).is(api)) return nullptr;
  }
  const auto* table = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(api.ptr(), "dlpack_exchange_api"));
  if (table == nullptr || table->major != 1 || table->minor < 3 || table->dltensor_from_py_object_no_sync == nullptr)
    return nullptr;
  return table;  // "must stay alive throughout the lifetime of the process"
}

}  // namespace

const DLPackExchangeAPI* exchange_api(nb::handle object) {
  // The last few types seen, each held by a reference so that its address is never
  // another type's (a type freed and another allocated in its place). A call sees two
  // or three: torch.Tensor, numpy.ndarray, a capsule. The GIL guards the cache.
  struct Entry {
    PyTypeObject* type = nullptr;
    const DLPackExchangeAPI* api = nullptr;
  };
  static std::array<Entry, 8> cache;
  static std::size_t filled = 0;
  PyTypeObject* type = Py_TYPE(object.ptr());
  for (std::size_t i = 0; i < filled; ++i)
    if (cache[i].type == type) return cache[i].api;
  const DLPackExchangeAPI* api = own_api_of(type);
  if (filled < cache.size()) {
    Py_INCREF(type);
    cache[filled++] = {type, api};
  }
  return api;
}

}  // namespace sdpa_python
