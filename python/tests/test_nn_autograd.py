"""sdpa.MultiheadAttention's gradients with respect to its inputs (issue 12: the output
silently dropped out of autograd): against torch.nn.MultiheadAttention with the same
weights in float64, by finite differences with GQA, RoPE, the window, ALiBi, softcap and
dropout, and what it refuses to differentiate."""

import numpy as np
import pytest
import torch

import sdpa
from test_nn import LAYOUTS, TOL64, attn_mask, max_err, padding_mask, torch_layer_and_ours

def float64_gradient_tolerance(reference):
    return 1e-9 * max(1.0, reference.abs().max().item())  # test_backward.py's float64 rule


GRADIENT_CASES = [
    # (layout, mask kind, padding kind, batch_first)
    ("self", None, None, True),
    ("self", "causal_bool", "bool", False),
    ("cross", "float", "float", True),
    ("cross_kvdim", "per_head_bool", None, False),
    ("cross_kvdim", "causal_float", "float", True),
]


@pytest.mark.parametrize("layout,mask_kind,padding_kind,batch_first", GRADIENT_CASES)
def test_layer_gradients_match_torch_multihead_attention_in_float64(layout, mask_kind, padding_kind, batch_first):
    """d(output · g) with respect to query, key, value and the float masks, against torch's
    own layer with the same weights."""
    cfg = LAYOUTS[layout]
    n, heads = 3, cfg["heads"]
    ref, ours, (q, k, v) = torch_layer_and_ours(layout, batch_first, n)
    mask = attn_mask(mask_kind, n, heads, cfg["l"], cfg["s"])
    pad = padding_mask(padding_kind, n, cfg["s"])
    if layout == "self":
        k = v = q
    leaves = list({id(t): t.requires_grad_() for t in (q, k, v, mask, pad)
                   if t is not None and t.is_floating_point()}.values())
    expected, _ = ref(q, k, v, key_padding_mask=pad, attn_mask=mask, need_weights=False)
    got, weights = ours(q, k, v, key_padding_mask=pad, attn_mask=mask, need_weights=False)
    assert weights is None and got.requires_grad
    assert max_err(got, expected) <= TOL64
    g = torch.randn_like(expected)
    for ours_grad, torch_grad in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(expected, leaves, g)):
        assert ours_grad.shape == torch_grad.shape
        assert max_err(ours_grad, torch_grad) <= float64_gradient_tolerance(torch_grad)


@pytest.mark.parametrize("batched", [True, False])
def test_layer_gradcheck_with_gqa_rope_window_alibi_softcap_and_dropout(batched):
    """Finite differences of the layer (the C++ forward) against its backward (the torch
    recomputation), everything the layer adds to torch's switched on: dropout replayed from
    the seed, grouped-query heads, partial interleaved RoPE from a position offset, a
    sliding window, ALiBi, softcapping, causal, and both float masks."""
    layer = sdpa.MultiheadAttention(12, 2, num_kv_heads=1, kdim=5, vdim=7, dropout=0.3, batch_first=True,
                                    dtype="float64", rope={"layout": "interleaved", "rotary_dim": 4, "base": 100.0},
                                    window_size=(2, 1), alibi_slopes=[0.5, 0.25], softcap=3.0, seed=3)
    weights = layer.state_dict()
    layer.load_state_dict({name: w + 0.1 * np.random.default_rng(1).standard_normal(w.shape)
                           for name, w in weights.items()})  # non-zero biases
    g = torch.Generator().manual_seed(2)
    lead = (2,) if batched else ()

    def rand(*shape):
        return torch.randn(*lead, *shape, generator=g, dtype=torch.float64, requires_grad=True)

    q, k, v, pad = rand(4, 12), rand(5, 5), rand(5, 7), rand(5)
    mask = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)

    def call(q, k, v, mask, pad):
        out, _ = layer(q, k, v, attn_mask=mask, key_padding_mask=pad, is_causal=True, need_weights=False, seed=11,
                       position_offset=3)
        return out

    dropped = call(q, k, v, mask, pad)
    assert not torch.equal(dropped, layer.eval()(q, k, v, attn_mask=mask, key_padding_mask=pad, is_causal=True,
                                                 need_weights=False, position_offset=3)[0])
    layer.train()
    assert torch.autograd.gradcheck(call, (q, k, v, mask, pad), atol=1e-7)


def test_layer_gives_the_same_output_with_and_without_a_gradient():
    """The forward is the C++ layer's either way: bitwise the same output."""
    layer = sdpa.MultiheadAttention(16, 4, num_kv_heads=2, rope={}, batch_first=True, dtype="float64", seed=4,
                                    dropout=0.2)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        plain, _ = layer(x, is_causal=True, need_weights=False, seed=5)
    attached, _ = layer(x.clone().requires_grad_(), is_causal=True, need_weights=False, seed=5)
    assert attached.requires_grad and not plain.requires_grad
    assert torch.equal(attached.detach(), plain)


def test_layer_refuses_what_it_cannot_differentiate():
    """Weights and the KV cache have no backward: asked for with inputs that require grad,
    they raise instead of returning results that silently drop out of autograd. Under
    no_grad both work."""
    layer = sdpa.MultiheadAttention(16, 4, batch_first=True, dtype="float64")
    x = torch.randn(1, 3, 16, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="^need_weights: the attention weights are not differentiable"):
        layer(x)
    cache = layer.make_cache(1)
    with pytest.raises(NotImplementedError, match="^cache: decoding with a KV cache has no backward"):
        layer(x, need_weights=False, cache=cache)
    assert cache.length == 0
    with torch.no_grad():
        out, weights = layer(x, cache=cache)
    assert not out.requires_grad and weights.shape == (1, 3, 3) and cache.length == 3
