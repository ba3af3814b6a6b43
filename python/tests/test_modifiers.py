"""The score modifiers in the Python forward (FlashAttention's sliding window: window_size,
alignment; ALiBi: alibi_slopes; logit softcapping: softcap) against oracle.extended_attention,
options.h's formula written out literally in float64 torch, with DESIGN.md §4's tolerances
(oracle.check_close; for bfloat16 and float16 the naive implementation is the same formula
computed in that dtype): sdpa.attention on torch tensors and NumPy arrays and the drop-in
sdpa.scaled_dot_product_attention by hypothesis (every dtype, GQA, masks, both causal
alignments, windows, slopes (Hq,) and (batch, Hq), softcap, lse), and the band, the default
alignment, the softcap's bound and the slopes' forms by hand. Their gradients:
test_backward.py; varlen and paged: test_varlen.py, test_paged.py; errors: test_api.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sdpa
from conftest import examples
from modifiers import F64, check_lse, check_output, extended_configs, keywords_of, make_extended, options_of
from test_conformance import NUMPY_DTYPES


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
                                             alignment=cfg.alignment, alibi_slopes=slopes, softcap=cfg.softcap,
                                             sinks=keywords_of(cfg, slopes)["sinks"])
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
