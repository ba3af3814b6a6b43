// Multi-head attention around sdpa::forward. The projections write (B, L, H·D) rows, the
// layout a GEMM produces; the attention reads and writes them as strided (B, H, L, D)
// views, so no transpose is ever materialised (DESIGN.md §1: any strides).
#include "sdpa/nn.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "api/resolve_options.h"
#include "api/views.h"
#include "common/philox.h"
#include "io/safetensors.h"
#include "nn/linear.h"
#include "nn/masks.h"
#include "nn/shape_text.h"
#include "sdpa/error.h"
#include "sdpa/sdpa.h"

namespace sdpa::nn {
namespace {

using Shape = std::vector<std::int64_t>;
using detail::shape_text;

[[noreturn]] void fail(const std::string& argument, const std::string& message, ErrorKind kind = ErrorKind::value) {
  throw Error(kind, argument, message);
}

// Copies `src` into `dst` (same shape), converting the dtype.
void convert_into(const Tensor& src, Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    std::copy_n(static_cast<const std::byte*>(src.data()), src.nbytes(), static_cast<std::byte*>(dst.data()));
    return;
  }
  for (std::int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.get(i));
}

// Rows [begin, begin + count) of a packed matrix or vector, as a new tensor.
Tensor slice_rows(const Tensor& t, std::int64_t begin, std::int64_t count) {
  Shape shape = t.shape();
  const std::int64_t row = t.numel() / std::max<std::int64_t>(shape[0], 1);
  shape[0] = count;
  Tensor out(t.dtype(), shape);
  const std::size_t item = dtype_size(t.dtype());
  std::copy_n(static_cast<const std::byte*>(t.data()) + begin * row * static_cast<std::int64_t>(item),
              static_cast<std::size_t>(count * row) * item, static_cast<std::byte*>(out.data()));
  return out;
}

// The options the layer hands sdpa::forward, but the tensors (mask, ALiBi slopes): the
// config's window and softcap, dropout in training calls, the call's threads.
Options attention_options(const MultiHeadAttentionConfig& c, const AttentionCall& call) {
  Options options;
  options.causal = call.causal;
  options.dropout_p = call.training ? c.dropout : 0.0;
  options.seed = call.dropout_seed;
  options.offset = call.dropout_offset;
  options.num_threads = call.num_threads;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.softcap = c.softcap;
  return options;
}

// The library's own check of those options (sdpa::detail::check_options), so that the layer
// refuses what sdpa::forward would, in the same words, before any work. Its errors name the
// field where the layer's caller set it: options.<field> becomes <owner>.<field> ("config"
// or "call"), dropout_p the config's dropout.
void check_attention_options(const Options& options, DType dtype, const std::string& owner, std::int64_t heads_q = 0) {
  try {
    sdpa::detail::check_options(options, dtype);
    // The (Hq,) per-head tensors (ALiBi slopes, sinks), whatever the batch: a sink too
    // large for float32 is refused here, not at the first call.
    if (heads_q > 0) sdpa::detail::check_per_head_options(options, {}, heads_q, dtype);
  } catch (const Error& error) {
    const std::string& argument = error.argument();
    std::string field = argument.substr(argument.find('.') + 1);
    if (field == "dropout_p") field = "dropout";
    throw Error(error.kind(), owner + "." + field, error.message());
  }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config) : config_(config) {
  MultiHeadAttentionConfig& c = config_;
  if (c.dtype != DType::float32 && c.dtype != DType::float64) {
    fail("config.dtype", std::string("expected float32 or float64, got ") + dtype_name(c.dtype), ErrorKind::type);
  }
  if (c.embed_dim <= 0) fail("config.embed_dim", "expected > 0, got " + std::to_string(c.embed_dim));
  if (c.num_heads <= 0) fail("config.num_heads", "expected > 0, got " + std::to_string(c.num_heads));
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  if (c.num_kv_heads < 0 || c.num_heads % c.num_kv_heads != 0) {
    fail("config.num_kv_heads",
         "expected a divisor of num_heads " + std::to_string(c.num_heads) + ", got " + std::to_string(c.num_kv_heads));
  }
  if (c.head_dim == 0) {
    if (c.embed_dim % c.num_heads != 0) {
      fail("config.num_heads", "expected a divisor of embed_dim " + std::to_string(c.embed_dim) +
                                   " (or an explicit head_dim), got " + std::to_string(c.num_heads));
    }
    c.head_dim = c.embed_dim / c.num_heads;
  }
  if (c.head_dim < 0) fail("config.head_dim", "expected > 0, got " + std::to_string(c.head_dim));
  if (c.kdim == 0) c.kdim = c.embed_dim;
  if (c.vdim == 0) c.vdim = c.embed_dim;
  if (c.kdim < 0) fail("config.kdim", "expected > 0, got " + std::to_string(c.kdim));
  if (c.vdim < 0) fail("config.vdim", "expected > 0, got " + std::to_string(c.vdim));
  if (c.rope) {
    const std::int64_t rd = c.rope->rotary_dim == 0 ? c.head_dim : c.rope->rotary_dim;
    if (rd < 0 || rd % 2 != 0 || rd > c.head_dim) {
      fail("config.rope.rotary_dim",
           "expected an even number <= head_dim " + std::to_string(c.head_dim) + ", got " + std::to_string(rd));
    }
    if (!(c.rope->base > 0) || !std::isfinite(c.rope->base)) {
      fail("config.rope.base", "expected a finite base > 0, got " + std::to_string(c.rope->base));
    }
  }
  // The per-head values as the (Hq,) float64 tensors the calls hand to sdpa::forward.
  const auto per_head = [&](const std::vector<double>& values, const char* name, const char* what) {
    if (values.empty()) return Tensor();
    if (static_cast<std::int64_t>(values.size()) != c.num_heads)
      fail(std::string("config.") + name, std::string("expected one ") + what + " per query head (" +
                                              std::to_string(c.num_heads) + "), got " + std::to_string(values.size()));
    Tensor t(DType::float64, {c.num_heads});
    for (std::int64_t h = 0; h < c.num_heads; ++h) t.set(h, values[static_cast<std::size_t>(h)]);
    return t;
  };
  alibi_slopes_ = per_head(c.alibi_slopes, "alibi_slopes", "slope");
  sinks_ = per_head(c.sinks, "sinks", "sink");
  // Dropout, window, softcap and the per-head values, as a training call passes them.
  AttentionCall training;
  training.training = true;
  Options options = attention_options(c, training);
  if (!c.alibi_slopes.empty()) options.alibi_slopes = alibi_slopes_.view();
  if (!c.sinks.empty()) options.sinks = sinks_.view();
  check_attention_options(options, c.dtype, "config", c.num_heads);

  const std::int64_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
  q_weight_ = Tensor(c.dtype, {q_out, c.embed_dim});
  k_weight_ = Tensor(c.dtype, {kv_out, c.kdim});
  v_weight_ = Tensor(c.dtype, {kv_out, c.vdim});
  o_weight_ = Tensor(c.dtype, {c.embed_dim, q_out});
  if (c.bias) {
    q_bias_ = Tensor(c.dtype, {q_out});
    k_bias_ = Tensor(c.dtype, {kv_out});
    v_bias_ = Tensor(c.dtype, {kv_out});
    o_bias_ = Tensor(c.dtype, {c.embed_dim});
  }
  // Each matrix from its own stream of the seed, so that changing one shape leaves the
  // others' values alone.
  int stream = 0;
  for (Tensor* w : {&q_weight_, &k_weight_, &v_weight_, &o_weight_}) {
    const std::uint64_t seed = c.seed ^ sdpa::detail::mix64(static_cast<std::uint64_t>(++stream));
    if (c.init == Init::xavier_uniform) {
      xavier_uniform(w->view(), seed);
    } else {
      xavier_normal(w->view(), seed);
    }
  }
}

KVCache MultiHeadAttention::make_cache(std::int64_t batch, std::int64_t capacity, std::optional<DType> dtype) const {
  if (dtype && *dtype != config_.dtype && *dtype != DType::int8)
    fail("dtype",
         std::string("expected the layer's dtype ") + dtype_name(config_.dtype) + " or int8, got " + dtype_name(*dtype),
         ErrorKind::type);
  return KVCache(dtype.value_or(config_.dtype), batch, config_.num_kv_heads, config_.head_dim, config_.head_dim,
                 capacity);
}

AttentionResult MultiHeadAttention::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                                            const AttentionCall& call) const {
  const MultiHeadAttentionConfig& c = config_;
  // ---- validation: everything is checked before any work or any change to the cache.
  const bool batched = query.rank() == 3;
  if (query.rank() != 2 && query.rank() != 3) {
    fail("query", "expected (B, L, embed_dim) or (L, embed_dim), got shape " + shape_text(query.shape));
  }
  for (auto [view, name, width] : {std::tuple{&query, "query", c.embed_dim}, std::tuple{&key, "key", c.kdim},
                                   std::tuple{&value, "value", c.vdim}}) {
    if (view->dtype != c.dtype) {
      fail(name, std::string("expected the layer's dtype ") + dtype_name(c.dtype) + ", got " + dtype_name(view->dtype),
           ErrorKind::type);
    }
    if (view->rank() != query.rank()) {
      fail(name,
           "expected rank " + std::to_string(query.rank()) + " like the query, got shape " + shape_text(view->shape));
    }
    if (view->shape.back() != width) {
      fail(name, "expected a last dim of " + std::to_string(width) + ", got shape " + shape_text(view->shape));
    }
    if (!view->strides.empty() && view->strides.size() != view->rank()) {
      fail(name, "expected one stride per dim, got " + std::to_string(view->strides.size()));
    }
    if (view->data == nullptr && view->numel() != 0) fail(name, "expected data, got a null pointer");
  }
  if (batched && (key.shape[0] != query.shape[0] || value.shape[0] != query.shape[0])) {
    fail(key.shape[0] != query.shape[0] ? "key" : "value",
         "expected the query's batch " + std::to_string(query.shape[0]) + ", got shape " +
             shape_text(key.shape[0] != query.shape[0] ? key.shape : value.shape));
  }
  const std::size_t seq_dim = batched ? 1 : 0;
  if (key.shape[seq_dim] != value.shape[seq_dim]) {
    fail("value", "expected as many positions as the key (" + std::to_string(key.shape[seq_dim]) + "), got shape " +
                      shape_text(value.shape));
  }
  const std::int64_t batch = batched ? query.shape[0] : 1;
  const std::int64_t L = query.shape[seq_dim], S_new = key.shape[seq_dim];
  const std::int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  KVCache* cache = call.cache;
  if (cache != nullptr) {
    const TensorView cached = cache->keys();
    if ((cached.dtype != c.dtype && cached.dtype != DType::int8) || cached.shape[0] != batch ||
        cached.shape[1] != Hkv || cached.shape[3] != D || cache->values().shape[3] != D) {
      fail("call.cache", "expected a cache of " + std::string(dtype_name(c.dtype)) + " or int8 (" +
                             std::to_string(batch) + ", " + std::to_string(Hkv) + ", T, " + std::to_string(D) +
                             ") (make_cache), got " + dtype_name(cached.dtype) + " " + shape_text(cached.shape));
    }
  }
  const std::int64_t past = cache != nullptr ? cache->length() : 0;
  const std::int64_t S = past + S_new;
  Options options = attention_options(c, call);
  check_attention_options(options, c.dtype, "call");  // the config's part passed at construction
  // RoPE positions run from past + offset to past + offset + max(L, S_new) − 1.
  std::int64_t last_position = 0;
  if (c.rope &&
      (__builtin_add_overflow(past, call.position_offset, &last_position) ||
       __builtin_add_overflow(last_position, std::max<std::int64_t>(std::max(L, S_new), 1) - 1, &last_position))) {
    fail("call.position_offset", "expected an offset whose last RoPE position (cache length " + std::to_string(past) +
                                     " + offset + " + std::to_string(std::max(L, S_new) - 1) + ") fits in int64, got " +
                                     std::to_string(call.position_offset));
  }
  detail::MergedMask mask = detail::merge_masks(call.mask, call.key_padding_mask, batch, Hq, L, S, batched);

  // ---- projections: (B, L, H·D) rows.
  Tensor q(c.dtype, {batch, L, Hq * D}), k(c.dtype, {batch, S_new, Hkv * D}), v(c.dtype, {batch, S_new, Hkv * D});
  detail::linear(query, q_weight_, c.bias ? &q_bias_ : nullptr, q.data());
  detail::linear(key, k_weight_, c.bias ? &k_bias_ : nullptr, k.data());
  detail::linear(value, v_weight_, c.bias ? &v_bias_ : nullptr, v.data());
  auto heads_view = [&](const Tensor& t, std::int64_t heads, std::int64_t tokens) {
    return TensorView{
        const_cast<void*>(t.data()), c.dtype, {batch, heads, tokens, D}, {tokens * heads * D, D, heads * D, 1}};
  };
  const TensorView qv = heads_view(q, Hq, L), kv = heads_view(k, Hkv, S_new), vv = heads_view(v, Hkv, S_new);
  if (c.rope) {
    apply_rope(qv, past + call.position_offset, *c.rope);
    apply_rope(kv, past + call.position_offset, *c.rope);
  }

  // ---- attention, written straight into (B, L, Hq·D) rows.
  options.mask = mask.view;
  if (cache != nullptr && call.causal != Causal::none) options.causal = Causal::bottom_right;
  if (!c.alibi_slopes.empty()) options.alibi_slopes = alibi_slopes_.view();
  if (!c.sinks.empty()) options.sinks = sinks_.view();

  AttentionResult result;
  if (call.need_weights) result.weights = Tensor(c.dtype, batched ? Shape{batch, Hq, L, S} : Shape{Hq, L, S});
  Tensor attended(c.dtype, {batch, L, Hq * D});
  ForwardOutputs outputs{heads_view(attended, Hq, L), std::nullopt, std::nullopt};
  if (call.need_weights) {
    outputs.weights = TensorView{result.weights.data(), c.dtype, {batch, Hq, L, S}, {}};
  }
  TensorView keys = kv, values = vv;
  if (cache != nullptr) {
    cache->append(kv, vv);
    keys = cache->keys();
    values = cache->values();
    options.key_scale = cache->key_scale();  // int8 caches: the scales beside q
    options.value_scale = cache->value_scale();
  }
  try {
    sdpa::forward(qv, keys, values, outputs, options);
  } catch (...) {
    if (cache != nullptr) cache->truncate(past);  // a failed call leaves the cache as it was
    throw;
  }

  // ---- output projection.
  result.output = Tensor(c.dtype, batched ? Shape{batch, L, c.embed_dim} : Shape{L, c.embed_dim});
  detail::linear(attended.view(), o_weight_, c.bias ? &o_bias_ : nullptr, result.output.data());
  return result;
}

