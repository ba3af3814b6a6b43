"""Autograd: the gradients of sdpa.scaled_dot_product_attention and sdpa.attention for torch
tensors (the torch.library custom ops of sdpa/_autograd.py over the C++ backward).

  * torch.autograd.gradcheck in float64 (finite differences), masks, causal, GQA, dropout;
  * conformance with torch's SDPA on the conformance grid (test_conformance.configs: every
    rank, layout, broadcast, GQA ratio, mask shape, causal alignment, scale and dtype): the
    gradients of Q, K, V and a float mask against torch's on float64 copies, with DESIGN.md
    §4's gradient rule (float64 1e-9, float32 1e-4 relative to max(1, max|ref|); bfloat16 and
    float16 at most 3x the error of torch's own math backend computing in that dtype, floor
    1e-5);
  * dropout: the gradients are torch's math on exactly the dropout mask our forward used
    (read off the weights it returns);
  * the score modifiers (window_size, alignment, alibi_slopes, softcap): against the float64
    oracle.extended_attention's autograd by hypothesis (float64, float32) and
    torch.autograd.gradcheck, and the gradient of the returned lse;
  * torch.compile (fullgraph) and torch.library.opcheck.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sdpa
from conftest import examples
from modifiers import extended_configs, keywords_of, make_extended, options_of, slopes_for
from sdpa import _autograd, _options
from test_conformance import configs, effective_gqa, make_inputs

F64 = torch.float64


def leaf(x):
    """The same memory and strides (transposed, expanded, ...) as a leaf that wants a gradient."""
    return x.detach().requires_grad_()


def gradients(output, inputs, grad_output):
    """d(Σ output ∘ grad_output)/d input for each input (None for those that need none)."""
    wanted = [x for x in inputs if x is not None and x.requires_grad]
    got = iter(torch.autograd.grad(output, wanted, grad_output, allow_unused=True))
    grads = [next(got) if x is not None and x.requires_grad else None for x in inputs]
    # An input the output does not depend on (a mask that is -inf everywhere) has gradient 0.
    return [torch.zeros_like(x) if g is None and x is not None and x.requires_grad else g
            for g, x in zip(grads, inputs)]


UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, **oracle.UNIT_ROUNDOFF}


def check_gradient(what, dtype, ours, reference, naive=None, stored=None, rounded_output=0.0):
    """DESIGN.md §4 for gradients (docs/numerics.md, "Gradient tolerances"), for a gradient
    computed at the precision of `dtype` and stored in `stored` (default: dtype) — a float
    mask of another dtype than the query's gets its gradient in its own dtype, one more
    rounding. Low precision adds `rounded_output`, the first-order effect of O arriving in
    the dtype (rounded_output_bounds)."""
    stored = stored or dtype
    assert ours.dtype == stored and tuple(ours.shape) == tuple(reference.shape), (what, ours.dtype, ours.shape)
    error = oracle.max_error(ours, reference)
    scale = oracle.max_abs(reference)
    naive_error = None
    if dtype == torch.float64:
        tolerance = 1e-9 * max(1.0, scale)
    elif dtype == torch.float32:
        tolerance = 1e-4 * max(1.0, scale)
    else:
        naive_error = oracle.max_error(naive, reference)
        # 3x the naive error; floor 1e-5, and one rounding of the largest gradient to the
        # dtype, which any result stored in it may carry (a lucky naive run on a handful of
        # elements can round closer than that).
        tolerance = max(3.0 * naive_error, 1e-5, UNIT_ROUNDOFF[dtype] * scale) + rounded_output
    if stored != dtype:
        tolerance += UNIT_ROUNDOFF[stored] * scale
    oracle.record(f"{what} {oracle.dtype_name(stored)}", error, tolerance, naive_error)
    assert error <= tolerance, (f"{what} ({oracle.dtype_name(stored)}): max error {error:.3g} > "
                                f"tolerance {tolerance:.3g}")
    assert not torch.isnan(ours).any() or torch.isnan(reference).any(), f"{what}: NaN"


def random_like_output(q, v, seed, dtype):
    shape = tuple(q.shape[:-1]) + tuple(v.shape[-1:])
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=F64).to(dtype)


def run_gradients(cfg, api, dropout_p=0.0, seed=0):
    """Our gradients, torch's in float64, and (low precision) torch's in the dtype, for the
    inputs of `cfg` through `api` ("torch": scaled_dot_product_attention, "attention")."""
    q, k, v, mask = make_inputs(cfg)
    float_mask = mask is not None and mask.dtype != torch.bool
    q, k, v = leaf(q), leaf(k), leaf(v)
    if float_mask:
        mask = leaf(mask)
    gqa = effective_gqa(cfg)
    L, S = cfg.L, cfg.S
    is_causal = cfg.causal == "top_left"
    if api == "torch":
        ours = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=cfg.scale,
                                                 enable_gqa=cfg.enable_gqa, dropout_p=dropout_p, seed=seed)
    else:
        ours = sdpa.attention(q, k, v, mask, causal=cfg.causal, scale=cfg.scale, dropout_p=dropout_p, seed=seed)
    dout = random_like_output(q, v, cfg.data_seed, cfg.dtype)
    # torch's output shape (batch broadcasting) is ours.
    dout = dout.expand(ours.shape) if tuple(dout.shape) != tuple(ours.shape) else dout
    got = gradients(ours, [q, k, v, mask], dout)

    kept = None
    if dropout_p > 0:
        with torch.no_grad():  # the dropout mask our forward used, read off its weights
            _, weights = sdpa.attention(q, k, v, mask, causal=cfg.causal, scale=cfg.scale, dropout_p=dropout_p,
                                        seed=seed, return_weights=True)
        kept = oracle.to64(weights) != 0

    def reference_grads(dtype):
        inputs = [leaf(x.detach().to(dtype)) for x in (q, k, v)]
        m = None
        if mask is not None:
            m = leaf(mask.detach().to(dtype)) if float_mask else mask.detach()
        ref_mask = oracle.combined_mask(m, L, S, cfg.causal, dtype=dtype)
        enable_gqa = gqa or (api == "torch" and cfg.enable_gqa)
        if dtype == F64:
            out, _ = oracle.torch_math(*inputs, ref_mask, scale=cfg.scale, enable_gqa=enable_gqa,
                                       dropout_p=dropout_p, dropout_mask=kept)
        else:
            with oracle.low_precision_math():
                out, _ = oracle.torch_math(*inputs, ref_mask, scale=cfg.scale, enable_gqa=enable_gqa,
                                           dropout_p=dropout_p, dropout_mask=kept)
        return gradients(out, inputs + [m if float_mask else None], dout.detach().to(dtype)), out, ref_mask

    reference, out64, ref_mask64 = reference_grads(F64)
    naive, bounds = [None] * 4, [0.0] * 4
    if cfg.dtype in oracle.LOW_PRECISION:
        naive = reference_grads(cfg.dtype)[0]
        bounds = rounded_output_bounds(cfg, q, k, v, mask if float_mask else None, ref_mask64, out64, dout,
                                       gqa or (api == "torch" and cfg.enable_gqa))
    return got, reference, naive, bounds, float_mask


def rounded_output_bounds(cfg, q, k, v, mask, ref_mask64, out64, dout, enable_gqa):
    """The first-order effect of O arriving in the dtype. The backward forms
    D = rowsum(dO ∘ O) from it (FlashAttention-2), so D_i is off by up to
    δ_i = u · Σ_c |dO_ic O_ic|, and dS_ij = P_ij (dP_ij − D_i) by P_ij δ_i; that reaches dQ,
    dK and the mask's gradient as an upstream gradient of S = scale · Q Kᵀ + mask does.
    Bounded on |Q| and |K|: the gradients of that map at (|Q|, |K|) for the upstream
    gradient P ∘ δ (autograd does the GQA and broadcast sums). dV does not depend on D.
    Returns the largest bound of each of dQ, dK, dV, dmask."""
    q64, k64, v64 = (oracle.to64(x) for x in (q, k, v))
    _, probabilities = oracle.torch_math(q64, k64, v64, ref_mask64, scale=cfg.scale, enable_gqa=enable_gqa)
    delta = oracle.UNIT_ROUNDOFF[cfg.dtype] * (oracle.to64(dout).abs() * out64.detach().abs()).sum(-1, keepdim=True)
    upstream = probabilities.detach() * delta
    qa, ka = leaf(q64.abs()), leaf(k64.abs())
    keys = ka
    if enable_gqa and q64.ndim >= 3 and q64.shape[-3] != k64.shape[-3]:
        keys = ka.repeat_interleave(q64.shape[-3] // k64.shape[-3], dim=-3)
    scale = abs(cfg.scale) if cfg.scale is not None else 1.0 / math.sqrt(q64.shape[-1])
    scores = scale * (qa @ keys.transpose(-1, -2))
    zero_mask = None
    if mask is not None:
        zero_mask = torch.zeros(mask.shape, dtype=F64, requires_grad=True)
        scores = scores + zero_mask
    grads = gradients(scores, [qa, ka, None, zero_mask], upstream.expand(scores.shape))
    return [0.0 if g is None else oracle.max_abs(g) for g in grads]


def check_all(cfg, api, dropout_p=0.0, seed=0, prefix=""):
    got, reference, naive, bounds, float_mask = run_gradients(cfg, api, dropout_p, seed)
    names = ["grad_query", "grad_key", "grad_value", "grad_mask"]
    for n in range(4 if float_mask else 3):
        # The mask's gradient is computed as the others and stored in the mask's dtype.
        check_gradient(prefix + names[n], cfg.dtype, got[n], reference[n], naive[n],
                       stored=cfg.mask_dtype if n == 3 else None, rounded_output=bounds[n])


# --- gradcheck (float64 finite differences) ----------------------------------------------

def _f64(*shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=F64, requires_grad=True)


@pytest.mark.parametrize("case", ["plain", "float mask", "causal", "gqa", "dropout", "rank 3", "broadcast batch"])
def test_gradcheck_scaled_dot_product_attention(case):
    q, k, v = _f64(2, 4, 5, 3, seed=1), _f64(2, 4, 6, 3, seed=2), _f64(2, 4, 6, 2, seed=3)
    kwargs = {}
    inputs = [q, k, v]
    if case == "float mask":
        mask = _f64(5, 6, seed=4)
        with torch.no_grad():
            mask[1, 2] = -math.inf
        inputs.append(mask)
    if case == "causal":
        kwargs["is_causal"] = True
    if case == "gqa":
        k, v = _f64(2, 2, 6, 3, seed=5), _f64(2, 2, 6, 2, seed=6)
        inputs = [q, k, v]
        kwargs["enable_gqa"] = True
    if case == "dropout":
        kwargs.update(dropout_p=0.3, seed=1234)  # a fixed seed: the same mask at every evaluation
    if case == "rank 3":
        inputs = [_f64(2, 5, 3, seed=7), _f64(2, 6, 3, seed=8), _f64(2, 6, 4, seed=9)]
    if case == "broadcast batch":
        inputs = [q, _f64(1, 4, 6, 3, seed=10), _f64(1, 4, 6, 2, seed=11)]

    def f(*args):
        mask = args[3] if len(args) > 3 else None
        return sdpa.scaled_dot_product_attention(args[0], args[1], args[2], attn_mask=mask, **kwargs)

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
def test_gradcheck_attention_bool_mask_and_both_causal_alignments(causal):
    q, k, v = _f64(1, 6, 4, 3, seed=1), _f64(1, 2, 7, 3, seed=2), _f64(1, 2, 7, 5, seed=3)
    gen = torch.Generator().manual_seed(4)
    mask = torch.rand(4, 7, generator=gen) < 0.7
    mask[2] = False  # a fully masked row: zero gradients

    def f(q, k, v):
        return sdpa.attention(q, k, v, mask, causal=causal, scale=-0.6)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


# --- conformance with torch on the conformance grid ---------------------------------------

@settings(max_examples=examples(250))
@given(cfg=configs("torch", "torch"))
def test_scaled_dot_product_attention_gradients_match_torch(cfg):
    oracle.count_example("gradients, scaled_dot_product_attention")
    check_all(cfg, "torch")


@settings(max_examples=examples(250))
@given(cfg=configs("torch", "attention"))
def test_attention_gradients_match_torch(cfg):
    oracle.count_example("gradients, attention (GQA, bottom_right)")
    check_all(cfg, "attention")


@settings(max_examples=examples(150))
@given(cfg=configs("torch", "attention"), p=st.sampled_from([0.1, 0.5, 0.9]), seed=st.integers(0, 2**64 - 1))
def test_dropout_gradients_are_torchs_math_on_our_dropout_mask(cfg, p, seed):
    """The backward regenerates the forward's Philox mask: its gradients are those of torch's
    math backend with exactly the dropout mask read off the weights our forward returned."""
    oracle.count_example("gradients with dropout")
    check_all(cfg, "attention", dropout_p=p, seed=seed, prefix="dropout ")


# --- behaviour -----------------------------------------------------------------------------

def test_fully_masked_rows_have_zero_gradients():
    q, k, v = _f64(1, 2, 4, 3, seed=1), _f64(1, 2, 5, 3, seed=2), _f64(1, 2, 5, 3, seed=3)
    mask = torch.zeros(4, 5, dtype=F64)
    mask[1] = -math.inf
    mask.requires_grad_()
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert (q.grad[:, :, 1] == 0).all() and (mask.grad[1] == 0).all()
    assert not any(torch.isnan(t).any() for t in (q.grad, k.grad, v.grad, mask.grad))


def test_lse_is_differentiable_and_unused_costs_nothing():
    """The lse carries a gradient (test_varlen.py and test_modifiers.py check its values); a loss on the
    output alone gets the same gradients as when no lse was asked for."""
    q = _f64(1, 1, 3, 2, seed=1)
    out, lse = sdpa.attention(q, q, q, return_lse=True)
    assert out.requires_grad and lse.requires_grad
    (with_lse,) = torch.autograd.grad(out.sum(), q)
    (alone,) = torch.autograd.grad(sdpa.attention(q, q, q).sum(), q)
    assert torch.equal(with_lse, alone)


def test_weights_and_out_buffers_are_refused_with_autograd():
    q = _f64(1, 1, 3, 2, seed=1)
    with pytest.raises(NotImplementedError, match="return_weights"):
        sdpa.attention(q, q, q, return_weights=True)
    with pytest.raises(NotImplementedError, match="out"):
        sdpa.attention(q, q, q, out=torch.empty(1, 1, 3, 2, dtype=F64))
    with torch.no_grad():  # no gradient wanted: both are fine
        out, weights = sdpa.attention(q, q, q, return_weights=True)
    assert not out.requires_grad and weights.shape == (1, 1, 3, 3)


def test_errors_keep_their_type_through_the_custom_op():
    q = _f64(1, 1, 3, 2, seed=1)
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(ValueError, match="attn_mask"):
        sdpa.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(4, 4, dtype=F64))


def test_gradients_flow_only_where_asked():
    q, k, v = _f64(1, 2, 4, 3, seed=1), _f64(1, 2, 5, 3, seed=2).detach(), _f64(1, 2, 5, 3, seed=3).detach()
    mask = torch.randn(4, 5, dtype=F64)  # no grad wanted for it
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert q.grad is not None and k.grad is None and mask.grad is None


def test_bitwise_deterministic_gradients():
    q, k, v = _f64(2, 4, 33, 8, seed=1), _f64(2, 2, 40, 8, seed=2), _f64(2, 2, 40, 8, seed=3)
    q32, k32, v32 = (leaf(t.detach().float()) for t in (q, k, v))
    runs = []
    for _ in range(2):
        out = sdpa.scaled_dot_product_attention(q32, k32, v32, enable_gqa=True, is_causal=True, dropout_p=0.2, seed=7)
        runs.append(torch.autograd.grad(out, (q32, k32, v32), torch.ones_like(out)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# --- the score modifiers: window, ALiBi, softcap (against oracle.extended_attention) ----------

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


# --- torch.compile and the custom ops' registration -------------------------------------------

def test_opcheck_forward_and_backward_ops():
    q, k, v = (torch.randn(2, 4, 7, 8, requires_grad=True) for _ in range(3))
    mask = torch.randn(7, 7, requires_grad=True)
    sinks = torch.randn(4, requires_grad=True)
    causal = _options.flatten(_options.Options(causal="top_left"))
    dropout = _options.flatten(_options.Options(scale=0.5, dropout_p=0.3, seed=2**64 - 5))
    torch.library.opcheck(_autograd.attention_forward, (q, k, v, mask, None, None, "mask") + causal)
    torch.library.opcheck(_autograd.attention_forward, (q, k, v, None, None, sinks, "mask") + dropout)
    plain = _options.flatten(_options.Options())
    for s in (None, sinks):
        with torch.no_grad():
            out, lse = _autograd.attention_forward(q, k, v, mask, None, s, "mask", *plain)
        dout = torch.randn_like(out)
        torch.library.opcheck(_autograd.attention_backward,
                              (dout, q, k, v, mask, None, s, out, lse, None, True, "mask") + plain,
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    q, k, v = (torch.randn(2, 4, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.randn(9, 9, requires_grad=True)

    def loss(q, k, v, mask):
        out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, dropout_p=0.1, seed=3)
        return out.square().sum()

    eager = torch.autograd.grad(loss(q, k, v, mask), (q, k, v, mask))
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    again = torch.autograd.grad(compiled(q, k, v, mask), (q, k, v, mask))
    for a, b in zip(eager, again):
        assert torch.equal(a, b)


def test_torch_compile_with_the_projection_layout_matches_eager():
    """Inputs viewed from (B, L, H, E) projections: the output takes that layout (as torch's,
    test_zero_copy.py), and the custom op's fake output must say so, or the compiled graph's
    view of it would read the wrong elements."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 9, 4, 8, generator=g).transpose(1, 2).requires_grad_() for _ in range(3))

    def f(q, k, v):
        out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).view(2, 9, 32)

    eager = f(q, k, v)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)
    for a, b in zip(torch.autograd.grad(eager.square().sum(), (q, k, v)),
                    torch.autograd.grad(compiled.square().sum(), (q, k, v))):
        assert torch.equal(a, b)


