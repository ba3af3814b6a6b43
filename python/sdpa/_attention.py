"""sdpa.attention and sdpa.scaled_dot_product_attention, the dense calls. Everything
numerical happens in C++ (sdpa._core); this file maps Python arguments onto one call of it,
allocates the output in the caller's framework (torch.empty / np.empty) and hands the C++
library views of the caller's memory, so no tensor is copied on the way in or out."""

from __future__ import annotations

import numpy as np

from . import _core
from ._arguments import (_NO_WINDOW, _autograd_module, _inference_only, _no_extras, _prepare_qkv, _scales,
                         _sinks, _slopes)
from ._frameworks import _Torch, _framework, output_like, torch_in_place
from ._options import causal_and_scale, make_options, to_core


def _batch_dims(ndim: int) -> int:
    # Rank >= 4 is (batch..., heads, seq, dim); rank 3 is (batch, seq, dim).
    return ndim - 3 if ndim >= 4 else max(ndim - 2, 0)


def _batch_differs(q_shape, k_shape, v_shape, nb: int) -> bool:
    """Whether the first nb dims of the three shapes differ anywhere."""
    for d in range(nb):
        if not q_shape[d] == k_shape[d] == v_shape[d]:
            return True
    return False


def _common_call(query, key, value, mask, mask_name, causal, scale, out, *, drop_in_gqa=None):
    """The call a model makes thousands of times, with the fewest checks: torch.Tensor
    itself for every tensor (read through torch's DLPack C exchange API), no gradient
    wanted, not traced by torch.compile, no keyword but causal, scale and out. The general
    path's checks cost more than a small head's whole computation (docs/performance.md,
    "Small problems"); those left out here are the ones the binding and the library make
    again (dtype, device, layout, shapes: a refused tensor cannot be exchanged) or that
    send a call to the general path (the lazy bits, gradients). Returns the output, or
    None when the call is not such a call or the library refuses it: the general path then
    runs from the start and raises its own error (the library writes nothing before its
    checks pass, and nothing has drawn a seed). drop_in_gqa: the drop-in's enable_gqa; its
    call is taken here only at rank 4 with head counts that differ only with enable_gqa
    (torch's rule, which the library does not apply) and one batch (a batch to broadcast
    is the general path's: the library would refuse it). None for sdpa.attention, which
    applies GQA always and broadcasts nothing."""
    fw = torch_in_place(query)
    if fw is None:
        return None
    torch = fw.torch
    tensor = torch.Tensor
    if not (type(query) is tensor and type(key) is tensor and type(value) is tensor
            and (mask is None or type(mask) is tensor) and (out is None or type(out) is tensor)):
        return None
    # Torch's errors too (RuntimeError: a nested tensor has no shape, a sparse one no
    # strides), all of them the general path's to report.
    try:
        if drop_in_gqa is not None:
            q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
            if not (len(q_shape) == len(k_shape) == len(v_shape) == 4 and q_shape[0] == k_shape[0] == v_shape[0]
                    and (drop_in_gqa or q_shape[1] == k_shape[1] == v_shape[1])):
                return None
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad
                                        or (mask is not None and mask.requires_grad)):
            return None
        # A lazily negated view: the general path resolves an input and refuses an output.
        if (query.is_neg() or key.is_neg() or value.is_neg() or (mask is not None and mask.is_neg())
                or (out is not None and out.is_neg())):
            return None
        options = causal_and_scale(causal, scale)
        if out is None:
            out = output_like(torch, query, value, 0.0)
        _core.forward(query, key, value, mask, None, None, out, None, None, options, mask_name)
    except (TypeError, ValueError, RuntimeError):
        return None
    return out


def _run(fw, q, k, v, mask, slopes, sinks, options, *, weights, lse, out, mask_name, compiling, scales=(None, None)):
    if scales[0] is not None or scales[1] is not None:
        _inference_only(fw, "key_scale / value_scale", q, k, v, mask, sinks, *scales)
    elif isinstance(fw, _Torch):
        _autograd = _autograd_module()
        if _autograd.wanted(q, k, v, mask, sinks, compiling=compiling):
            # Training (or torch.compile): the custom op with its registered backward.
            if weights:
                raise NotImplementedError("return_weights: the weights are not differentiable; ask for them in a "
                                          "separate call under torch.no_grad()")
            if out is not None:
                raise NotImplementedError("out: an output buffer does not support automatic differentiation")
            output, lse_tensor = _autograd.attention(q, k, v, mask, slopes, sinks, options, mask_name=mask_name)
            return output, None, (lse_tensor if lse else None)
    if out is None:
        out = fw.output_like(q, v, options.dropout_p)
    else:
        out = fw.prepare("out", out, output=True, compiling=compiling)
    weights_buffer = lse_buffer = None
    if weights or lse:  # (a torch.Size slice costs a few tenths of a µs: not in a plain call)
        rows = tuple(q.shape[:-1])  # (..., Hq, L)
        weights_buffer = fw.empty(rows + tuple(k.shape[-2:-1]), q.dtype) if weights else None
        lse_buffer = fw.empty(rows, fw.lse_dtype(q)) if lse else None
    # The library validates everything (shapes, dtypes, mask broadcasting, overlap) before it
    # writes anything; its errors arrive as TypeError / ValueError. No gradient is wanted
    # here: the tensors go as DLPack views of the caller's memory (fw.export).
    export = fw.export
    _core.forward(export(q), export(k), export(v), export(mask), export(slopes), export(sinks), export(out),
                  export(weights_buffer), export(lse_buffer), to_core(options), mask_name,
                  export(scales[0]), export(scales[1]))
    return out, weights_buffer, lse_buffer


