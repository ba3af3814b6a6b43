"""sdpa.varlen_attention (sequences packed without padding, FlashAttention's varlen
layout) and sdpa.paged_attention (a paged KV cache, vLLM's and FlashInfer's). As the dense
calls (sdpa/_attention.py): the arguments checked in the caller's layout, the outputs
allocated in its framework, and one call of the C++ library on views of the caller's
memory."""

from __future__ import annotations

from . import _core
from ._arguments import (_NO_WINDOW, _autograd_module, _inference_only, _integers, _like, _no_extras,
                         _prepare_qkv, _rank, _scales, _scales_like, _sinks, _slopes)
from ._frameworks import _Torch, _framework, torch_in_place
from ._options import causal_and_scale, make_options, to_core

_LAYOUTS = ("HND", "NHD")


def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, *, causal=None, scale=None, dropout_p=0.0,
                     seed=None, window_size=(-1, -1), alignment=None, alibi_slopes=None, softcap=0.0,
                     sinks=None, return_lse=False, key_scale=None, value_scale=None):
    """Attention over a batch of sequences of different lengths packed without padding
    (FlashAttention's ``flash_attn_varlen_func`` layout).

    Sequence b is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` against key / value rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``, attended alone: the result equals
    sdpa.attention on that sequence by itself, causal alignment, window and ALiBi distances
    counted within the sequence. The buffers are read in place (handed to the library as
    (H, total, E) views by strides): no padding, no copy.

    Args:
        query: (total_q, Hq, E), torch tensor or NumPy array.
        key: (total_k, Hkv, E); Hq must be a multiple of Hkv (GQA).
        value: (total_k, Hkv, Ev).
        cu_seqlens_q, cu_seqlens_k: the cumulative sequence lengths, batch + 1 entries each,
            starting at 0, never decreasing, ending at total_q / total_k: int32 or int64
            tensors / arrays, or lists of ints.
        causal: None (the default), "top_left" (query i of a sequence sees its keys
            j <= i) or "bottom_right" (j <= i + S_b - L_b: the queries are the last L_b
            positions of the sequence, as in chunked prefill). Spelled as in
            sdpa.attention; a bool is refused, because torch's is_causal=True means
            "top_left" and FlashAttention's causal=True means "bottom_right".
        scale, dropout_p, seed, window_size, alignment, softcap: as in sdpa.attention.
            Dropout in sequence b draws as batch element b of a padded (batch, Hq, L, S)
            call would.
        alibi_slopes, sinks: (Hq,) or (batch, Hq), float32 or float64; sinks as in
            sdpa.attention (differentiable).
        return_lse: also return the log-sum-exp, (Hq, total_q) (FlashAttention's
            softmax_lse layout), float32 (float64 for float64 inputs).
        key_scale, value_scale: with an int8 key (value), its float32 scale per (token,
            KV head), (total_k, Hkv): sdpa.quantize_kv of the packed key gives both. As in
            sdpa.attention; inference only.

    Returns:
        output (total_q, Hq, Ev) in the query's dtype, or ``(output, lse)``.

    Autograd: torch inputs that require grad get gradients from the library's
    backward_varlen (dropout replayed, GQA summed), torch.compile included; not with
    int8 key / value.

    Raises:
        TypeError: a wrong dtype (of the tensors or of cu_seqlens), mixed frameworks.
        ValueError: ranks or shapes that do not fit, cu_seqlens that are not a valid
            partition of the packed rows, and the option errors of sdpa.attention.
        NotImplementedError: int8 key / value with inputs (scales included) that require grad.
    """
    fw = _framework(query)
    compiling = fw.compiling()
    q, k, v = _prepare_qkv(fw, query, key, value, compiling=compiling)
    _rank("query", q, 3, "(total_q, Hq, E)")
    _rank("key", k, 3, "(total_k, Hkv, E)")
    _rank("value", v, 3, "(total_k, Hkv, Ev)")
    _like("value", v, "the key", k)
    cu_q = _integers(fw, "cu_seqlens_q", cu_seqlens_q, compiling=compiling)
    cu_k = _integers(fw, "cu_seqlens_k", cu_seqlens_k, compiling=compiling)
    slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
    # After the tensors' checks: a rejected call draws no seed from the global generator.
    key_scale, value_scale = _scales(fw, key_scale, value_scale)
    _scales_like(key_scale, value_scale, k, v, "(total_k, Hkv)")
    quantized = key_scale is not None or value_scale is not None
    if quantized:
        _inference_only(fw, "key_scale / value_scale", q, k, v, sink_logits, key_scale, value_scale)
    options = make_options(fw, causal=causal, scale=scale, dropout_p=dropout_p, seed=seed,
                           window_size=window_size, alignment=alignment, softcap=softcap)
    if isinstance(fw, _Torch):
        _autograd = _autograd_module()
        if not quantized and _autograd.wanted(q, k, v, sink_logits, compiling=compiling):
            output, lse = _autograd.varlen(q, k, v, cu_q, cu_k, slopes, sink_logits, options)
            return (output, lse) if return_lse else output
    # No gradient is wanted past this point: the tensors go as DLPack views (fw.export).
    total_q, heads_q = q.shape[0], q.shape[1]
    # FlashAttention's layouts, written through (H, total, ·) views.
    output = fw.packed_like(q, v)
    lse = fw.empty((heads_q, total_q), fw.lse_dtype(q)) if return_lse else None
    key_scale, value_scale = (None if s is None else fw.swap(s, 0, 1) for s in (key_scale, value_scale))
    export, swap = fw.export, fw.swap
    _core.forward_varlen(export(swap(q, 0, 1)), export(swap(k, 0, 1)), export(swap(v, 0, 1)), export(cu_q),
                         export(cu_k), export(slopes), export(sink_logits), export(swap(output, 0, 1)), export(lse),
                         to_core(options), export(key_scale), export(value_scale))
    return (output, lse) if return_lse else output


