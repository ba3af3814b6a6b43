// Everything about one attention call that is not a tensor.
#pragma once

#include <cstdint>
#include <optional>

#include "sdpa/tensor.h"

namespace sdpa {

// Which keys a query may see when causal.
//   top_left:     query i sees keys j <= i              (PyTorch is_causal=True)
//   bottom_right: query i sees keys j <= i + S - L      (FlashAttention >= 2.1, KV cache)
// They agree when L == S.
enum class Causal { none, top_left, bottom_right };

// Where a query's diagonal lies, for the sliding window and ALiBi: query i's diagonal
// key is d(i) = i (top_left) or d(i) = i + S − L (bottom_right, FlashAttention's).
enum class Alignment { top_left, bottom_right };

// Which implementation runs the call. `automatic` picks the fastest available;
// `reference` is the float64 oracle (slow, for checking).
enum class Backend { automatic, reference, cpu };

struct Options {
  // Optional mask, broadcastable to (..., Hq, L, S). bool: true = the position takes
  // part (PyTorch's polarity). Floating point: added to the scaled scores.
  std::optional<TensorView> mask;
  Causal causal = Causal::none;
  // Multiplies Q Kᵀ. Default 1/sqrt(E). Any finite value, negative and zero included.
  std::optional<double> scale;

  // Beyond PyTorch's SDPA (FlashAttention's window_size, alibi_slopes, softcap). The
  // score of query i and key j is
  //   s = softcap · tanh(scale · q·k / softcap)     (softcap > 0; else scale · q·k)
  //     − slope[h] · |d(i) − j|                     (ALiBi, when slopes are given)
  //     + mask                                      (float mask; bool/causal/window: −inf)
  // Sliding window: query i sees key j only when d(i) − window_left <= j <=
  // d(i) + window_right; −1 leaves that side unbounded. Causal caps window_right at 0.
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // Unset: the causal alignment when causal is set, else bottom_right. Set together with
  // causal, it must name the same alignment.
  std::optional<Alignment> alignment;
  // ALiBi slopes, float32 or float64: (Hq,) or (batch..., Hq), one per query head.
  std::optional<TensorView> alibi_slopes;
  // Logit softcapping; 0 = off, else a finite cap > 0 (Gemma 2, Grok: 30 or 50).
  double softcap = 0.0;
  // Attention sinks (gpt-oss, StreamingLLM's learned sink), float32 or float64: (Hq,) or
  // (batch..., Hq), one logit per query head that joins every row's softmax denominator
  // and takes no value:
  //   out_i = Σ_j exp(s_ij − m) v_j / (exp(sink − m) + Σ_j exp(s_ij − m)),
  //   lse_i = log(exp(sink) + Σ_j exp(s_ij)).
  // A row whose keys are all masked gives output 0 and lse = sink; −inf is no sink.
  std::optional<TensorView> sinks;

  // Quantized K and V (llama.cpp's q8_0, OpenVINO's u8 caches, symmetric): an int8 key
  // or value holds q in [−127, 127] and its scale here, one float32 per (token, KV head),
  // the key's (value's) shape without its last dim — (batch..., Hkv, S) — so that
  //   key[..., h, j, e] = key_scale[..., h, j] · q[..., h, j, e].
  // Required with an int8 key (value), refused otherwise; quantize_kv (sdpa/quantize.h)
  // makes both; any scales are read as given. The float32 kernels read the int8 rows and
  // apply the scale to the score (scale_k[j] · q·k_j) and to the weight (scale_v[j] · p_j),
  // never a dequantized copy of K/V; float64 queries dequantize one tile at a time, exactly.
  // Inference only: backward() refuses int8 K/V.
  std::optional<TensorView> key_scale;
  std::optional<TensorView> value_scale;

  // Dropout on the attention weights, 0 <= dropout_p < 1. The keep/drop decision for
  // (batch, head, i, j) is a pure function of (seed, offset, batch, head, i, j)
  // through Philox4x32-10; see docs/semantics.md.
  double dropout_p = 0.0;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  Backend backend = Backend::automatic;
  // Threads for the CPU backend; 0 = OpenMP's default, at most kMaxThreads (more is a
  // typo, not a machine: OpenMP would crash trying to start them). Results do not
  // depend on it.
  int num_threads = 0;
  static constexpr int kMaxThreads = 4096;
};

}  // namespace sdpa
