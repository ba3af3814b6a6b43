"""The public functions. Everything numerical happens in C++ (sdpa._core); this file maps
Python arguments onto one call of it, allocates the outputs in the caller's framework
(torch.empty / np.empty) and hands the C++ library views of the caller's memory, so no
tensor is copied on the way in or out."""

from __future__ import annotations

import numpy as np

from . import _core
from ._frameworks import _framework, _Torch, _torch_module
from ._options import _reals, make_options, to_core

_LAYOUTS = ("HND", "NHD")


def _prepare_qkv(fw, query, key, value):
    """query, key and value as the binding takes them (each checked under its own name)."""
    compiling = fw.compiling()
    return (fw.prepare("query", query, compiling=compiling), fw.prepare("key", key, compiling=compiling),
            fw.prepare("value", value, compiling=compiling))


def _per_head(fw, name, values, *, constant):
    """A per-head tensor (alibi_slopes, sinks) in the caller's framework: a tensor / array is
    read in place (float32 or float64, shape checked by the library); a list or tuple of
    numbers becomes float64. ALiBi slopes are `constant` (no gradient flows to them); the
    sinks are learned logits, differentiable like the query."""
    if values is None:
        return None
    if isinstance(values, (list, tuple)):
        values = np.asarray(_reals(name, values), dtype=np.float64)
    if isinstance(fw, _Torch):
        if isinstance(values, np.ndarray):
            values = fw.torch.from_numpy(values)
        values = fw.prepare(name, values)
        return values.detach() if constant else values
    return fw.prepare(name, values)


def _slopes(fw, alibi_slopes):
    return _per_head(fw, "alibi_slopes", alibi_slopes, constant=True)


def _sinks(fw, sinks):
    return _per_head(fw, "sinks", sinks, constant=False)


def _integers(fw, name, x):
    """An integer table (cu_seqlens, block_table, seq_lens): a torch tensor or NumPy array is
    passed as it is (int32 or int64, checked by the binding), anything else becomes an int64
    array. Through the torch custom ops it must be a tensor."""
    torch = _torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cpu:
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device}")
        # DLPack exports a negated view's memory, the values' negatives, as they are.
        return x.detach().resolve_neg()
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except ValueError as error:  # ragged nested lists
            raise ValueError(f"{name}: expected a rectangular table of ints, got {error}") from None
        if x.size == 0:
            x = x.astype(np.int64)  # np.asarray([]) is float64
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected int32 or int64, got {x.dtype}")
    # Packed (a small copy, which the binding makes anyway): a field of a structured array
    # has strides DLPack cannot express.
    x = np.ascontiguousarray(x)
    return fw.torch.from_numpy(x) if isinstance(fw, _Torch) else x


def _scales(fw, key_scale, value_scale):
    """The scales of int8 key / value (float32, the tensor's shape without its last dim;
    checked by the library), read in place; None when absent."""
    if key_scale is None and value_scale is None:  # most calls: no generator to run
        return None, None
    return tuple(None if s is None else fw.prepare(name, s)
                 for name, s in (("key_scale", key_scale), ("value_scale", value_scale)))


def _scales_like(key_scale, value_scale, key, value, layout):
    """Each scale has its tensor's shape without the last dim, checked in the caller's
    layout (a packed or NHD call hands the library swapped views, and its message would
    show those)."""
    for name, s, tensor in (("key_scale", key_scale, key), ("value_scale", value_scale, value)):
        if s is not None and tuple(s.shape) != tuple(tensor.shape[:-1]):
            raise ValueError(f"{name}: expected {layout} = {tuple(tensor.shape[:-1])}, got shape {tuple(s.shape)}")


def _inference_only(fw, what, *tensors):
    """Quantized K/V have no backward: a call that would need one is refused up front."""
    if isinstance(fw, _Torch):
        torch = fw.torch
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            raise NotImplementedError(f"{what}: int8 key / value are for inference (no backward); call it under "
                                      "torch.no_grad() or torch.inference_mode()")


