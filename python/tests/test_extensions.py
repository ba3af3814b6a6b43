"""FlashAttention's extensions in the Python package (issue #7): the sliding window
(window_size, alignment), ALiBi (alibi_slopes), logit softcapping (softcap), packed
variable-length batches (sdpa.varlen_attention) and the paged KV cache
(sdpa.paged_attention).

The reference is oracle.extended_attention: options.h's formula written out literally in
float64 torch, differentiated by torch.autograd. Tolerances are DESIGN.md §4's
(oracle.check_close, test_backward.check_gradient); for bfloat16 and float16 the naive
implementation is the same formula computed in that dtype.

  * forward conformance by hypothesis (every dtype, torch and NumPy, GQA, masks, both
    causal alignments, windows, slopes (Hq,) and (batch, Hq), softcap, lse);
  * gradients by hypothesis (float64, float32) and torch.autograd.gradcheck (float64);
  * varlen: each packed sequence equals attention on it alone (outputs, lse, gradients),
    and dropout draws as batch element b of the padded call;
  * paged: equal to attention against the same keys held contiguously, both page layouts,
    pages shuffled, block-table entries past a sequence's end never read;
  * errors name the Python argument; torch.compile and opcheck for the new custom ops.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sdpa
from conftest import examples
from sdpa import _autograd, _options
from test_backward import check_gradient, gradients, leaf
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
    return Extended(lib, dtype, draw(st.integers(1, 2)), heads_q, heads_kv, L, S, E, Ev, causal, alignment, window,
                    slopes, slopes_dtype, softcap, scale, mask, draw(st.integers(0, 2**32 - 1)))


def slopes_for(batch, heads_q, kind, dtype=F64, seed=0):
    """ALiBi's geometric slopes 2^(-8 h / Hq), perturbed per batch element for (batch, Hq)."""
    if kind is None:
        return None
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads_q) for h in range(heads_q)], dtype=F64)
    if kind == "batch":
        g = torch.Generator().manual_seed(seed)
        base = base * (0.5 + torch.rand(batch, heads_q, generator=g, dtype=F64))
    return base.to(dtype)


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
    """The keyword arguments of the oracle for `cfg`."""
    return dict(scale=cfg.scale, causal=cfg.causal, window=cfg.window, alignment=cfg.alignment,
                softcap=cfg.softcap)


def keywords_of(cfg: Extended, slopes):
    """The keyword arguments of sdpa.attention for `cfg`."""
    return dict(scale=cfg.scale, causal=cfg.causal, window_size=cfg.window, alignment=cfg.alignment,
                alibi_slopes=slopes, softcap=cfg.softcap)


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
    dead = torch.isneginf(lse)
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


# --- forward conformance ---------------------------------------------------------------------

@settings(max_examples=examples(120))
@given(cfg=extended_configs("torch"), return_lse=st.booleans())
def test_attention_window_alibi_softcap_match_the_oracle(cfg, return_lse):
    oracle.count_example("extensions: attention (window, ALiBi, softcap)")
    q, k, v, mask, slopes = make_extended(cfg)
    result = sdpa.attention(q, k, v, mask, return_lse=return_lse, **keywords_of(cfg, slopes))
    ours = result[0] if return_lse else result
    _, lse = check_output("extensions output", cfg.dtype, ours, q, k, v, mask, slopes, **options_of(cfg))
    assert isinstance(ours, torch.Tensor) and ours.dtype == cfg.dtype
    if return_lse:
        check_lse(result[1], lse, cfg.dtype)


@settings(max_examples=examples(60))
@given(cfg=extended_configs("numpy"))
def test_numpy_window_alibi_softcap_match_the_oracle(cfg):
    oracle.count_example("extensions: attention on NumPy arrays")
    q, k, v, mask, slopes = make_extended(cfg)
    ours = sdpa.attention(q, k, v, mask, **keywords_of(cfg, slopes))
    assert isinstance(ours, np.ndarray) and ours.dtype == NUMPY_DTYPES[cfg.dtype]
    check_output("extensions output", cfg.dtype, ours, q, k, v, mask, slopes, **options_of(cfg))


@settings(max_examples=examples(40))
@given(cfg=extended_configs("torch", masks=False))
def test_scaled_dot_product_attention_takes_the_extensions(cfg):
    """The drop-in's keywords: is_causal is top-left, so the causal configurations become
    top-left ones; alignment None without is_causal is bottom-right."""
    oracle.count_example("extensions: scaled_dot_product_attention")
    causal = "top_left" if cfg.causal else None
    cfg = dataclasses.replace(cfg, causal=causal, alignment=causal if cfg.alignment and causal else cfg.alignment)
    q, k, v, _, slopes = make_extended(cfg)
    ours = sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal is not None, scale=cfg.scale,
                                             enable_gqa=cfg.heads_q != cfg.heads_kv, window_size=cfg.window,
                                             alignment=cfg.alignment, alibi_slopes=slopes, softcap=cfg.softcap)
    check_output("extensions output", cfg.dtype, ours, q, k, v, None, slopes, **options_of(cfg))


