"""Autograd for torch tensors: sdpa's forward and backward as torch.library custom ops.

    sdpa::attention_forward(q, k, v, mask, ...)  -> (out, lse)
    sdpa::attention_backward(dout, q, k, v, mask, out, lse, ...) -> (dq, dk, dv, dmask)
    sdpa::varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, ...) -> (out, lse)
    sdpa::varlen_backward(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, ...) -> (dq, dk, dv)
    sdpa::paged_forward(q, key_pages, value_pages, block_table, seq_lens, ...) -> (out, lse)

Every op ends with the options beyond PyTorch's SDPA (issue #7): window_left, window_right,
alignment ("none" = the library's default), alibi_slopes (not differentiated) and softcap.

Each forward op but the paged one has its backward op registered as its autograd formula
(torch.library.register_autograd), and both have fake (meta) implementations, so the
pair works under torch.autograd, torch.autograd.gradcheck and torch.compile alike. The
backward is the C++ library's (FlashAttention-2's recomputation from the log-sum-exp,
docs/semantics.md "Backward"): it regenerates the forward's dropout mask from the same
Philox seed, sums dK and dV over a GQA group, and gives a float mask its gradient (summed
over the dims it broadcasts along). The log-sum-exp output is differentiable too (its
gradient adds P · dlse to dS), for losses that merge partial attentions by their lse.

sdpa.attention, sdpa.scaled_dot_product_attention and sdpa.varlen_attention route torch
tensors here when a gradient is wanted (an input requires grad and grad mode is on) or when
torch.compile is tracing; otherwise they call the library directly. sdpa.paged_attention
(forward only) comes here only under torch.compile.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _core

_TWO_64 = 1 << 64


def _to_int64(seed: int) -> int:
    # Custom-op ints are int64; the seed is a uint64 (two's complement, both ways).
    return seed - _TWO_64 if seed >= 1 << 63 else seed


def _to_uint64(seed: int) -> int:
    return seed + _TWO_64 if seed < 0 else seed


def _lse_dtype(query: torch.Tensor) -> torch.dtype:
    return torch.float64 if query.dtype == torch.float64 else torch.float32


def _lse_gradient(grad_lse: Optional[torch.Tensor], lse: torch.Tensor) -> Optional[torch.Tensor]:
    """dL/d(lse) in lse's dtype, readable by the library; None when the loss did not use it."""
    return None if grad_lse is None else _readable(grad_lse).to(lse.dtype)


def _readable(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # DLPack refuses tensors that require grad (detach: a view, no copy), and exports a
    # lazily negated view's memory, the negatives of its values, as it is.
    if x is None:
        return None
    x = x.detach()
    if x.is_neg():
        x = x.resolve_neg()
    return x


@torch.library.custom_op("sdpa::attention_forward", mutates_args=(), device_types="cpu")
def attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                      causal: str, scale: Optional[float], dropout_p: float, seed: int, mask_name: str,
                      window_left: int = -1, window_right: int = -1, alignment: str = "none",
                      alibi_slopes: Optional[torch.Tensor] = None,
                      softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, lse) of one attention call; see sdpa.attention."""
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.forward(_readable(query), _readable(key), _readable(value), _readable(mask), out, None, lse, causal, scale,
                  dropout_p, _to_uint64(seed), 0, 0, "automatic", mask_name, window_left, window_right, alignment,
                  _readable(alibi_slopes), softcap)
    return out, lse


@attention_forward.register_fake
def _(query, key, value, mask, causal, scale, dropout_p, seed, mask_name, window_left=-1, window_right=-1,
      alignment="none", alibi_slopes=None, softcap=0.0):
    rows = tuple(query.shape[:-1])
    return (query.new_empty(rows + tuple(value.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query)))


@torch.library.custom_op("sdpa::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward(grad_output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: Optional[torch.Tensor], output: torch.Tensor, lse: torch.Tensor, causal: str,
                       scale: Optional[float], dropout_p: float, seed: int, mask_gradient: bool, mask_name: str,
                       window_left: int = -1, window_right: int = -1, alignment: str = "none",
                       alibi_slopes: Optional[torch.Tensor] = None, softcap: float = 0.0,
                       grad_lse: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                         torch.Tensor]:
    """(dq, dk, dv, dmask) of one attention call; dmask is empty unless `mask_gradient`.
    `grad_lse`, when the loss used the returned lse too, is its gradient."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    dmask = torch.empty(mask.shape, dtype=mask.dtype) if mask_gradient else torch.empty(0, dtype=query.dtype)
    # autograd hands over dO in whatever dtype the output had; the library wants the query's.
    grad_output = _readable(grad_output).to(query.dtype)
    _core.backward(_readable(query), _readable(key), _readable(value), _readable(mask), _readable(output),
                   _readable(lse), grad_output, dq, dk, dv, dmask if mask_gradient else None, causal, scale,
                   dropout_p, _to_uint64(seed), 0, 0, "automatic", mask_name, window_left, window_right, alignment,
                   _readable(alibi_slopes), softcap, _lse_gradient(grad_lse, lse))
    return dq, dk, dv, dmask


