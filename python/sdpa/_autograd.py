"""Autograd for torch tensors: sdpa's forward and backward as torch.library custom ops.

    sdpa::attention_forward(q, k, v, mask, alibi_slopes, sinks, mask_name, *options) -> (out, lse)
    sdpa::attention_backward(dout, q, k, v, mask, alibi_slopes, sinks, out, lse, dlse, mask_gradient,
                             mask_name, *options) -> (dq, dk, dv, dmask, dsinks)
    sdpa::varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *options) -> (out, lse)
    sdpa::varlen_backward(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, out, lse,
                          dlse, *options) -> (dq, dk, dv, dsinks)
    sdpa::paged_forward(q, key_pages, value_pages, block_table, seq_lens, alibi_slopes, sinks, nhd,
                        *options) -> (out, lse)

A custom op's schema holds tensors and scalars only, so every op ends with the call's
options flattened (sdpa/_options.py: `flatten`, `unflatten` and the schema's part, SCHEMA,
all derived from the binding's list of fields). A new option bound in
python/src/options.cpp reaches every op with nothing to change here. alibi_slopes is a
tensor beside the others, never differentiated; the attention sinks (one logit per query
head) are differentiated, their gradient (dsinks, empty without sinks) summed over rows by
the library.

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
(forward only) comes here only under torch.compile. In eager mode (plain tensors, not
traced) attention and varlen calls take each op pair's torch.autograd.Function twin
(`_differentiable`): the same bodies, without torch.library's per-call dispatch cost.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _core, _options
from ._frameworks import _Torch, output_like

def _op(name: str, arguments: str, returns: str):
    """torch.library.custom_op over CPU tensors, its schema `arguments` then the options'."""
    schema = f"({arguments}, {_options.SCHEMA}) -> {returns}"
    return torch.library.custom_op(f"sdpa::{name}", mutates_args=(), device_types="cpu", schema=schema)


def _core_options(flat) -> _core.Options:
    return _options.to_core(_options.unflatten(flat))


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


# A tensor (or None) as the binding takes it: the tensor itself, read through torch's
# DLPack C exchange API, or a DLPack capsule from torch's C exporter — never
# Tensor.__dlpack__ (~4 µs a tensor in Python, docs/performance.md "Small problems").
_view = _Torch().export


def _input(x: Optional[torch.Tensor]):
    """An input as the binding takes it: _readable, then _view."""
    return _view(_readable(x))


def _heads_first(x: torch.Tensor):
    """A (total, H, E) varlen input as the binding takes it: the library's (H, total, E)
    view of it (transpose: strides only), _readable."""
    return _view(_readable(x).transpose(0, 1))


def _attention_forward_body(query, key, value, mask, alibi_slopes, sinks, mask_name, *options):
    """(output, lse) of one attention call; see sdpa.attention."""
    rows = tuple(query.shape[:-1])
    unflat = _options.unflatten(options)
    out = output_like(torch, query, value, unflat.dropout_p)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.forward(_input(query), _input(key), _input(value), _input(mask), _input(alibi_slopes), _input(sinks),
                  _view(out), None, _view(lse), _options.to_core(unflat), mask_name)
    return out, lse


attention_forward = _op("attention_forward", "Tensor query, Tensor key, Tensor value, Tensor? mask, "
                        "Tensor? alibi_slopes, Tensor? sinks, str mask_name",
                        "(Tensor, Tensor)")(_attention_forward_body)


@attention_forward.register_fake
def _(query, key, value, mask, alibi_slopes, sinks, mask_name, *options):
    rows = tuple(query.shape[:-1])
    return (output_like(torch, query, value, _options.unflatten(options).dropout_p),
            query.new_empty(rows, dtype=_lse_dtype(query)))