def _common_paged(query, key_pages, value_pages, block_table, seq_lens, layout, causal, scale):
    """A decode step's paged call, with the fewest checks: as the dense calls' short path
    (_attention._common_call), torch.Tensor itself for every tensor and table, no gradient
    wanted, not traced, no keyword but layout, causal and scale. The general path's Python
    was ~7 of a tiny decode call's 11 µs (Zen 5, docs/performance.md). What it leaves out,
    the binding and the library check again (ranks, dtypes, device, page indices, lengths)
    or sends to the general path (gradients, lazily negated views: of a table too, whose
    memory holds the negatives). Returns the output, or None: the general path then runs
    from the start and raises its own error (the library writes nothing before its checks
    pass). The output is the general path's: packed (packed_like)."""
    fw = torch_in_place(query)
    if fw is None or layout not in _LAYOUTS:
        return None
    torch = fw.torch
    tensor = torch.Tensor
    if not (type(query) is tensor and type(key_pages) is tensor and type(value_pages) is tensor
            and type(block_table) is tensor and type(seq_lens) is tensor):
        return None
    try:  # (torch's errors too: IndexError for a dim a tensor lacks)
        if torch.is_grad_enabled() and (query.requires_grad or key_pages.requires_grad or value_pages.requires_grad):
            return None
        # (A negated table's memory holds negative indices and lengths, which the library
        # refuses anyway but where they are 0, their own negatives: asked all the same.)
        if (query.is_neg() or key_pages.is_neg() or value_pages.is_neg() or block_table.is_neg()
                or seq_lens.is_neg()):
            return None
        options = causal_and_scale(causal, scale)
        if layout == "NHD":  # (pages, page_size, Hkv, ·) read as (pages, Hkv, page_size, ·)
            key_pages, value_pages = fw.swap(key_pages, 1, 2), fw.swap(value_pages, 1, 2)
        out = fw.packed_like(query, value_pages)
        _core.forward_paged(query, key_pages, value_pages, block_table, seq_lens, None, None, out, None, options,
                            None, None)
    except (TypeError, ValueError, RuntimeError, IndexError):
        return None
    return out


