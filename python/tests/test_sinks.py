"""Attention sinks (gpt-oss; issue #17): one logit per query head that joins every row's
softmax denominator and takes no value,

    out_i = Σ_j exp(s_ij − m) v_j / (exp(sink − m) + Σ_j exp(s_ij − m)).

Checked against gpt-oss's own eager formulation (the sink appended as one more column of
logits, softmax, the column dropped), in float64 and float32; gradients by
torch.autograd.gradcheck (float64, through the output and the lse) and against autograd of
the eager formula; varlen and paged against each sequence alone; the layer's sinks; rows
that see no key; the errors. The random configurations of test_modifiers.py and
test_backward.py draw sinks too (modifiers.sinks_for)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sdpa
from test_backward import _f64, leaf

F64 = torch.float64


def eager_sinks(q, k, v, sinks, mask=None, scale=None):
    """gpt-oss's eager attention with sinks (transformers' modeling_gpt_oss, written from its
    description): logits = q kᵀ · scale + mask; append the head's sink as a last column;
    softmax over keys and sink; drop the sink's column; · v. GQA by repeating K/V."""
    if k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        logits = logits + mask
    sink = sinks.to(logits.dtype)[..., None, None].expand(logits.shape[:-1] + (1,))
    combined = torch.cat([logits, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return probs @ v, torch.logsumexp(torch.cat([logits, sink], dim=-1), dim=-1)


def _inputs(dtype, B=2, Hq=4, Hkv=2, L=6, S=9, E=8, Ev=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, E, generator=g, dtype=F64).to(dtype)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=F64).to(dtype)
    v = torch.randn(B, Hkv, S, Ev, generator=g, dtype=F64).to(dtype)
    sinks = (torch.rand(Hq, generator=g, dtype=F64) * 3 - 1).to(dtype)
    return q, k, v, sinks


@pytest.mark.parametrize("dtype,tolerance", [(F64, 1e-12), (torch.float32, 2e-6)])
def test_sinks_are_gpt_oss_eager_attention(dtype, tolerance):
    q, k, v, sinks = _inputs(dtype)
    mask = torch.zeros(6, 9, dtype=dtype).masked_fill(torch.ones(6, 9, dtype=torch.bool).triu(4), -math.inf)
    want, want_lse = eager_sinks(q, k, v, sinks, mask)
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, sinks=sinks), None
    assert torch.allclose(out, want, atol=tolerance, rtol=0)
    out, lse = sdpa.attention(q, k, v, mask, sinks=sinks, return_lse=True)
    assert torch.allclose(out, want, atol=tolerance, rtol=0)
    assert torch.allclose(lse.to(F64), want_lse.to(F64), atol=tolerance * 4, rtol=0)
    # The sink takes a share of every row: the output shrinks toward 0 by 1 - exp(sink - lse).
    plain = sdpa.attention(q, k, v, mask)
    assert not torch.allclose(out, plain, atol=1e-3)


def test_sinks_as_numpy_and_lists_give_the_torch_result():
    q, k, v, sinks = _inputs(F64, seed=1)
    want = sdpa.attention(q, k, v, sinks=sinks)
    from_list = sdpa.attention(q, k, v, sinks=sinks.tolist())
    from_numpy = sdpa.attention(q.numpy(), k.numpy(), v.numpy(), sinks=sinks.numpy())
    assert torch.equal(from_list, want)
    assert np.array_equal(from_numpy, want.numpy())


def test_rows_that_see_no_key_give_zero_and_the_sink_as_lse():
    q, k, v, sinks = _inputs(torch.float32, L=5, S=3)
    # top-left causal with L > S: rows 3 and 4 of ... see keys j <= i; window (0, 0) leaves
    # rows 3, 4 nothing (their diagonal key is past the last).
    out, lse = sdpa.attention(q, k, v, causal="top_left", window_size=(0, 0), sinks=sinks, return_lse=True)
    assert torch.equal(out[:, :, 3:], torch.zeros_like(out[:, :, 3:]))
    assert torch.allclose(lse[:, :, 3:], sinks[None, :, None].expand(2, 4, 2), atol=1e-6, rtol=0)
    assert torch.isfinite(lse).all()


