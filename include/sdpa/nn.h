// Layers on top of sdpa::forward: multi-head attention with Q/K/V/O projections (GQA,
// self- and cross-attention, masks, causal, dropout), rotary position embedding,
// Xavier/Glorot initialisation from a seeded counter-based generator, and a KV cache
// for incremental decoding. Weights load from and save to safetensors files, under
// sdpa's own names or torch.nn.MultiheadAttention's.
//
// float32 and float64 layers; the attention inside is sdpa::forward.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sdpa/options.h"
#include "sdpa/tensor.h"

namespace sdpa::nn {

// ---- Rotary position embedding (Su et al., RoFormer, 2021) --------------------------
//
// Each pair (a, b) of a head's channels is rotated by the angle p · θ_i, where p is the
// token's position and θ_i = base^(−2i/d) for pair i = 0 … d/2 − 1 (d = rotary_dim):
//   a' = a cos(p θ_i) − b sin(p θ_i)
//   b' = a sin(p θ_i) + b cos(p θ_i)
// so that <R_m q, R_n k> depends on m − n only. Which channels form pair i:
//   half_split:  (x[i], x[i + d/2])     GPT-NeoX, LLaMA in Hugging Face transformers
//   interleaved: (x[2i], x[2i + 1])     RoFormer's R_Θ, Meta's LLaMA, seed 003's R_i
// Weights trained under one layout give wrong results under the other.
enum class RopeLayout { half_split, interleaved };

struct RopeOptions {
  double base = 10000.0;
  RopeLayout layout = RopeLayout::half_split;
  // Channels rotated (even, ≤ head dim); the rest pass through unchanged (GPT-NeoX's
  // rotary_pct). 0 = the whole head.
  std::int64_t rotary_dim = 0;
};

// Rotates `x` in place: x is (..., L, D), float32 or float64, any strides; row l of
// every leading index is at position `position_offset + l`. Throws sdpa::Error on a bad
// dtype, rank, odd rotary dim, base ≤ 0, or a last position beyond int64.
void apply_rope(const TensorView& x, std::int64_t position_offset, const RopeOptions& options = {});

// ---- Initialisation ----------------------------------------------------------------
//
// fan_in and fan_out as torch.nn.init computes them for a (out, in, *kernel) weight:
// fan_in = in · prod(kernel), fan_out = out · prod(kernel).
//   xavier_uniform: U(−a, a),       a = gain · sqrt(6 / (fan_in + fan_out))
//   xavier_normal:  N(0, σ²),       σ = gain · sqrt(2 / (fan_in + fan_out))   (seed 003)
// Element i's value is a pure function of (seed, i) through Philox4x32-10, so the same
// seed gives bitwise the same weights on every machine and standard library (unlike
// std::normal_distribution, whose algorithm is implementation-defined).
enum class Init { xavier_uniform, xavier_normal };
void xavier_uniform(const TensorView& weight, std::uint64_t seed, double gain = 1.0);
void xavier_normal(const TensorView& weight, std::uint64_t seed, double gain = 1.0);

// ---- KV cache ----------------------------------------------------------------------
//
// Keys (B, Hkv, T, D) and values (B, Hkv, T, Dv) of the tokens seen so far, stored as
// (B, Hkv, capacity, ·) so that keys() and values() are strided views sdpa::forward
// reads directly. Capacity doubles when an append needs more.
//
// An int8 cache (quantized K/V, half the bytes of bfloat16 per decoded token) stores q
// and a float32 scale per (batch, head, position): append() takes floating-point keys
// and values and quantizes each row as quantize_kv does (sdpa/quantize.h);
// key_scale() and value_scale() are the views to pass as Options::key_scale and
// value_scale beside keys() and values().
//
// Not thread-safe: append() and truncate() change the length and may move the storage
// that keys() and values() point into. A cache belongs to one thread (one per
// sequence being decoded); share one only behind your own lock.
class KVCache {
 public:
  KVCache() = default;
  KVCache(DType dtype, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
          std::int64_t capacity = 0);

