"""Random configurations with the score modifiers (window_size, alignment, alibi_slopes,
softcap, sinks) and the checks against oracle.extended_attention (options.h's formula written out
literally in float64 torch) with DESIGN.md §4's tolerances: shared by the forward
(test_modifiers.py), autograd (test_backward.py), varlen (test_varlen.py) and paged
(test_paged.py) tests."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

import oracle
from test_conformance import NUMPY_DTYPES, TORCH_DTYPES

F64 = torch.float64


# --- configurations ----------------------------------------------------------------------

@dataclasses.dataclass
class Extended:
    lib: str
    dtype: torch.dtype
    batch: int
    heads_q: int
    heads_kv: int
    L: int
    S: int
    E: int
    Ev: int
    causal: str | None
    alignment: str | None
    window: tuple
    slopes: str | None  # None, "heads" (Hq,), "batch" (batch, Hq)
    slopes_dtype: torch.dtype
    softcap: float
    scale: float | None
    mask: str | None  # None, "bool", "float"
    data_seed: int
    sinks: str | None = None  # None, "heads" (Hq,), "batch" (batch, Hq); in slopes_dtype


SIDE = st.sampled_from([-1, -1, 0, 1, 2, 5, 17])


@st.composite
def extended_configs(draw, lib="torch", dtypes=None, masks=True):
    dtypes = dtypes or (TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES))
    dtype = draw(st.sampled_from(dtypes))
    heads_kv = draw(st.integers(1, 3))
    heads_q = heads_kv * draw(st.sampled_from([1, 1, 2, 3]))
    L = draw(st.one_of(st.integers(1, 20), st.sampled_from([0, 1, 33, 64])))
    S = draw(st.one_of(st.integers(1, 20), st.sampled_from([0, 1, 33, 65])))
    E = draw(st.sampled_from([1, 3, 8, 16, 40]))
    Ev = draw(st.one_of(st.just(E), st.sampled_from([2, 8])))
    causal = draw(st.sampled_from([None, None, "top_left", "bottom_right"]))
    # alignment: None, or the causal one (the only one allowed with causal), or either.
    alignment = draw(st.sampled_from([None, causal] if causal else [None, "top_left", "bottom_right"]))
    window = (draw(SIDE), draw(SIDE))
    slopes = draw(st.sampled_from([None, "heads", "batch"]))
    slopes_dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    softcap = draw(st.sampled_from([0.0, 0.0, 1.0, 5.0, 30.0]))
    factor = draw(st.one_of(st.none(), st.floats(-2.5, 2.5, allow_nan=False)))
    scale = None if factor is None else factor / math.sqrt(E)
    mask = draw(st.sampled_from([None, None, "bool", "float"])) if masks else None
    sinks = draw(st.sampled_from([None, None, "heads", "batch"]))
    return Extended(lib, dtype, draw(st.integers(1, 2)), heads_q, heads_kv, L, S, E, Ev, causal, alignment, window,
                    slopes, slopes_dtype, softcap, scale, mask, draw(st.integers(0, 2**32 - 1)), sinks)


def slopes_for(batch, heads_q, kind, dtype=F64, seed=0):
    """ALiBi's geometric slopes 2^(-8 h / Hq), perturbed per batch element for (batch, Hq)."""
    if kind is None:
        return None
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads_q) for h in range(heads_q)], dtype=F64)
    if kind == "batch":
        g = torch.Generator().manual_seed(seed)
        base = base * (0.5 + torch.rand(batch, heads_q, generator=g, dtype=F64))
    return base.to(dtype)


def sinks_for(cfg: Extended):
    """cfg's attention sinks as float64 torch: logits in [-1, 2], where a sink takes a fair
    share of a row, (Hq,) or (batch, Hq); with (batch, Hq) the last head of the last batch
    element is -inf (no sink). None without sinks."""
    if cfg.sinks is None:
        return None
    g = torch.Generator().manual_seed(cfg.data_seed + 1)
    shape = (cfg.heads_q,) if cfg.sinks == "heads" else (cfg.batch, cfg.heads_q)
    sinks = -1.0 + 3.0 * torch.rand(shape, generator=g, dtype=F64)
    if cfg.sinks == "batch":
        sinks[-1, -1] = -math.inf
    return sinks


def convert(x: torch.Tensor, dtype, lib):
    """x (float64 torch) in `dtype`, as a torch tensor or a NumPy array."""
    if lib == "torch":
        return x.to(dtype)
    return x.numpy().astype(NUMPY_DTYPES[dtype] if dtype != torch.bool else np.bool_)