def _attention_backward_body(grad_output, query, key, value, mask, alibi_slopes, sinks, output, lse, grad_lse,
                             mask_gradient, mask_name, *options):
    """(dq, dk, dv, dmask, dsinks) of one attention call; dmask is empty unless
    `mask_gradient`, dsinks without sinks. `grad_lse`, when the loss used the returned lse
    too, is its gradient."""
    # Each gradient in its input's memory order: the gradient of a (B, L, H, E)
    # projection's (B, H, L, E) view then flows back through the view without a copy, as
    # torch's does (torch's own are always in (B, L, H, E) order, the same there; for a
    # packed input sdpa's stays packed, where torch's would need a copy on the way back).
    dq, dk, dv = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
    dmask = torch.empty(mask.shape, dtype=mask.dtype) if mask_gradient else torch.empty(0, dtype=query.dtype)
    dsinks = _sink_gradient_buffer(sinks, query)
    # autograd hands over dO in whatever dtype the output had; the library wants the query's.
    grad_output = _readable(grad_output).to(query.dtype)
    _core.backward(_input(query), _input(key), _input(value), _input(mask), _input(alibi_slopes), _input(sinks),
                   _input(output), _input(lse), _view(grad_output), _view(_lse_gradient(grad_lse, lse)), _view(dq),
                   _view(dk), _view(dv), _view(dmask) if mask_gradient else None,
                   None if sinks is None else _view(dsinks), _core_options(options), mask_name)
    return dq, dk, dv, dmask, dsinks


attention_backward = _op("attention_backward", "Tensor grad_output, Tensor query, Tensor key, Tensor value, "
                         "Tensor? mask, Tensor? alibi_slopes, Tensor? sinks, Tensor output, Tensor lse, "
                         "Tensor? grad_lse, bool mask_gradient, str mask_name",
                         "(Tensor, Tensor, Tensor, Tensor, Tensor)")(_attention_backward_body)


@attention_backward.register_fake
def _(grad_output, query, key, value, mask, alibi_slopes, sinks, output, lse, grad_lse, mask_gradient, mask_name,
      *options):
    dmask = mask.new_empty(mask.shape) if mask_gradient else query.new_empty(0)
    dsinks = query.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dmask, dsinks


def _sink_gradient_buffer(sinks, query):
    """The sinks' gradient buffer: their shape and dtype; empty without sinks."""
    return torch.empty(0, dtype=query.dtype) if sinks is None else torch.empty(sinks.shape, dtype=sinks.dtype)


def _setup_context(ctx, inputs, output):
    query, key, value, mask, alibi_slopes, sinks, mask_name, *options = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, alibi_slopes, sinks, out, lse)
    ctx.mask_name = mask_name
    ctx.options = options
    # Unused outputs' gradients arrive as None (not zeros): no lse gradient costs nothing.
    ctx.set_materialize_grads(False)


def _gradients(backward, ctx, grad_output, grad_lse):
    """The inputs' gradients, the library's backward called as `backward` (the custom op, or
    its body in eager mode)."""
    query, key, value, mask, alibi_slopes, sinks, out, lse = ctx.saved_tensors
    mask_gradient = mask is not None and mask.dtype != torch.bool and ctx.needs_input_grad[3]
    if grad_output is None:  # the loss used only the lse
        grad_output = torch.zeros_like(out)
    dq, dk, dv, dmask, dsinks = backward(grad_output, query, key, value, mask, alibi_slopes, sinks, out, lse,
                                         grad_lse, mask_gradient, ctx.mask_name, *ctx.options)
    # alibi_slopes, the mask's name and the options get no gradient.
    return ((dq, dk, dv, (dmask if mask_gradient else None), None, (dsinks if ctx.needs_input_grad[5] else None), None)
            + (None,) * len(ctx.options))