@attention_backward.register_fake
def _(grad_output, query, key, value, mask, output, lse, causal, scale, dropout_p, seed, mask_gradient, mask_name,
      window_left=-1, window_right=-1, alignment="none", alibi_slopes=None, softcap=0.0, grad_lse=None):
    dmask = mask.new_empty(mask.shape) if mask_gradient else query.new_empty(0)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dmask


def _setup_context(ctx, inputs, output):
    (query, key, value, mask, causal, scale, dropout_p, seed, mask_name, window_left, window_right, alignment,
     alibi_slopes, softcap) = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, out, lse, alibi_slopes)
    ctx.options = (causal, scale, dropout_p, seed)
    ctx.extras = (window_left, window_right, alignment, softcap)
    ctx.mask_name = mask_name
    # Unused outputs' gradients arrive as None (not zeros): no lse gradient costs nothing.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_output, grad_lse):
    query, key, value, mask, out, lse, alibi_slopes = ctx.saved_tensors
    causal, scale, dropout_p, seed = ctx.options
    window_left, window_right, alignment, softcap = ctx.extras
    mask_gradient = mask is not None and mask.dtype != torch.bool and ctx.needs_input_grad[3]
    if grad_output is None:  # the loss used only the lse
        grad_output = torch.zeros_like(out)
    dq, dk, dv, dmask = attention_backward(grad_output, query, key, value, mask, out, lse, causal, scale, dropout_p,
                                           seed, mask_gradient, ctx.mask_name, window_left, window_right, alignment,
                                           alibi_slopes, softcap, grad_lse)
    # The options, alibi_slopes included, get no gradient.
    return (dq, dk, dv, (dmask if mask_gradient else None)) + (None,) * 10


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def wanted(*tensors) -> bool:
    """Whether a call on these torch tensors must go through the custom ops: a gradient is
    wanted, or torch.compile is tracing (it sees custom ops, not the library's calls)."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def attention(query, key, value, mask, *, causal: str, scale, dropout_p: float, seed: int, mask_name: str,
              extras=(-1, -1, "none", None, 0.0)):
    """(output, lse) through the custom op; `extras` is (window_left, window_right,
    alignment, alibi_slopes, softcap)."""
    return attention_forward(query, key, value, mask, causal, scale, dropout_p, _to_int64(seed), mask_name, *extras)


# --- packed variable-length batches ------------------------------------------------------
#
# The tensors are in FlashAttention's (total, H, E) layout here; the library's (H, total, E)
# views are made at the call (transpose: strides only). Gradients come out in the layout of
# a fresh (total, H, E) tensor, as the fake implementations say.

@torch.library.custom_op("sdpa::varlen_forward", mutates_args=(), device_types="cpu")
def varlen_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, causal: str, scale: Optional[float], dropout_p: float, seed: int,
                   window_left: int, window_right: int, alignment: str, alibi_slopes: Optional[torch.Tensor],
                   softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (total_q, Hq, Ev), lse (Hq, total_q)); see sdpa.varlen_attention."""
    total_q, heads = query.shape[0], query.shape[1]
    out = torch.empty((total_q, heads, value.shape[-1]), dtype=query.dtype)
    lse = torch.empty((heads, total_q), dtype=_lse_dtype(query))
    _core.forward_varlen(_readable(query).transpose(0, 1), _readable(key).transpose(0, 1),
                         _readable(value).transpose(0, 1), _readable(cu_seqlens_q), _readable(cu_seqlens_k),
                         out.transpose(0, 1), lse, causal, scale, dropout_p, _to_uint64(seed), 0, 0, "automatic",
                         window_left, window_right, alignment, _readable(alibi_slopes), softcap)
    return out, lse


