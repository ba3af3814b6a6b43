"""sdpa.MultiheadAttention: torch.nn.MultiheadAttention's call signature and results on
sdpa's C++ layer (include/sdpa/nn.h), which adds grouped-query attention, rotary position
embedding and a KV cache for incremental decoding.

    mha = sdpa.MultiheadAttention.from_torch(torch_mha)         # same weights, same answers
    out, weights = mha(query, key, value, key_padding_mask=pad, attn_mask=causal_mask)

Weights load from a torch.nn.MultiheadAttention (its in_proj_weight, in_proj_bias,
out_proj.weight, out_proj.bias), from a state dict, or from a safetensors file.

For torch inputs that require grad the output is differentiable with respect to them (the
backward is sdpa/_layer_autograd.py's); the layer's weights are constants.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._frameworks import _framework, _is_torch_tensor
from ._options import _integer, _real, _reals, _seed, _seed_value, _window

_DTYPES = {"float32": "float32", "float64": "float64"}
# What the binding reads through DLPack; other float parameters are converted first.
_STATE_DICT_FLOATS = ("float16", "bfloat16", "float32", "float64")
_INT32_END = 1 << 31


def _dtype_name(dtype) -> str:
    """'float32' or 'float64' from a string, a NumPy dtype or a torch dtype."""
    name = str(dtype).replace("torch.", "")
    if name in ("float", "double"):
        name = {"float": "float32", "double": "float64"}[name]
    if name not in _DTYPES:
        raise TypeError(f"dtype: expected float32 or float64, got {dtype}")
    return name


def _string(name, value) -> str:
    # Which strings are valid is the binding's to say; here only that it is one.
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    return value


def _state_dict_entry(name, x):
    """A parameter as the binding reads it, in place where it can (the binding copies it into
    the layer's dtype). torch tensors stay torch tensors: NumPy has no bfloat16, the usual
    checkpoint dtype. A float dtype the binding cannot read (float8, np.longdouble) becomes
    float64, which holds all of them but the longest long double's extra bits."""
    if _is_torch_tensor(x):
        import torch

        x = x.detach().cpu()
        if x.is_quantized:
            x = x.dequantize()
        x = x.resolve_conj().resolve_neg()  # lazily negated views hold -x in memory
        if x.is_floating_point() and str(x.dtype).replace("torch.", "") not in _STATE_DICT_FLOATS:
            x = x.to(torch.float64)
        return x
    a = np.asarray(x)
    if a.dtype.kind not in "biufc":
        raise TypeError(f"{name}: expected a tensor or array of floats, got {a.dtype}")
    if a.dtype.kind == "f" and a.dtype.name not in _STATE_DICT_FLOATS:
        a = a.astype(np.float64)
    # Packed and native: DLPack expresses neither a structured array's field nor big-endian.
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))


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
        self._core.truncate(_integer("length", length))

    def keys(self):
        """A copy of the cached keys, (batch, kv_heads, length, head_dim), as NumPy."""
        return self._core.keys()

    def values(self):
        return self._core.values()

    @property
    def dtype(self) -> str:
        """The storage dtype: the layer's, or "int8" for a quantized cache."""
        return self._core.dtype

    def scales(self):
        """An int8 cache's (key_scale, value_scale), copies (batch, kv_heads, length) float32
        as NumPy, so that keys() · key_scale[..., None] are the keys it stands for; None for
        a floating-point cache."""
        return self._core.scales()