def test_eager_calls_give_the_custom_ops_bits():
    """Outside torch.compile a call takes the custom op's eager twin (_autograd._differentiable: the same
    forward and backward bodies without torch.library's dispatch); its outputs and every
    gradient (a float mask's and the sinks' too, through a loss on the lse) are the op's."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.randn(7, 7, generator=g, requires_grad=True)
    sinks = torch.randn(4, generator=g, requires_grad=True)
    flat = _options.flatten(_options.Options(causal="top_left", dropout_p=0.2, seed=11))
    inputs = (q, k, v, mask, None, sinks)
    results = []
    for op in (_autograd.attention_forward, _autograd._eager_attention):
        out, lse = op(*inputs, "mask", *flat)
        loss = out.square().sum() + lse.sin().sum()
        results.append((out, lse) + torch.autograd.grad(loss, (q, k, v, mask, sinks)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_eager_varlen_calls_give_the_custom_ops_bits():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(9, 4, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    flat = _options.flatten(_options.Options(causal="bottom_right"))
    results = []
    for op in (_autograd.varlen_forward, _autograd._eager_varlen):
        out, lse = op(q, k, v, cu, cu, None, sinks, *flat)
        results.append((out, lse) + torch.autograd.grad(out.square().sum() + lse.sum(), (q, k, v, sinks)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("varlen", [False, True])
def test_a_second_derivative_is_refused(varlen):
    """The library's backward is not itself differentiated: through the eager path as
    through the custom op, asking for a second derivative is an error, not a silent zero
    (a gradient outside the graph would drop its terms from a loss that mixes it with
    others)."""
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = sdpa.varlen_attention(q, k, v, [0, 2, 5], [0, 2, 5]) if varlen else sdpa.attention(q, k, v)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="twice|no autograd formula"):
        (dq.sum() + q.sum()).backward()


def test_transforms_and_dispatch_modes_see_the_custom_op():
    """A vectorized jacobian (vmap over the backward) and make_fx go through the custom op,
    as before the eager twin: the jacobian is the looped one's, and make_fx's graph holds
    the op (a twin's body would leave only its torch.empty in the graph)."""
    g = torch.Generator().manual_seed(8)
    q = torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    jac = torch.autograd.functional.jacobian(lambda q: sdpa.attention(q, k, v), q, vectorize=True)
    jac_loop = torch.autograd.functional.jacobian(lambda q: sdpa.attention(q, k, v), q)
    assert torch.allclose(jac, jac_loop, rtol=0, atol=1e-12)
    from torch.fx.experimental.proxy_tensor import make_fx
    traced = make_fx(lambda q: sdpa.attention(q, k, v), tracing_mode="real")(q)
    assert "sdpa.attention_forward" in str(traced.graph)
    assert torch.equal(traced(q), sdpa.attention(q, k, v))


def test_calls_take_the_twin_or_the_op_by_what_they_are_given():
    """The route, read off the grad_fn: plain tensors and Parameters (a model's weights,
    the common case) take the eager twin, named after the call (an autograd error says
    "SdpaAttentionBackward", not a generated name); a tensor subclass takes the custom op
    (a fake tensor's call is traced, not run); a call where no gradient is wanted takes
    neither."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, requires_grad=True) for _ in range(3))
    assert type(sdpa.attention(q, k, v).grad_fn).__name__ == "SdpaAttentionBackward"
    weight = torch.nn.Parameter(q.detach().clone())
    assert type(sdpa.scaled_dot_product_attention(weight, k, v).grad_fn).__name__ == "SdpaAttentionBackward"
    cu = [0, 1, 4]
    packed = [x[0].transpose(0, 1) for x in (q, k, v)]
    assert type(sdpa.varlen_attention(*packed, cu, cu).grad_fn).__name__ == "SdpaVarlenBackward"
    with torch.no_grad():
        assert sdpa.attention(q, k, v).grad_fn is None
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in (q, k, v)]
        out = sdpa.attention(*fake)
    assert "sdpa_attention_forward" in type(out.grad_fn).__name__
    assert out.shape == (1, 2, 4, 8)


def test_numpy_inputs_are_unaffected():
    """The autograd path is for torch tensors only; NumPy arrays take the library directly."""
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4))
    assert isinstance(sdpa.scaled_dot_product_attention(x, x, x), np.ndarray)