def test_window_is_flashattentions_band():
    """window_size=(left, right) with L == S keeps i - left <= j <= i + right, read off the
    weights; (-1, -1) is no window; causal caps the right side at 0."""
    q, k, v = (torch.randn(1, 1, 9, 4, dtype=F64) for _ in range(3))
    with torch.no_grad():
        _, weights = sdpa.attention(q, k, v, window_size=(2, 1), return_weights=True)
        i, j = torch.arange(9).unsqueeze(1), torch.arange(9).unsqueeze(0)
        assert torch.equal(weights[0, 0] != 0, (j >= i - 2) & (j <= i + 1))
        _, weights = sdpa.attention(q, k, v, window_size=(-1, -1), return_weights=True)
        assert (weights != 0).all()
        _, weights = sdpa.attention(q, k, v, window_size=(3, 5), causal="top_left", return_weights=True)
        assert torch.equal(weights[0, 0] != 0, (j >= i - 3) & (j <= i))


def test_alignment_defaults_to_bottom_right_without_causal():
    """L < S: the window is centred on d(i) = i + S - L unless told top_left."""
    q, k, v = torch.randn(1, 1, 3, 4, dtype=F64), torch.randn(1, 1, 8, 4, dtype=F64), torch.randn(1, 1, 8, 2, dtype=F64)
    i, j = torch.arange(3).unsqueeze(1), torch.arange(8).unsqueeze(0)
    _, weights = sdpa.attention(q, k, v, window_size=(1, 0), return_weights=True)
    assert torch.equal(weights[0, 0] != 0, (j >= i + 5 - 1) & (j <= i + 5))
    _, weights = sdpa.attention(q, k, v, window_size=(1, 0), alignment="top_left", return_weights=True)
    assert torch.equal(weights[0, 0] != 0, (j >= i - 1) & (j <= i))


def test_softcap_bounds_the_scores():
    """With softcap c every score lies in (-c, c): at c = 1e-3 the weights are uniform to
    within e^(2c) whatever the logits."""
    q, k, v = torch.randn(1, 2, 5, 8, dtype=F64) * 100, torch.randn(1, 2, 7, 8, dtype=F64), torch.randn(1, 2, 7, 3,
                                                                                                       dtype=F64)
    _, weights = sdpa.attention(q, k, v, softcap=1e-3, return_weights=True)
    assert (weights - 1 / 7).abs().max() < 1e-3


def test_alibi_slopes_accept_lists_and_numpy_with_torch_inputs():
    q, k, v = (torch.randn(2, 3, 4, 8, dtype=torch.float32) for _ in range(3))
    slopes = [0.5, 0.25, 0.125]
    a = sdpa.attention(q, k, v, alibi_slopes=slopes)
    b = sdpa.attention(q, k, v, alibi_slopes=np.array(slopes))
    c = sdpa.attention(q, k, v, alibi_slopes=torch.tensor(slopes, dtype=torch.float32))
    assert torch.equal(a, b) and torch.allclose(a, c, atol=1e-6)


# --- gradients ---------------------------------------------------------------------------------

def reference_gradients(cfg, q, k, v, mask, slopes, dout):
    inputs = [leaf(oracle.to64(t)) for t in (q, k, v)]
    float_mask = mask is not None and mask.dtype != torch.bool
    m = None if mask is None else (leaf(oracle.to64(mask)) if float_mask else mask)
    s64 = None if slopes is None else oracle.to64(slopes)
    out, _, _ = oracle.extended_attention(*inputs, m, slopes=s64, **options_of(cfg))
    return gradients(out, inputs + [m if float_mask else None], dout.to(F64))


@settings(max_examples=examples(60))
@given(cfg=extended_configs("torch", dtypes=(F64, torch.float32)))
def test_gradients_through_window_alibi_softcap_match_the_oracle(cfg):
    oracle.count_example("extensions: gradients")
    q, k, v, mask, slopes = make_extended(cfg)
    float_mask = mask is not None and mask.dtype != torch.bool
    q, k, v = leaf(q), leaf(k), leaf(v)
    if float_mask:
        mask = leaf(mask)
    if slopes is not None:
        slopes = leaf(slopes)  # constants: they get no gradient, and do not break the call
    ours = sdpa.attention(q, k, v, mask, **keywords_of(cfg, slopes))
    dout = torch.randn(ours.shape, generator=torch.Generator().manual_seed(cfg.data_seed), dtype=F64).to(cfg.dtype)
    got = gradients(ours, [q, k, v, mask if float_mask else None], dout)
    reference = reference_gradients(cfg, q, k, v, mask, slopes, dout)
    names = ["grad_query", "grad_key", "grad_value", "grad_mask"]
    for n in range(4 if float_mask else 3):
        check_gradient("extensions " + names[n], cfg.dtype, got[n], reference[n])
    if slopes is not None:
        assert slopes.grad is None


def _f64(*shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=F64, requires_grad=True)


@pytest.mark.parametrize("case", ["window", "window bottom_right", "alibi", "alibi batch", "softcap",
                                  "all top_left causal", "all bottom_right causal gqa", "all + float mask",
                                  "all + dropout"])