std::vector<std::pair<std::string, const Tensor*>> MultiHeadAttention::parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> params = {{"q_proj.weight", &q_weight_},
                                                               {"k_proj.weight", &k_weight_},
                                                               {"v_proj.weight", &v_weight_},
                                                               {"out_proj.weight", &o_weight_}};
  if (config_.bias) {
    params.insert(
        params.end(),
        {{"q_proj.bias", &q_bias_}, {"k_proj.bias", &k_bias_}, {"v_proj.bias", &v_bias_}, {"out_proj.bias", &o_bias_}});
  }
  return params;
}

const Tensor& MultiHeadAttention::parameter(const std::string& name) const {
  for (const auto& [n, t] : parameters())
    if (n == name) return *t;
  std::string known;
  for (const auto& [n, t] : parameters()) known += (known.empty() ? "" : ", ") + n;
  fail("name", "expected one of " + known + ", got '" + name + "'");
}

Tensor& MultiHeadAttention::parameter(const std::string& name) {
  return const_cast<Tensor&>(static_cast<const MultiHeadAttention*>(this)->parameter(name));
}

void MultiHeadAttention::load_state_dict(const std::map<std::string, Tensor>& tensors) {
  const MultiHeadAttentionConfig& c = config_;
  // Translate torch.nn.MultiheadAttention's names into sdpa's. Its packed in_proj
  // holds [W_q; W_k; W_v] stacked along the output dim.
  std::map<std::string, Tensor> named;
  auto put = [&](const std::string& name, Tensor t, const std::string& source) {
    if (!named.emplace(name, std::move(t)).second) {
      fail(source, "expected each parameter once, got '" + name + "' a second time (from '" + source + "')");
    }
  };
  const std::int64_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
  for (const auto& [name, tensor] : tensors) {
    // bool and int8 (a safetensors I8 tensor loads as int8) would load as 0/1 or integer weights.
    if (!sdpa::detail::is_float(tensor.dtype()))
      fail(name, std::string("expected a floating-point tensor, got ") + dtype_name(tensor.dtype()), ErrorKind::type);
    if (name == "in_proj_weight" || name == "in_proj_bias") {
      const bool is_weight = name == "in_proj_weight";
      const Shape expected = is_weight ? Shape{q_out + 2 * kv_out, c.embed_dim} : Shape{q_out + 2 * kv_out};
      if (is_weight && (c.kdim != c.embed_dim || c.vdim != c.embed_dim)) {
        fail(name,
             "expected q_proj_weight, k_proj_weight and v_proj_weight for a layer with kdim/vdim != embed_dim, "
             "got the packed in_proj_weight");
      }
      if (tensor.shape() != expected) {
        fail(name, "expected shape " + shape_text(expected) + ", got " + shape_text(tensor.shape()));
      }
      const std::string suffix = is_weight ? ".weight" : ".bias";
      put("q_proj" + suffix, slice_rows(tensor, 0, q_out), name);
      put("k_proj" + suffix, slice_rows(tensor, q_out, kv_out), name);
      put("v_proj" + suffix, slice_rows(tensor, q_out + kv_out, kv_out), name);
    } else if (name == "q_proj_weight" || name == "k_proj_weight" || name == "v_proj_weight") {
      put(name.substr(0, 6) + ".weight", tensor, name);
    } else if (name == "bias_k" || name == "bias_v") {
      fail(name, "expected no add_bias_kv parameters (sdpa's layer has none), got '" + name + "'");
    } else {
      put(name, tensor, name);
    }
  }

  // Everything checked before anything is replaced.
  std::set<std::string> expected_names;
  for (const auto& [name, param] : parameters()) {
    expected_names.insert(name);
    const auto it = named.find(name);
    if (it == named.end()) fail(name, "expected this parameter in the state dict, got none");
    if (it->second.shape() != param->shape()) {
      fail(name, "expected shape " + shape_text(param->shape()) + ", got " + shape_text(it->second.shape()));
    }
  }
  for (const auto& [name, t] : named) {
    if (!expected_names.count(name)) {
      std::string known;
      for (const std::string& n : expected_names) known += (known.empty() ? "" : ", ") + n;
      fail(name, "expected only this layer's parameters (" + known + "), got '" + name + "'");
    }
  }
  for (const auto& [name, param] : parameters()) convert_into(named.at(name), const_cast<Tensor&>(*param));
}

