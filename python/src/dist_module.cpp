// sdpa._core's ring attention (sdpa::distributed, include/sdpa/distributed.h), compiled in
// where the build found MPI (SDPA_HAVE_MPI). The communicator arrives as its Fortran
// handle (mpi4py's Comm.py2f()), which MPI_Comm_f2c turns back into the MPI_Comm of the
// same MPI library: the extension needs no mpi4py headers to build, and mpi4py is only a
// run-time dependency of sdpa.distributed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "errors.h"
#include "sdpa/sdpa.h"
#include "tensor_argument.h"

#ifdef SDPA_HAVE_MPI
#include "sdpa/distributed.h"
#endif

namespace nb = nanobind;

namespace {

#ifdef SDPA_HAVE_MPI
using Input = sdpa_python::TensorArgument<nb::ro>;
using Output = sdpa_python::TensorArgument<>;

// The Python side has already checked devices and dtypes (torch tensors on the CPU), on
// every rank together (sdpa/distributed.py's agreement): an error here would be one
// rank's alone, raised before the C++ call's agreement, and leave the others waiting.
template <class Array>
sdpa::TensorView view(const Array& a, const std::string& name) {
  const std::optional<sdpa::DType> dtype = sdpa_python::sdpa_dtype(a.dtype());
  if (!dtype || !sdpa_python::in_host_memory(a))
    throw nb::type_error((name + ": expected a CPU tensor of float16, bfloat16, float32, float64 or bool").c_str());
  return sdpa_python::view_over(a, *dtype);
}

// `partition` is "zigzag" or "contiguous", then ":ring", ":all_gather" or ":ordered" for
// the exchange (the Python side checks both words).
sdpa::distributed::Sharding sharding_of(std::int64_t query_length, std::int64_t key_length,
                                        const std::string& partition) {
  const std::size_t colon = partition.find(':');
  const std::string layout = partition.substr(0, colon);
  const std::string exchange = colon == std::string::npos ? "ring" : partition.substr(colon + 1);
  if ((layout != "zigzag" && layout != "contiguous") ||
      (exchange != "ring" && exchange != "all_gather" && exchange != "ordered"))
    throw nb::value_error(
        ("partition: expected zigzag|contiguous[:ring|all_gather|ordered], got '" + partition + "'").c_str());
  return {query_length, key_length,
          layout == "zigzag" ? sdpa::distributed::Partition::zigzag : sdpa::distributed::Partition::contiguous,
          exchange == "all_gather" ? sdpa::distributed::Exchange::all_gather
          : exchange == "ordered"  ? sdpa::distributed::Exchange::ordered
                                   : sdpa::distributed::Exchange::ring};
}

sdpa::Options call_options(const sdpa::Options& options, const std::optional<Input>& mask,
                           const std::optional<Input>& alibi_slopes, const std::optional<Input>& sinks) {
  sdpa::Options call = options;
  if (mask) call.mask = view(*mask, "mask");
  if (alibi_slopes) call.alibi_slopes = view(*alibi_slopes, "alibi_slopes");
  if (sinks) call.sinks = view(*sinks, "sinks");
  return call;
}

void ring_forward(std::int64_t comm, const Input& query, const Input& key, const Input& value,
                  const std::optional<Input>& mask, const std::optional<Input>& alibi_slopes,
                  const std::optional<Input>& sinks, const Output& output, const Output& lse,
                  std::int64_t query_length, std::int64_t key_length, const std::string& partition,
                  const sdpa::Options& options) {
  const sdpa::Options call = call_options(options, mask, alibi_slopes, sinks);
  const sdpa::distributed::Sharding sharding = sharding_of(query_length, key_length, partition);
  const sdpa::ForwardOutputs outputs{view(output, "out"), std::nullopt, view(lse, "lse")};
  // Every view made before the GIL goes: a torch tensor's shape and strides are read in
  // place (tensor_argument.h), valid only while the GIL is held.
  const sdpa::TensorView q = view(query, "query"), k = view(key, "key"), v = view(value, "value");
  try {
    nb::gil_scoped_release release;
    sdpa::distributed::forward(MPI_Comm_f2c(static_cast<MPI_Fint>(comm)), q, k, v, outputs, sharding, call);
  } catch (const sdpa::Error& error) {
    sdpa_python::raise(error, {{"output", "out"}});
  }
}

void ring_backward(std::int64_t comm, const Input& query, const Input& key, const Input& value,
                   const std::optional<Input>& mask, const std::optional<Input>& alibi_slopes,
                   const std::optional<Input>& sinks, const Input& output, const Input& lse, const Input& grad_output,
                   const std::optional<Input>& grad_lse, const Output& grad_query, const Output& grad_key,
                   const Output& grad_value, const std::optional<Output>& grad_sinks, std::int64_t query_length,
                   std::int64_t key_length, const std::string& partition, const sdpa::Options& options) {
  const sdpa::Options call = call_options(options, mask, alibi_slopes, sinks);
  const sdpa::distributed::Sharding sharding = sharding_of(query_length, key_length, partition);
  sdpa::BackwardInputs inputs{view(query, "query"),   view(key, "key"), view(value, "value"),
                              view(output, "output"), view(lse, "lse"), view(grad_output, "grad_output")};
  if (grad_lse) inputs.grad_lse = view(*grad_lse, "grad_lse");
  sdpa::BackwardOutputs outputs{view(grad_query, "grad_query"), view(grad_key, "grad_key"),
                                view(grad_value, "grad_value"), std::nullopt};
  if (grad_sinks) outputs.grad_sinks = view(*grad_sinks, "grad_sinks");
  try {
    nb::gil_scoped_release release;
    sdpa::distributed::backward(MPI_Comm_f2c(static_cast<MPI_Fint>(comm)), inputs, outputs, sharding, call);
  } catch (const sdpa::Error& error) {
    sdpa_python::raise(error, {});
  }
}
#endif

}  // namespace

void register_dist(nb::module_& m) {
#ifdef SDPA_HAVE_MPI
  m.attr("has_distributed") = true;
  m.def("ring_forward", &ring_forward, nb::arg("comm"), nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("mask").none(), nb::arg("alibi_slopes").none(), nb::arg("sinks").none(), nb::arg("output"),
        nb::arg("lse"), nb::arg("query_length"), nb::arg("key_length"), nb::arg("partition"), nb::arg("options"),
        "Ring attention's forward over an MPI communicator (its Fortran handle); see sdpa.distributed.");
  m.def("ring_backward", &ring_backward, nb::arg("comm"), nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("mask").none(), nb::arg("alibi_slopes").none(), nb::arg("sinks").none(), nb::arg("output"),
        nb::arg("lse"), nb::arg("grad_output"), nb::arg("grad_lse").none(), nb::arg("grad_query"),
        nb::arg("grad_key"), nb::arg("grad_value"), nb::arg("grad_sinks").none(), nb::arg("query_length"), nb::arg("key_length"), nb::arg("partition"),
        nb::arg("options"), "Ring attention's backward (used by sdpa.distributed's autograd).");
#else
  m.attr("has_distributed") = false;
#endif
}