def paged_attention(query, key_pages, value_pages, block_table, seq_lens, *, layout="HND", causal=None, scale=None,
                    window_size=_NO_WINDOW, alignment=None, alibi_slopes=None, softcap=0.0, sinks=None,
                    return_lse=False, key_scale=None, value_scale=None):
    """Attention of each sequence's queries against its keys and values in a paged KV cache
    (vLLM's PagedAttention, FlashInfer's page table). Forward only (inference).

    The cache is a pool of fixed-size pages shared by the batch. Sequence b has
    ``seq_lens[b]`` keys; key j lives in row ``j % page_size`` of page
    ``block_table[b, j // page_size]``. Entries of block_table past a sequence's last page
    are not read. The result equals sdpa.attention against the same keys held
    contiguously; the pages are read through the block table (the cache is never gathered:
    each K/V row passes through a per-thread tile).

    Args:
        query: (batch, Hq, L, E), torch tensor or NumPy array; L = 1 is decoding.
        key_pages: (pages, Hkv, page_size, E) with layout="HND" (the default), or
            (pages, page_size, Hkv, E) with layout="NHD" (FlashInfer's names).
        value_pages: (pages, Hkv, page_size, Ev), or (pages, page_size, Hkv, Ev) with "NHD".
        block_table: (batch, max_pages_per_sequence) page indices, int32 / int64 tensor or
            array, or a list of lists.
        seq_lens: (batch,) key counts, int32 / int64 tensor or array, or a list.
        layout: "HND" or "NHD": how the pages are laid out.
        causal: None (the default) or "bottom_right", which puts the L queries at the end of
            their sequence (query i sees keys j <= i + seq_lens[b] - L): chunked prefill and
            speculative decoding into the cache. "top_left" is accepted too.
        scale, window_size, alignment, softcap: as in sdpa.attention.
        alibi_slopes, sinks: (Hq,) or (batch, Hq), float32 or float64; sinks as in
            sdpa.attention.
        return_lse: also return the log-sum-exp (batch, Hq, L), float32 (float64 for float64
            inputs), for merging with attention over other keys.
        key_scale, value_scale: int8 pages' scales (sdpa.quantize_kv of the pages), float32,
            the pages' shape without the last dim: (pages, Hkv, page_size), or (pages,
            page_size, Hkv) with "NHD".

    Returns:
        output (batch, Hq, L, Ev) in the query's dtype, or ``(output, lse)``.

    Raises:
        TypeError: a wrong dtype (of the tensors or of the tables), mixed frameworks.
        ValueError: ranks or shapes that do not fit, page indices out of range, a sequence
            longer than its block table holds, a bad layout, and the option errors of
            sdpa.attention.
        NotImplementedError: inputs that require grad (paged attention has no backward;
            call it under torch.no_grad() or torch.inference_mode()).
    """
    if not return_lse and _no_extras(0.0, None, window_size, alignment, alibi_slopes, softcap, sinks, key_scale,
                                     value_scale):
        output = _common_paged(query, key_pages, value_pages, block_table, seq_lens, layout, causal, scale)
        if output is not None:
            return output
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
    fw = _framework(query)
    options = make_options(fw, causal=causal, scale=scale, window_size=window_size, alignment=alignment,
                           softcap=softcap)
    compiling = fw.compiling()
    q = fw.prepare("query", query, compiling=compiling)
    kp = fw.prepare("key_pages", key_pages, compiling=compiling)
    vp = fw.prepare("value_pages", value_pages, compiling=compiling)
    _rank("query", q, 4, "(batch, Hq, L, E)")
    pages_layout = "(pages, Hkv, page_size, {})" if layout == "HND" else "(pages, page_size, Hkv, {})"
    _rank("key_pages", kp, 4, pages_layout.format("E"))
    _rank("value_pages", vp, 4, pages_layout.format("Ev"))
    _like("value_pages", vp, "key_pages", kp)
    table = _integers(fw, "block_table", block_table, compiling=compiling)
    lengths = _integers(fw, "seq_lens", seq_lens, compiling=compiling)
    slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
    nhd = layout == "NHD"
    key_scale, value_scale = _scales(fw, key_scale, value_scale)
    if key_scale is not None or value_scale is not None:
        _inference_only(fw, "key_scale / value_scale", q, kp, vp, sink_logits, key_scale, value_scale)
        _scales_like(key_scale, value_scale, kp, vp, "(pages, Hkv, page_size)" if layout == "HND"
                     else "(pages, page_size, Hkv)")
        if nhd:  # (pages, page_size, Hkv) read as (pages, Hkv, page_size)
            key_scale, value_scale = (s if s is None else fw.swap(s, 1, 2) for s in (key_scale, value_scale))
    elif isinstance(fw, _Torch):
        torch = fw.torch
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, kp, vp, sink_logits)):
            raise NotImplementedError("paged_attention: forward only (no backward); call it under torch.no_grad() "
                                      "or torch.inference_mode(), or use sdpa.attention / sdpa.varlen_attention "
                                      "for training")
        if compiling:
            output, lse = _autograd_module().paged(q, kp, vp, table, lengths, slopes, sink_logits, options, nhd=nhd)
            return (output, lse) if return_lse else output
    # No gradient is wanted past the checks above: the tensors go as DLPack views (fw.export).
    if nhd:  # (pages, page_size, Hkv, E) read as (pages, Hkv, page_size, E)
        kp, vp = fw.swap(kp, 1, 2), fw.swap(vp, 1, 2)
    output = fw.packed_like(q, vp)
    lse = fw.empty(tuple(q.shape[:-1]), fw.lse_dtype(q)) if return_lse else None
    export = fw.export
    _core.forward_paged(export(q), export(kp), export(vp), export(table), export(lengths), export(slopes),
                        export(sink_logits), export(output), export(lse), to_core(options), export(key_scale),
                        export(value_scale))
    return (output, lse) if return_lse else output