def test_gradcheck_window_alibi_softcap(case):
    q, k, v = _f64(2, 4, 5, 3, seed=1), _f64(2, 4, 7, 3, seed=2), _f64(2, 4, 7, 2, seed=3)
    kw = {}
    inputs = [q, k, v]
    everything = case.startswith("all")
    if case.startswith("window") or everything:
        kw["window_size"] = (2, 1)
    if case == "window bottom_right":
        kw["alignment"] = "bottom_right"
    if case.startswith("alibi") or everything:
        kw["alibi_slopes"] = (slopes_for(2, 4, "batch" if case == "alibi batch" else "heads", seed=5))
    if case == "softcap" or everything:
        kw["softcap"] = 1.5
    if "top_left causal" in case:
        kw["causal"] = "top_left"
    if "bottom_right causal" in case:
        kw["causal"] = "bottom_right"
        k, v = _f64(2, 2, 7, 3, seed=6), _f64(2, 2, 7, 2, seed=7)
        inputs = [q, k, v]
    if "float mask" in case:
        mask = _f64(5, 7, seed=8)
        with torch.no_grad():
            mask[1, 2] = -math.inf
        inputs.append(mask)
    if "dropout" in case:
        kw.update(dropout_p=0.3, seed=99)

    def f(*args):
        return sdpa.attention(args[0], args[1], args[2], args[3] if len(args) > 3 else None, scale=0.7, **kw)

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_scaled_dot_product_attention_with_extensions():
    q, k, v = _f64(1, 2, 4, 3, seed=1), _f64(1, 2, 6, 3, seed=2), _f64(1, 2, 6, 4, seed=3)

    def f(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, window_size=(1, -1),
                                                 alibi_slopes=torch.tensor([0.3, 0.7], dtype=F64), softcap=2.0)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


# --- the log-sum-exp's gradient ----------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, dict(causal="top_left", window_size=(3, 0), softcap=5.0),
                                dict(causal="bottom_right", alibi_slopes=[0.5, 0.25, 0.125, 0.0625], dropout_p=0.2,
                                     seed=3)])
def test_lse_is_differentiable(kw):
    """A loss may use the returned lse (merging partial attentions): its gradient flows,
    alone or with the output's, and equals the oracle's (torch.logsumexp's autograd)."""
    q, k, v = _f64(2, 4, 5, 3, seed=1), _f64(2, 2, 7, 3, seed=2), _f64(2, 2, 7, 4, seed=3)
    both = lambda q, k, v: sdpa.attention(q, k, v, return_lse=True, **kw)
    assert torch.autograd.gradcheck(both, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradcheck(lambda q, k, v: both(q, k, v)[1], (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)
    if "dropout_p" in kw:
        return  # the oracle has no dropout; gradcheck above covers it
    g = torch.randn(2, 4, 5, dtype=F64, generator=torch.Generator().manual_seed(4))
    slopes = None if "alibi_slopes" not in kw else torch.tensor(kw["alibi_slopes"], dtype=F64)
    _, _, want_lse = oracle.extended_attention(q, k, v, causal=kw.get("causal"), window=kw.get("window_size", (-1, -1)),
                                               slopes=slopes, softcap=kw.get("softcap", 0.0))
    want = torch.autograd.grad((want_lse * g).sum(), (q, k, v), allow_unused=True)  # lse does not read V
    got = torch.autograd.grad((both(q, k, v)[1] * g).sum(), (q, k, v))
    for a, b in zip(got, want):
        assert (a - (torch.zeros_like(a) if b is None else b)).abs().max() < 1e-12


def test_varlen_lse_is_differentiable():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    q, k, v = _f64(5, 4, 3, seed=1), _f64(5, 2, 3, seed=2), _f64(5, 2, 3, seed=3)
    f = lambda q, k, v: sdpa.varlen_attention(q, k, v, cu, cu, causal="bottom_right", return_lse=True)
    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


# --- varlen ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Varlen:
    lib: str
    dtype: torch.dtype
    lengths_q: tuple
    lengths_k: tuple
    heads_q: int
    heads_kv: int
    E: int
    Ev: int
    causal: str | None
    window: tuple
    slopes: str | None
    softcap: float
    scale: float | None
    cu_kind: str  # "int32", "int64", "list"
    data_seed: int

    @property
    def batch(self):
        return len(self.lengths_q)


@st.composite
def varlen_configs(draw, lib="torch", dtypes=None):
    dtypes = dtypes or (TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES))
    batch = draw(st.integers(1, 4))
    length = st.one_of(st.integers(0, 12), st.sampled_from([1, 17, 33]))
    lengths_q = tuple(draw(length) for _ in range(batch))
    same = draw(st.booleans())
    lengths_k = lengths_q if same else tuple(draw(length) for _ in range(batch))
    heads_kv = draw(st.integers(1, 2))
    heads_q = heads_kv * draw(st.sampled_from([1, 2, 3]))
    E = draw(st.sampled_from([1, 4, 8, 16]))
    Ev = draw(st.one_of(st.just(E), st.just(3)))
    factor = draw(st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False)))
    return Varlen(lib, draw(st.sampled_from(dtypes)), lengths_q, lengths_k, heads_q, heads_kv, E, Ev,
                  draw(st.sampled_from([None, "top_left", "bottom_right"])), (draw(SIDE), draw(SIDE)),
                  draw(st.sampled_from([None, "heads", "batch"])), draw(st.sampled_from([0.0, 0.0, 3.0])),
                  None if factor is None else factor / math.sqrt(E),
                  draw(st.sampled_from(["int32", "int64", "list"])), draw(st.integers(0, 2**32 - 1)))


def cumulative(lengths, kind, lib):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    if kind == "list":
        return cu
    if lib == "torch":
        return torch.tensor(cu, dtype=torch.int32 if kind == "int32" else torch.int64)
    return np.array(cu, dtype=np.int32 if kind == "int32" else np.int64)