@varlen_forward.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, causal, scale, dropout_p, seed, window_left, window_right,
      alignment, alibi_slopes, softcap):
    total_q, heads = query.shape[0], query.shape[1]
    return (query.new_empty((total_q, heads, value.shape[-1])),
            query.new_empty((heads, total_q), dtype=_lse_dtype(query)))


@torch.library.custom_op("sdpa::varlen_backward", mutates_args=(), device_types="cpu")
def varlen_backward(grad_output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
                    causal: str, scale: Optional[float], dropout_p: float, seed: int, window_left: int,
                    window_right: int, alignment: str, alibi_slopes: Optional[torch.Tensor], softcap: float,
                    grad_lse: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one varlen call, each the shape of what it is the gradient of; `grad_lse`
    as in attention_backward."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    grad_output = _readable(grad_output).to(query.dtype)
    _core.backward_varlen(_readable(query).transpose(0, 1), _readable(key).transpose(0, 1),
                          _readable(value).transpose(0, 1), _readable(cu_seqlens_q), _readable(cu_seqlens_k),
                          _readable(output).transpose(0, 1), _readable(lse), grad_output.transpose(0, 1),
                          dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1), causal, scale, dropout_p,
                          _to_uint64(seed), 0, 0, "automatic", window_left, window_right, alignment,
                          _readable(alibi_slopes), softcap, _lse_gradient(grad_lse, lse))
    return dq, dk, dv


@varlen_backward.register_fake
def _(grad_output, query, key, value, cu_seqlens_q, cu_seqlens_k, output, lse, causal, scale, dropout_p, seed,
      window_left, window_right, alignment, alibi_slopes, softcap, grad_lse=None):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _varlen_setup_context(ctx, inputs, output):
    (query, key, value, cu_seqlens_q, cu_seqlens_k, causal, scale, dropout_p, seed, window_left, window_right,
     alignment, alibi_slopes, softcap) = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse, alibi_slopes)
    ctx.options = (causal, scale, dropout_p, seed, window_left, window_right, alignment)
    ctx.softcap = softcap
    ctx.set_materialize_grads(False)  # as attention_forward's


def _varlen_backward(ctx, grad_output, grad_lse):
    query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse, alibi_slopes = ctx.saved_tensors
    if grad_output is None:  # the loss used only the lse
        grad_output = torch.zeros_like(out)
    dq, dk, dv = varlen_backward(grad_output, query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse, *ctx.options,
                                 alibi_slopes, ctx.softcap, grad_lse)
    return (dq, dk, dv) + (None,) * 11


varlen_forward.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, *, causal: str, scale, dropout_p: float, seed: int,
           extras):
    """(output, lse) through the varlen custom op; `extras` as attention's."""
    return varlen_forward(query, key, value, cu_seqlens_q, cu_seqlens_k, causal, scale, dropout_p, _to_int64(seed),
                          *extras)


# --- paged KV cache (forward only) -----------------------------------------------------------

@torch.library.custom_op("sdpa::paged_forward", mutates_args=(), device_types="cpu")
def paged_forward(query: torch.Tensor, key_pages: torch.Tensor, value_pages: torch.Tensor,
                  block_table: torch.Tensor, seq_lens: torch.Tensor, nhd: bool, causal: str, scale: Optional[float],
                  window_left: int, window_right: int, alignment: str, alibi_slopes: Optional[torch.Tensor],
                  softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (batch, Hq, L, Ev), lse (batch, Hq, L)); see sdpa.paged_attention. `nhd`: the
    pages are (pages, page_size, Hkv, E)."""
    key_pages, value_pages = _readable(key_pages), _readable(value_pages)
    if nhd:
        key_pages, value_pages = key_pages.transpose(1, 2), value_pages.transpose(1, 2)
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value_pages.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.forward_paged(_readable(query), key_pages, value_pages, _readable(block_table), _readable(seq_lens), out,
                        lse, causal, scale, 0, "automatic", window_left, window_right, alignment,
                        _readable(alibi_slopes), softcap)
    return out, lse


@paged_forward.register_fake
def _(query, key_pages, value_pages, block_table, seq_lens, nhd, causal, scale, window_left, window_right,
      alignment, alibi_slopes, softcap):
    rows = tuple(query.shape[:-1])
    return query.new_empty(rows + tuple(value_pages.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query))


def paged(query, key_pages, value_pages, block_table, seq_lens, *, nhd: bool, causal: str, scale, extras):
    """(output, lse) through the paged custom op (torch.compile)."""
    return paged_forward(query, key_pages, value_pages, block_table, seq_lens, nhd, causal, scale, *extras)