def _differentiable(name, forward_op, forward_body, setup_context, gradients, backward_op, backward_body):
    """Registers `forward_op`'s autograd formula — `gradients(backward_op, ctx, *grads)` —
    and returns its eager twin, for calls outside torch.compile: a torch.autograd.Function
    (its `apply`) named `name`, with the same forward body, context and gradients, without
    torch.library's dispatch, whose autograd wrapper rebuilds the op's schema (some twenty
    arguments) each time it reads one while filling in defaults for setup_context
    (torch/_library/utils.py, fill_defaults): ~160 µs a call on the Cascade Lake Xeon of
    bench/RESULTS.md, ten times a small head's forward (docs/performance.md, "Small
    problems"). Its outputs' grad_fn is f"{name}Backward", the name autograd's errors and
    graph printers show.

    `gradients(backward, ctx, *grads)` calls the library's backward as `backward`: its body,
    or, when the backward pass builds a graph (create_graph=True runs it in grad mode), the
    backward op, whose outputs then refuse a second derivative (it has no formula) instead of
    entering the graph as constants that would drop their terms from a loss."""

    def forward(ctx, *inputs):
        output = forward_body(*inputs)
        setup_context(ctx, inputs, output)
        return output

    def backward(ctx, *grads):
        # Batched gradients (jacobian(vectorize=True), gradcheck's batched check) are
        # vmap-wrapped: the op has the batching rule the body's detach lacks.
        wrapped = any(g is not None and torch._C._dispatch_isTensorSubclassLike(g) for g in grads)
        return gradients(backward_op if torch.is_grad_enabled() or wrapped else backward_body, ctx, *grads)

    def formula(ctx, *grads):
        return gradients(backward_op, ctx, *grads)

    forward_op.register_autograd(formula, setup_context=setup_context)
    # type(), not a class statement: autograd names the grad_fn class when the Function
    # class is made. Its module is the op's (sdpa.distributed for the ring's).
    twin = type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward),
                                                   "__module__": forward_body.__module__})
    return twin.apply


_eager_attention = _differentiable("SdpaAttention", attention_forward, _attention_forward_body, _setup_context,
                                   _gradients, attention_backward, _attention_backward_body)


def wanted(*tensors, compiling=None) -> bool:
    """Whether a call on these torch tensors must go through the custom ops: a gradient is
    wanted, or torch.compile is tracing (it sees custom ops, not the library's calls;
    `compiling`: torch.compiler.is_compiling(), when the caller has asked it already)."""
    if torch.compiler.is_compiling() if compiling is None else compiling:
        return True
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # (a loop: a generator under any() costs a few tenths of a µs more)
        if t is not None and t.requires_grad:
            return True
    return False


def _traced(*tensors) -> bool:
    """Whether the custom op must carry the call: torch.compile is tracing, a tensor is a
    subclass (a fake tensor dispatches through the op's registrations), a functorch
    transform is active (vmap's and grad's wrapped tensors have torch.Tensor's type) or a
    dispatch mode is (make_fx, FlopCounterMode: they must see the op)."""
    return (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or _dispatch_mode() is not None or not all(t is None or type(t) in _PLAIN for t in tensors))


_dispatch_mode = torch.utils._python_dispatch._get_current_dispatch_mode


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def attention(query, key, value, mask, alibi_slopes, sinks, options, *, mask_name: str):
    """(output, lse) through the custom op (traced) or its eager twin; `options` an
    sdpa._options.Options."""
    op = attention_forward if _traced(query, key, value, mask, alibi_slopes, sinks) else _eager_attention
    return op(query, key, value, mask, alibi_slopes, sinks, mask_name, *_options.flatten(options))


# --- packed variable-length batches ------------------------------------------------------
#
# The tensors are in FlashAttention's (total, H, E) layout here; the library's (H, total, E)
# views are made at the call (transpose: strides only). Gradients come out in the layout of
# a fresh (total, H, E) tensor, as the fake implementations say.

def _varlen_forward_body(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *options):
    """(output (total_q, Hq, Ev), lse (Hq, total_q)); see sdpa.varlen_attention."""
    total_q, heads = query.shape[0], query.shape[1]
    out = torch.empty((total_q, heads, value.shape[-1]), dtype=query.dtype)
    lse = torch.empty((heads, total_q), dtype=_lse_dtype(query))
    _core.forward_varlen(_heads_first(query), _heads_first(key), _heads_first(value), _input(cu_seqlens_q),
                         _input(cu_seqlens_k), _input(alibi_slopes), _input(sinks), _view(out.transpose(0, 1)),
                         _view(lse), _core_options(options))
    return out, lse


varlen_forward = _op("varlen_forward", "Tensor query, Tensor key, Tensor value, Tensor cu_seqlens_q, "
                     "Tensor cu_seqlens_k, Tensor? alibi_slopes, Tensor? sinks",
                     "(Tensor, Tensor)")(_varlen_forward_body)


@varlen_forward.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *options):
    total_q, heads = query.shape[0], query.shape[1]
    return (query.new_empty((total_q, heads, value.shape[-1])),
            query.new_empty((heads, total_q), dtype=_lse_dtype(query)))


