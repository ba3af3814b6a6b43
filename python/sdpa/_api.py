"""The two public functions. Everything numerical happens in C++ (sdpa._core); this file
maps Python arguments onto one call of it, allocates the outputs in the caller's framework
(torch.empty / np.empty) and hands the C++ library views of the caller's memory, so no
tensor is copied on the way in or out."""

from __future__ import annotations

import numbers
import sys

import numpy as np

from . import _core

_CAUSAL = {None: "none", "top_left": "top_left", "bottom_right": "bottom_right"}
_UINT64_END = 1 << 64


def _torch_module():
    # torch is optional: it is only touched when the caller passes torch tensors, and then it
    # is already imported.
    return sys.modules.get("torch")


def _is_torch_tensor(x) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


class _Torch:
    """Inputs and outputs as torch tensors (CPU, strided layout)."""

    def __init__(self):
        import torch

        self.torch = torch

    def prepare(self, name, x):
        torch = self.torch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like the query, got {type(x).__module__}.{type(x).__name__}")
        if x.layout != torch.strided:
            raise TypeError(f"{name}: expected a strided (dense) tensor, got layout {x.layout}")
        if x.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device} (sdpa has no GPU backend yet)")
        # A tensor that requires grad stays attached: _run sends it through the autograd op
        # (sdpa/_autograd.py), or detaches it (a view, no copy) when no gradient is wanted.
        # A lazily negated view cannot be exported through DLPack. (Under torch.compile the
        # custom op resolves it, and the check would break the graph.)
        if not torch.compiler.is_compiling() and x.is_neg():
            x = x.resolve_neg()
        return x

    def empty(self, shape, dtype):
        return self.torch.empty(tuple(shape), dtype=dtype, device="cpu")

    def lse_dtype(self, query):
        return self.torch.float64 if query.dtype == self.torch.float64 else self.torch.float32

    def broadcast_to(self, x, shape):
        return x.expand(*shape)

    def unsqueeze(self, x):
        return x.unsqueeze(0)

    def draw_seed(self) -> int:
        # From torch's default CPU generator, so torch.manual_seed makes dropout reproducible.
        return int(self.torch.randint(0, (1 << 63) - 1, (), dtype=self.torch.int64))


class _NumPy:
    """Inputs and outputs as NumPy arrays (anything np.asarray accepts comes in)."""

    def prepare(self, name, x):
        if _is_torch_tensor(x):
            raise TypeError(f"{name}: expected a NumPy array like the query, got a torch.Tensor")
        a = np.asarray(x)  # an ndarray passes through untouched
        if a.dtype.kind not in "biufc" or not a.dtype.isnative:
            raise TypeError(f"{name}: expected float16, float32 or float64 (bool for a mask), got {a.dtype}")
        return a

    def empty(self, shape, dtype):
        return np.empty(tuple(shape), dtype=dtype)

    def lse_dtype(self, query):
        return np.float64 if query.dtype == np.float64 else np.float32

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, tuple(shape))

    def unsqueeze(self, x):
        return x[np.newaxis]

    def draw_seed(self) -> int:
        # From NumPy's global generator, so np.random.seed makes dropout reproducible.
        return int(np.random.randint(0, (1 << 63) - 1, dtype=np.int64))


def _framework(query):
    return _Torch() if _is_torch_tensor(query) else _NumPy()


def _dropout(dropout_p) -> float:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}")
    return float(dropout_p)  # the range is checked by the library


def _scale(scale):
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    return float(scale)  # finiteness is checked by the library


def _seed(fw, seed, dropout_p: float) -> int:
    if seed is None:
        # p = 0 draws nothing, so inference does not advance the caller's generator.
        return fw.draw_seed() if dropout_p > 0 else 0
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed: expected an int or None, got {type(seed).__name__}")
    if not 0 <= int(seed) < _UINT64_END:
        raise ValueError(f"seed: expected an integer in [0, 2**64), got {int(seed)}")
    return int(seed)


def _batch_dims(ndim: int) -> int:
    # Rank >= 4 is (batch..., heads, seq, dim); rank 3 is (batch, seq, dim).
    return ndim - 3 if ndim >= 4 else max(ndim - 2, 0)