def make_varlen(cfg: Varlen):
    """Packed (total, H, E) inputs in cfg's dtype and framework."""
    g = torch.Generator().manual_seed(cfg.data_seed)
    tq, tk = sum(cfg.lengths_q), sum(cfg.lengths_k)
    q = torch.randn(tq, cfg.heads_q, cfg.E, generator=g, dtype=F64)
    k = torch.randn(tk, cfg.heads_kv, cfg.E, generator=g, dtype=F64)
    v = torch.randn(tk, cfg.heads_kv, cfg.Ev, generator=g, dtype=F64)
    slopes = slopes_for(cfg.batch, cfg.heads_q, cfg.slopes, seed=cfg.data_seed)
    return tuple(convert(t, cfg.dtype, cfg.lib) for t in (q, k, v)) + (
        None if slopes is None else convert(slopes, F64, cfg.lib),)


def sequences(cfg: Varlen, x, lengths):
    """Sequence b of a packed (total, H, E) tensor as (1, H, n_b, E)."""
    out, start = [], 0
    for n in lengths:
        out.append(oracle.to_torch(x)[start:start + n].transpose(0, 1).unsqueeze(0))
        start += n
    return out


def varlen_keywords(cfg: Varlen, slopes):
    return dict(scale=cfg.scale, causal=cfg.causal, window_size=cfg.window, alibi_slopes=slopes,
                softcap=cfg.softcap)


def slopes_of_sequence(slopes, b):
    if slopes is None:
        return None
    s = oracle.to64(slopes)
    return s if s.ndim == 1 else s[b]


@settings(max_examples=examples(80))
@given(cfg=varlen_configs("torch"), return_lse=st.booleans())
def test_varlen_equals_each_sequence_alone(cfg, return_lse):
    """Each packed sequence against the oracle on that sequence by itself: causal
    alignment, window and ALiBi distances counted within the sequence."""
    oracle.count_example("extensions: varlen_attention")
    run_varlen(cfg, return_lse)


@settings(max_examples=examples(30))
@given(cfg=varlen_configs("numpy"))
def test_varlen_on_numpy_equals_each_sequence_alone(cfg):
    oracle.count_example("extensions: varlen_attention on NumPy arrays")
    run_varlen(cfg, False)


def run_varlen(cfg, return_lse):
    q, k, v, slopes = make_varlen(cfg)
    cu_q, cu_k = cumulative(cfg.lengths_q, cfg.cu_kind, cfg.lib), cumulative(cfg.lengths_k, cfg.cu_kind, cfg.lib)
    result = sdpa.varlen_attention(q, k, v, cu_q, cu_k, return_lse=return_lse, **varlen_keywords(cfg, slopes))
    ours = result[0] if return_lse else result
    assert tuple(ours.shape) == (sum(cfg.lengths_q), cfg.heads_q, cfg.Ev)
    if cfg.lib == "torch":
        assert isinstance(ours, torch.Tensor) and ours.dtype == cfg.dtype
    else:
        assert isinstance(ours, np.ndarray) and ours.dtype == NUMPY_DTYPES[cfg.dtype]
    seen = sdpa._core.last_call()
    for name, t in (("query", q), ("key", k), ("value", v), ("output", ours)):
        if math.prod(t.shape) > 0:
            assert seen[name] == oracle.data_pointer(t), f"{name} was copied"
    options = dict(scale=cfg.scale, causal=cfg.causal, window=cfg.window, softcap=cfg.softcap)
    parts_q, parts_k, parts_v = (sequences(cfg, t, n) for t, n in ((q, cfg.lengths_q), (k, cfg.lengths_k),
                                                                  (v, cfg.lengths_k)))
    parts_out = sequences(cfg, ours, cfg.lengths_q)
    lse_parts = []
    for b in range(cfg.batch):
        _, lse = check_output("varlen output", cfg.dtype, parts_out[b], parts_q[b], parts_k[b], parts_v[b], None,
                              slopes_of_sequence(slopes, b), **options)
        lse_parts.append(lse[0])
    if return_lse:
        assert tuple(result[1].shape) == (cfg.heads_q, sum(cfg.lengths_q))
        check_lse(result[1], torch.cat(lse_parts, dim=-1), cfg.dtype)


@settings(max_examples=examples(40))
@given(cfg=varlen_configs("torch", dtypes=(F64, torch.float32)))
def test_varlen_gradients_equal_each_sequences_gradients(cfg):
    oracle.count_example("extensions: varlen gradients")
    q, k, v, slopes = make_varlen(cfg)
    q, k, v = leaf(q), leaf(k), leaf(v)
    cu_q, cu_k = cumulative(cfg.lengths_q, cfg.cu_kind, "torch"), cumulative(cfg.lengths_k, cfg.cu_kind, "torch")
    ours = sdpa.varlen_attention(q, k, v, cu_q, cu_k, **varlen_keywords(cfg, slopes))
    assert ours.requires_grad or ours.numel() == 0 or not (q.requires_grad or k.requires_grad)
    dout = torch.randn(ours.shape, generator=torch.Generator().manual_seed(cfg.data_seed), dtype=F64).to(cfg.dtype)
    got = gradients(ours, [q, k, v], dout)

    # The reference: each sequence alone through the float64 oracle, gradients packed back.
    q64, k64, v64 = (leaf(oracle.to64(t)) for t in (q, k, v))
    options = dict(scale=cfg.scale, causal=cfg.causal, window=cfg.window, softcap=cfg.softcap)
    outs = []
    parts_q, parts_k, parts_v = (sequences(cfg, t, n) for t, n in ((q64, cfg.lengths_q), (k64, cfg.lengths_k),
                                                                  (v64, cfg.lengths_k)))
    for b in range(cfg.batch):
        out, _, _ = oracle.extended_attention(parts_q[b], parts_k[b], parts_v[b], slopes=slopes_of_sequence(slopes, b),
                                              **options)
        outs.append(out[0].transpose(0, 1))
    reference = gradients(torch.cat(outs, dim=0), [q64, k64, v64], dout.to(F64))
    for name, a, b in zip(("grad_query", "grad_key", "grad_value"), got, reference):
        check_gradient("varlen " + name, cfg.dtype, a, b)