class MultiheadAttention:
    """Multi-head attention with torch.nn.MultiheadAttention's interface.

    Arguments as torch's (embed_dim, num_heads, dropout, bias, kdim, vdim, batch_first),
    plus: num_kv_heads (grouped-query attention; default num_heads), head_dim (default
    embed_dim // num_heads), rope (None, or a dict with 'base', 'layout' = 'half_split' |
    'interleaved', 'rotary_dim'), dtype ('float32' or 'float64', or the torch / NumPy
    dtype), init ('xavier_uniform' or 'xavier_normal') and seed (initial weights; biases
    start at 0), and sdpa.attention's window_size=(left, right) (a sliding window, -1 =
    unbounded side), alibi_slopes (one per query head), softcap (0 = off) and sinks (one
    attention-sink logit per query head, as gpt-oss's), counted from each query's own
    position (bottom-right with a cache). add_bias_kv and add_zero_attn
    are not supported.

    Calls take torch tensors (and return torch tensors) or NumPy arrays (and return
    NumPy arrays) of the layer's dtype. Dropout applies while `training` is True (as for a
    torch module, the default; call .eval() for inference).

    Autograd: when torch inputs require grad (grad mode on), the output is differentiable
    with respect to query, key, value and a float attn_mask / key_padding_mask; dropout is
    replayed from the call's seed. The layer's weights are constants, not torch parameters
    (it is not a torch.nn.Module): no gradient reaches them. The forward is the C++ layer's;
    the backward recomputes the layer in torch (projections, RoPE) around sdpa's attention
    op, as activation checkpointing does, so a call keeps only its inputs for the backward.
    Such calls take need_weights=False (the weights are not differentiable) and no cache
    (decoding is inference); both raise NotImplementedError.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, *, num_kv_heads=None, head_dim=None, rope=None,
                 dtype="float32", init="xavier_uniform", seed=0, window_size=(-1, -1), alibi_slopes=None,
                 softcap=0.0, sinks=None):
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn: not supported by sdpa.MultiheadAttention")
        rope = dict(rope) if rope is not None else None
        if rope is not None:
            unknown = set(rope) - {"base", "layout", "rotary_dim"}
            if unknown:
                raise ValueError(f"rope: expected keys 'base', 'layout', 'rotary_dim', got {sorted(unknown)}")
        # The arguments in the binding's types; their ranges are the C++ layer's to check.
        window_left, window_right = _window(window_size)
        slopes = alibi_slopes.tolist() if hasattr(alibi_slopes, "tolist") else alibi_slopes  # tensors, arrays
        sinks = sinks.tolist() if hasattr(sinks, "tolist") else sinks
        # (base, layout, rotary_dim), as the C++ layer applies them; the backward's formula
        # (sdpa/_layer_autograd.py) rotates with the same.
        self._rope = None if rope is None else (_real("rope.base", rope.get("base", 10000.0)),
                                                _string("rope.layout", rope.get("layout", "half_split")),
                                                _integer("rope.rotary_dim", rope.get("rotary_dim", 0)))
        rope_base, rope_layout, rotary_dim = self._rope or (None, "half_split", 0)
        self._core = _core.MultiHeadAttention(
            embed_dim=_integer("embed_dim", embed_dim), num_heads=_integer("num_heads", num_heads),
            num_kv_heads=_integer("num_kv_heads", num_kv_heads or 0), head_dim=_integer("head_dim", head_dim or 0),
            kdim=_integer("kdim", kdim or 0), vdim=_integer("vdim", vdim or 0), bias=bool(bias),
            dropout=_real("dropout", dropout), rope_base=rope_base, rope_layout=rope_layout, rotary_dim=rotary_dim,
            dtype=_dtype_name(dtype), init=_string("init", init),
            seed=_seed_value("seed", seed), window_left=window_left, window_right=window_right,
            alibi_slopes=[] if slopes is None else _reals("alibi_slopes", slopes), softcap=_real("softcap", softcap),
            sinks=[] if sinks is None else _reals("sinks", sinks))
        self._torch_parameters = None  # the weights as torch tensors, for the backward; made on demand
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
        Keyword arguments (e.g. rope=...) are passed to the constructor. The layer's dtype is
        the module's, float32 for a float16 or bfloat16 module (the layer computes in float32
        or float64; float32 is what the library accumulates those in); dtype= overrides it."""
        if module.bias_k is not None or module.add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn: not supported by sdpa.MultiheadAttention")
        weight_dtype = str(module.out_proj.weight.dtype).replace("torch.", "")
        layer = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=module.in_proj_bias is not None,
                    kdim=module.kdim, vdim=module.vdim, batch_first=module.batch_first,
                    dtype=kwargs.pop("dtype", weight_dtype if weight_dtype in _DTYPES else "float32"), **kwargs)
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
        out_proj.weight, out_proj.bias); torch tensors or arrays of any float dtype (bfloat16
        and float16 checkpoints included), converted to the layer's."""
        self._core.load_state_dict({str(k): _state_dict_entry(str(k), v) for k, v in state_dict.items()})
        self._torch_parameters = None

    def state_dict(self) -> dict:
        """The parameters under sdpa's names, as NumPy arrays (copies)."""
        return {name: self._core.parameter(name) for name in self._core.parameter_names()}

    def save_safetensors(self, path, metadata=None):
        self._core.save_safetensors(str(path), dict(metadata or {}))

    def load_safetensors(self, path, prefix=""):
        self._core.load_safetensors(str(path), _string("prefix", prefix))
        self._torch_parameters = None

    # ---- modes ----------------------------------------------------------------------

    def train(self, mode: bool = True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def make_cache(self, batch: int, capacity: int = 0, dtype=None) -> KVCache:
        """A KV cache for `batch` sequences, for decoding a token (or a chunk) per call.

        dtype: None (the layer's) or int8 ("int8", torch.int8 or np.int8): a quantized cache
        that stores each appended key and value row as int8 with a float32 scale per token
        and head (sdpa.quantize_kv), a quarter of float32's bytes; the attention reads it
        directly. Inference only, like any cache."""
        name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", str(dtype))  # np.int8, torch.int8
        if dtype is not None and name.rsplit(".", 1)[-1] != "int8":
            raise TypeError(f"dtype: expected None (the layer's) or int8, got {dtype!r}")
        return KVCache(self._core.make_cache(_integer("batch", batch), _integer("capacity", capacity),
                                             dtype is not None))

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

        With torch inputs that require grad the output is differentiable (need_weights=False,
        no cache; see the class).
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
            # (N·num_heads, L, S) as (N, num_heads, L, S); any other shape is the C++
            # layer's to refuse (it must broadcast to (N, num_heads, L, S)).
            if mask.ndim == 3 and batched and mask.shape[0] == query.shape[0] * self.num_heads:
                mask = mask.reshape(query.shape[0], self.num_heads, mask.shape[-2], mask.shape[-1])
        padding = None if key_padding_mask is None else fw.prepare("key_padding_mask", key_padding_mask)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected a KVCache from make_cache, got {type(cache).__name__}")

        causal = "top_left" if is_causal else "none"
        dropout_p = self.dropout if self.training else 0.0
        dropout_seed = _seed(fw, seed, dropout_p)
        position_offset = _integer("position_offset", position_offset)
        num_threads = _integer("num_threads", num_threads, low=-_INT32_END, end=_INT32_END)

        def run(query, key, value, mask, padding):
            """The C++ layer: it checks every argument before any work."""
            return self._core.forward(query, key, value, mask, padding, causal, bool(need_weights), self.training,
                                      dropout_seed, position_offset, None if cache is None else cache._core,
                                      num_threads)

        weights = None
        if torch_in and fw.torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (query, key, value, mask, padding)):
            output = self._differentiable(run, query, key, value, mask, padding, need_weights=bool(need_weights),
                                          cache=cache, causal=causal, dropout_p=dropout_p, seed=dropout_seed,
                                          position_offset=position_offset)
        else:
            output, weights = run(query, key, value, mask, padding)
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

    def _differentiable(self, run, query, key, value, mask, padding, *, need_weights, cache, causal, dropout_p, seed,
                        position_offset):
        """The output of `run` (the C++ layer), attached to autograd (sdpa/_layer_autograd.py)."""
        if need_weights:
            raise NotImplementedError("need_weights: the attention weights are not differentiable; pass "
                                      "need_weights=False when a gradient is wanted, or ask for the weights in a "
                                      "separate call under torch.no_grad()")
        if cache is not None:
            raise NotImplementedError("cache: decoding with a KV cache has no backward; call it under "
                                      "torch.no_grad() or torch.inference_mode()")
        from . import _layer_autograd

        if self._torch_parameters is None:
            self._torch_parameters = _layer_autograd.parameters(self._core)
        formula = _layer_autograd.layer_formula(self._torch_parameters, self._core.config(), self._rope,
                                                causal=causal, dropout_p=dropout_p, seed=seed,
                                                position_offset=position_offset)
        return _layer_autograd.apply(run, formula, query, key, value, mask, padding)

    def __repr__(self):
        return (f"sdpa.MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"batch_first={self.batch_first}, rope={self.rope})")
