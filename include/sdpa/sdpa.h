// sdpa: exact scaled dot-product attention.
//
//   output = softmax(Q Kᵀ · scale + mask) V
//
// with PyTorch's semantics (torch.nn.functional.scaled_dot_product_attention); the
// contract is written out in docs/semantics.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/options.h"
#include "sdpa/quantize.h"
#include "sdpa/tensor.h"

namespace sdpa {

// Caller-provided buffers for forward(). Shapes, with Q (..., Hq, L, E),
// K (..., Hkv, S, E), V (..., Hkv, S, Ev):
//   output  (..., Hq, L, Ev)  dtype of the query
//   weights (..., Hq, L, S)   dtype of the query: the weights multiplied into V, after
//                             dropout
//   lse     (..., Hq, L)      float32 (float64 for float64 inputs): log-sum-exp of each
//                             row of scaled, masked scores; -inf for fully masked rows
// Any strides, as long as the elements of one buffer do not overlap.
struct ForwardOutputs {
  TensorView output;
  std::optional<TensorView> weights;
  std::optional<TensorView> lse;
};

// Computes attention into caller buffers. Validates everything first and throws
// sdpa::Error naming the argument at fault; on error nothing has been written.
void forward(const TensorView& query, const TensorView& key, const TensorView& value, const ForwardOutputs& outputs,
             const Options& options = {});

// What the allocating forward() returns. `weights` and `lse` are empty tensors unless
// asked for.
struct ForwardResult {
  Tensor output;
  Tensor weights;
  Tensor lse;
};

// What to return besides the output.
struct Returns {
  bool weights = false;
  bool lse = false;
};

// Allocating form: returns packed tensors.
ForwardResult forward(const TensorView& query, const TensorView& key, const TensorView& value,
                      const Options& options = {}, Returns returns = {});

// ---- Backward ----------------------------------------------------------------------
//
// Gradients of a loss through output = softmax(Q Kᵀ · scale + mask) V, given dO:
//   P  = exp(Q Kᵀ · scale + mask − lse)     recomputed, never stored whole
//   W  = P ∘ Z                               Z = keep/(1−p): the forward's dropout mask
//   dV = Wᵀ dO,   dP = (dO Vᵀ) ∘ Z,   D = rowsum(dO ∘ O)
//   dS = P ∘ (dP − D + dlse)              dlse: the gradient of the returned lse, if any
//   dQ = scale · dS K,   dK = scale · dSᵀ Q,   dmask = dS (summed over broadcast dims)
//   dsink = Σ_i P_sink,i · (dlse_i − dO_i · O_i),   P_sink,i = exp(sink − lse_i)
// GQA: dK and dV of a KV head sum over the query heads of its group.

// What backward() reads. query, key, value and the options (mask, causal, scale,
// dropout seed and offset) must be those of the forward call; output and lse are what
// it returned (lse as ForwardOutputs::lse: float32, float64 for float64 inputs).
// grad_output is dL/d(output); grad_lse, when the loss also depends on the returned lse
// (merging partial attentions, ring attention), is dL/d(lse), the lse's shape and dtype
// (∂lse_i/∂s_ij = P_ij). All read-only, any strides (stride 0 included).
struct BackwardInputs {
  TensorView query, key, value;
  TensorView output;                                  // (..., Hq, L, Ev), dtype of the query
  TensorView lse;                                     // (..., Hq, L)
  TensorView grad_output;                             // (..., Hq, L, Ev), dtype of the query
  std::optional<TensorView> grad_lse = std::nullopt;  // (..., Hq, L), dtype of lse
};

// Caller-provided buffers for backward(), each the shape and dtype of what it is the
// gradient of. grad_mask only for a floating-point mask: the mask's own shape and dtype,
// the full gradient summed over the dims the mask broadcasts along. grad_sinks only with
// sinks: their shape and dtype, summed over the rows (and the batch, for (Hq,) sinks).
// Any strides, as long as no two elements overlap and no buffer overlaps another or an
// input.
struct BackwardOutputs {
  TensorView grad_query, grad_key, grad_value;
  std::optional<TensorView> grad_mask = std::nullopt;
  std::optional<TensorView> grad_sinks = std::nullopt;
};

// Computes the gradients into caller buffers. Validates everything first and throws
// sdpa::Error naming the argument at fault; on error nothing has been written. Bitwise
// the same results for any thread count.
void backward(const BackwardInputs& inputs, const BackwardOutputs& outputs, const Options& options = {});

// What the allocating backward() returns; grad_mask is empty unless asked for, grad_sinks
// unless options.sinks is given.
struct BackwardResult {
  Tensor grad_query, grad_key, grad_value, grad_mask, grad_sinks;
};

// Allocating form: returns packed tensors. `mask_gradient` asks for grad_mask (a float
// mask must be given).
BackwardResult backward(const BackwardInputs& inputs, const Options& options = {}, bool mask_gradient = false);

// ---- Packed variable-length batches (FlashAttention's varlen) ----------------------
//
// Sequences of different lengths packed along the sequence dim, no padding:
//   query (Hq, total_q, E), key (Hkv, total_k, E), value (Hkv, total_k, Ev)
// (any strides: FlashAttention's (total, H, E) buffers are these with permuted strides).
// Sequence b is query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) against key rows
// [cu_seqlens_k[b], cu_seqlens_k[b+1]), attended alone: the result equals forward() on
// that sequence by itself (causal alignment, window and ALiBi distances are within the
// sequence). cu_seqlens start at 0, never decrease and end at total_q / total_k; both
// have batch + 1 entries. Options as forward(), except:
//   mask          not accepted (per-sequence masks have no packed form);
//   alibi_slopes  (Hq,) or (batch, Hq);
//   dropout       sequence b draws as batch element b of a padded (batch, Hq, L, S) call.
// Outputs: output (Hq, total_q, Ev), lse (Hq, total_q); no weights.
struct VarlenSequences {
  std::vector<std::int64_t> cu_seqlens_q;
  std::vector<std::int64_t> cu_seqlens_k;
};

void forward_varlen(const TensorView& query, const TensorView& key, const TensorView& value,
                    const VarlenSequences& sequences, const ForwardOutputs& outputs, const Options& options = {});
ForwardResult forward_varlen(const TensorView& query, const TensorView& key, const TensorView& value,
                             const VarlenSequences& sequences, const Options& options = {}, Returns returns = {});

// Gradients of forward_varlen: inputs and gradients in the packed shapes above
// (inputs.lse is (Hq, total_q)).
void backward_varlen(const BackwardInputs& inputs, const VarlenSequences& sequences, const BackwardOutputs& outputs,
                     const Options& options = {});
BackwardResult backward_varlen(const BackwardInputs& inputs, const VarlenSequences& sequences,
                               const Options& options = {});

// ---- Paged KV cache (vLLM's PagedAttention, FlashInfer) ---------------------------
//
// K and V live in fixed-size pages shared by every sequence of the batch:
//   key_pages (pages, Hkv, page_size, E), value_pages (pages, Hkv, page_size, Ev)
// (any strides: a (pages, page_size, Hkv, E) buffer is this with permuted strides).
// Sequence b's keys are j < seq_lens[b]; key j is row j % page_size of page
// block_table[b · blocks_per_sequence + j / page_size]. Entries of the block table past
// a sequence's last page are not read.
struct PagedKV {
  TensorView key_pages;
  TensorView value_pages;
  std::vector<std::int64_t> block_table;  // (batch, blocks_per_sequence), row-major
  std::int64_t blocks_per_sequence = 0;
  std::vector<std::int64_t> seq_lens;  // (batch,)
};

// Attention of query (batch, Hq, L, E) against each sequence's paged keys: equal to
// forward() against the same keys held contiguously (S = seq_lens[b]; bottom_right
// causal puts the L queries at the end of the sequence, as in decoding). Options as
// forward() except mask (not accepted); alibi_slopes (Hq,) or (batch, Hq). Outputs:
// output (batch, Hq, L, Ev), lse (batch, Hq, L); no weights.
void forward_paged(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                   const Options& options = {});
ForwardResult forward_paged(const TensorView& query, const PagedKV& cache, const Options& options = {},
                            Returns returns = {});

// The version string ("0.1.0").
const char* version();

// What the library found on this machine and would run.
struct RuntimeInfo {
  std::string version;
  std::string cpu_features;  // e.g. "avx2 fma avx512f avx512bf16"
  std::string cpu_kernel;    // the CPU forward kernel the dispatcher picks
  int max_threads = 1;       // OpenMP threads available
  // bfloat16 products on vdpbf16ps (AMD's cores with AVX-512 BF16, where it outruns the
  // float32 FMAs), or widened to float32 FMAs (everywhere else: no such instruction, or
  // Intel's, whose vdpbf16ps runs at half their rate).
  bool bfloat16_on_vdpbf16ps = false;
};
RuntimeInfo runtime_info();

}  // namespace sdpa
