"""Autograd for torch tensors: sdpa's forward and backward as torch.library custom ops.

    sdpa::attention_forward(q, k, v, mask, ...)  -> (out, lse)
    sdpa::attention_backward(dout, q, k, v, mask, out, lse, ...) -> (dq, dk, dv, dmask)

The forward op has the backward op registered as its autograd formula
(torch.library.register_autograd), and both have fake (meta) implementations, so the
pair works under torch.autograd, torch.autograd.gradcheck and torch.compile alike. The
backward is the C++ library's (FlashAttention-2's recomputation from the log-sum-exp,
docs/semantics.md "Backward"): it regenerates the forward's dropout mask from the same
Philox seed, sums dK and dV over a GQA group, and gives a float mask its gradient (summed
over the dims it broadcasts along). The log-sum-exp output is not differentiable.

sdpa.attention and sdpa.scaled_dot_product_attention route torch tensors here when a
gradient is wanted (an input requires grad and grad mode is on) or when torch.compile is
tracing; otherwise they call the library directly.
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


def _readable(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # DLPack refuses tensors that require grad (detach: a view, no copy) and lazily negated
    # or conjugated views.
    if x is None:
        return None
    x = x.detach()
    if x.is_neg():
        x = x.resolve_neg()
    return x


@torch.library.custom_op("sdpa::attention_forward", mutates_args=(), device_types="cpu")
def attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                      causal: str, scale: Optional[float], dropout_p: float, seed: int,
                      mask_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, lse) of one attention call; see sdpa.attention."""
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.forward(_readable(query), _readable(key), _readable(value), _readable(mask), out, None, lse, causal, scale,
                  dropout_p, _to_uint64(seed), 0, 0, "automatic", mask_name)
    return out, lse


@attention_forward.register_fake
def _(query, key, value, mask, causal, scale, dropout_p, seed, mask_name):
    rows = tuple(query.shape[:-1])
    return (query.new_empty(rows + tuple(value.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query)))


@torch.library.custom_op("sdpa::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward(grad_output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: Optional[torch.Tensor], output: torch.Tensor, lse: torch.Tensor, causal: str,
                       scale: Optional[float], dropout_p: float, seed: int, mask_gradient: bool,
                       mask_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dmask) of one attention call; dmask is empty unless `mask_gradient`."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    dmask = torch.empty(mask.shape, dtype=mask.dtype) if mask_gradient else torch.empty(0, dtype=query.dtype)
    # autograd hands over dO in whatever dtype the output had; the library wants the query's.
    grad_output = _readable(grad_output).to(query.dtype)
    _core.backward(_readable(query), _readable(key), _readable(value), _readable(mask), _readable(output),
                   _readable(lse), grad_output, dq, dk, dv, dmask if mask_gradient else None, causal, scale,
                   dropout_p, _to_uint64(seed), 0, 0, "automatic", mask_name)
    return dq, dk, dv, dmask


@attention_backward.register_fake
def _(grad_output, query, key, value, mask, output, lse, causal, scale, dropout_p, seed, mask_gradient, mask_name):
    dmask = mask.new_empty(mask.shape) if mask_gradient else query.new_empty(0)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dmask


def _setup_context(ctx, inputs, output):
    query, key, value, mask, causal, scale, dropout_p, seed, mask_name = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, out, lse)
    ctx.options = (causal, scale, dropout_p, seed)
    ctx.mask_name = mask_name
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_output, grad_lse):
    query, key, value, mask, out, lse = ctx.saved_tensors
    causal, scale, dropout_p, seed = ctx.options
    mask_gradient = mask is not None and mask.dtype != torch.bool and ctx.needs_input_grad[3]
    dq, dk, dv, dmask = attention_backward(grad_output, query, key, value, mask, out, lse, causal, scale, dropout_p,
                                           seed, mask_gradient, ctx.mask_name)
    return dq, dk, dv, (dmask if mask_gradient else None), None, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def wanted(*tensors) -> bool:
    """Whether a call on these torch tensors must go through the custom ops: a gradient is
    wanted, or torch.compile is tracing (it sees custom ops, not the library's calls)."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def attention(query, key, value, mask, *, causal: str, scale, dropout_p: float, seed: int, mask_name: str):
    """(output, lse) through the custom op."""
    return attention_forward(query, key, value, mask, causal, scale, dropout_p, _to_int64(seed), mask_name)
