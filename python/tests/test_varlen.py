"""sdpa.varlen_attention, FlashAttention's packed variable-length batches: each packed
sequence equals attention on it alone through oracle.extended_attention (outputs, lse,
gradients, by hypothesis; torch and NumPy), dropout draws as batch element b of the padded
call, gradcheck, packed buffers read in place, torch.compile, and the custom ops' opcheck
(the modifiers' attention op and the paged op with them). Errors: test_api.py.
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
from modifiers import F64, SIDE, check_lse, check_output, convert, slopes_for, slopes_of_sequence
from sdpa import _autograd, _options
from test_backward import _f64, check_gradient, gradients, leaf
from test_conformance import NUMPY_DTYPES, TORCH_DTYPES


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
    torch.library.opcheck(_autograd.attention_forward, (q, k, v, None, slopes, None, "mask") + _options.flatten(extras))
    qp, kp, vp = (torch.randn(9, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 9])
    flat = _options.flatten(_options.Options(causal="bottom_right", dropout_p=0.2, seed=7, window_left=2))
    for sinks in (None, torch.randn(2, 2, requires_grad=True)):  # none, and (batch, Hq)
        args = (qp, kp, vp, cu, cu, None, sinks) + flat
        torch.library.opcheck(_autograd.varlen_forward, args)
        with torch.no_grad():
            out, lse = _autograd.varlen_forward(*args)
        torch.library.opcheck(_autograd.varlen_backward,
                              (torch.randn_like(out), qp, kp, vp, cu, cu, None, sinks, out, lse, None) + flat,
                              test_utils=("test_schema", "test_faketensor"))
    pages = torch.randn(5, 2, 4, 8)
    table, lens = torch.tensor([[3, 1], [0, 4]]), torch.tensor([6, 8])
    torch.library.opcheck(_autograd.paged_forward,
                          (torch.randn(2, 2, 1, 8), pages, pages, table, lens, None, torch.randn(2), False)
                          + _options.flatten(_options.Options()), test_utils=("test_schema", "test_faketensor"))
