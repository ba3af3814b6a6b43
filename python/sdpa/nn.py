"""sdpa.MultiheadAttention: torch.nn.MultiheadAttention's call signature and results on
sdpa's C++ layer (include/sdpa/nn.h), which adds grouped-query attention, rotary position
embedding and a KV cache for incremental decoding.

    mha = sdpa.MultiheadAttention.from_torch(torch_mha)         # same weights, same answers
    out, weights = mha(query, key, value, key_padding_mask=pad, attn_mask=causal_mask)

Weights load from a torch.nn.MultiheadAttention (its in_proj_weight, in_proj_bias,
out_proj.weight, out_proj.bias), from a state dict, or from a safetensors file.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._api import _framework, _is_torch_tensor

_DTYPES = {"float32": "float32", "float64": "float64"}


def _dtype_name(dtype) -> str:
    """'float32' or 'float64' from a string, a NumPy dtype or a torch dtype."""
    name = str(dtype).replace("torch.", "")
    if name in ("float", "double"):
        name = {"float": "float32", "double": "float64"}[name]
    if name not in _DTYPES:
        raise TypeError(f"dtype: expected float32 or float64, got {dtype}")
    return name


def _to_array(x):
    """A NumPy view (or copy, for torch tensors needing it) of a parameter."""
    if _is_torch_tensor(x):
        return x.detach().cpu().contiguous().numpy()
    return np.asarray(x)


class KVCache:
    """Keys and values of the tokens decoded so far, for MultiheadAttention(..., cache=)."""

    def __init__(self, core):
        self._core = core

    @property
    def length(self) -> int:
        return self._core.length

    def clear(self):
        self._core.clear()

    def truncate(self, length: int):
        """Keeps the first `length` positions (rolls back rejected speculative tokens)."""
        self._core.truncate(length)

    def keys(self):
        """A copy of the cached keys, (batch, kv_heads, length, head_dim), as NumPy."""
        return self._core.keys()

    def values(self):
        return self._core.values()


class MultiheadAttention:
    """Multi-head attention with torch.nn.MultiheadAttention's interface.

    Arguments as torch's (embed_dim, num_heads, dropout, bias, kdim, vdim, batch_first),
    plus: num_kv_heads (grouped-query attention; default num_heads), head_dim (default
    embed_dim // num_heads), rope (None, or a dict with 'base', 'layout' = 'half_split' |
    'interleaved', 'rotary_dim'), dtype ('float32' or 'float64', or the torch / NumPy
    dtype), init ('xavier_uniform' or 'xavier_normal') and seed (initial weights; biases
    start at 0), and sdpa.attention's window_size=(left, right) (a sliding window, -1 =
    unbounded side), alibi_slopes (one per query head) and softcap (0 = off), counted from
    each query's own position (bottom-right with a cache). add_bias_kv and add_zero_attn
    are not supported.

    Calls take torch tensors (and return torch tensors) or NumPy arrays (and return
    NumPy arrays) of the layer's dtype. Dropout applies while `training` is True (as for a
    torch module, the default; call .eval() for inference).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, *, num_kv_heads=None, head_dim=None, rope=None,
                 dtype="float32", init="xavier_uniform", seed=0, window_size=(-1, -1), alibi_slopes=None,
                 softcap=0.0):
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn: not supported by sdpa.MultiheadAttention")
        rope = dict(rope) if rope is not None else None
        if rope is not None:
            unknown = set(rope) - {"base", "layout", "rotary_dim"}
            if unknown:
                raise ValueError(f"rope: expected keys 'base', 'layout', 'rotary_dim', got {sorted(unknown)}")
        self._core = _core.MultiHeadAttention(
            embed_dim=int(embed_dim), num_heads=int(num_heads), num_kv_heads=int(num_kv_heads or 0),
            head_dim=int(head_dim or 0), kdim=int(kdim or 0), vdim=int(vdim or 0), bias=bool(bias),
            dropout=float(dropout), rope_base=None if rope is None else float(rope.get("base", 10000.0)),
            rope_layout="half_split" if rope is None else rope.get("layout", "half_split"),
            rotary_dim=0 if rope is None else int(rope.get("rotary_dim", 0)), dtype=_dtype_name(dtype), init=init,
            seed=int(seed), window_left=int(window_size[0]), window_right=int(window_size[1]),
            alibi_slopes=[] if alibi_slopes is None else [float(s) for s in alibi_slopes], softcap=float(softcap))
        self.batch_first = bool(batch_first)
        self.training = True
        config = self._core.config()
        self.embed_dim = config["embed_dim"]
        self.num_heads = config["num_heads"]
        self.num_kv_heads = config["num_kv_heads"]
        self.head_dim = config["head_dim"]
        self.kdim = config["kdim"]
        self.vdim = config["vdim"]
        self.dropout = config["dropout"]
        self.dtype = config["dtype"]
        self.rope = rope

    # ---- weights --------------------------------------------------------------------

    @classmethod
    def from_torch(cls, module, **kwargs):
        """A layer with the configuration and the weights of a torch.nn.MultiheadAttention.
        Keyword arguments (e.g. rope=...) are passed to the constructor."""
        if module.bias_k is not None or module.add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn: not supported by sdpa.MultiheadAttention")
        weight = module.out_proj.weight
        layer = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=module.in_proj_bias is not None,
                    kdim=module.kdim, vdim=module.vdim, batch_first=module.batch_first,
                    dtype=kwargs.pop("dtype", weight.dtype), **kwargs)
        layer.load_state_dict(module.state_dict())
        layer.training = module.training
        return layer

    @classmethod
    def from_safetensors(cls, path, embed_dim, num_heads, prefix="", **kwargs):
        """A layer built with these arguments, its weights read from a safetensors file
        (sdpa's names or torch's; `prefix` selects one layer of a whole model's file)."""
        layer = cls(embed_dim, num_heads, **kwargs)
        layer.load_safetensors(path, prefix)
        return layer

    def load_state_dict(self, state_dict):
        """Replaces the weights. sdpa's names (q_proj.weight, ..., out_proj.bias) or torch's
        (in_proj_weight, in_proj_bias, q_proj_weight/k_proj_weight/v_proj_weight,
        out_proj.weight, out_proj.bias); torch tensors or arrays of any float dtype."""
        self._core.load_state_dict({str(k): _to_array(v) for k, v in state_dict.items()})

    def state_dict(self) -> dict:
        """The parameters under sdpa's names, as NumPy arrays (copies)."""
        return {name: self._core.parameter(name) for name in self._core.parameter_names()}

    def save_safetensors(self, path, metadata=None):
        self._core.save_safetensors(str(path), dict(metadata or {}))

    def load_safetensors(self, path, prefix=""):
        self._core.load_safetensors(str(path), prefix)

    # ---- modes ----------------------------------------------------------------------

    def train(self, mode: bool = True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def make_cache(self, batch: int, capacity: int = 0) -> KVCache:
        """A KV cache for `batch` sequences, for decoding a token (or a chunk) per call."""
        return KVCache(self._core.make_cache(int(batch), int(capacity)))

    # ---- the call -------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, *, cache=None, position_offset=0, seed=None,
                num_threads=0):
        """torch.nn.MultiheadAttention.forward's arguments and results:
        (attn_output, attn_weights), the weights averaged over heads unless
        average_attn_weights=False, None when need_weights=False.

        key and value default to the query (self-attention). attn_mask: (L, S) or
        (N·num_heads, L, S); bool True = not allowed to attend, float = added (torch's
        polarity). key_padding_mask: (N, S); bool True = padding. is_causal applies a causal
        mask by itself (torch requires attn_mask with it; here it may stand alone, and with
        attn_mask both apply). cache: a KVCache from make_cache; this call's keys and values
        are appended to it and the queries attend to all of it (causal aligned to the end).
        """
        fw = _framework(query)
        key = query if key is None else key
        value = key if value is None else value
        query, key, value = (fw.prepare(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
        batched = query.ndim == 3
        torch_in = _is_torch_tensor(query)

        def swap(x):  # (L, N, E) <-> (N, L, E): a strided view, no copy
            return x.transpose(0, 1) if torch_in else np.swapaxes(x, 0, 1)

        if batched and not self.batch_first:
            query, key, value = swap(query), swap(key), swap(value)

        mask = None
        if attn_mask is not None:
            mask = fw.prepare("attn_mask", attn_mask)
            # torch: True = masked out; sdpa: True = takes part.
            if str(mask.dtype) in ("torch.bool", "bool"):
                mask = ~mask if torch_in else np.logical_not(mask)
            if mask.ndim == 3 and batched:
                mask = mask.reshape(query.shape[0], self.num_heads, mask.shape[-2], mask.shape[-1])
        padding = None if key_padding_mask is None else fw.prepare("key_padding_mask", key_padding_mask)

        dropout_seed = 0
        if self.training and self.dropout > 0:
            dropout_seed = fw.draw_seed() if seed is None else int(seed)
        output, weights = self._core.forward(
            query, key, value, mask, padding, "top_left" if is_causal else "none", bool(need_weights),
            self.training, dropout_seed, int(position_offset), None if cache is None else cache._core,
            int(num_threads))

        if need_weights and average_attn_weights:
            weights = weights.mean(axis=1 if batched else 0)
        if torch_in:
            torch = fw.torch
            output = torch.from_numpy(output)
            weights = None if weights is None else torch.from_numpy(np.ascontiguousarray(weights))
        if batched and not self.batch_first:
            output = swap(output)
            output = output.contiguous() if torch_in else np.ascontiguousarray(output)
        return output, weights

    def __repr__(self):
        return (f"sdpa.MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"batch_first={self.batch_first}, rope={self.rope})")
