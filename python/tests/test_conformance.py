"""Conformance with torch.nn.functional.scaled_dot_product_attention, by hypothesis.

Random configurations over the whole contract (DESIGN.md §1): rank 2 to 5, L ≠ S, Ev ≠ E,
GQA, bool and float masks in every broadcast shape and layout, fully masked rows, causal
(both alignments through sdpa.attention), scale (negative and zero too), non-contiguous
inputs (transposed, sliced, expanded, Fortran-ordered, negative strides), batch
broadcasting, every dtype, torch tensors and NumPy arrays. The reference is PyTorch on
float64 copies of the same values; the tolerance is DESIGN.md §4's (oracle.check_close).
Dropout: the dropped positions read off the returned weights must be the Philox function
of semantics.md, and the output must be torch's math on exactly that dropout mask.
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

NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}
TORCH_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class Config:
    lib: str  # "torch" or "numpy"
    dtype: torch.dtype
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    heads: bool  # whether dim -3 is a head dim
    enable_gqa: bool
    causal: str | None  # None, "top_left", "bottom_right"
    scale: float | None
    layouts: tuple  # of query, key, value
    mask_kind: str | None  # None, "bool", "float"
    mask_shape: tuple
    mask_dtype: torch.dtype | None
    mask_layout: str
    dead_rows: bool  # force some fully masked rows
    magnitude: float
    data_seed: int

    @property
    def L(self):
        return self.q_shape[-2]

    @property
    def S(self):
        return self.k_shape[-2]


SEQ = st.one_of(st.integers(1, 24), st.sampled_from([0, 1, 3, 17, 33, 64, 113]))
HEAD_DIM = st.sampled_from([1, 2, 3, 8, 16, 40, 64, 80])


@st.composite
def configs(draw, lib: str, api: str):
    """api "torch": the arguments of sdpa.scaled_dot_product_attention (torch's rules:
    enable_gqa, batch broadcasting, top-left causal only); api "attention": sdpa.attention
    (batch dims equal, GQA whenever head counts differ, both causal alignments)."""
    dtype = draw(st.sampled_from(TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES)))
    rank = draw(st.sampled_from([2, 3, 3, 4, 4, 4, 5]))
    enable_gqa = api == "torch" and rank >= 3 and draw(st.booleans())
    heads = rank >= 4 or (rank == 3 and enable_gqa)
    batch = tuple(draw(st.integers(1, 3)) for _ in range(rank - (3 if heads else 2)))
    L, S = draw(SEQ), draw(SEQ)
    E = draw(HEAD_DIM)
    Ev = draw(st.one_of(st.just(E), HEAD_DIM))
    heads_q = heads_kv = 1
    if heads:
        heads_kv = draw(st.integers(1, 3))
        if api == "attention" or enable_gqa:
            group = draw(st.sampled_from([1, 1, 2, 3, 5, 27] if heads_kv == 1 else [1, 2, 3]))
            heads_q = heads_kv * group
        elif draw(st.integers(0, 4)) == 0:  # one KV head, which torch's matmul broadcasts
            heads_q, heads_kv = draw(st.integers(2, 4)), 1
        else:
            heads_q = heads_kv
    # Keep an example cheap: at most ~150k scores.
    while math.prod(batch) * heads_q * L * S > 150_000:
        L, S = max(L // 2, 1), max(S // 2, 1)

    def shape(rows, cols, h):
        return batch + ((h,) if heads else ()) + (rows, cols)

    q_shape, k_shape, v_shape = shape(L, E, heads_q), shape(S, E, heads_kv), shape(S, Ev, heads_kv)
    out_batch = batch
    if api == "torch" and batch and L and S and draw(st.integers(0, 4)) == 0:
        # Batch broadcasting (torch's matmul does it): some inputs carry size-1 batch dims.
        # Not with L or S = 0, where torch returns the query's batch shape unbroadcast.
        nb = len(batch)
        ones = (1,) * nb
        which = draw(st.sampled_from(["q", "kv", "k", "v"]))
        if which == "q":
            q_shape = ones + q_shape[nb:]
        if which in ("kv", "k"):
            k_shape = ones + k_shape[nb:]
        if which in ("kv", "v"):
            v_shape = ones + v_shape[nb:]
    causal_choices = [None, "top_left"] + (["bottom_right"] if api == "attention" else [])
    causal = draw(st.sampled_from(causal_choices))
    factor = draw(st.one_of(st.none(), st.just(0.0), st.floats(-2.5, 2.5, allow_nan=False)))
    scale = None if factor is None else factor / math.sqrt(E)
    layout_choices = ["contiguous", "contiguous", "transposed", "sliced", "expanded", "fortran"]
    if lib == "numpy":
        layout_choices.append("reversed")
    layouts = tuple(draw(st.sampled_from(layout_choices)) for _ in range(3))

    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    target = out_batch + ((heads_q,) if heads else ()) + (L, S)
    mask_shape, mask_dtype, mask_layout = (), None, "contiguous"
    if mask_kind is not None:
        keep_dims = draw(st.integers(2, len(target)))
        mask_shape = tuple(size if draw(st.booleans()) else 1 for size in target[len(target) - keep_dims:])
        if mask_kind == "bool":
            mask_dtype = torch.bool
        elif draw(st.integers(0, 3)) == 0:  # any float dtype (sdpa converts; torch wants the query's)
            mask_dtype = draw(st.sampled_from(TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES)))
        else:
            mask_dtype = dtype
        mask_layout = draw(st.sampled_from(["contiguous", "contiguous", "transposed", "expanded"]))
    dead_rows = mask_kind is not None and draw(st.integers(0, 3)) == 0
    magnitude = draw(st.sampled_from([0.5, 1.0, 2.0]))
    data_seed = draw(st.integers(0, 2**32 - 1))
    return Config(lib, dtype, q_shape, k_shape, v_shape, heads, enable_gqa, causal, scale, layouts, mask_kind,
                  mask_shape, mask_dtype, mask_layout, dead_rows, magnitude, data_seed)


# --- building inputs with a given layout ------------------------------------------------

def _convert(values: np.ndarray, dtype, lib):
    if lib == "torch":
        return torch.from_numpy(values).to(dtype)
    return values.astype(NUMPY_DTYPES[dtype] if dtype != torch.bool else np.bool_)


def _transpose(x, a, b):
    return x.transpose(a, b) if isinstance(x, torch.Tensor) else np.swapaxes(x, a, b)


def _expand(x, shape):
    return x.expand(*shape) if isinstance(x, torch.Tensor) else np.broadcast_to(x, shape)


def laid_out(values_for, shape: tuple, dtype, layout: str, lib: str, matrix_dims: int = 2):
    """A tensor of `shape` whose memory has `layout`; `values_for(base_shape)` gives the
    float64 values of the underlying buffer."""
    nd = len(shape)
    if layout == "expanded" and any(s > 1 for s in shape[: nd - matrix_dims]):
        base = tuple(1 if d < nd - matrix_dims else s for d, s in enumerate(shape))
        return _expand(_convert(values_for(base), dtype, lib), shape)  # stride 0 on those dims
    if layout == "transposed" and nd >= 2:
        a, b = (nd - 3, nd - 2) if nd >= 3 else (0, 1)
        base = list(shape)
        base[a], base[b] = base[b], base[a]
        return _transpose(_convert(values_for(tuple(base)), dtype, lib), a, b)
    if layout == "sliced" and nd >= 1:
        x = _convert(values_for(shape[:-1] + (2 * shape[-1],)), dtype, lib)
        return x[..., ::2]
    if layout == "fortran":
        x = _convert(values_for(shape[::-1]), dtype, lib)
        return x.permute(*reversed(range(nd))) if isinstance(x, torch.Tensor) else x.transpose()
    if layout == "reversed" and nd >= 2:  # NumPy only: a negative stride over the rows
        return _convert(values_for(shape), dtype, lib)[..., ::-1, :]
    return _convert(values_for(shape), dtype, lib)


def make_inputs(cfg: Config):
    rng = np.random.default_rng(cfg.data_seed)

    def normal(shape):
        return rng.standard_normal(shape) * cfg.magnitude

    q, k, v = (laid_out(normal, shape, cfg.dtype, layout, cfg.lib)
               for shape, layout in zip((cfg.q_shape, cfg.k_shape, cfg.v_shape), cfg.layouts))
    mask = None
    if cfg.mask_kind is not None:
        keep_probability = rng.uniform(0.3, 0.95)

        def mask_values(shape):
            allowed = rng.random(shape) < keep_probability
            if cfg.dead_rows and len(shape) >= 2 and shape[-2] > 0:
                rows = rng.random(shape[-2]) < 0.3
                rows[rng.integers(shape[-2])] = True
                allowed[..., rows, :] = False
            if cfg.mask_kind == "bool":
                return allowed
            return np.where(allowed, rng.standard_normal(shape) * 2.0, -np.inf)

        if cfg.mask_layout == "transposed":
            # a mask stored (..., S, L): column-major matrices
            base = cfg.mask_shape[:-2] + cfg.mask_shape[-2:][::-1]
            mask = _transpose(_convert(mask_values(base), cfg.mask_dtype, cfg.lib), -1, -2)
        else:
            mask = laid_out(mask_values, cfg.mask_shape, cfg.mask_dtype, cfg.mask_layout, cfg.lib)
    return q, k, v, mask


# --- checks shared by the tests ---------------------------------------------------------

def check_result_type(cfg: Config, result, shape):
    if cfg.lib == "torch":
        assert isinstance(result, torch.Tensor) and result.dtype == cfg.dtype
    else:
        assert isinstance(result, np.ndarray) and result.dtype == NUMPY_DTYPES[cfg.dtype]
    assert tuple(result.shape) == tuple(shape)


def check_zero_copy(q, k, v, mask, out):
    """The library read the callers' buffers and wrote the returned one: no copies."""
    seen = sdpa._core.last_call()
    for name, t in (("query", q), ("key", k), ("value", v), ("mask", mask), ("output", out)):
        if t is not None and math.prod(t.shape) > 0:
            assert seen[name] == oracle.data_pointer(t), f"{name} was copied"