def quantize_kv(x):
    """Symmetric int8 quantization of keys or values, one scale per row (per token and KV
    head), as llama.cpp's q8_0 and OpenVINO's u8 caches store them:

        scale[..., j] = max_e |x[..., j, e]| / 127,   q[..., j, e] = round(x[..., j, e] / scale)

    q in [-127, 127], round to nearest (ties to even); a zero row gets scale 0. Each element
    then satisfies |x - scale · q| <= scale / 2 (docs/numerics.md derives what that bounds in
    the attention's output).

    Args:
        x: (..., dim) float16, bfloat16, float32 or float64, finite, any strides: a key
            (batch..., Hkv, S, E) or value tensor, or pages (pages, Hkv, page_size, E).

    Returns:
        ``(values, scale)`` in x's framework: int8 of x's shape, float32 of x's shape without
        its last dim — the key / value and its ``key_scale`` / ``value_scale``.

    Raises:
        TypeError: a dtype other than floating point.
        ValueError: a NaN or infinity in x, a scalar x.
    """
    fw = _framework(x)
    a = fw.prepare("x", x)
    if a.ndim < 1:
        raise ValueError("x: expected rank >= 1 (..., dim), got a scalar")
    int8, float32 = (fw.torch.int8, fw.torch.float32) if isinstance(fw, _Torch) else (np.int8, np.float32)
    values = fw.empty(tuple(a.shape), int8)
    scale = fw.empty(tuple(a.shape[:-1]), float32)
    _core.quantize_kv(fw.export(a.detach() if isinstance(fw, _Torch) else a), values, scale)
    return values, scale


def _batch_dims(ndim: int) -> int:
    # Rank >= 4 is (batch..., heads, seq, dim); rank 3 is (batch, seq, dim).
    return ndim - 3 if ndim >= 4 else max(ndim - 2, 0)


def _batch_differs(q_shape, k_shape, v_shape, nb: int) -> bool:
    """Whether the first nb dims of the three shapes differ anywhere."""
    for d in range(nb):
        if not q_shape[d] == k_shape[d] == v_shape[d]:
            return True
    return False


def _autograd_module():
    """sdpa._autograd, imported on the first torch call (it imports torch) and kept: an
    import statement in the call itself costs a microsecond or two every time."""
    global _AUTOGRAD
    if _AUTOGRAD is None:
        from . import _autograd

        _AUTOGRAD = _autograd
    return _AUTOGRAD


_AUTOGRAD = None


def _run(fw, q, k, v, mask, slopes, sinks, options, *, weights, lse, out, mask_name, scales=(None, None)):
    compiling = fw.compiling()
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
        out = fw.output_like(q, v.shape[-1], options.dropout_p)
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
              return_weights=False, return_lse=False, out=None, window_size=(-1, -1), alignment=None,
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
    fw = _framework(query)
    q, k, v = _prepare_qkv(fw, query, key, value)
    m = None if mask is None else fw.prepare("mask", mask)
    slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
    # After the tensors' checks: a rejected call draws no seed from the global generator.
    options = make_options(fw, causal=causal, scale=scale, dropout_p=dropout_p, seed=seed,
                           window_size=window_size, alignment=alignment, softcap=softcap)
    scales = _scales(fw, key_scale, value_scale)
    output, weights, lse = _run(fw, q, k, v, m, slopes, sink_logits, options, weights=return_weights, lse=return_lse,
                                out=out, mask_name="mask", scales=scales)
    if not (return_weights or return_lse):
        return output
    return (output,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, seed=None, window_size=(-1, -1), alignment=None,
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
    fw = _framework(query)
    q, k, v = _prepare_qkv(fw, query, key, value)
    m = None if attn_mask is None else fw.prepare("attn_mask", attn_mask)
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
                        mask_name="attn_mask", scales=scales)
    return output[0] if squeeze else output


def _rank(name, x, rank, layout):
    if x.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {tuple(x.shape)}")


