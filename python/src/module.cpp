// sdpa._core: the one binding the Python package calls. Tensors arrive through DLPack
// (torch) or the buffer protocol / DLPack (NumPy) as nb::ndarray, and are handed to
// sdpa::forward as TensorViews over the caller's memory: any strides, no copy. The
// outputs are buffers the Python side allocated (torch.empty / np.empty), written in place,
// so nothing is copied on the way out either.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "sdpa/sdpa.h"

namespace nb = nanobind;

// The layer classes (nn_module.cpp).
void register_nn(nb::module_& m);

namespace {

// Inputs are only read: accept read-only arrays (np.broadcast_to, torch.expand) too.
using Input = nb::ndarray<nb::ro>;
using Output = nb::ndarray<>;

// The data pointers of the last call, for the package's zero-copy tests: they show that the
// memory the library read and wrote is the caller's own, not a packed copy.
struct LastCall {
  std::uintptr_t query = 0, key = 0, value = 0, mask = 0, output = 0, weights = 0, lse = 0;
};
LastCall last_call;

// "int32", "complex64", ... for an error message (DLPack type codes 0-6).
std::string describe(const nb::dlpack::dtype& dt) {
  static const char* const kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool)) return "bool";
  std::string name = dt.code < std::size(kCodes) ? kCodes[dt.code] : "dlpack-code-" + std::to_string(dt.code) + "-";
  name += std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

// Maps a DLPack dtype onto sdpa's. Anything else is a TypeError naming the argument; a bool
// query reaches the library, which reports it in its own words.
sdpa::DType dtype_of(const nb::dlpack::dtype& dt, const std::string& name, bool is_mask) {
  if (const std::optional<sdpa::DType> dtype = sdpa_python::sdpa_dtype(dt)) return *dtype;
  throw nb::type_error((name +
                        (is_mask ? ": expected bool or float16, bfloat16, float32 or float64, got "
                                 : ": expected float16, bfloat16, float32 or float64, got ") +
                        describe(dt))
                           .c_str());
}

// A view of the caller's memory, which must be host memory of a dtype sdpa has.
template <class Array>
sdpa::TensorView view_of(const Array& a, const std::string& name, bool is_mask = false) {
  if (!sdpa_python::in_host_memory(a))
    throw nb::value_error((name + ": expected a tensor in CPU memory, got DLPack device type " +
                           std::to_string(a.device_type()) + " (sdpa has no GPU backend yet)")
                              .c_str());
  return sdpa_python::view_over(a, dtype_of(a.dtype(), name, is_mask));
}

sdpa::Backend backend_of(const std::string& backend) {
  if (backend == "automatic") return sdpa::Backend::automatic;
  if (backend == "reference") return sdpa::Backend::reference;
  if (backend == "cpu") return sdpa::Backend::cpu;
  throw nb::value_error(("backend: expected 'automatic', 'reference' or 'cpu', got '" + backend + "'").c_str());
}

// The options forward and backward share (the mask is each call's own).
sdpa::Options options_of(const std::string& causal, std::optional<double> scale, double dropout_p, std::uint64_t seed,
                         std::uint64_t offset, int num_threads, const std::string& backend) {
  sdpa::Options options;
  options.causal = sdpa_python::causal_of(causal);
  options.scale = scale;
  options.dropout_p = dropout_p;
  options.seed = seed;
  options.offset = offset;
  options.num_threads = num_threads;
  options.backend = backend_of(backend);
  return options;
}

// The library names its arguments as C++ sees them; Python users know them by the names of
// the Python function they called. Only the leading "<argument>:" changes.
std::string python_message(const sdpa::Error& error, const std::string& mask_name) {
  const std::string& argument = error.argument();
  std::string renamed = argument;
  if (argument == "mask")
    renamed = mask_name;
  else if (argument == "output")
    renamed = "out";
  else if (argument.rfind("options.", 0) == 0)
    renamed = argument.substr(8);
  const std::string what = error.what();
  if (renamed == argument || what.rfind(argument, 0) != 0) return what;
  return renamed + what.substr(argument.size());
}

[[noreturn]] void raise(const sdpa::Error& error, const std::string& mask_name) {
  const std::string message = python_message(error, mask_name);
  if (error.kind() == sdpa::ErrorKind::type) throw nb::type_error(message.c_str());
  throw nb::value_error(message.c_str());
}