def _run(fw, q, k, v, mask, *, causal, scale, dropout_p, seed, weights, lse, out, mask_name):
    dropout_p = _dropout(dropout_p)
    scale = _scale(scale)
    seed = _seed(fw, seed, dropout_p)
    if isinstance(fw, _Torch):
        from . import _autograd

        if _autograd.wanted(q, k, v, mask):
            # Training (or torch.compile): the custom op with its registered backward.
            if weights:
                raise NotImplementedError("return_weights: the weights are not differentiable; ask for them in a "
                                          "separate call under torch.no_grad()")
            if out is not None:
                raise NotImplementedError("out: an output buffer does not support automatic differentiation")
            output, lse_tensor = _autograd.attention(q, k, v, mask, causal=causal, scale=scale, dropout_p=dropout_p,
                                                     seed=seed, mask_name=mask_name)
            return output, None, (lse_tensor if lse else None)
        # No gradient wanted: DLPack exports only tensors that do not require grad.
        q, k, v = q.detach(), k.detach(), v.detach()
        mask = None if mask is None else mask.detach()
    rows = tuple(q.shape[:-1])  # (..., Hq, L)
    if out is None:
        out = fw.empty(rows + tuple(v.shape[-1:]), q.dtype)
    else:
        out = fw.prepare("out", out)
        if isinstance(out, np.ndarray) and not out.flags.writeable:
            raise ValueError("out: expected a writable array, got a read-only one")
    weights_buffer = fw.empty(rows + tuple(k.shape[-2:-1]), q.dtype) if weights else None
    lse_buffer = fw.empty(rows, fw.lse_dtype(q)) if lse else None
    # The library validates everything (shapes, dtypes, mask broadcasting, overlap) before it
    # writes anything; its errors arrive as TypeError / ValueError.
    written = out.detach() if isinstance(fw, _Torch) else out  # the caller's memory either way
    _core.forward(q, k, v, mask, written, weights_buffer, lse_buffer, causal, scale, dropout_p, seed, 0, 0,
                  "automatic", mask_name)
    return out, weights_buffer, lse_buffer


def attention(query, key, value, mask=None, *, causal=None, scale=None, dropout_p=0.0, seed=None,
              return_weights=False, return_lse=False, out=None):
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

    Returns:
        output (..., Hq, L, Ev) in the query's dtype; ``(output, weights)``,
        ``(output, lse)`` or ``(output, weights, lse)`` when those are asked for.
        A fully masked row gives output 0, weights 0 and lse -inf.

    Autograd: torch inputs that require grad (grad mode on) get gradients from sdpa's own
    backward, dropout mask included, and so does a float mask that requires grad; it works
    under torch.compile. The lse is returned without a gradient.

    Raises:
        TypeError: a wrong dtype, or inputs of mixed frameworks.
        ValueError: shapes that do not fit, a mask that does not broadcast, Hq % Hkv != 0,
            dropout_p outside [0, 1), a non-finite scale. Nothing is written then.
        NotImplementedError: return_weights or out with inputs that require grad.
    """
    if causal not in _CAUSAL:
        raise ValueError(f"causal: expected None, 'top_left' or 'bottom_right', got {causal!r}")
    fw = _framework(query)
    q = fw.prepare("query", query)
    k = fw.prepare("key", key)
    v = fw.prepare("value", value)
    m = None if mask is None else fw.prepare("mask", mask)
    output, weights, lse = _run(fw, q, k, v, m, causal=_CAUSAL[causal], scale=scale, dropout_p=dropout_p, seed=seed,
                                weights=return_weights, lse=return_lse, out=out, mask_name="mask")
    if not (return_weights or return_lse):
        return output
    return (output,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, seed=None):
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
        included); a float attn_mask that requires grad gets its gradient too.

    Raises:
        TypeError: a wrong dtype, or inputs of mixed frameworks.
        ValueError: shapes that do not fit, Hq != Hkv without enable_gqa, a mask that does
            not broadcast, dropout_p outside [0, 1), a non-finite scale.
    """
    fw = _framework(query)
    q = fw.prepare("query", query)
    k = fw.prepare("key", key)
    v = fw.prepare("value", value)
    m = None if attn_mask is None else fw.prepare("attn_mask", attn_mask)

    # torch reads dim -3 as the head dim when it applies GQA, also at rank 3; the library's
    # rank 3 is (batch, seq, dim), so such inputs become (1, heads, seq, dim).
    squeeze = enable_gqa and q.ndim == k.ndim == v.ndim == 3
    if squeeze:
        q, k, v = fw.unsqueeze(q), fw.unsqueeze(k), fw.unsqueeze(v)

    if q.ndim == k.ndim == v.ndim and q.ndim >= 4:
        heads_q, heads_k, heads_v = q.shape[-3], k.shape[-3], v.shape[-3]
        # The library always applies GQA when head counts differ; torch only with enable_gqa,
        # except for one KV head, which its matmul broadcasts (the same numbers).
        if not enable_gqa and not (heads_k == heads_v == 1):
            for name, heads in (("key", heads_k), ("value", heads_v)):
                if heads != heads_q:
                    raise ValueError(f"{name}: expected {heads_q} heads like the query, got {heads} "
                                     "(pass enable_gqa=True for grouped-query attention)")

    if q.ndim == k.ndim == v.ndim:
        # torch's math broadcasts batch dims of size 1 (matmul); expanded views cost nothing.
        nb = _batch_dims(q.ndim)
        shapes = [tuple(t.shape[:nb]) for t in (q, k, v)]
        if len(set(shapes)) > 1:
            try:
                batch = np.broadcast_shapes(*shapes)
            except ValueError:
                batch = None  # the library reports the mismatch
            if batch is not None:
                q, k, v = (fw.broadcast_to(t, batch + tuple(t.shape[nb:])) for t in (q, k, v))

    output, _, _ = _run(fw, q, k, v, m, causal="top_left" if is_causal else "none", scale=scale, dropout_p=dropout_p,
                        seed=seed, weights=False, lse=False, out=None, mask_name="attn_mask")
    return output[0] if squeeze else output