def dead_rows(mask, L, S, causal, out_shape):
    """(..., L) bool: rows where no key may be seen."""
    allowed = oracle.allowed_positions(mask, L, S, causal)
    return torch.broadcast_to(~allowed.any(-1), tuple(out_shape[:-1]))


def check_dead_rows_zero(ours, dead):
    if dead.any():
        assert (oracle.to64(ours)[dead] == 0).all(), "a fully masked row is not 0"


def effective_gqa(cfg: Config) -> bool:
    return cfg.heads and cfg.q_shape[-3] != cfg.k_shape[-3]


# --- the tests ----------------------------------------------------------------------------

def run_torch_api(cfg: Config):
    q, k, v, mask = make_inputs(cfg)
    is_causal = cfg.causal == "top_left"
    ours = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=cfg.scale,
                                             enable_gqa=cfg.enable_gqa)
    check_zero_copy(q, k, v, mask, ours)

    q64, k64, v64 = oracle.to64(q), oracle.to64(k), oracle.to64(v)
    L, S = cfg.L, cfg.S
    if mask is not None and is_causal:  # torch refuses both; sdpa applies both
        ref_mask, ref_causal = oracle.combined_mask(mask, L, S, cfg.causal), False
    else:
        ref_mask, ref_causal = None if mask is None else oracle.combined_mask(mask, L, S, None), is_causal
    reference = oracle.torch_sdpa(q64, k64, v64, attn_mask=ref_mask, is_causal=ref_causal, scale=cfg.scale,
                                  enable_gqa=cfg.enable_gqa)
    check_result_type(cfg, ours, reference.shape)
    naive, bound = None, 0.0
    if cfg.dtype in oracle.LOW_PRECISION:
        low_mask = oracle.combined_mask(mask, L, S, cfg.causal, dtype=cfg.dtype)
        naive, _ = oracle.naive_low_precision(q, k, v, low_mask, scale=cfg.scale, enable_gqa=cfg.enable_gqa)
        bound = oracle.rounding_bound(cfg.dtype, q64, k64, v64, oracle.combined_mask(mask, L, S, cfg.causal),
                                      scale=cfg.scale, enable_gqa=cfg.enable_gqa, reference=reference)
    oracle.check_close("output", cfg.dtype, ours, reference, naive, bound)
    check_dead_rows_zero(ours, dead_rows(mask, L, S, cfg.causal, reference.shape))


