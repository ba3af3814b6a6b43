// sdpa._core's layer classes: sdpa::nn::MultiHeadAttention and its KV cache, which the
// Python class sdpa.MultiheadAttention (python/sdpa/nn.py) wraps. Inputs arrive as
// nb::ndarray (DLPack from torch, buffer protocol / DLPack from NumPy) and are read in
// place with their strides; results are the layer's own tensors handed to NumPy without
// a copy (a capsule owns them), which torch.from_numpy then shares.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "errors.h"
#include "options.h"
#include "sdpa/nn.h"
#include "sdpa/sdpa.h"

namespace nb = nanobind;

namespace {

using Input = nb::ndarray<nb::ro>;
using Array = nb::ndarray<nb::numpy>;

sdpa::DType dtype_of(const nb::dlpack::dtype& dt, const std::string& name) {
  if (const std::optional<sdpa::DType> dtype = sdpa_python::sdpa_dtype(dt)) return *dtype;
  throw nb::type_error((name + ": expected bool, float16, bfloat16, float32 or float64, got DLPack type code " +
                        std::to_string(dt.code) + " of " + std::to_string(dt.bits) + " bits")
                           .c_str());
}

// A view of the caller's memory (CPU only), strides in elements as DLPack gives them.
sdpa::TensorView view_of(const Input& a, const std::string& name) {
  if (!sdpa_python::in_host_memory(a)) {
    throw nb::value_error(
        (name + ": expected a tensor in CPU memory, got DLPack device type " + std::to_string(a.device_type()))
            .c_str());
  }
  return sdpa_python::view_over(a, dtype_of(a.dtype(), name));
}

// Hands a tensor to NumPy without copying: the capsule owns it from here on.
Array to_numpy(sdpa::Tensor&& tensor) {
  auto* owned = new sdpa::Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<sdpa::Tensor*>(p); });
  std::vector<std::size_t> shape(owned->shape().begin(), owned->shape().end());
  nb::dlpack::dtype dtype;
  switch (owned->dtype()) {
    case sdpa::DType::float64:
      dtype = nb::dtype<double>();
      break;
    case sdpa::DType::float32:
      dtype = nb::dtype<float>();
      break;
    case sdpa::DType::boolean:
      dtype = nb::dtype<bool>();
      break;
    case sdpa::DType::int8:
      dtype = nb::dtype<std::int8_t>();
      break;
    case sdpa::DType::float16:
      dtype = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
      break;
    case sdpa::DType::bfloat16:
      dtype = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
      break;
  }
  return Array(owned->data(), shape.size(), shape.data(), owner, nullptr, dtype);
}

// A packed copy of a view, in its own dtype.
sdpa::Tensor copy_of(const sdpa::TensorView& v) {
  sdpa::Tensor t(v.dtype, v.shape);
  const std::vector<std::int64_t> strides = v.effective_strides();
  const std::size_t item = sdpa::dtype_size(v.dtype);
  std::vector<std::int64_t> index(v.rank(), 0);
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    std::memcpy(static_cast<std::byte*>(t.data()) + i * static_cast<std::int64_t>(item),
                static_cast<const std::byte*>(v.data) + offset * static_cast<std::int64_t>(item), item);
    for (std::size_t d = v.rank(); d-- > 0;) {
      if (++index[d] < v.shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= (v.shape[d] - 1) * strides[d];
      index[d] = 0;
    }
  }
  return t;
}

sdpa::Tensor copy_of(const Input& a, const std::string& name) { return copy_of(view_of(a, name)); }

sdpa::DType layer_dtype(const std::string& name) {
  if (name == "float32") return sdpa::DType::float32;
  if (name == "float64") return sdpa::DType::float64;
  throw nb::type_error(("dtype: expected 'float32' or 'float64', got '" + name + "'").c_str());
}