void MultiHeadAttention::save_safetensors(const std::string& path,
                                          const std::map<std::string, std::string>& metadata) const {
  // The configuration travels in the metadata, so a reader can rebuild the layer.
  std::map<std::string, std::string> meta = metadata;
  const MultiHeadAttentionConfig& c = config_;
  meta["sdpa.embed_dim"] = std::to_string(c.embed_dim);
  meta["sdpa.num_heads"] = std::to_string(c.num_heads);
  meta["sdpa.num_kv_heads"] = std::to_string(c.num_kv_heads);
  meta["sdpa.head_dim"] = std::to_string(c.head_dim);
  meta["sdpa.kdim"] = std::to_string(c.kdim);
  meta["sdpa.vdim"] = std::to_string(c.vdim);
  meta["sdpa.bias"] = c.bias ? "true" : "false";
  io::write_safetensors(path, parameters(), meta);
}

void MultiHeadAttention::load_safetensors(const std::string& path, const std::string& prefix) {
  io::SafetensorsFile file = io::read_safetensors(path);
  std::map<std::string, Tensor> selected;
  for (auto& [name, tensor] : file.tensors) {
    if (name.compare(0, prefix.size(), prefix) == 0) selected.emplace(name.substr(prefix.size()), std::move(tensor));
  }
  for (const auto& [name, dtype] : file.skipped) {
    if (name.compare(0, prefix.size(), prefix) == 0) {
      fail(path, "expected floating-point parameters, got '" + name + "' of dtype " + dtype, ErrorKind::type);
    }
  }
  try {
    load_state_dict(selected);
  } catch (const Error& e) {
    throw Error(e.kind(), path, e.what());  // name the file; the message names the tensor
  }
}

}  // namespace sdpa::nn