@settings(max_examples=examples(1600))
@given(cfg=configs("torch", "torch"))
def test_scaled_dot_product_attention_matches_torch(cfg):
    oracle.count_example("scaled_dot_product_attention, torch tensors")
    run_torch_api(cfg)


@settings(max_examples=examples(700))
@given(cfg=configs("numpy", "torch"))
def test_scaled_dot_product_attention_on_numpy_matches_torch(cfg):
    oracle.count_example("scaled_dot_product_attention, NumPy arrays")
    run_torch_api(cfg)


def reference_lse(q64, k64, mask, scale, causal, gqa):
    """log Σ_j exp(scale · q·k_j + mask_j) over the allowed keys, in float64 torch."""
    if gqa:
        k64 = k64.repeat_interleave(q64.shape[-3] // k64.shape[-3], dim=-3)
    E = q64.shape[-1]
    scores = (q64 @ k64.transpose(-1, -2)) * (1.0 / math.sqrt(E) if scale is None else scale)
    if mask is not None and oracle.to_torch(mask).dtype != torch.bool:
        scores = scores + oracle.to64(mask)
    allowed = oracle.allowed_positions(mask, q64.shape[-2], k64.shape[-2], causal)
    return torch.logsumexp(scores.masked_fill(~allowed, -math.inf), dim=-1)


def check_lse(dtype, ours, reference):
    ours64 = oracle.to64(ours)
    assert tuple(ours64.shape) == tuple(reference.shape)
    empty = torch.isneginf(reference)
    assert torch.equal(torch.isneginf(ours64), empty), "lse is -inf exactly on the fully masked rows"
    expected_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert oracle.to_torch(ours).dtype == expected_dtype
    # float32 accumulation for every non-float64 input: the float32 rule
    oracle.check_close("lse", expected_dtype, ours64[~empty], reference[~empty])


@settings(max_examples=examples(900))
@given(cfg=configs("torch", "attention"), return_weights=st.booleans(), return_lse=st.booleans())
def test_attention_outputs_weights_lse_match_torch(cfg, return_weights, return_lse):
    """sdpa.attention: both causal alignments, GQA without a flag, the weights and the
    log-sum-exp, against torch's math backend on float64 copies."""
    oracle.count_example("attention (+weights, lse, bottom_right)")
    q, k, v, mask = make_inputs(cfg)
    result = sdpa.attention(q, k, v, mask, causal=cfg.causal, scale=cfg.scale, return_weights=return_weights,
                            return_lse=return_lse)
    if not (return_weights or return_lse):
        result = (result,)
    assert len(result) == 1 + return_weights + return_lse
    ours = result[0]
    check_zero_copy(q, k, v, mask, ours)

    gqa = effective_gqa(cfg)
    q64, k64, v64 = oracle.to64(q), oracle.to64(k), oracle.to64(v)
    ref_mask = oracle.combined_mask(mask, cfg.L, cfg.S, cfg.causal)
    ref_out, ref_weights = oracle.torch_math(q64, k64, v64, ref_mask, scale=cfg.scale, enable_gqa=gqa)
    check_result_type(cfg, ours, ref_out.shape)
    naive_out = naive_weights = None
    bound = weights_bound = 0.0
    if cfg.dtype in oracle.LOW_PRECISION:
        low_mask = oracle.combined_mask(mask, cfg.L, cfg.S, cfg.causal, dtype=cfg.dtype)
        naive_out, naive_weights = oracle.naive_low_precision(q, k, v, low_mask, scale=cfg.scale, enable_gqa=gqa)
        bound = oracle.rounding_bound(cfg.dtype, q64, k64, v64, ref_mask, scale=cfg.scale, enable_gqa=gqa,
                                      reference=ref_out)
        weights_bound = oracle.UNIT_ROUNDOFF[cfg.dtype] * oracle.max_abs(ref_weights)
    oracle.check_close("output", cfg.dtype, ours, ref_out, naive_out, bound)
    dead = dead_rows(mask, cfg.L, cfg.S, cfg.causal, ref_out.shape)
    check_dead_rows_zero(ours, dead)
    if return_weights:
        weights = result[1]
        check_result_type(cfg, weights, ref_weights.shape)
        oracle.check_close("weights", cfg.dtype, weights, ref_weights, naive_weights, weights_bound)
        assert sdpa._core.last_call()["weights"] == oracle.data_pointer(weights)
    if return_lse:
        check_lse(cfg.dtype, result[-1], reference_lse(q64, k64, mask, cfg.scale, cfg.causal, gqa))


@settings(max_examples=examples(600))
@given(cfg=configs("torch", "attention"), p=st.sampled_from([0.1, 0.25, 0.5, 0.9]),
       seed=st.integers(0, 2**64 - 1))
def test_dropout_is_philox_and_matches_torch_on_that_mask(cfg, p, seed):
    """The weights returned are those multiplied into V, so the kept positions can be read
    off them: they must be semantics.md's Philox function of (seed, b, h, i, j), and the
    output must be torch's math backend with exactly that dropout mask."""
    oracle.count_example("dropout")
    q, k, v, mask = make_inputs(cfg)
    ours, weights = sdpa.attention(q, k, v, mask, causal=cfg.causal, scale=cfg.scale, dropout_p=p, seed=seed,
                                   return_weights=True)
    again = sdpa.attention(q, k, v, mask, causal=cfg.causal, scale=cfg.scale, dropout_p=p, seed=seed)
    assert torch.equal(ours, again), "same seed, same output, bit for bit"

    gqa = effective_gqa(cfg)
    q64, k64, v64 = oracle.to64(q), oracle.to64(k), oracle.to64(v)
    ref_mask = oracle.combined_mask(mask, cfg.L, cfg.S, cfg.causal)
    _, exact_weights = oracle.torch_math(q64, k64, v64, ref_mask, scale=cfg.scale, enable_gqa=gqa)
    w_shape = tuple(exact_weights.shape)
    kept = oracle.to64(weights) != 0

    # Philox, position by position, where the weight is far from underflow in any dtype.
    heads = w_shape[-3] if cfg.heads else 1
    batch = math.prod(w_shape[:-3]) if cfg.heads else math.prod(w_shape[:-2])
    formula = torch.from_numpy(oracle.dropout_keep(p, seed, 0, batch, heads, cfg.L, cfg.S).reshape(w_shape))
    visible = exact_weights > 1e-6
    assert torch.equal(kept[visible], formula[visible]), "dropped positions are not Philox(seed, b, h, i, j)"
    assert not kept[exact_weights == 0].any(), "masked positions have weight 0"

    ref_out, ref_attn = oracle.torch_math(q64, k64, v64, ref_mask, scale=cfg.scale, enable_gqa=gqa, dropout_p=p,
                                          dropout_mask=kept)
    naive_out = naive_weights = None
    bound = weights_bound = 0.0
    if cfg.dtype in oracle.LOW_PRECISION:
        low_mask = oracle.combined_mask(mask, cfg.L, cfg.S, cfg.causal, dtype=cfg.dtype)
        naive_out, naive_attn = oracle.naive_low_precision(q, k, v, low_mask, scale=cfg.scale, enable_gqa=gqa,
                                                           dropout_p=p, dropout_mask=kept)
        naive_weights = naive_attn * (1.0 / (1.0 - p))  # rounded in the dtype, as ours
        bound = oracle.rounding_bound(cfg.dtype, q64, k64, v64, ref_mask, scale=cfg.scale, enable_gqa=gqa,
                                      reference=ref_out, dropout_p=p, dropout_mask=kept)
        weights_bound = oracle.UNIT_ROUNDOFF[cfg.dtype] * oracle.max_abs(ref_attn / (1.0 - p))
    oracle.check_close("dropout output", cfg.dtype, ours, ref_out, naive_out, bound)
    oracle.check_close("dropout weights", cfg.dtype, weights, ref_attn / (1.0 - p), naive_weights, weights_bound)

    # The drop-in function draws the same mask from the same seed.
    if cfg.causal != "bottom_right" and not (len(cfg.q_shape) == 3 and gqa):
        drop_in = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                    is_causal=cfg.causal == "top_left", scale=cfg.scale,
                                                    enable_gqa=gqa, seed=seed)
        assert torch.equal(drop_in, ours)