def test_minus_infinity_sinks_are_no_sinks():
    q, k, v, _ = _inputs(torch.float32, seed=2)
    none = torch.full((4,), -math.inf)
    assert torch.equal(sdpa.attention(q, k, v, sinks=none), sdpa.attention(q, k, v))


@pytest.mark.parametrize("per_batch", [False, True])
def test_gradcheck_sinks_through_output_and_lse(per_batch):
    q, k, v = _f64(2, 4, 5, 3, seed=1), _f64(2, 2, 7, 3, seed=2), _f64(2, 2, 7, 2, seed=3)
    sinks = _f64(*((2, 4) if per_batch else (4,)), seed=4)

    def f(q, k, v, sinks):
        out, lse = sdpa.attention(q, k, v, causal="bottom_right", window_size=(3, 0), softcap=2.0, sinks=sinks,
                                  return_lse=True)
        return out, lse

    assert torch.autograd.gradcheck(f, (q, k, v, sinks), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_sink_gradients_match_autograd_of_the_eager_formula():
    q, k, v, sinks = (leaf(t) for t in _inputs(torch.float32, seed=5))
    out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks)
    g = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v, sinks), g)
    q64, k64, v64, s64 = (leaf(t.detach().to(F64)) for t in (q, k, v, sinks))
    want_out, _ = eager_sinks(q64, k64, v64, s64)
    want = torch.autograd.grad(want_out, (q64, k64, v64, s64), g.to(F64))
    for name, a, b in zip(("q", "k", "v", "sinks"), ours, want):
        assert torch.allclose(a.to(F64), b, atol=1e-4 * max(1.0, b.abs().max().item()), rtol=0), name
    assert ours[3].abs().max() > 1e-3  # the sinks do get a gradient


def test_varlen_sinks_equal_each_sequence_alone_with_gradients():
    lengths = [(3, 5), (0, 2), (4, 0), (6, 6)]
    g = torch.Generator().manual_seed(6)
    total_q, total_k = sum(L for L, _ in lengths), sum(S for _, S in lengths)
    q = leaf(torch.randn(total_q, 4, 8, generator=g, dtype=F64))
    k = leaf(torch.randn(total_k, 2, 8, generator=g, dtype=F64))
    v = leaf(torch.randn(total_k, 2, 3, generator=g, dtype=F64))
    sinks = leaf(torch.randn(len(lengths), 4, generator=g, dtype=F64))  # (batch, Hq)
    cu_q = torch.tensor([0] + list(np.cumsum([L for L, _ in lengths])))
    cu_k = torch.tensor([0] + list(np.cumsum([S for _, S in lengths])))
    out, lse = sdpa.varlen_attention(q, k, v, cu_q, cu_k, causal="bottom_right", sinks=sinks, return_lse=True)
    grad = torch.randn(out.shape, generator=g, dtype=F64)
    got = torch.autograd.grad((out * grad).sum() + lse.sum(), (q, k, v, sinks))
    want_sinks = torch.zeros_like(sinks)
    for b in range(len(lengths)):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        qs, ks, vs = (leaf(t[a:z].detach().transpose(0, 1)[None]) for t, a, z in ((q, q0, q1), (k, k0, k1),
                                                                               (v, k0, k1)))
        sb = leaf(sinks[b].detach())
        alone, alone_lse = sdpa.attention(qs, ks, vs, causal="bottom_right", sinks=sb, return_lse=True)
        assert torch.allclose(out[q0:q1], alone[0].transpose(0, 1), atol=1e-12, rtol=0)
        assert torch.allclose(lse[:, q0:q1], alone_lse[0], atol=1e-12, rtol=0)
        loss = (alone[0].transpose(0, 1) * grad[q0:q1]).sum() + alone_lse.sum()
        if loss.requires_grad:
            (want_sinks[b],) = torch.autograd.grad(loss, (sb,), allow_unused=True, materialize_grads=True)
    assert torch.allclose(got[3], want_sinks, atol=1e-12, rtol=0)


