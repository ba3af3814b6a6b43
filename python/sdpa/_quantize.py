"""sdpa.quantize_kv: int8 keys and values with a float32 scale per row, the form the
library's int8 K/V kernels read (key_scale / value_scale of the public functions)."""

from __future__ import annotations

import numpy as np

from . import _core
from ._frameworks import _framework, _Torch


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
