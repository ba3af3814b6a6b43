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
  const auto* table = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(api.ptr(), "dlpack_exchange_api"));
  // Inherited (a subclass of torch.Tensor) is not the type's own: the base's API takes the
  // base's objects only (DLPack: "Must have the same type as the one the DLPackExchangeAPI
  // was discovered from"). (The tables compared, not the capsules: a type may make a new
  // capsule at each read.)
  if (type->tp_base != nullptr) {
    const nb::handle base(reinterpret_cast<PyObject*>(type->tp_base));
    const nb::object base_api = nb::getattr(base, "__dlpack_c_exchange_api__", nb::none());
    if (!base_api.is_none() && PyCapsule_IsValid(base_api.ptr(), "dlpack_exchange_api") &&
        PyCapsule_GetPointer(base_api.ptr(), "dlpack_exchange_api") == table)
      return nullptr;
  }
  // The layout above is DLPack 1.3's (later minor versions only add fields); an older
  // table goes the capsule way.
  if (table == nullptr || table->major != 1 || table->minor < 3 || table->dltensor_from_py_object_no_sync == nullptr)
    return nullptr;
  return table;  // "must stay alive throughout the lifetime of the process"
}

// torch.Tensor itself (not a subclass, not another framework's type).
bool is_torch_tensor_type(PyTypeObject* type) {
  const nb::handle type_object(reinterpret_cast<PyObject*>(type));
  const nb::object module = nb::getattr(type_object, "__module__", nb::none());
  const nb::object name = nb::getattr(type_object, "__qualname__", nb::none());
  return PyUnicode_Check(module.ptr()) && PyUnicode_Check(name.ptr()) &&
         PyUnicode_CompareWithASCIIString(module.ptr(), "torch") == 0 &&
         PyUnicode_CompareWithASCIIString(name.ptr(), "Tensor") == 0;
}

// The first few types seen, each with what it offers, held by a reference so that its
// address is never another type's (a type freed and another allocated in its place). A
// call sees two or three: torch.Tensor, numpy.ndarray, a capsule; a type past the eighth
// is looked up at each argument. The GIL guards the cache.
Exchange exchange_of_type(PyTypeObject* type) {
  struct Entry {
    PyTypeObject* type = nullptr;
    Exchange info;
  };
  static std::array<Entry, 8> cache;
  static std::size_t filled = 0;
  for (std::size_t i = 0; i < filled; ++i)
    if (cache[i].type == type) return cache[i].info;
  Exchange info;
  info.api = own_api_of(type);
  info.writable = info.api != nullptr && is_torch_tensor_type(type);
  if (filled < cache.size()) {
    Py_INCREF(type);
    cache[filled++] = {type, info};
  }
  return info;
}

}  // namespace

Exchange exchange_of(nb::handle object) { return exchange_of_type(Py_TYPE(object.ptr())); }

}  // namespace sdpa_python