  // Copies `keys` (B, Hkv, T, D) and `values` (B, Hkv, T, Dv), any strides, the cache's
  // dtype (an int8 cache: any floating-point dtype, quantized), after the cached
  // positions. Throws sdpa::Error on a shape or dtype mismatch, or a non-finite value
  // for an int8 cache (and then leaves the cache unchanged).
  void append(const TensorView& keys, const TensorView& values);
  // Views of the cached positions: (B, Hkv, length, D) and (B, Hkv, length, Dv). Valid
  // until the next append or clear.
  TensorView keys() const;
  TensorView values() const;
  // An int8 cache's scales, (B, Hkv, length) float32, valid as keys(); nullopt otherwise.
  std::optional<TensorView> key_scale() const;
  std::optional<TensorView> value_scale() const;
  DType dtype() const { return dtype_; }
  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  // Forgets the cached positions (keeps the memory).
  void clear() { length_ = 0; }
  // Keeps the first `length` positions (0 <= length <= length()): rolls back rejected
  // speculative tokens, or a call that failed after its append.
  void truncate(std::int64_t length);

 private:
  // Makes room for `needed` positions; returns the storage it replaced (empty if none),
  // which the caller keeps alive while it may still read from it.
  std::pair<Tensor, Tensor> grow(std::int64_t needed);
  DType dtype_ = DType::float32;
  std::int64_t batch_ = 0, kv_heads_ = 0, head_dim_ = 0, value_dim_ = 0;
  std::int64_t length_ = 0, capacity_ = 0;
  Tensor keys_, values_;
  Tensor key_scale_, value_scale_;  // int8: (B, Hkv, capacity) float32
};

// ---- Multi-head attention ----------------------------------------------------------
//
//   Q = x_q W_qᵀ + b_q,  K = x_k W_kᵀ + b_k,  V = x_v W_vᵀ + b_v        (split into heads)
//   Q, K ← RoPE(Q), RoPE(K)                                              (if configured)
//   O = concat_h sdpa::forward(Q_h, K_{h / (Hq/Hkv)}, V_{h / (Hq/Hkv)})  scale 1/sqrt(D)
//   y = O W_oᵀ + b_o
// which is torch.nn.MultiheadAttention's computation (and, with num_kv_heads < num_heads,
// grouped-query attention as in LLaMA 2/3).
struct MultiHeadAttentionConfig {
  std::int64_t embed_dim = 0;     // d_model: width of the query input and of the output
  std::int64_t num_heads = 1;     // query heads Hq
  std::int64_t num_kv_heads = 0;  // key/value heads Hkv; 0 = num_heads. Hq % Hkv == 0
  std::int64_t head_dim = 0;      // D; 0 = embed_dim / num_heads (which must divide)
  std::int64_t kdim = 0;          // width of the key input; 0 = embed_dim (torch's kdim)
  std::int64_t vdim = 0;          // width of the value input; 0 = embed_dim (torch's vdim)
  bool bias = true;               // biases on all four projections
  double dropout = 0.0;           // on the attention weights, in training calls only
  std::optional<RopeOptions> rope;
  // Beyond torch.nn.MultiheadAttention (sdpa::Options, docs/semantics.md): a sliding
  // window (Mistral's local layers; −1 = that side unbounded), ALiBi slopes (one per query
  // head; empty = none), logit softcapping (Gemma 2; 0 = off), attention sinks (gpt-oss:
  // one logit per query head in every row's softmax denominator; empty = none). They count
  // from each query's own position, so with a KV cache the window reaches back from the
  // newest tokens (the causal alignment is bottom-right there).
  std::int64_t window_left = -1, window_right = -1;
  std::vector<double> alibi_slopes;
  double softcap = 0.0;
  std::vector<double> sinks;
  DType dtype = DType::float32;  // float32 or float64
  Init init = Init::xavier_uniform;
  std::uint64_t seed = 0;  // for the initial weights
};

// What one call takes besides the inputs.
struct AttentionCall {
  // Broadcastable to (B, Hq, L, S): bool true = the position takes part, float added
  // (sdpa's polarity, docs/semantics.md).
  std::optional<TensorView> mask;
  // (B, S): true = key s of batch b is padding and is ignored (torch.nn.
  // MultiheadAttention's key_padding_mask polarity, as the name says); a float mask is
  // added.
  std::optional<TensorView> key_padding_mask;
  // With a KV cache, any causal setting is applied bottom-right aligned: the L new
  // queries are the last L of the length() cached positions.
  Causal causal = Causal::none;
  bool need_weights = false;  // also return the per-head weights (B, Hq, L, S)
  bool training = false;      // applies config.dropout
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
  // RoPE position of the first token of this call; with a cache, positions continue
  // from the cache's length, and this is added to it.
  std::int64_t position_offset = 0;
  // Incremental decoding: this call's keys and values are appended to the cache and the
  // queries attend to everything in it.
  KVCache* cache = nullptr;
  int num_threads = 0;  // for sdpa::forward; 0 = OpenMP's default
};

struct AttentionResult {
  Tensor output;   // (B, L, embed_dim), or (L, embed_dim) for unbatched inputs
  Tensor weights;  // (B, Hq, L, S) (or (Hq, L, S)) when need_weights, else empty
};

class MultiHeadAttention {
 public:
  // Validates the configuration (sdpa::Error naming the field) and initialises the
  // weights: the projection matrices by config.init from config.seed (each from its own
  // stream), the biases to zero.
  explicit MultiHeadAttention(const MultiHeadAttentionConfig& config);