def _varlen_backward_body(grad_output, query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, output,
                          lse, grad_lse, *options):
    """(dq, dk, dv, dsinks) of one varlen call, each the shape of what it is the gradient of
    (dsinks empty without sinks); `grad_lse` as in attention_backward."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    dsinks = _sink_gradient_buffer(sinks, query)
    grad_output = _readable(grad_output).to(query.dtype)
    _core.backward_varlen(_heads_first(query), _heads_first(key), _heads_first(value), _input(cu_seqlens_q),
                          _input(cu_seqlens_k), _input(alibi_slopes), _input(sinks), _heads_first(output),
                          _input(lse), _view(grad_output.transpose(0, 1)), _view(_lse_gradient(grad_lse, lse)),
                          _view(dq.transpose(0, 1)), _view(dk.transpose(0, 1)), _view(dv.transpose(0, 1)),
                          None if sinks is None else _view(dsinks), _core_options(options))
    return dq, dk, dv, dsinks


varlen_backward = _op("varlen_backward", "Tensor grad_output, Tensor query, Tensor key, Tensor value, "
                      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? alibi_slopes, Tensor? sinks, Tensor output, "
                      "Tensor lse, Tensor? grad_lse", "(Tensor, Tensor, Tensor, Tensor)")(_varlen_backward_body)


@varlen_backward.register_fake
def _(grad_output, query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, output, lse, grad_lse,
      *options):
    dsinks = query.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dsinks


def _varlen_setup_context(ctx, inputs, output):
    query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *options = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, out, lse)
    ctx.options = options
    ctx.set_materialize_grads(False)  # as attention_forward's


def _varlen_gradients(backward, ctx, grad_output, grad_lse):
    """The inputs' gradients, as _gradients (the custom op or its body as `backward`)."""
    query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, out, lse = ctx.saved_tensors
    if grad_output is None:  # the loss used only the lse
        grad_output = torch.zeros_like(out)
    dq, dk, dv, dsinks = backward(grad_output, query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks,
                                  out, lse, grad_lse, *ctx.options)
    return ((dq, dk, dv, None, None, None, (dsinks if ctx.needs_input_grad[6] else None))
            + (None,) * len(ctx.options))


_eager_varlen = _differentiable("SdpaVarlen", varlen_forward, _varlen_forward_body, _varlen_setup_context,
                                _varlen_gradients, varlen_backward, _varlen_backward_body)


def varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, options):
    """(output, lse) through the varlen custom op (traced) or its eager twin; `options` an
    sdpa._options.Options."""
    traced = _traced(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
    op = varlen_forward if traced else _eager_varlen
    return op(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *_options.flatten(options))


# --- paged KV cache (forward only) -----------------------------------------------------------

@_op("paged_forward", "Tensor query, Tensor key_pages, Tensor value_pages, Tensor block_table, Tensor seq_lens, "
     "Tensor? alibi_slopes, Tensor? sinks, bool nhd", "(Tensor, Tensor)")
def paged_forward(query, key_pages, value_pages, block_table, seq_lens, alibi_slopes, sinks, nhd, *options):
    """(output (batch, Hq, L, Ev), lse (batch, Hq, L)); see sdpa.paged_attention. `nhd`: the
    pages are (pages, page_size, Hkv, E)."""
    key_pages, value_pages = _readable(key_pages), _readable(value_pages)
    if nhd:
        key_pages, value_pages = key_pages.transpose(1, 2), value_pages.transpose(1, 2)
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value_pages.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.forward_paged(_input(query), _view(key_pages), _view(value_pages), _input(block_table), _input(seq_lens),
                        _input(alibi_slopes), _input(sinks), _view(out), _view(lse), _core_options(options))
    return out, lse


@paged_forward.register_fake
def _(query, key_pages, value_pages, block_table, seq_lens, alibi_slopes, sinks, nhd, *options):
    rows = tuple(query.shape[:-1])
    return query.new_empty(rows + tuple(value_pages.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query))


def paged(query, key_pages, value_pages, block_table, seq_lens, alibi_slopes, sinks, options, *, nhd: bool):
    """(output, lse) through the paged custom op (torch.compile); `options` an sdpa._options.Options."""
    return paged_forward(query, key_pages, value_pages, block_table, seq_lens, alibi_slopes, sinks, nhd,
                         *_options.flatten(options))