void forward(const Input& query, const Input& key, const Input& value, const std::optional<Input>& mask,
             const Output& output, const std::optional<Output>& weights, const std::optional<Output>& lse,
             const std::string& causal, std::optional<double> scale, double dropout_p, std::uint64_t seed,
             std::uint64_t offset, int num_threads, const std::string& backend, const std::string& mask_name) {
  sdpa::Options options = options_of(causal, scale, dropout_p, seed, offset, num_threads, backend);
  const sdpa::TensorView q = view_of(query, "query"), k = view_of(key, "key"), v = view_of(value, "value");
  if (mask) options.mask = view_of(*mask, mask_name, /*is_mask=*/true);
  sdpa::ForwardOutputs outputs{view_of(output, "out"), std::nullopt, std::nullopt};
  if (weights) outputs.weights = view_of(*weights, "weights");
  if (lse) outputs.lse = view_of(*lse, "lse");

  last_call = {};
  auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  last_call.query = address(q.data);
  last_call.key = address(k.data);
  last_call.value = address(v.data);
  if (options.mask) last_call.mask = address(options.mask->data);
  last_call.output = address(outputs.output.data);
  if (outputs.weights) last_call.weights = address(outputs.weights->data);
  if (outputs.lse) last_call.lse = address(outputs.lse->data);

  try {
    // The arrays stay referenced by this frame, so their memory outlives the call.
    nb::gil_scoped_release release;
    sdpa::forward(q, k, v, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, mask_name);
  }
}

// The gradients of one forward call (sdpa::backward) into buffers the Python side
// allocated: what sdpa's torch autograd (sdpa/_autograd.py) calls.
void backward(const Input& query, const Input& key, const Input& value, const std::optional<Input>& mask,
              const Input& output, const Input& lse, const Input& grad_output, const Output& grad_query,
              const Output& grad_key, const Output& grad_value, const std::optional<Output>& grad_mask,
              const std::string& causal, std::optional<double> scale, double dropout_p, std::uint64_t seed,
              std::uint64_t offset, int num_threads, const std::string& backend, const std::string& mask_name) {
  sdpa::Options options = options_of(causal, scale, dropout_p, seed, offset, num_threads, backend);
  const sdpa::BackwardInputs inputs{view_of(query, "query"),  view_of(key, "key"), view_of(value, "value"),
                                    view_of(output, "output"), view_of(lse, "lse"),
                                    view_of(grad_output, "grad_output")};
  if (mask) options.mask = view_of(*mask, mask_name, /*is_mask=*/true);
  sdpa::BackwardOutputs outputs{view_of(grad_query, "grad_query"), view_of(grad_key, "grad_key"),
                                view_of(grad_value, "grad_value"), std::nullopt};
  if (grad_mask) outputs.grad_mask = view_of(*grad_mask, "grad_mask");
  try {
    nb::gil_scoped_release release;
    sdpa::backward(inputs, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, mask_name);
  }
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "sdpa's C++ core. Use the functions of the `sdpa` package instead.";

  // Anything else that throws sdpa::Error still arrives as the right Python type.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const sdpa::Error& error) {
      const std::string message = python_message(error, "mask");
      PyErr_SetString(error.kind() == sdpa::ErrorKind::type ? PyExc_TypeError : PyExc_ValueError, message.c_str());
    }
  });

  // noconvert: an array nanobind would have to convert (copy) is refused rather than
  // copied, so the library always sees the caller's memory and writes into the caller's
  // output buffers, never into a temporary.
  m.def("forward", &forward, nb::arg("query").noconvert(), nb::arg("key").noconvert(), nb::arg("value").noconvert(),
        nb::arg("mask").noconvert().none(), nb::arg("output").noconvert(), nb::arg("weights").noconvert().none(),
        nb::arg("lse").noconvert().none(), nb::arg("causal"), nb::arg("scale").none(), nb::arg("dropout_p"),
        nb::arg("seed"), nb::arg("offset"), nb::arg("num_threads"), nb::arg("backend"), nb::arg("mask_name"),
        "Computes attention into the given output buffers (see sdpa.attention).");

  m.def("backward", &backward, nb::arg("query").noconvert(), nb::arg("key").noconvert(),
        nb::arg("value").noconvert(), nb::arg("mask").noconvert().none(), nb::arg("output").noconvert(),
        nb::arg("lse").noconvert(), nb::arg("grad_output").noconvert(), nb::arg("grad_query").noconvert(),
        nb::arg("grad_key").noconvert(), nb::arg("grad_value").noconvert(), nb::arg("grad_mask").noconvert().none(),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"),
        nb::arg("num_threads"), nb::arg("backend"), nb::arg("mask_name"),
        "Gradients of one forward call into the given buffers (used by sdpa's torch autograd).");

  m.def(
      "last_call",
      []() {
        nb::dict d;
        d["query"] = last_call.query;
        d["key"] = last_call.key;
        d["value"] = last_call.value;
        d["mask"] = last_call.mask;
        d["output"] = last_call.output;
        d["weights"] = last_call.weights;
        d["lse"] = last_call.lse;
        return d;
      },
      "Data pointers the library saw in the last forward call (0 = absent); for tests.");

  register_nn(m);

  m.def("version", []() { return std::string(sdpa::version()); });
  m.def("runtime_info", []() {
    const sdpa::RuntimeInfo info = sdpa::runtime_info();
    nb::dict d;
    d["version"] = info.version;
    d["cpu_features"] = info.cpu_features;
    d["cpu_kernel"] = info.cpu_kernel;
    d["max_threads"] = info.max_threads;
    return d;
  });
}