def test_philox_oracle_known_answers():
    """The tests' own Philox against Random123's published known-answer vectors, so the
    dropout test checks the library against the real generator."""
    def block(counter, key):
        return [int(w) for w in oracle.philox4x32_10(*[np.array(c) for c in counter], key)]

    assert block((0, 0, 0, 0), 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert block((0xFFFFFFFF,) * 4, 0xFFFFFFFFFFFFFFFF) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert block((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0x299F31D0 << 32) | 0xA4093822) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_dropout_keeps_a_fraction_one_minus_p(dtype):
    """Over 64k positions the kept fraction is 1 - p within 5 sigma, and kept weights are
    the softmax scaled by 1/(1-p) (row sums average to 1)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 16, dtype=dtype) for _ in range(3))
    p = 0.3
    _, weights = sdpa.attention(q, k, v, dropout_p=p, seed=1234, return_weights=True)
    kept = (weights != 0).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / weights.numel())
    assert abs(kept - (1 - p)) < 5 * sigma
    assert abs(weights.double().sum(-1).mean().item() - 1.0) < 0.02


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["plain", "causal+gqa", "float mask", "dropout"])
def test_large_low_precision_meets_twice_torchs_error_without_the_floor(dtype, case):
    """On tensors big enough for the max error to be a statistic, DESIGN.md's rule holds as
    written — 2 × torch's own error in the dtype, floor 1e-5, no rounding-bound floor."""
    g = torch.Generator().manual_seed(7)
    heads_kv = 2 if case == "causal+gqa" else 8
    q = torch.randn(2, 8, 200, 64, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, heads_kv, 240, 64, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(2, heads_kv, 240, 48, generator=g, dtype=torch.float64).to(dtype)
    mask = None
    if case == "float mask":
        mask = (torch.randn(200, 240, generator=g, dtype=torch.float64) * 2).to(dtype)
    causal = "bottom_right" if case == "causal+gqa" else None
    gqa = heads_kv != 8
    p = 0.2 if case == "dropout" else 0.0
    ours, weights = sdpa.attention(q, k, v, mask, causal=causal, dropout_p=p, seed=99, return_weights=True)
    ref_mask = oracle.combined_mask(mask, 200, 240, causal)
    low_mask = oracle.combined_mask(mask, 200, 240, causal, dtype=dtype)
    kept = (weights != 0) if p else None
    reference, _ = oracle.torch_math(q.double(), k.double(), v.double(), ref_mask, enable_gqa=gqa, dropout_p=p,
                                     dropout_mask=kept)
    naive, _ = oracle.naive_low_precision(q, k, v, low_mask, scale=None, enable_gqa=gqa, dropout_p=p,
                                          dropout_mask=kept)
    oracle.check_close("large output", dtype, ours, reference, naive)
