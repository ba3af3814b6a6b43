// sdpa._core: the bindings the Python package calls. Tensors arrive as torch tensors (read
// through DLPack's C exchange API), DLPack capsules or NumPy arrays (tensor_argument.h),
// and are handed to sdpa::forward (backward, and their varlen and paged forms) as
// TensorViews over the caller's memory: any strides, no copy. The outputs are buffers the
// Python side allocated (torch.empty / np.empty), written in place, so nothing is copied
// on the way out either. The scalar options arrive as one sdpa::Options
// (sdpa._core.Options, bound in options.cpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "errors.h"
#include "options.h"
#include "sdpa/sdpa.h"
#include "tensor_argument.h"

namespace nb = nanobind;
using sdpa_python::python_message;
using sdpa_python::raise;
using sdpa_python::Renames;

// The layer classes (nn_module.cpp).
void register_nn(nb::module_& m);
// Ring attention over MPI, where the build found it (dist_module.cpp).
void register_dist(nb::module_& m);

namespace {

// Inputs are only read: accept read-only arrays (np.broadcast_to, torch.expand) too.
using Input = sdpa_python::TensorArgument<nb::ro>;
using Output = sdpa_python::TensorArgument<>;

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

// The call's options: the bound sdpa._core.Options (options.cpp), with the per-head
// tensors, ALiBi slopes and sinks, laid over the caller's memory like the other tensors.
sdpa::Options with_per_head(const sdpa::Options& options, const std::optional<Input>& alibi_slopes,
                            const std::optional<Input>& sinks) {
  sdpa::Options call = options;
  if (alibi_slopes) call.alibi_slopes = view_of(*alibi_slopes, "alibi_slopes");
  if (sinks) call.sinks = view_of(*sinks, "sinks");
  return call;
}

// The scales of int8 K/V (Options::key_scale, value_scale), over the caller's memory.
void add_scales(sdpa::Options& options, const std::optional<Input>& key_scale, const std::optional<Input>& value_scale) {
  if (key_scale) options.key_scale = view_of(*key_scale, "key_scale");
  if (value_scale) options.value_scale = view_of(*value_scale, "value_scale");
}

// An integer table the library takes as std::vector (cu_seqlens, block_table, seq_lens):
// int32 or int64 of `ndim` dims, any strides, copied row-major (it is small next to the
// tensors, and the library keeps no pointer to it). `columns` receives the last dim.
std::vector<std::int64_t> integers_of(const Input& a, const std::string& name, std::size_t ndim,
                                      std::int64_t* columns = nullptr) {
  if (!sdpa_python::in_host_memory(a))
    throw nb::value_error(
        (name + ": expected a tensor in CPU memory, got DLPack device type " + std::to_string(a.device_type()))
            .c_str());
  const nb::dlpack::dtype dt = a.dtype();
  const bool is_int = dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) && dt.lanes == 1 &&
                      (dt.bits == 32 || dt.bits == 64);
  if (!is_int) throw nb::type_error((name + ": expected int32 or int64, got " + describe(dt)).c_str());
  if (a.ndim() != ndim) {
    std::string shape = "(";
    for (std::size_t d = 0; d < a.ndim(); ++d) shape += (d ? ", " : "") + std::to_string(a.shape(d));
    shape += a.ndim() == 1 ? ",)" : ")";
    throw nb::value_error(
        (name + ": expected " + std::to_string(ndim) + " dim" + (ndim == 1 ? "" : "s") + ", got shape " + shape)
            .c_str());
  }
  const std::int64_t rows = ndim == 2 ? static_cast<std::int64_t>(a.shape(0)) : 1;
  const std::int64_t cols = static_cast<std::int64_t>(a.shape(ndim - 1));
  const std::int64_t row_stride = ndim == 2 ? a.stride(0) : 0, col_stride = a.stride(ndim - 1);
  if (columns) *columns = cols;
  std::vector<std::int64_t> values;
  values.reserve(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t at = r * row_stride + c * col_stride;
      values.push_back(dt.bits == 32 ? static_cast<const std::int32_t*>(a.data())[at]
                                     : static_cast<const std::int64_t*>(a.data())[at]);
    }
  return values;
}