  // query (B, L, embed_dim), key (B, S, kdim), value (B, S, vdim), any strides, the
  // layer's dtype; or the same without B (unbatched). Throws sdpa::Error naming the
  // argument at fault before any work.
  AttentionResult forward(const TensorView& query, const TensorView& key, const TensorView& value,
                          const AttentionCall& call = {}) const;
  // Self-attention: query = key = value = x.
  AttentionResult forward(const TensorView& x, const AttentionCall& call = {}) const { return forward(x, x, x, call); }

  // A cache sized for this layer (Hkv heads of head_dim) and `batch` sequences.
  // `dtype`: the layer's (unset), or int8 for a quantized cache.
  KVCache make_cache(std::int64_t batch, std::int64_t capacity = 0, std::optional<DType> dtype = std::nullopt) const;

  const MultiHeadAttentionConfig& config() const { return config_; }

  // The parameters under sdpa's names, in this order:
  //   q_proj.weight (Hq·D, embed_dim)   k_proj.weight (Hkv·D, kdim)   v_proj.weight (Hkv·D, vdim)
  //   out_proj.weight (embed_dim, Hq·D) and, with bias, q_proj.bias, k_proj.bias,
  //   v_proj.bias, out_proj.bias.
  std::vector<std::pair<std::string, const Tensor*>> parameters() const;
  // One parameter by name; throws sdpa::Error for an unknown name.
  Tensor& parameter(const std::string& name);
  const Tensor& parameter(const std::string& name) const;

  // Replaces the weights. Accepts sdpa's names, and torch.nn.MultiheadAttention's
  // (in_proj_weight and in_proj_bias, or q_proj_weight/k_proj_weight/v_proj_weight,
  // out_proj.weight, out_proj.bias). Every parameter must be given exactly once with its
  // shape; any float dtype (converted to the layer's). Unknown names are an error.
  // Validates everything before changing anything.
  void load_state_dict(const std::map<std::string, Tensor>& tensors);

  // safetensors files. Loading takes the tensors whose names start with `prefix` (the
  // prefix stripped), so one layer can be read out of a whole model's file.
  void save_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  void load_safetensors(const std::string& path, const std::string& prefix = "");

 private:
  MultiHeadAttentionConfig config_;
  Tensor q_weight_, k_weight_, v_weight_, o_weight_;
  Tensor q_bias_, k_bias_, v_bias_, o_bias_;
  Tensor alibi_slopes_;  // float64 (Hq,) from config.alibi_slopes, when given
  Tensor sinks_;         // float64 (Hq,) from config.sinks, when given
};

}  // namespace sdpa::nn