sdpa::nn::MultiHeadAttentionConfig make_config(std::int64_t embed_dim, std::int64_t num_heads,
                                               std::int64_t num_kv_heads, std::int64_t head_dim, std::int64_t kdim,
                                               std::int64_t vdim, bool bias, double dropout,
                                               std::optional<double> rope_base, const std::string& rope_layout,
                                               std::int64_t rotary_dim, const std::string& dtype,
                                               const std::string& init, std::uint64_t seed, std::int64_t window_left,
                                               std::int64_t window_right, const std::vector<double>& alibi_slopes,
                                               double softcap, const std::vector<double>& sinks) {
  sdpa::nn::MultiHeadAttentionConfig c;
  c.embed_dim = embed_dim;
  c.num_heads = num_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.kdim = kdim;
  c.vdim = vdim;
  c.bias = bias;
  c.dropout = dropout;
  if (rope_base) {
    if (rope_layout != "half_split" && rope_layout != "interleaved") {
      throw nb::value_error(("rope.layout: expected 'half_split' or 'interleaved', got '" + rope_layout + "'").c_str());
    }
    c.rope = sdpa::nn::RopeOptions{
        *rope_base, rope_layout == "interleaved" ? sdpa::nn::RopeLayout::interleaved : sdpa::nn::RopeLayout::half_split,
        rotary_dim};
  }
  c.dtype = layer_dtype(dtype);
  if (init != "xavier_uniform" && init != "xavier_normal") {
    throw nb::value_error(("init: expected 'xavier_uniform' or 'xavier_normal', got '" + init + "'").c_str());
  }
  c.init = init == "xavier_normal" ? sdpa::nn::Init::xavier_normal : sdpa::nn::Init::xavier_uniform;
  c.seed = seed;
  c.window_left = window_left;
  c.window_right = window_right;
  c.alibi_slopes = alibi_slopes;
  c.softcap = softcap;
  c.sinks = sinks;
  return c;
}

nb::tuple forward(const sdpa::nn::MultiHeadAttention& layer, const Input& query, const Input& key, const Input& value,
                  const std::optional<Input>& mask, const std::optional<Input>& key_padding_mask,
                  const std::string& causal, bool need_weights, bool training, std::uint64_t dropout_seed,
                  std::int64_t position_offset, sdpa::nn::KVCache* cache, int num_threads) {
  sdpa::nn::AttentionCall call;
  if (mask) call.mask = view_of(*mask, "attn_mask");
  if (key_padding_mask) call.key_padding_mask = view_of(*key_padding_mask, "key_padding_mask");
  call.causal = sdpa_python::causal_of(causal);
  call.need_weights = need_weights;
  call.training = training;
  call.dropout_seed = dropout_seed;
  call.position_offset = position_offset;
  call.cache = cache;
  call.num_threads = num_threads;
  const sdpa::TensorView q = view_of(query, "query"), k = view_of(key, "key"), v = view_of(value, "value");
  sdpa::nn::AttentionResult result;
  try {
    // The arrays stay referenced by this frame, so their memory outlives the call.
    nb::gil_scoped_release release;
    result = layer.forward(q, k, v, call);
  } catch (const sdpa::Error& error) {
    sdpa_python::raise(error, {{"mask", "attn_mask"}});  // call.mask is torch's attn_mask
  }
  nb::object weights = nb::none();
  if (need_weights) weights = nb::cast(to_numpy(std::move(result.weights)));
  return nb::make_tuple(to_numpy(std::move(result.output)), weights);
}

}  // namespace