def make_extended(cfg: Extended):
    g = torch.Generator().manual_seed(cfg.data_seed)
    B, Hq, Hkv = cfg.batch, cfg.heads_q, cfg.heads_kv
    q = torch.randn(B, Hq, cfg.L, cfg.E, generator=g, dtype=F64)
    k = torch.randn(B, Hkv, cfg.S, cfg.E, generator=g, dtype=F64)
    v = torch.randn(B, Hkv, cfg.S, cfg.Ev, generator=g, dtype=F64)
    if cfg.E > 1 and cfg.data_seed % 3 == 0:
        q = q * 4.0  # large logits, where softcap matters
    mask = None
    if cfg.mask == "bool":
        mask = torch.rand(cfg.L, cfg.S, generator=g) < 0.8
    elif cfg.mask == "float":
        mask = torch.randn(1, Hq, cfg.L, cfg.S, generator=g, dtype=F64)
        mask = mask.masked_fill(torch.rand(cfg.L, cfg.S, generator=g) < 0.1, -math.inf)
    slopes = slopes_for(B, Hq, cfg.slopes, cfg.slopes_dtype, cfg.data_seed)
    q, k, v = (convert(t, cfg.dtype, cfg.lib) for t in (q, k, v))
    if mask is not None:
        mask = convert(mask, torch.bool if cfg.mask == "bool" else cfg.dtype, cfg.lib)
    if slopes is not None:
        slopes = convert(slopes, cfg.slopes_dtype, cfg.lib)
    return q, k, v, mask, slopes


def options_of(cfg: Extended):
    """The keyword arguments of the oracle for `cfg` (its sinks in the dtype sdpa gets them)."""
    sinks = sinks_for(cfg)
    return dict(scale=cfg.scale, causal=cfg.causal, window=cfg.window, alignment=cfg.alignment,
                softcap=cfg.softcap, sinks=None if sinks is None else sinks.to(cfg.slopes_dtype).to(F64))


def keywords_of(cfg: Extended, slopes):
    """The keyword arguments of sdpa.attention for `cfg`."""
    sinks = sinks_for(cfg)
    return dict(scale=cfg.scale, causal=cfg.causal, window_size=cfg.window, alignment=cfg.alignment,
                alibi_slopes=slopes, softcap=cfg.softcap,
                sinks=None if sinks is None else convert(sinks, cfg.slopes_dtype, cfg.lib))


def check_output(what, dtype, ours, q, k, v, mask, slopes, **options):
    """ours against the float64 oracle, with DESIGN.md §4's rule (low precision: 2 × the
    naive error in the dtype, floor its first-order rounding bound)."""
    q64, k64, v64 = oracle.to64(q), oracle.to64(k), oracle.to64(v)
    mask64 = None if mask is None else oracle.to_torch(mask)
    s64 = None if slopes is None else oracle.to64(slopes)
    reference, weights, lse = oracle.extended_attention(q64, k64, v64, mask64, slopes=s64, **options)
    naive, bound = None, 0.0
    if dtype in oracle.LOW_PRECISION:
        lowmask = None if mask64 is None or mask64.dtype == torch.bool else mask64.to(dtype)
        naive, _, _ = oracle.extended_attention(*(oracle.to_torch(t).to(dtype) for t in (q, k, v)),
                                                mask64 if lowmask is None else lowmask, slopes=s64, **options)
        weighted, _, _ = oracle.extended_attention(q64, k64, v64.abs(), mask64, slopes=s64, **options)
        bound = oracle.UNIT_ROUNDOFF[dtype] * (weighted + reference.abs()).max().item() if reference.numel() else 0.0
    oracle.check_close(what, dtype, ours, reference, naive, bound)
    dead = torch.isneginf(lse) | (weights.sum(-1) == 0)  # no key: only a sink, if any
    if dead.any():
        assert (oracle.to64(ours)[dead] == 0).all(), "a row that sees no key is not 0"
    return reference, lse


def check_lse(ours, reference_lse, dtype):
    ours64 = oracle.to64(ours)
    assert tuple(ours64.shape) == tuple(reference_lse.shape)
    dead = torch.isneginf(reference_lse)
    assert torch.equal(torch.isneginf(ours64), dead), "lse is -inf exactly where a row sees no key"
    lse_dtype = F64 if dtype == F64 else torch.float32
    oracle.check_close("extensions lse", lse_dtype, ours64[~dead], reference_lse[~dead])


def slopes_of_sequence(slopes, b):
    if slopes is None:
        return None
    s = oracle.to64(slopes)
    return s if s.ndim == 1 else s[b]
