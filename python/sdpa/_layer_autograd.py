"""Autograd for sdpa.MultiheadAttention on torch tensors.

The forward is the C++ layer's (sdpa::nn::MultiHeadAttention, which checks every argument
before any work), so a call gives the same numbers with and without a gradient. The
backward recomputes the same layer in torch, the formula of include/sdpa/nn.h:

    Q = x_q W_qᵀ + b_q,  K = x_k W_kᵀ + b_k,  V = x_v W_vᵀ + b_v        (split into heads)
    Q, K ← RoPE(Q), RoPE(K)                                              (if configured)
    y = attention(Q, K, V, merged masks) W_oᵀ + b_o

with torch's linear algebra around sdpa's attention op (sdpa/_autograd.py, whose backward
is the C++ library's, dropout replayed from the call's seed), and differentiates that. It
is activation checkpointing: a call keeps only its inputs, at the price of a second
forward in the backward. Gradients reach query, key, value and a float attn_mask or
key_padding_mask; the layer's weights are constants (torch tensors copied from the layer,
which require no grad).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _autograd
from ._options import make_options


def parameters(core) -> dict:
    """The layer's weights under sdpa's names, as torch tensors (copies)."""
    return {name: torch.from_numpy(core.parameter(name)) for name in core.parameter_names()}


def _keep_as_additive(keep: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = attend) as the float mask that adds 0 or -inf."""
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -math.inf)


def _merged_mask(mask, key_padding_mask):
    """src/nn/masks.cpp's merge: `mask` in sdpa's polarity (bool True = attend; float added),
    key_padding_mask (B, S) in torch's (bool True = padding; float added). Two bool masks
    give their AND, anything else the sum of the masks as floats (bool as 0 / -inf)."""
    if key_padding_mask is None:
        return mask
    padding = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    if padding.dtype == torch.bool:
        keep = ~padding
        if mask is None or mask.dtype == torch.bool:
            return keep if mask is None else mask & keep
        padding = _keep_as_additive(keep)
    if mask is None:
        return padding
    return (_keep_as_additive(mask) if mask.dtype == torch.bool else mask) + padding


def _rope(x: torch.Tensor, position_offset: int, base: float, layout: str, rotary_dim: int) -> torch.Tensor:
    """src/nn/rope.cpp's rotation of x (B, H, T, D), angles and products in float64 as there:
    pair i = (x[i], x[i + d/2]) ("half_split") or (x[2i], x[2i + 1]) ("interleaved") of the
    first d = rotary_dim channels turns by (position_offset + t) · base^(-2i/d)."""
    d = rotary_dim or x.shape[-1]
    pairs = d // 2
    theta = base ** (-2.0 * torch.arange(pairs, dtype=torch.float64) / d)
    angle = (position_offset + torch.arange(x.shape[-2], dtype=torch.float64))[:, None] * theta
    cos, sin = angle.cos(), angle.sin()
    interleaved = layout == "interleaved"
    a, b = (x[..., 0:d:2], x[..., 1:d:2]) if interleaved else (x[..., :pairs], x[..., pairs:d])
    a, b = a.double(), b.double()
    a, b = (a * cos - b * sin).to(x.dtype), (a * sin + b * cos).to(x.dtype)
    rotated = torch.stack((a, b), dim=-1).flatten(-2) if interleaved else torch.cat((a, b), dim=-1)
    return torch.cat((rotated, x[..., d:]), dim=-1)


def layer_formula(params: dict, config: dict, rope, *, causal: str, dropout_p: float, seed: int,
                  position_offset: int):
    """The layer's forward in torch, a function of (query, key, value, mask, key_padding_mask)
    in the C++ layer's terms (batch first, mask in sdpa's polarity); `rope` is (base, layout,
    rotary_dim) or None. No KV cache: the caller refuses one."""
    heads_q, heads_kv, head_dim = config["num_heads"], config["num_kv_heads"], config["head_dim"]
    slopes = torch.tensor(config["alibi_slopes"], dtype=torch.float64) if config["alibi_slopes"] else None
    sinks = torch.tensor(config["sinks"], dtype=torch.float64) if config["sinks"] else None  # constants, as the weights
    # The options the C++ layer passes to sdpa::forward (no alignment: the library's default,
    # as the C++ layer leaves it).
    options = make_options(None, causal=None if causal == "none" else causal, dropout_p=dropout_p, seed=seed,
                           window_size=config["window_size"], softcap=config["softcap"])

    def heads(x, projection, count):  # (B, T, width) -> (B, count, T, D)
        y = F.linear(x, params[projection + ".weight"], params.get(projection + ".bias"))
        return y.unflatten(-1, (count, head_dim)).transpose(1, 2)

    def layer(query, key, value, mask, key_padding_mask):
        batched = query.ndim == 3
        if not batched:  # one sequence: batch 1 (a mask of rank <= 3 broadcasts over it)
            query, key, value = query[None], key[None], value[None]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        q, k, v = heads(query, "q_proj", heads_q), heads(key, "k_proj", heads_kv), heads(value, "v_proj", heads_kv)
        if rope is not None:
            q, k = _rope(q, position_offset, *rope), _rope(k, position_offset, *rope)
        attended, _ = _autograd.attention(q, k, v, _merged_mask(mask, key_padding_mask), slopes, sinks, options,
                                          mask_name="attn_mask")
        y = F.linear(attended.transpose(1, 2).flatten(2), params["out_proj.weight"], params.get("out_proj.bias"))
        return y if batched else y[0]

    return layer


class _Layer(torch.autograd.Function):
    """Forward: `run`, the C++ layer. Backward: the gradient of `formula` at the same inputs."""

    @staticmethod
    def forward(ctx, run, formula, *inputs):
        ctx.formula = formula
        ctx.save_for_backward(*inputs)
        output, _ = run(*(None if t is None else t.detach() for t in inputs))
        return torch.from_numpy(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        needs = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            inputs = [None if t is None else t.detach().requires_grad_(need)
                      for t, need in zip(ctx.saved_tensors, needs)]
            output = ctx.formula(*inputs)
            wanted = [t for t, need in zip(inputs, needs) if need]
            # allow_unused: a float mask the output does not depend on (all -inf) gets None,
            # which autograd reads as zeros.
            grads = iter(torch.autograd.grad(output, wanted, grad_output, allow_unused=True))
        return (None, None) + tuple(next(grads) if need else None for need in needs)


def apply(run, formula, query, key, value, mask, key_padding_mask):
    """The C++ layer's output (run(...)[0]) as a torch tensor that autograd differentiates
    through `formula`."""
    return _Layer.apply(run, formula, query, key, value, mask, key_padding_mask)