void register_nn(nb::module_& m) {
  nb::class_<sdpa::nn::KVCache>(m, "KVCache", "Keys and values of the tokens seen so far (see sdpa/nn.h).")
      .def_prop_ro("length", &sdpa::nn::KVCache::length)
      .def_prop_ro("capacity", &sdpa::nn::KVCache::capacity)
      .def("clear", &sdpa::nn::KVCache::clear)
      .def("truncate", &sdpa::nn::KVCache::truncate, nb::arg("length"))
      .def(
          "keys", [](const sdpa::nn::KVCache& c) { return to_numpy(copy_of(c.keys())); },
          "A copy of the cached keys (B, Hkv, length, D).")
      .def(
          "values", [](const sdpa::nn::KVCache& c) { return to_numpy(copy_of(c.values())); },
          "A copy of the cached values (B, Hkv, length, D).")
      .def(
          "scales",
          [](const sdpa::nn::KVCache& c) -> nb::object {
            if (!c.key_scale()) return nb::none();
            return nb::make_tuple(to_numpy(copy_of(*c.key_scale())), to_numpy(copy_of(*c.value_scale())));
          },
          "An int8 cache's scales, copies (B, Hkv, length) float32 for keys and values; None otherwise.")
      .def_prop_ro("dtype", [](const sdpa::nn::KVCache& c) { return std::string(sdpa::dtype_name(c.dtype())); });

  nb::class_<sdpa::nn::MultiHeadAttention>(m, "MultiHeadAttention",
                                           "sdpa::nn::MultiHeadAttention; use sdpa.MultiheadAttention instead.")
      .def(
          "__init__",
          [](sdpa::nn::MultiHeadAttention* self, std::int64_t embed_dim, std::int64_t num_heads,
             std::int64_t num_kv_heads, std::int64_t head_dim, std::int64_t kdim, std::int64_t vdim, bool bias,
             double dropout, std::optional<double> rope_base, const std::string& rope_layout, std::int64_t rotary_dim,
             const std::string& dtype, const std::string& init, std::uint64_t seed, std::int64_t window_left,
             std::int64_t window_right, const std::vector<double>& alibi_slopes, double softcap,
             const std::vector<double>& sinks) {
            new (self) sdpa::nn::MultiHeadAttention(make_config(
                embed_dim, num_heads, num_kv_heads, head_dim, kdim, vdim, bias, dropout, rope_base, rope_layout,
                rotary_dim, dtype, init, seed, window_left, window_right, alibi_slopes, softcap, sinks));
          },
          nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("kdim"),
          nb::arg("vdim"), nb::arg("bias"), nb::arg("dropout"), nb::arg("rope_base").none(), nb::arg("rope_layout"),
          nb::arg("rotary_dim"), nb::arg("dtype"), nb::arg("init"), nb::arg("seed"), nb::arg("window_left") = -1,
          nb::arg("window_right") = -1, nb::arg("alibi_slopes") = std::vector<double>{}, nb::arg("softcap") = 0.0,
          nb::arg("sinks") = std::vector<double>{})
      .def("forward", &forward, nb::arg("query").noconvert(), nb::arg("key").noconvert(), nb::arg("value").noconvert(),
           nb::arg("mask").noconvert().none(), nb::arg("key_padding_mask").noconvert().none(), nb::arg("causal"),
           nb::arg("need_weights"), nb::arg("training"), nb::arg("dropout_seed"), nb::arg("position_offset"),
           nb::arg("cache").none(), nb::arg("num_threads"))
      .def(
          "make_cache",
          [](const sdpa::nn::MultiHeadAttention& layer, std::int64_t batch, std::int64_t capacity, bool int8) {
            return layer.make_cache(batch, capacity, int8 ? std::optional(sdpa::DType::int8) : std::nullopt);
          },
          nb::arg("batch"), nb::arg("capacity") = 0, nb::arg("int8") = false)
      .def("config",
           [](const sdpa::nn::MultiHeadAttention& layer) {
             const sdpa::nn::MultiHeadAttentionConfig& c = layer.config();
             nb::dict d;
             d["embed_dim"] = c.embed_dim;
             d["num_heads"] = c.num_heads;
             d["num_kv_heads"] = c.num_kv_heads;
             d["head_dim"] = c.head_dim;
             d["kdim"] = c.kdim;
             d["vdim"] = c.vdim;
             d["bias"] = c.bias;
             d["dropout"] = c.dropout;
             d["window_size"] = nb::make_tuple(c.window_left, c.window_right);
             d["alibi_slopes"] = c.alibi_slopes;
             d["softcap"] = c.softcap;
             d["sinks"] = c.sinks;
             d["dtype"] = std::string(sdpa::dtype_name(c.dtype));
             return d;
           })
      .def("parameter_names",
           [](const sdpa::nn::MultiHeadAttention& layer) {
             std::vector<std::string> names;
             for (const auto& [name, t] : layer.parameters()) names.push_back(name);
             return names;
           })
      .def(
          "parameter",
          [](const sdpa::nn::MultiHeadAttention& layer, const std::string& name) {
            return to_numpy(sdpa::Tensor(layer.parameter(name)));  // a copy: the layer keeps its own
          },
          nb::arg("name"))
      .def(
          "load_state_dict",
          [](sdpa::nn::MultiHeadAttention& layer, const std::map<std::string, Input>& arrays) {
            std::map<std::string, sdpa::Tensor> tensors;
            for (const auto& [name, a] : arrays) tensors.emplace(name, copy_of(a, name));
            layer.load_state_dict(tensors);
          },
          nb::arg("state_dict"))
      .def("save_safetensors", &sdpa::nn::MultiHeadAttention::save_safetensors, nb::arg("path"),
           nb::arg("metadata") = std::map<std::string, std::string>{})
      .def("load_safetensors", &sdpa::nn::MultiHeadAttention::load_safetensors, nb::arg("path"),
           nb::arg("prefix") = "");
}