def _like(name, x, other_name, other):
    """x's shape is other's but for the last dim (value and key; value_pages and key_pages),
    checked here so that the message shows the caller's layout, not the library's view."""
    if tuple(x.shape[:-1]) != tuple(other.shape[:-1]):
        expected = "(" + ", ".join(str(n) for n in other.shape[:-1]) + ", Ev)"
        raise ValueError(f"{name}: expected {expected} like {other_name}, got shape {tuple(x.shape)}")


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
    q, k, v = _prepare_qkv(fw, query, key, value)
    _rank("query", q, 3, "(total_q, Hq, E)")
    _rank("key", k, 3, "(total_k, Hkv, E)")
    _rank("value", v, 3, "(total_k, Hkv, Ev)")
    _like("value", v, "the key", k)
    cu_q = _integers(fw, "cu_seqlens_q", cu_seqlens_q)
    cu_k = _integers(fw, "cu_seqlens_k", cu_seqlens_k)
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
        if not quantized and _autograd.wanted(q, k, v, sink_logits):
            output, lse = _autograd.varlen(q, k, v, cu_q, cu_k, slopes, sink_logits, options)
            return (output, lse) if return_lse else output
    # No gradient is wanted past this point: the tensors go as DLPack views (fw.export).
    total_q, heads_q = q.shape[0], q.shape[1]
    # FlashAttention's layouts, written through (H, total, ·) views.
    output = fw.empty((total_q, heads_q, v.shape[-1]), q.dtype)
    lse = fw.empty((heads_q, total_q), fw.lse_dtype(q)) if return_lse else None
    key_scale, value_scale = (None if s is None else fw.swap(s, 0, 1) for s in (key_scale, value_scale))
    export, swap = fw.export, fw.swap
    _core.forward_varlen(export(swap(q, 0, 1)), export(swap(k, 0, 1)), export(swap(v, 0, 1)), export(cu_q),
                         export(cu_k), export(slopes), export(sink_logits), export(swap(output, 0, 1)), export(lse),
                         to_core(options), export(key_scale), export(value_scale))
    return (output, lse) if return_lse else output


def paged_attention(query, key_pages, value_pages, block_table, seq_lens, *, layout="HND", causal=None, scale=None,
                    window_size=(-1, -1), alignment=None, alibi_slopes=None, softcap=0.0, sinks=None,
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
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
    fw = _framework(query)
    options = make_options(fw, causal=causal, scale=scale, window_size=window_size, alignment=alignment,
                           softcap=softcap)
    q = fw.prepare("query", query)
    kp = fw.prepare("key_pages", key_pages)
    vp = fw.prepare("value_pages", value_pages)
    _rank("query", q, 4, "(batch, Hq, L, E)")
    pages_layout = "(pages, Hkv, page_size, {})" if layout == "HND" else "(pages, page_size, Hkv, {})"
    _rank("key_pages", kp, 4, pages_layout.format("E"))
    _rank("value_pages", vp, 4, pages_layout.format("Ev"))
    _like("value_pages", vp, "key_pages", kp)
    table = _integers(fw, "block_table", block_table)
    lengths = _integers(fw, "seq_lens", seq_lens)
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
        if torch.compiler.is_compiling():
            output, lse = _autograd_module().paged(q, kp, vp, table, lengths, slopes, sink_logits, options, nhd=nhd)
            return (output, lse) if return_lse else output
    # No gradient is wanted past the checks above: the tensors go as DLPack views (fw.export).
    if nhd:  # (pages, page_size, Hkv, E) read as (pages, Hkv, page_size, E)
        kp, vp = fw.swap(kp, 1, 2), fw.swap(vp, 1, 2)
    rows = tuple(q.shape[:-1])
    output = fw.empty(rows + tuple(vp.shape[-1:]), q.dtype)
    lse = fw.empty(rows, fw.lse_dtype(q)) if return_lse else None
    export = fw.export
    _core.forward_paged(export(q), export(kp), export(vp), export(table), export(lengths), export(slopes),
                        export(sink_logits), export(output), export(lse), to_core(options), export(key_scale),
                        export(value_scale))
    return (output, lse) if return_lse else output
