"""A call's arguments as the C++ library takes them, shared by the public functions
(sdpa/_attention.py, sdpa/_sequences.py, sdpa/_quantize.py) and sdpa/distributed.py: the
query, key and value checked in the caller's framework, the per-head tensors (ALiBi
slopes, sinks), integer tables, int8 scales, and the checks whose messages must show the
caller's layout rather than the library's views."""

from __future__ import annotations

import numpy as np

from ._frameworks import _Torch, _torch_module
from ._options import _reals

# The window_size default, by identity: a call that leaves it may be a common call (_no_extras).
_NO_WINDOW = (-1, -1)


def _no_extras(dropout_p, seed, window_size, alignment, alibi_slopes, softcap, sinks, key_scale, value_scale):
    """Whether a call leaves every keyword but causal and scale (and the dense calls' out,
    enable_gqa; paged_attention's layout) at its default — return_weights and return_lse
    are the callers' to test: a common call's, which a short path may take
    (_attention._common_call, _sequences._common_paged). A number is compared only once its
    type is known (an array's == would be an array)."""
    return (type(dropout_p) is float and dropout_p == 0.0 and seed is None and window_size is _NO_WINDOW
            and alignment is None and alibi_slopes is None and type(softcap) is float and softcap == 0.0
            and sinks is None and key_scale is None and value_scale is None)


def _prepare_qkv(fw, query, key, value, *, compiling):
    """query, key and value as the binding takes them (each checked under its own name).
    `compiling`: fw.compiling(), asked once a call (the costliest check: _Torch.compiling)."""
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


def _integers(fw, name, x, *, compiling):
    """An integer table (cu_seqlens, block_table, seq_lens): a torch tensor or NumPy array is
    passed as it is (int32 or int64, checked by the binding), anything else becomes an int64
    array. Through the torch custom ops it must be a tensor. `compiling`: fw.compiling()."""
    torch = _torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cpu:
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device}")
        # DLPack exports a negated view's memory, the values' negatives, as they are. (Each
        # new view costs ~0.5 µs a call: made only when needed — only a float tensor, which
        # the binding refuses by its dtype, can require grad — but where torch.compile
        # traces, which the bool of is_neg() would break.)
        if compiling:
            return x.detach().resolve_neg()
        if x.is_neg():
            x = x.resolve_neg()
        return x.detach() if x.requires_grad else x
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


def _rank(name, x, rank, layout):
    if x.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {tuple(x.shape)}")


def _like(name, x, other_name, other):
    """x's shape is other's but for the last dim (value and key; value_pages and key_pages),
    checked here so that the message shows the caller's layout, not the library's view."""
    if tuple(x.shape[:-1]) != tuple(other.shape[:-1]):
        expected = "(" + ", ".join(str(n) for n in other.shape[:-1]) + ", Ev)"
        raise ValueError(f"{name}: expected {expected} like {other_name}, got shape {tuple(x.shape)}")


def _autograd_module():
    """sdpa._autograd, imported on the first torch call (it imports torch) and kept: an
    import statement in the call itself costs a microsecond or two every time."""
    global _AUTOGRAD
    if _AUTOGRAD is None:
        from . import _autograd

        _AUTOGRAD = _autograd
    return _AUTOGRAD


_AUTOGRAD = None