def padded(lengths, x):
    """(batch, H, max_len, E) float64 from a packed (total, H, E), zeros past each end."""
    longest = max(lengths) if lengths else 0
    out = torch.zeros(len(lengths), x.shape[1], longest, x.shape[2], dtype=x.dtype)
    start = 0
    for b, n in enumerate(lengths):
        out[b, :, :n] = x[start:start + n].transpose(0, 1)
        start += n
    return out


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)])
def test_varlen_dropout_draws_as_the_padded_batch(heads):
    """Sequence b draws its dropout mask as batch element b of a padded (batch, Hq, L, S)
    call (options.h), so varlen equals the padded call with the padding keys masked off,
    outputs and gradients."""
    heads_q, heads_kv = heads
    lengths_q, lengths_k = (3, 0, 7, 5), (4, 2, 7, 9)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lengths_q), heads_q, 8, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(sum(lengths_k), heads_kv, 8, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(sum(lengths_k), heads_kv, 5, generator=g, dtype=F64, requires_grad=True)
    cu_q, cu_k = cumulative(lengths_q, "int64", "torch"), cumulative(lengths_k, "int32", "torch")
    ours = sdpa.varlen_attention(q, k, v, cu_q, cu_k, dropout_p=0.4, seed=2024)
    dout = torch.randn(ours.shape, generator=g, dtype=F64)
    got = torch.autograd.grad(ours, (q, k, v), dout)

    qp, kp, vp = (leaf(padded(n, t.detach())) for t, n in ((q, lengths_q), (k, lengths_k), (v, lengths_k)))
    keys = torch.arange(max(lengths_k)).unsqueeze(0) < torch.tensor(lengths_k).unsqueeze(1)
    padded_out = sdpa.attention(qp, kp, vp, keys[:, None, None, :], dropout_p=0.4, seed=2024)
    mine = torch.cat([padded_out[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths_q)])
    assert (mine - ours).abs().max() < 1e-12
    dpad = torch.autograd.grad(mine, (qp, kp, vp), dout)
    for a, b, n in zip(got, dpad, (lengths_q, lengths_k, lengths_k)):
        packed_back = torch.cat([b[i, :, :m].transpose(0, 1) for i, m in enumerate(n)])
        assert (a - packed_back).abs().max() < 1e-12


def test_gradcheck_varlen():
    lengths_q, lengths_k = (2, 0, 3), (3, 1, 4)
    q, k, v = _f64(5, 4, 3, seed=1), _f64(8, 2, 3, seed=2), _f64(8, 2, 2, seed=3)
    cu_q, cu_k = cumulative(lengths_q, "int32", "torch"), cumulative(lengths_k, "int64", "torch")
    slopes = slopes_for(3, 4, "batch", seed=4)

    def f(q, k, v):
        return sdpa.varlen_attention(q, k, v, cu_q, cu_k, causal="bottom_right", window_size=(1, -1),
                                     alibi_slopes=slopes, softcap=2.0, scale=0.8)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_varlen_reads_flashattentions_packed_buffers_in_place():
    """A (total, 3·H, E) qkv projection sliced into q, k and v: strided views, read where
    they lie."""
    qkv = torch.randn(11, 3 * 2, 8)
    q, k, v = qkv[:, 0:2], qkv[:, 2:4], qkv[:, 4:6]
    out = sdpa.varlen_attention(q, k, v, [0, 4, 11], [0, 4, 11], causal="top_left")
    seen = sdpa._core.last_call()
    assert seen["query"] == q.data_ptr() and seen["key"] == k.data_ptr() and seen["value"] == v.data_ptr()
    first = sdpa.attention(q[:4].transpose(0, 1), k[:4].transpose(0, 1), v[:4].transpose(0, 1), causal="top_left")
    assert torch.allclose(out[:4], first.transpose(0, 1), atol=1e-6)


def test_varlen_under_torch_compile_matches_eager():
    q, k, v = (torch.randn(9, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)

    def loss(q, k, v):
        out = sdpa.varlen_attention(q, k, v, cu, cu, causal="top_left", window_size=(2, 0), softcap=5.0,
                                    dropout_p=0.1, seed=3)
        return out.square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    again = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(eager, again):
        assert torch.equal(a, b)


def test_opcheck_new_custom_ops():
    q, k, v = (torch.randn(2, 4, 7, 8, requires_grad=True) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    extras = _options.Options(causal="top_left", window_left=3, window_right=0, alignment="top_left", softcap=10.0)
    torch.library.opcheck(_autograd.attention_forward, (q, k, v, None, slopes, "mask") + _options.flatten(extras))
    qp, kp, vp = (torch.randn(9, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 9])
    flat = _options.flatten(_options.Options(causal="bottom_right", dropout_p=0.2, seed=7, window_left=2))
    args = (qp, kp, vp, cu, cu, None) + flat
    torch.library.opcheck(_autograd.varlen_forward, args)
    with torch.no_grad():
        out, lse = _autograd.varlen_forward(*args)
    torch.library.opcheck(_autograd.varlen_backward, (torch.randn_like(out), qp, kp, vp, cu, cu, None, out, lse, None)
                          + flat, test_utils=("test_schema", "test_faketensor"))
    pages = torch.randn(5, 2, 4, 8)
    table, lens = torch.tensor([[3, 1], [0, 4]]), torch.tensor([6, 8])
    torch.library.opcheck(_autograd.paged_forward,
                          (torch.randn(2, 2, 1, 8), pages, pages, table, lens, None, False)
                          + _options.flatten(_options.Options()), test_utils=("test_schema", "test_faketensor"))


# --- paged KV cache -------------------------------------------------------------------------------

@dataclasses.dataclass
class Paged:
    lib: str
    dtype: torch.dtype
    seq_lens: tuple
    L: int
    page_size: int
    heads_q: int
    heads_kv: int
    E: int
    Ev: int
    layout: str
    causal: str | None
    window: tuple
    slopes: str | None
    softcap: float
    spare_blocks: int
    table_kind: str
    data_seed: int


@st.composite
def paged_configs(draw, lib="torch"):
    batch = draw(st.integers(1, 3))
    seq_lens = tuple(draw(st.one_of(st.integers(0, 40), st.sampled_from([1, 16, 17]))) for _ in range(batch))
    heads_kv = draw(st.integers(1, 2))
    E = draw(st.sampled_from([1, 8, 16]))
    return Paged(lib, draw(st.sampled_from(TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES))), seq_lens,
                 draw(st.sampled_from([1, 1, 2, 5])), draw(st.sampled_from([1, 4, 16])), heads_kv * draw(
                     st.sampled_from([1, 2, 4])), heads_kv, E, draw(st.one_of(st.just(E), st.just(4))),
                 draw(st.sampled_from(["HND", "NHD"])), draw(st.sampled_from([None, "bottom_right", "top_left"])),
                 (draw(SIDE), draw(SIDE)), draw(st.sampled_from([None, "heads", "batch"])),
                 draw(st.sampled_from([0.0, 4.0])), draw(st.integers(0, 2)),
                 draw(st.sampled_from(["int32", "int64", "list"])), draw(st.integers(0, 2**32 - 1)))


def make_paged(cfg: Paged):
    """Contiguous per-sequence K, V (float64) and the same scattered over shuffled pages."""
    g = torch.Generator().manual_seed(cfg.data_seed)
    P = cfg.page_size
    blocks = [-(-n // P) for n in cfg.seq_lens]
    per_sequence = max(blocks, default=0) + cfg.spare_blocks
    pages = sum(blocks) + 2  # two pages no sequence uses
    order = torch.randperm(pages, generator=g)
    keys = [torch.randn(cfg.heads_kv, n, cfg.E, generator=g, dtype=F64) for n in cfg.seq_lens]
    values = [torch.randn(cfg.heads_kv, n, cfg.Ev, generator=g, dtype=F64) for n in cfg.seq_lens]
    k_pages = torch.randn(pages, cfg.heads_kv, P, cfg.E, generator=g, dtype=F64) * 1e3  # garbage where unused
    v_pages = torch.randn(pages, cfg.heads_kv, P, cfg.Ev, generator=g, dtype=F64) * 1e3
    table = torch.full((len(cfg.seq_lens), per_sequence), int(pages - 1), dtype=torch.int64)
    used = 0
    for b, n in enumerate(cfg.seq_lens):
        for block in range(blocks[b]):
            page = int(order[used])
            used += 1
            table[b, block] = page
            rows = slice(block * P, min(n, (block + 1) * P))
            count = rows.stop - rows.start
            k_pages[page, :, :count] = keys[b][:, rows]
            v_pages[page, :, :count] = values[b][:, rows]
    q = torch.randn(len(cfg.seq_lens), cfg.heads_q, cfg.L, cfg.E, generator=g, dtype=F64)
    slopes = slopes_for(len(cfg.seq_lens), cfg.heads_q, cfg.slopes, seed=cfg.data_seed)
    return q, keys, values, k_pages, v_pages, table, slopes


def paged_inputs(cfg: Paged, q, k_pages, v_pages, table, slopes):
    if cfg.layout == "NHD":
        k_pages, v_pages = k_pages.transpose(1, 2).contiguous(), v_pages.transpose(1, 2).contiguous()
    q, k_pages, v_pages = (convert(t, cfg.dtype, cfg.lib) for t in (q, k_pages, v_pages))
    lens = list(cfg.seq_lens)
    if cfg.table_kind == "list":
        table = table.tolist()
    else:
        dtype = torch.int32 if cfg.table_kind == "int32" else torch.int64
        table, lens = table.to(dtype), torch.tensor(lens, dtype=dtype)
        if cfg.lib == "numpy":
            table, lens = table.numpy(), lens.numpy()
    return q, k_pages, v_pages, table, lens, None if slopes is None else convert(slopes, F64, cfg.lib)


@settings(max_examples=examples(60))
@given(cfg=paged_configs("torch"), return_lse=st.booleans())
def test_paged_equals_attention_on_contiguous_keys(cfg, return_lse):
    oracle.count_example("extensions: paged_attention")
    run_paged(cfg, return_lse)


@settings(max_examples=examples(25))
@given(cfg=paged_configs("numpy"))
def test_paged_on_numpy_equals_attention_on_contiguous_keys(cfg):
    oracle.count_example("extensions: paged_attention on NumPy arrays")
    run_paged(cfg, False)


def run_paged(cfg, return_lse):
    q64, keys, values, k_pages, v_pages, table, slopes64 = make_paged(cfg)
    q, kp, vp, table, lens, slopes = paged_inputs(cfg, q64, k_pages, v_pages, table, slopes64)
    result = sdpa.paged_attention(q, kp, vp, table, lens, layout=cfg.layout, causal=cfg.causal,
                                  window_size=cfg.window, alibi_slopes=slopes, softcap=cfg.softcap,
                                  return_lse=return_lse)
    ours = result[0] if return_lse else result
    assert tuple(ours.shape) == (len(cfg.seq_lens), cfg.heads_q, cfg.L, cfg.Ev)
    seen = sdpa._core.last_call()
    assert seen["key"] == oracle.data_pointer(kp) and seen["value"] == oracle.data_pointer(vp)
    assert seen["output"] == oracle.data_pointer(ours)
    options = dict(causal=cfg.causal, window=cfg.window, softcap=cfg.softcap)
    for b in range(len(cfg.seq_lens)):
        # The same keys held contiguously, in the same dtype (their values as given).
        k_b = convert(keys[b][None], cfg.dtype, cfg.lib)
        v_b = convert(values[b][None], cfg.dtype, cfg.lib)
        _, lse = check_output("paged output", cfg.dtype, ours[b:b + 1], q[b:b + 1], k_b, v_b, None,
                              slopes_of_sequence(slopes, b), **options)
        if return_lse:
            check_lse(result[1][b:b + 1], lse, cfg.dtype)
        if cfg.dtype == F64 and cfg.lib == "torch":  # and the library's own contiguous call
            contiguous = sdpa.attention(q[b:b + 1], k_b, v_b, causal=cfg.causal, window_size=cfg.window,
                                        alibi_slopes=slopes_of_sequence(slopes, b), softcap=cfg.softcap)
            assert (contiguous - ours[b:b + 1]).abs().max().item() <= 1e-12


def test_paged_block_table_entries_past_the_end_are_not_read():
    """Entries past a sequence's last page may hold anything (-1, huge indices): they are
    not read, so they are not refused either."""
    k_pages, v_pages = torch.randn(3, 1, 4, 8), torch.randn(3, 1, 4, 8)
    q = torch.randn(2, 2, 1, 8)
    table = torch.tensor([[2, -1, 10**9], [0, 1, -7]], dtype=torch.int64)
    out = sdpa.paged_attention(q, k_pages, v_pages, table, [3, 6])
    keys = [k_pages[2, :, :3], torch.cat([k_pages[0], k_pages[1, :, :2]], dim=-2)]
    values = [v_pages[2, :, :3], torch.cat([v_pages[0], v_pages[1, :, :2]], dim=-2)]
    for b in range(2):
        expected = sdpa.attention(q[b:b + 1], keys[b][None], values[b][None])
        assert torch.allclose(out[b:b + 1], expected, atol=1e-6)


def test_lazily_negated_integer_tables_are_read_as_their_values():
    """Issue 12: DLPack exported a torch._neg_view's memory as it is, so the library read the
    negatives of the block table and the sequence lengths (here: -1 instead of page 1)."""
    k_pages, v_pages = torch.randn(3, 1, 4, 8), torch.randn(3, 1, 4, 8)
    q = torch.randn(1, 2, 1, 8)
    table, lengths = torch.tensor([[1, 2]]), torch.tensor([6])
    expected = sdpa.paged_attention(q, k_pages, v_pages, table, lengths)
    got = sdpa.paged_attention(q, k_pages, v_pages, torch._neg_view(-table), torch._neg_view(-lengths))
    assert torch.equal(got, expected)
    packed_q, packed_kv = torch.randn(5, 2, 8), torch.randn(7, 2, 8)
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
    assert torch.equal(sdpa.varlen_attention(packed_q, packed_kv, packed_kv, torch._neg_view(-cu_q),
                                             torch._neg_view(-cu_k)),
                       sdpa.varlen_attention(packed_q, packed_kv, packed_kv, cu_q, cu_k))


def test_paged_attention_is_forward_only():
    q = torch.randn(1, 1, 1, 4, requires_grad=True)
    pages = torch.randn(2, 1, 4, 4)
    with pytest.raises(NotImplementedError, match="paged_attention: forward only"):
        sdpa.paged_attention(q, pages, pages, [[0, 1]], [5])
    with torch.no_grad():
        assert sdpa.paged_attention(q, pages, pages, [[0, 1]], [5]).shape == (1, 1, 1, 4)
    with torch.inference_mode():
        assert sdpa.paged_attention(q.detach(), pages, pages, [[0, 1]], [5]).shape == (1, 1, 1, 4)


def test_paged_under_torch_compile_matches_eager():
    q, pages = torch.randn(2, 4, 1, 8), torch.randn(6, 4, 2, 8)  # NHD: (pages, page_size, Hkv, E)
    table, lens = torch.tensor([[5, 0, 2], [1, 3, 4]], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32)

    def decode(q, pages):
        return sdpa.paged_attention(q, pages, pages, table, lens, layout="NHD", causal="bottom_right",
                                    softcap=20.0)

    compiled = torch.compile(decode, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, pages), decode(q, pages))


# --- errors -------------------------------------------------------------------------------------------

Q, K, V = (torch.randn(2, 4, 5, 8) for _ in range(3))
QP, KP, VP = torch.randn(10, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
PAGES = torch.randn(4, 2, 4, 8)

BAD_CALLS = [
    # (call, exception, what the message starts with)
    (lambda: sdpa.attention(Q, K, V, window_size=(-2, 0)), ValueError, "window_size[0]: expected >= 0, or -1"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, window_size=(0, -3)), ValueError,
     "window_size[1]: expected >= 0, or -1"),
    (lambda: sdpa.attention(Q, K, V, window_size=4), TypeError, "window_size: expected a pair (left, right)"),
    (lambda: sdpa.attention(Q, K, V, window_size=(1.5, 0)), TypeError, "window_size[0]: expected an int"),
    # Issue 12: beyond int64 these were nanobind's "incompatible function arguments".
    (lambda: sdpa.attention(Q, K, V, window_size=(2**63, 0)), ValueError,
     "window_size[0]: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0, 4, 10], [0, 5, 12], window_size=(0, -2**63 - 1)), ValueError,
     "window_size[1]: expected an integer in [-2**63, 2**63), got -9223372036854775809"),
    (lambda: sdpa.attention(Q, K, V, softcap=10**400), ValueError, "softcap: "),
    (lambda: sdpa.attention(Q, K, V, alibi_slopes=[1.0, 2.0, 10**400]), ValueError,
     "alibi_slopes: expected shape (4,)"),
    (lambda: sdpa.attention(Q, K, V, softcap=-1.0), ValueError, "softcap: expected a finite cap > 0, or 0"),
    (lambda: sdpa.attention(Q, K, V, softcap=math.inf), ValueError,
     "softcap: expected a number finite in float32, the compute dtype of float32 inputs"),
    (lambda: sdpa.attention(Q, K, V, softcap="30"), TypeError, "softcap: expected a float"),
    (lambda: sdpa.attention(Q, K, V, alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes: expected shape (4,)"),
    (lambda: sdpa.attention(Q, K, V, alibi_slopes=torch.ones(4, dtype=torch.float16)), TypeError,
     "alibi_slopes: expected float32 or float64"),
    (lambda: sdpa.attention(Q.numpy(), K.numpy(), V.numpy(), alibi_slopes=torch.ones(4)), TypeError,
     "alibi_slopes: expected a NumPy array like the query"),
    (lambda: sdpa.attention(Q, K, V, causal="top_left", alignment="bottom_right"), ValueError,
     "alignment: expected the causal alignment"),
    (lambda: sdpa.attention(Q, K, V, alignment="center"), ValueError,
     "alignment: expected None, 'top_left' or 'bottom_right', got 'center'"),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0, 4, 10], [0, 5, 12], causal=True), ValueError,
     "causal: expected None, 'top_left' or 'bottom_right', got True (torch's is_causal=True is 'top_left', "
     "FlashAttention's causal=True is 'bottom_right')"),
    (lambda: sdpa.varlen_attention(QP[0], KP, VP, [0, 4, 10], [0, 5, 12]), ValueError,
     "query: expected rank 3 (total_q, Hq, E), got shape (4, 8)"),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0, 4, 11], [0, 5, 12]), ValueError, "cu_seqlens_q: "),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0, 4, 10], [0, 6, 5, 12]), ValueError, "cu_seqlens_k: "),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0.0, 4.0, 10.0], [0, 5, 12]), TypeError,
     "cu_seqlens_q: expected int32 or int64, got float64"),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [[0, 4, 10]], [0, 5, 12]), ValueError,
     "cu_seqlens_q: expected 1 dim, got shape (1, 3)"),
    (lambda: sdpa.varlen_attention(QP, KP, VP, [0, 4, 10], [0, 5, 12], alibi_slopes=torch.ones(3, 4)), ValueError,
     "alibi_slopes: "),
    (lambda: sdpa.varlen_attention(QP, KP[:, :, :4], VP, [0, 4, 10], [0, 5, 12]), ValueError, "key: "),
    (lambda: sdpa.varlen_attention(QP, KP, VP[:11], [0, 4, 10], [0, 5, 12]), ValueError,
     "value: expected (12, 2, Ev) like the key, got shape (11, 2, 8)"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES.transpose(1, 2), PAGES.transpose(1, 2)[:, :, :1],
                                  [[0, 1], [2, 3]], [3, 5], layout="NHD"), ValueError,
     "value_pages: expected (4, 4, 2, Ev) like key_pages, got shape (4, 4, 1, 8)"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [[0, 1], [2, 3]], [8, 9]), ValueError, "seq_lens"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [[0, 9], [2, 3]], [8, 5]), ValueError,
     "block_table"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [0, 1, 2, 3], [3, 5]), ValueError,
     "block_table: expected 2 dims, got shape (4,)"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [[0, 1], [2, 3]], [3, 5, 1]), ValueError,
     "seq_lens"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES[..., :4], PAGES, [[0, 1], [2, 3]], [3, 5]), ValueError,
     "key_pages"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [[0, 1], [2, 3]], [3, 5], layout="HDN"), ValueError,
     "layout: expected 'HND' or 'NHD', got 'HDN'"),
    (lambda: sdpa.paged_attention(Q[0], PAGES, PAGES, [[0, 1], [2, 3]], [3, 5]), ValueError,
     "query: expected rank 4 (batch, Hq, L, E), got shape (4, 5, 8)"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES[0], PAGES, [[0, 1], [2, 3]], [3, 5], layout="NHD"),
     ValueError, "key_pages: expected rank 4 (pages, page_size, Hkv, E), got shape (2, 4, 8)"),
    (lambda: sdpa.paged_attention(Q[:, :, :1], PAGES, PAGES, [[0, 1], [2, 3]], torch.tensor([3.0, 5.0])), TypeError,
     "seq_lens: expected int32 or int64, got float32"),
]


@pytest.mark.parametrize("call,exception,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_bad_input_names_the_python_argument(call, exception, message):
    with pytest.raises(exception) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)