Renames dense_renames(const std::string& mask_name) { return {{"mask", mask_name}, {"output", "out"}}; }

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Records the pointers a forward call hands to the library (sdpa._core.last_call(), for
// the tests that show nothing was copied).
void remember(const void* query, const void* key, const void* value, const sdpa::ForwardOutputs& outputs,
              const void* mask = nullptr) {
  last_call = {};
  last_call.query = address(query);
  last_call.key = address(key);
  last_call.value = address(value);
  last_call.mask = address(mask);
  last_call.output = address(outputs.output.data);
  if (outputs.weights) last_call.weights = address(outputs.weights->data);
  if (outputs.lse) last_call.lse = address(outputs.lse->data);
}

void forward(const Input& query, const Input& key, const Input& value, const std::optional<Input>& mask,
             const std::optional<Input>& alibi_slopes, const std::optional<Input>& sinks, const Output& output,
             const std::optional<Output>& weights, const std::optional<Output>& lse, const sdpa::Options& call_options,
             const std::string& mask_name, const std::optional<Input>& key_scale,
             const std::optional<Input>& value_scale) {
  sdpa::Options options = with_per_head(call_options, alibi_slopes, sinks);
  add_scales(options, key_scale, value_scale);
  const sdpa::TensorView q = view_of(query, "query"), k = view_of(key, "key"), v = view_of(value, "value");
  if (mask) options.mask = view_of(*mask, mask_name, /*is_mask=*/true);
  sdpa::ForwardOutputs outputs{view_of(output, "out"), std::nullopt, std::nullopt};
  if (weights) outputs.weights = view_of(*weights, "weights");
  if (lse) outputs.lse = view_of(*lse, "lse");

  remember(q.data, k.data, v.data, outputs, options.mask ? options.mask->data : nullptr);

  try {
    // The arguments stay referenced by this frame, so their memory outlives the call (the
    // views were all made above, with the GIL: tensor_argument.h).
    nb::gil_scoped_release release;
    sdpa::forward(q, k, v, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, dense_renames(mask_name));
  }
}

// The gradients of one forward call (sdpa::backward) into buffers the Python side
// allocated: what sdpa's torch autograd (sdpa/_autograd.py) calls.
void backward(const Input& query, const Input& key, const Input& value, const std::optional<Input>& mask,
              const std::optional<Input>& alibi_slopes, const std::optional<Input>& sinks, const Input& output,
              const Input& lse, const Input& grad_output, const std::optional<Input>& grad_lse,
              const Output& grad_query, const Output& grad_key, const Output& grad_value,
              const std::optional<Output>& grad_mask, const std::optional<Output>& grad_sinks,
              const sdpa::Options& call_options, const std::string& mask_name) {
  sdpa::Options options = with_per_head(call_options, alibi_slopes, sinks);
  sdpa::BackwardInputs inputs{view_of(query, "query"),   view_of(key, "key"), view_of(value, "value"),
                              view_of(output, "output"), view_of(lse, "lse"), view_of(grad_output, "grad_output")};
  if (grad_lse) inputs.grad_lse = view_of(*grad_lse, "grad_lse");
  if (mask) options.mask = view_of(*mask, mask_name, /*is_mask=*/true);
  sdpa::BackwardOutputs outputs{view_of(grad_query, "grad_query"), view_of(grad_key, "grad_key"),
                                view_of(grad_value, "grad_value"), std::nullopt};
  if (grad_mask) outputs.grad_mask = view_of(*grad_mask, "grad_mask");
  if (grad_sinks) outputs.grad_sinks = view_of(*grad_sinks, "grad_sinks");
  try {
    nb::gil_scoped_release release;
    sdpa::backward(inputs, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, {{"mask", mask_name}});
  }
}

// Packed variable-length batches (sdpa::forward_varlen). The tensors arrive in the
// library's (H, total, E) form; the Python side passes FlashAttention's (total, H, E)
// buffers as transposed views, so nothing is copied.
void forward_varlen(const Input& query, const Input& key, const Input& value, const Input& cu_seqlens_q,
                    const Input& cu_seqlens_k, const std::optional<Input>& alibi_slopes,
                    const std::optional<Input>& sinks, const Output& output, const std::optional<Output>& lse,
                    const sdpa::Options& call_options, const std::optional<Input>& key_scale,
                    const std::optional<Input>& value_scale) {
  sdpa::Options options = with_per_head(call_options, alibi_slopes, sinks);
  add_scales(options, key_scale, value_scale);
  const sdpa::VarlenSequences sequences{integers_of(cu_seqlens_q, "cu_seqlens_q", 1),
                                        integers_of(cu_seqlens_k, "cu_seqlens_k", 1)};
  const sdpa::TensorView q = view_of(query, "query"), k = view_of(key, "key"), v = view_of(value, "value");
  sdpa::ForwardOutputs outputs{view_of(output, "out"), std::nullopt, std::nullopt};
  if (lse) outputs.lse = view_of(*lse, "lse");

  remember(q.data, k.data, v.data, outputs);
  try {
    nb::gil_scoped_release release;
    sdpa::forward_varlen(q, k, v, sequences, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, {});
  }
}

void backward_varlen(const Input& query, const Input& key, const Input& value, const Input& cu_seqlens_q,
                     const Input& cu_seqlens_k, const std::optional<Input>& alibi_slopes,
                     const std::optional<Input>& sinks, const Input& output, const Input& lse, const Input& grad_output,
                     const std::optional<Input>& grad_lse, const Output& grad_query, const Output& grad_key,
                     const Output& grad_value, const std::optional<Output>& grad_sinks,
                     const sdpa::Options& call_options) {
  const sdpa::Options options = with_per_head(call_options, alibi_slopes, sinks);
  const sdpa::VarlenSequences sequences{integers_of(cu_seqlens_q, "cu_seqlens_q", 1),
                                        integers_of(cu_seqlens_k, "cu_seqlens_k", 1)};
  sdpa::BackwardInputs inputs{view_of(query, "query"),   view_of(key, "key"), view_of(value, "value"),
                              view_of(output, "output"), view_of(lse, "lse"), view_of(grad_output, "grad_output")};
  if (grad_lse) inputs.grad_lse = view_of(*grad_lse, "grad_lse");
  sdpa::BackwardOutputs outputs{view_of(grad_query, "grad_query"), view_of(grad_key, "grad_key"),
                                view_of(grad_value, "grad_value")};
  if (grad_sinks) outputs.grad_sinks = view_of(*grad_sinks, "grad_sinks");
  try {
    nb::gil_scoped_release release;
    sdpa::backward_varlen(inputs, sequences, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, {});
  }
}

// Attention against a paged KV cache (sdpa::forward_paged). The pages arrive as
// (pages, Hkv, page_size, E) views; FlashInfer's NHD buffers are passed transposed.
void forward_paged(const Input& query, const Input& key_pages, const Input& value_pages, const Input& block_table,
                   const Input& seq_lens, const std::optional<Input>& alibi_slopes, const std::optional<Input>& sinks,
                   const Output& output, const std::optional<Output>& lse, const sdpa::Options& call_options,
                   const std::optional<Input>& key_scale, const std::optional<Input>& value_scale) {
  sdpa::Options options = with_per_head(call_options, alibi_slopes, sinks);
  add_scales(options, key_scale, value_scale);
  sdpa::PagedKV cache;
  cache.key_pages = view_of(key_pages, "key_pages");
  cache.value_pages = view_of(value_pages, "value_pages");
  cache.block_table = integers_of(block_table, "block_table", 2, &cache.blocks_per_sequence);
  cache.seq_lens = integers_of(seq_lens, "seq_lens", 1);
  const sdpa::TensorView q = view_of(query, "query");
  sdpa::ForwardOutputs outputs{view_of(output, "out"), std::nullopt, std::nullopt};
  if (lse) outputs.lse = view_of(*lse, "lse");

  remember(q.data, cache.key_pages.data, cache.value_pages.data, outputs);
  try {
    nb::gil_scoped_release release;
    sdpa::forward_paged(q, cache, outputs, options);
  } catch (const sdpa::Error& error) {
    raise(error, {});
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
      const std::string message = python_message(error, {});
      PyErr_SetString(error.kind() == sdpa::ErrorKind::type ? PyExc_TypeError : PyExc_ValueError, message.c_str());
    }
  });

  sdpa_python::register_options(m);

  // Every function takes the call's tensors, then one sdpa._core.Options. noconvert: an
  // array nanobind would have to convert (copy) is refused rather than copied, so the
  // library always sees the caller's memory and writes into the caller's output buffers,
  // never into a temporary.
  const auto in = [](const char* name) { return nb::arg(name).noconvert(); };
  const auto maybe = [](const char* name) { return nb::arg(name).noconvert().none(); };
  m.def("forward", &forward, in("query"), in("key"), in("value"), maybe("mask"), maybe("alibi_slopes"), maybe("sinks"),
        in("output"), maybe("weights"), maybe("lse"), nb::arg("options"), nb::arg("mask_name") = "mask",
        maybe("key_scale") = nb::none(), maybe("value_scale") = nb::none(),
        "Computes attention into the given output buffers (see sdpa.attention); int8 key / value with their "
        "scales.");
  m.def("backward", &backward, in("query"), in("key"), in("value"), maybe("mask"), maybe("alibi_slopes"),
        maybe("sinks"), in("output"), in("lse"), in("grad_output"), maybe("grad_lse"), in("grad_query"), in("grad_key"),
        in("grad_value"), maybe("grad_mask"), maybe("grad_sinks"), nb::arg("options"), nb::arg("mask_name") = "mask",
        "Gradients of one forward call into the given buffers (used by sdpa's torch autograd).");
  m.def("forward_varlen", &forward_varlen, in("query"), in("key"), in("value"), in("cu_seqlens_q"), in("cu_seqlens_k"),
        maybe("alibi_slopes"), maybe("sinks"), in("output"), maybe("lse"), nb::arg("options"),
        maybe("key_scale") = nb::none(), maybe("value_scale") = nb::none(),
        "Packed variable-length attention, tensors (H, total, E), into the given buffers (see "
        "sdpa.varlen_attention).");
  m.def("backward_varlen", &backward_varlen, in("query"), in("key"), in("value"), in("cu_seqlens_q"),
        in("cu_seqlens_k"), maybe("alibi_slopes"), maybe("sinks"), in("output"), in("lse"), in("grad_output"),
        maybe("grad_lse"), in("grad_query"), in("grad_key"), in("grad_value"), maybe("grad_sinks"), nb::arg("options"),
        "Gradients of one forward_varlen call into the given buffers (used by sdpa's torch autograd).");
  m.def("forward_paged", &forward_paged, in("query"), in("key_pages"), in("value_pages"), in("block_table"),
        in("seq_lens"), maybe("alibi_slopes"), maybe("sinks"), in("output"), maybe("lse"), nb::arg("options"),
        maybe("key_scale") = nb::none(), maybe("value_scale") = nb::none(),
        "Attention against a paged KV cache, pages (pages, Hkv, page_size, E), into the given buffers (see "
        "sdpa.paged_attention).");

  m.def(
      "quantize_kv",
      [](const Input& x, const Output& values, const Output& scale) {
        const sdpa::TensorView xv = view_of(x, "x"), vv = view_of(values, "values"), sv = view_of(scale, "scale");
        try {
          nb::gil_scoped_release release;
          sdpa::quantize_kv(xv, vv, sv);
        } catch (const sdpa::Error& error) {
          raise(error, {});
        }
      },
      in("x"), in("values"), in("scale"),
      "Symmetric int8 quantization per row into the given buffers (see sdpa.quantize_kv).");
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
      "Data pointers the library saw in the last forward call, varlen and paged included (0 = absent); "
      "for tests.");

  register_nn(m);
  register_dist(m);

  m.def(
      "reads_in_place", [](nb::handle tensor) { return sdpa_python::exchange_of(tensor).api != nullptr; },
      nb::arg("tensor"),
      "Whether the functions read `tensor` itself, through its type's DLPack C exchange API (a torch.Tensor "
      "from DLPack 1.3 on), rather than a DLPack capsule of it.");
  m.def("version", []() { return std::string(sdpa::version()); });
  m.def("runtime_info", []() {
    const sdpa::RuntimeInfo info = sdpa::runtime_info();
    nb::dict d;
    d["version"] = info.version;
    d["cpu_features"] = info.cpu_features;
    d["cpu_kernel"] = info.cpu_kernel;
    d["bfloat16_on_vdpbf16ps"] = info.bfloat16_on_vdpbf16ps;
    d["max_threads"] = info.max_threads;
    return d;
  });
}