def test_paged_sinks_equal_the_contiguous_cache():
    g = torch.Generator().manual_seed(7)
    pages = torch.randn(6, 2, 4, 8, generator=g), torch.randn(6, 2, 4, 5, generator=g)
    table, lens = torch.tensor([[4, 1, 0], [2, 5, 3]]), torch.tensor([10, 0])
    q = torch.randn(2, 4, 1, 8, generator=g)
    sinks = torch.randn(4, generator=g)
    out, lse = sdpa.paged_attention(q, *pages, table, lens, causal="bottom_right", sinks=sinks, return_lse=True)
    keys = torch.cat([pages[0][p] for p in table[0]], dim=1)[:, :10][None]
    values = torch.cat([pages[1][p] for p in table[0]], dim=1)[:, :10][None]
    want = sdpa.attention(q[:1], keys, values, causal="bottom_right", sinks=sinks)
    assert torch.allclose(out[:1], want, atol=1e-6, rtol=0)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # no keys: only the sink
    assert torch.allclose(lse[1, :, 0], sinks, atol=1e-6, rtol=0)


def test_layer_sinks_are_the_functional_sinks():
    layer = sdpa.MultiheadAttention(16, 4, batch_first=True, num_kv_heads=2, dtype="float64", seed=3,
                                    sinks=[0.5, -1.0, 2.0, 0.0])
    plain = sdpa.MultiheadAttention(16, 4, batch_first=True, num_kv_heads=2, dtype="float64", seed=3)
    x = torch.randn(2, 7, 16, dtype=F64, generator=torch.Generator().manual_seed(8))
    with_sinks, _ = layer(x, x, x, need_weights=False, is_causal=True)
    without, _ = plain(x, x, x, need_weights=False, is_causal=True)
    assert not torch.allclose(with_sinks, without, atol=1e-6)
    # The same projections: only the attention changed, by the sinks' formula.
    q = torch.nn.functional.linear(x, torch.as_tensor(layer.state_dict()["q_proj.weight"])).unflatten(-1, (4, 4))
    k = torch.nn.functional.linear(x, torch.as_tensor(layer.state_dict()["k_proj.weight"])).unflatten(-1, (2, 4))
    v = torch.nn.functional.linear(x, torch.as_tensor(layer.state_dict()["v_proj.weight"])).unflatten(-1, (2, 4))
    attended = sdpa.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal="top_left",
                              sinks=torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64))
    want = torch.nn.functional.linear(attended.transpose(1, 2).flatten(2),
                                      torch.as_tensor(layer.state_dict()["out_proj.weight"]))
    assert torch.allclose(with_sinks, want, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"^sinks: expected one sink per query head \(4\), got 2"):
        sdpa.MultiheadAttention(16, 4, sinks=[0.5, 1.0])


@pytest.mark.parametrize("sinks,error,message", [
    (torch.zeros(3), ValueError, r"^sinks: expected shape \(4,\) or \(2, 4\), got \(3,\)"),
    (torch.zeros(4, dtype=torch.float16), TypeError, "^sinks: expected float32 or float64"),
    (torch.tensor([0.0, 1e39, 0.0, 0.0], dtype=F64), ValueError, "^sinks: expected a number finite in float32"),
    (["a", 1, 2, 3], TypeError, "^sinks"),
])
def test_bad_sinks_are_refused_naming_them(sinks, error, message):
    q, k, v, _ = _inputs(torch.float32)
    with pytest.raises(error, match=message):
        sdpa.attention(q, k, v, sinks=sinks)


def test_sinks_that_require_grad_under_no_grad_are_read_in_place():
    q, k, v, sinks = _inputs(torch.float32, seed=9)
    learned = leaf(sinks)
    with torch.no_grad():
        out = sdpa.attention(q, k, v, sinks=learned)
        varlen = sdpa.varlen_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                       [0, 6], [0, 9], sinks=learned)
    assert torch.equal(out, sdpa.attention(q, k, v, sinks=sinks))
    assert torch.equal(varlen, out[0].transpose(0, 1))