def attention(query, key, value, mask=None, *, causal=None, scale=None, dropout_p=0.0, seed=None,
              return_weights=False, return_lse=False, out=None, window_size=_NO_WINDOW, alignment=None,
              alibi_slopes=None, softcap=0.0, sinks=None, key_scale=None, value_scale=None):
    """Scaled dot-product attention, softmax(query @ keyᵀ · scale + mask) @ value.

    The library's own interface (docs/semantics.md): the seeds' ``(output, weights)`` form
    and the extras. Accepts torch tensors (returns torch tensors) or NumPy arrays (returns
    NumPy arrays), read in place whatever their strides.

    Args:
        query: (..., Hq, L, E); rank 3 is (batch, L, E) with one head, rank 2 one (L, E).
        key: (..., Hkv, S, E). Hq must be a multiple of Hkv: grouped-query attention, query
            head h reads key/value head h // (Hq // Hkv).
        value: (..., Hkv, S, Ev). The batch dims of query, key and value must be equal.
        mask: optional, broadcastable to (..., Hq, L, S). bool: True = the position takes
            part (PyTorch's polarity). Floating point (any float dtype): added to the scaled
            scores; -inf removes a position.
        causal: None, "top_left" (query i sees keys j <= i; torch's is_causal) or
            "bottom_right" (j <= i + S - L; KV-cache decoding). Combines with the mask.
        scale: multiplies query @ keyᵀ; default 1/sqrt(E). Any finite value, negative too.
        dropout_p: dropout on the weights after the softmax, 0 <= p < 1; kept weights are
            scaled by 1/(1 - p).
        seed: the dropout seed, an int in [0, 2**64). The keep/drop decision is
            Philox4x32-10 of (seed, batch, head, i, j). None draws one from torch's default
            generator for torch inputs, from NumPy's global generator (np.random) for
            NumPy inputs; nothing is drawn when dropout_p == 0.
        return_weights: also return the weights (..., Hq, L, S) in the query's dtype, as
            multiplied into value (after dropout).
        return_lse: also return the row log-sum-exp (..., Hq, L) of the scaled, masked
            scores: float32 (float64 for float64 inputs), -inf for fully masked rows.
        out: optional output buffer (..., Hq, L, Ev) of the query's dtype and framework, any
            strides (a (B, L, Hq, Ev) buffer's transposed view works); written in place and
            returned.
        window_size, alignment, alibi_slopes, softcap: FlashAttention's extensions, below.
        sinks: attention sinks (gpt-oss), below.
        key_scale, value_scale: quantized K/V (sdpa.quantize_kv): with an int8 key
            (value), its float32 scale per (token, KV head), the key's shape without its
            last dim; key[..., j, e] = key_scale[..., j] · q[..., j, e], read as given. The
            float32 kernels read the int8 rows in place when decoding and widen them tile
            by tile otherwise (the scale multiplies the score and the weight), never a
            dequantized copy of K/V; float64 queries dequantize one tile at a time, exactly.
            Inference only (no autograd).

    Beyond PyTorch (FlashAttention's window_size, alibi_slopes and softcap). The score of
    query i and key j in query head h is

        s = softcap · tanh(scale · q·k / softcap)   (softcap > 0; else scale · q·k)
            - slope[h] · |d(i) - j|                 (ALiBi, when alibi_slopes are given)
            + mask

    where d(i) is query i's diagonal key: i ("top_left") or i + S - L ("bottom_right").

        window_size: (left, right); query i sees key j only when
            d(i) - left <= j <= d(i) + right; -1 leaves that side unbounded (the default
            (-1, -1) is no window). Causal caps right at 0.
        alignment: None, "top_left" or "bottom_right": where d(i) lies for the window and
            ALiBi. None is the causal alignment when causal is set, else "bottom_right"
            (FlashAttention's); given together with causal it must name the same one.
        alibi_slopes: (Hq,) or (batch..., Hq), float32 or float64, a tensor / array of the
            query's framework (a list of numbers is taken as float64). Not differentiated.
        softcap: logit softcapping (Gemma 2, Grok); 0 = off, else a finite cap > 0.
        sinks: (Hq,) or (batch..., Hq), float32 or float64 (a list of numbers is taken as
            float64): one logit per query head that joins every row's softmax denominator
            and takes no value, out_i = Σ_j exp(s_ij - m) v_j / (exp(sink - m) + Σ_j
            exp(s_ij - m)); -inf is no sink. Differentiable (learned, as in gpt-oss).

    Returns:
        output (..., Hq, L, Ev) in the query's dtype; ``(output, weights)``,
        ``(output, lse)`` or ``(output, weights, lse)`` when those are asked for.
        A fully masked row gives output 0, weights 0 and lse -inf (with a sink: output
        0, weights 0 and lse = the sink). The weights of a row sum to 1 minus the sink's
        share.

    Autograd: torch inputs that require grad (grad mode on) get gradients from sdpa's own
    backward, dropout mask included, and so does a float mask that requires grad; it works
    under torch.compile. The lse is differentiable too (a loss that merges partial
    attentions by their lse gets its gradient).

    Raises:
        TypeError: a wrong dtype, or inputs of mixed frameworks; an out= the library cannot
            write in place (a torch view with the lazy negative or conjugate bit, such as
            torch._neg_view(buf) or z.conj().imag; for NumPy, anything but an ndarray).
        ValueError: shapes that do not fit, a mask that does not broadcast, Hq % Hkv != 0,
            dropout_p outside [0, 1), a non-finite scale, a window side below -1, a negative
            or non-finite softcap, alibi_slopes of the wrong shape, an alignment that
            contradicts causal, NumPy strides that are no whole number of elements (a field
            of a structured array). Nothing is written then.
        NotImplementedError: return_weights or out with inputs that require grad; int8
            key / value with inputs (scales included) that require grad.
    """
    if not return_weights and not return_lse and _no_extras(dropout_p, seed, window_size, alignment, alibi_slopes,
                                                             softcap, sinks, key_scale, value_scale):
        output = _common_call(query, key, value, mask, "mask", causal, scale, out)
        if output is not None:
            return output
    fw = _framework(query)
    compiling = fw.compiling()
    q, k, v = _prepare_qkv(fw, query, key, value, compiling=compiling)
    m = None if mask is None else fw.prepare("mask", mask, compiling=compiling)
    slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
    # After the tensors' checks: a rejected call draws no seed from the global generator.
    options = make_options(fw, causal=causal, scale=scale, dropout_p=dropout_p, seed=seed,
                           window_size=window_size, alignment=alignment, softcap=softcap)
    scales = _scales(fw, key_scale, value_scale)
    output, weights, lse = _run(fw, q, k, v, m, slopes, sink_logits, options, weights=return_weights, lse=return_lse,
                                out=out, mask_name="mask", compiling=compiling, scales=scales)
    if not (return_weights or return_lse):
        return output
    return (output,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, seed=None, window_size=_NO_WINDOW, alignment=None,
                                 alibi_slopes=None, softcap=0.0, sinks=None, key_scale=None, value_scale=None):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

    Same signature and semantics: ``softmax(query @ keyᵀ · scale + attn_mask) @ value``
    with query (..., Hq, L, E), key (..., Hkv, S, E), value (..., Hkv, S, Ev) and output
    (..., Hq, L, Ev). Accepts torch tensors (returns a torch tensor) or NumPy arrays
    (returns a NumPy array); bfloat16 from torch, float16/32/64 from both. Inputs are read
    in place through DLPack whatever their strides (transposed, expanded, sliced views), and
    the output is written into a fresh tensor by the library: no copies.

    As in PyTorch: a bool attn_mask is True where a position takes part, a float one is
    added to the scaled scores; is_causal is the top-left causal mask (query i sees keys
    j <= i); scale defaults to 1/sqrt(E) and may be negative; Hq != Hkv needs
    enable_gqa=True (except Hkv == 1, which broadcasts as in torch); batch dims broadcast;
    with enable_gqa=True a rank-3 input is (heads, L, E). Fully masked rows give 0.

    Where it differs from PyTorch (docs/semantics.md, "Python"):
      * dropout uses sdpa's Philox generator keyed by ``seed`` (keyword-only; None draws a
        seed from torch's default generator, or NumPy's global one for arrays), so the
        dropped positions differ from torch's own;
      * attn_mask and is_causal may be given together (both apply; torch refuses);
      * a float attn_mask may have any float dtype (torch wants the query's);
      * autograd through sdpa's own backward (a torch.library custom op, torch.compile
        included); a float attn_mask that requires grad gets its gradient too;
      * keyword-only extensions torch does not have, FlashAttention's: ``window_size=(left,
        right)`` (a sliding window, -1 = unbounded side), ``alibi_slopes`` ((Hq,) or
        (batch..., Hq)), ``softcap`` (logit softcapping, 0 = off), ``sinks`` (attention
        sinks, gpt-oss's: one logit per query head in every row's denominator, (Hq,) or
        (batch..., Hq)) and ``alignment`` (where
        the window's and ALiBi's diagonal lies: None follows is_causal, top-left, and
        without is_causal is "bottom_right", FlashAttention's). See sdpa.attention for the
        formula. Gradients flow through all of them;
      * int8 key / value with ``key_scale`` / ``value_scale`` (sdpa.quantize_kv; see
        sdpa.attention), for inference: no autograd; a scale broadcasts along the batch
        with its key / value.

    Raises:
        TypeError: a wrong dtype, or inputs of mixed frameworks.
        ValueError: shapes that do not fit, Hq != Hkv without enable_gqa, a mask that does
            not broadcast, dropout_p outside [0, 1), a non-finite scale, a bad window_size,
            softcap, alibi_slopes, sinks or alignment.
    """
    if _no_extras(dropout_p, seed, window_size, alignment, alibi_slopes, softcap, sinks, key_scale, value_scale):
        output = _common_call(query, key, value, attn_mask, "attn_mask", "top_left" if is_causal else None, scale,
                              None, drop_in_gqa=bool(enable_gqa))
        if output is not None:
            return output
    fw = _framework(query)
    compiling = fw.compiling()
    q, k, v = _prepare_qkv(fw, query, key, value, compiling=compiling)
    m = None if attn_mask is None else fw.prepare("attn_mask", attn_mask, compiling=compiling)
    slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
    # After the tensors' checks: a rejected call draws no seed from the global generator.
    options = make_options(fw, causal="top_left" if is_causal else None, scale=scale, dropout_p=dropout_p,
                           seed=seed, window_size=window_size, alignment=alignment, softcap=softcap)

    # torch reads dim -3 as the head dim when it applies GQA, also at rank 3; the library's
    # rank 3 is (batch, seq, dim), so such inputs become (1, heads, seq, dim).
    squeeze = enable_gqa and q.ndim == k.ndim == v.ndim == 3
    scales = _scales(fw, key_scale, value_scale)
    if squeeze:
        q, k, v = fw.unsqueeze(q), fw.unsqueeze(k), fw.unsqueeze(v)
        scales = tuple(None if s is None else fw.unsqueeze(s) for s in scales)

    # Each shape read once (a torch attribute read costs what the tuple work below does).
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    if len(q_shape) == len(k_shape) == len(v_shape) >= 4 and not enable_gqa:
        heads_q, heads_k, heads_v = q_shape[-3], k_shape[-3], v_shape[-3]
        # The library always applies GQA when head counts differ; torch only with enable_gqa,
        # except for one KV head, which its matmul broadcasts (the same numbers).
        if not (heads_k == heads_v == 1):
            for name, heads in (("key", heads_k), ("value", heads_v)):
                if heads != heads_q:
                    raise ValueError(f"{name}: expected {heads_q} heads like the query, got {heads} "
                                     "(pass enable_gqa=True for grouped-query attention)")

    if len(q_shape) == len(k_shape) == len(v_shape):
        # torch's math broadcasts batch dims of size 1 (matmul); expanded views cost nothing.
        # (Compared dim by dim: a slice of a torch.Size costs a few tenths of a µs.)
        nb = _batch_dims(len(q_shape))
        if _batch_differs(q_shape, k_shape, v_shape, nb):
            shapes = (q_shape[:nb], k_shape[:nb], v_shape[:nb])
            try:
                batch = np.broadcast_shapes(*shapes)
            except ValueError:
                batch = None  # the library reports the mismatch
            if batch is not None:
                # A scale (one per row of its key / value) follows its tensor; one that does not
                # match it is left as it is for the library to report.
                scales = tuple(fw.broadcast_to(s, batch + tuple(s.shape[nb:]))
                               if s is not None and tuple(s.shape) == tuple(t.shape[:-1]) else s
                               for s, t in zip(scales, (k, v)))
                q, k, v = (fw.broadcast_to(t, batch + tuple(t.shape[nb:])) for t in (q, k, v))
    output, _, _ = _run(fw, q, k, v, m, slopes, sink_logits, options, weights=False, lse=False, out=None,
                        mask_name="attn_mask", compiling=compiling, scales=scales)
    return output[0] if squeeze else output
