"""int8 K/V with a float32 scale per (token, KV head): sdpa.quantize_kv's guarantees, the
attention functions on int8 key / value (torch and NumPy) against the float64 eager
formula on the dequantized values (oracle.extended_attention), paged int8 pages in both
layouts, the layer's int8 KVCache against a float32 cache within the bound
docs/numerics.md derives, and the errors (each naming its argument)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import oracle
import sdpa

F64 = torch.float64


def dequantized(values, scale):
    """scale · q in float64, elementwise, apart from the library."""
    return oracle.to64(values) * oracle.to64(scale).unsqueeze(-1)


def tolerance(dtype, reference):
    """The float32 rule (1e-5 of the output scale), plus the rounding of the output to the
    query's dtype (half an ulp: 2^-8 relative for bfloat16, 2^-11 for float16): the kernel
    computes in float32 from int8 K/V whatever the query's dtype."""
    floor = 1e-5 * max(1.0, reference.abs().max().item())
    ulp = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}.get(dtype, 0.0)
    return floor + ulp * reference.abs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_quantize_kv_round_trip_property(dtype):
    x = (torch.randn(3, 5, 33, dtype=F64) * 4).to(dtype)
    x[1, 2] = 0  # a zero row
    values, scale = sdpa.quantize_kv(x)
    assert values.dtype == torch.int8 and scale.dtype == torch.float32
    assert tuple(values.shape) == (3, 5, 33) and tuple(scale.shape) == (3, 5)
    x64 = oracle.to64(x)
    expected_scale = (x64.abs().amax(-1) / 127).to(torch.float32)
    assert torch.equal(scale, expected_scale)
    q = values.to(F64)
    assert q.abs().max() <= 127
    assert torch.all((x64 - q * scale.to(F64).unsqueeze(-1)).abs() <= scale.to(F64).unsqueeze(-1) / 2 * (1 + 1e-12))
    largest = q.abs().amax(-1)
    assert torch.equal(largest, torch.where(scale > 0, 127.0, 0.0).to(F64))
    assert scale[1, 2] == 0 and torch.all(values[1, 2] == 0)


def test_quantize_kv_numpy_strided_and_refusals():
    x = np.random.default_rng(1).standard_normal((6, 9)).astype(np.float32)
    values, scale = sdpa.quantize_kv(x.T)  # strided input
    v2, s2 = sdpa.quantize_kv(np.ascontiguousarray(x.T))
    assert values.dtype == np.int8 and scale.dtype == np.float32
    assert np.array_equal(values, v2) and np.array_equal(scale, s2)
    bad = x.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="^x: .*finite"):
        sdpa.quantize_kv(bad)
    with pytest.raises(TypeError, match="^x: "):
        sdpa.quantize_kv(np.zeros((2, 3), dtype=np.int8))


def run_int8(lib, dtype, B, Hq, Hkv, L, S, E, Ev, causal, which="both", seed=0):
    """sdpa.attention on int8 K and/or V against the float64 formula on what they stand for."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, E, generator=gen, dtype=F64).to(dtype)
    k = torch.randn(B, Hkv, S, E, generator=gen, dtype=F64).to(torch.float32)
    v = torch.randn(B, Hkv, S, Ev, generator=gen, dtype=F64).to(torch.float32)
    k8, ks = sdpa.quantize_kv(k)
    v8, vs = sdpa.quantize_kv(v)
    key, key_scale, k64 = (k8, ks, dequantized(k8, ks)) if which in ("both", "key") else (k.to(dtype), None,
                                                                                         oracle.to64(k.to(dtype)))
    value, value_scale, v64 = (v8, vs, dequantized(v8, vs)) if which in ("both", "value") else (v.to(dtype), None,
                                                                                             oracle.to64(v.to(dtype)))
    if lib == "numpy":
        q, key, value = (t.numpy() for t in (q, key, value))
        key_scale = None if key_scale is None else key_scale.numpy()
        value_scale = None if value_scale is None else value_scale.numpy()
    if key_scale is None and value_scale is None:
        return
    out, lse = sdpa.attention(q, key, value, causal=causal, key_scale=key_scale, value_scale=value_scale,
                              return_lse=True)
    reference, _, reference_lse = oracle.extended_attention(oracle.to64(q), k64, v64, causal=causal)
    ours = oracle.to64(out)
    assert torch.all((ours - reference).abs() <= tolerance(dtype, reference)), (ours - reference).abs().max()
    assert torch.allclose(oracle.to64(lse), reference_lse, rtol=0, atol=1e-5 * max(1.0, reference_lse.abs().max()))


@pytest.mark.parametrize("L", [1, 3, 16])
@pytest.mark.parametrize("S", [1, 77, 5000])
def test_attention_int8_decode_matches_formula(L, S):
    run_int8("torch", torch.float32, 1, 8, 2, L, S, 64, 32, "bottom_right" if L > 1 else None, seed=L * S)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("which", ["both", "key", "value"])
def test_attention_int8_every_query_dtype_and_either_tensor(dtype, which):
    run_int8("torch", dtype, 2, 4, 2, 7, 130, 40, 24, "top_left", which=which, seed=3)


def test_attention_int8_numpy_and_prefill():
    run_int8("numpy", torch.float32, 2, 6, 3, 65, 65, 32, 32, "top_left", seed=5)


def test_scaled_dot_product_attention_int8_gqa():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 8, 5, 32, generator=gen)
    k, v = torch.randn(2, 2, 40, 32, generator=gen), torch.randn(2, 2, 40, 32, generator=gen)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(k), sdpa.quantize_kv(v)
    out = sdpa.scaled_dot_product_attention(q, k8, v8, is_causal=True, enable_gqa=True, key_scale=ks, value_scale=vs)
    reference, _, _ = oracle.extended_attention(oracle.to64(q), dequantized(k8, ks), dequantized(v8, vs),
                                                causal="top_left")
    assert torch.all((oracle.to64(out) - reference).abs() <= tolerance(torch.float32, reference))


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_scaled_dot_product_attention_int8_broadcasts_the_scales_with_the_batch(lib):
    """torch's SDPA broadcasts batch dims of size 1; an int8 K/V shared by the batch brings
    its scales along (they were left (1, ...) and refused before)."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(3, 2, 5, 16, generator=gen)
    k, v = torch.randn(1, 2, 9, 16, generator=gen), torch.randn(1, 2, 9, 12, generator=gen)
    k8, ks = sdpa.quantize_kv(k)
    args = (q, k8, v) if lib == "torch" else (q.numpy(), k8.numpy(), v.numpy())
    scale = ks if lib == "torch" else ks.numpy()
    out = torch.as_tensor(sdpa.scaled_dot_product_attention(*args, key_scale=scale))
    reference, _, _ = oracle.extended_attention(oracle.to64(q), dequantized(k8, ks).expand(3, -1, -1, -1),
                                                oracle.to64(v).expand(3, -1, -1, -1))
    assert out.shape == (3, 2, 5, 12)
    assert torch.all((oracle.to64(out) - reference).abs() <= tolerance(torch.float32, reference))
    out = torch.as_tensor(sdpa.scaled_dot_product_attention(*args[:2], args[1], key_scale=scale, value_scale=scale))
    reference, _, _ = oracle.extended_attention(oracle.to64(q), dequantized(k8, ks).expand(3, -1, -1, -1),
                                                dequantized(k8, ks).expand(3, -1, -1, -1))
    assert torch.all((oracle.to64(out) - reference).abs() <= tolerance(torch.float32, reference))
    with pytest.raises(ValueError, match="^key_scale: "):  # a scale that is not its key's is still named
        sdpa.scaled_dot_product_attention(*args, key_scale=scale[..., :8])


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_paged_int8_pages_match_dense(layout):
    gen = torch.Generator().manual_seed(11)
    B, Hq, Hkv, L, E, page = 3, 4, 2, 2, 16, 8
    seq_lens = [5, 0, 21]
    pages = 8
    shape = (pages, Hkv, page, E) if layout == "HND" else (pages, page, Hkv, E)
    kp, vp = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(kp), sdpa.quantize_kv(vp)
    table = torch.tensor([[3, 0, 0], [1, 1, 1], [6, 2, 5]], dtype=torch.int32)
    q = torch.randn(B, Hq, L, E, generator=gen)
    out = sdpa.paged_attention(q, k8, v8, table, seq_lens, layout=layout, causal="bottom_right", key_scale=ks,
                               value_scale=vs)
    kd, vd = dequantized(k8, ks), dequantized(v8, vs)
    if layout == "NHD":
        kd, vd = kd.transpose(1, 2), vd.transpose(1, 2)
    for b, S in enumerate(seq_lens):
        rows = [(int(table[b, j // page]), j % page) for j in range(S)]
        kb = torch.stack([kd[p, :, r] for p, r in rows], dim=1) if S else torch.zeros(Hkv, 0, E, dtype=F64)
        vb = torch.stack([vd[p, :, r] for p, r in rows], dim=1) if S else torch.zeros(Hkv, 0, E, dtype=F64)
        reference, _, _ = oracle.extended_attention(oracle.to64(q[b]), kb, vb, causal="bottom_right")
        assert torch.all((oracle.to64(out[b]) - reference).abs() <= tolerance(torch.float32, reference)), b


def test_int8_errors_name_the_argument():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(k), sdpa.quantize_kv(v)
    with pytest.raises(ValueError, match="^key_scale: .*int8 key.*got none"):
        sdpa.attention(q, k8, v)
    with pytest.raises(ValueError, match="^value_scale: expected no scale"):
        sdpa.attention(q, k, v, value_scale=vs)
    with pytest.raises(ValueError, match=r"^key_scale: expected shape \(1, 2, 5\)"):
        sdpa.attention(q, k8, v, key_scale=ks[..., :4])
    with pytest.raises(TypeError, match="^key_scale: expected float32"):
        sdpa.attention(q, k8, v, key_scale=ks.double())
    with pytest.raises(TypeError, match="^query: .*got int8"):
        sdpa.attention(k8[:, :, :3], k8, v8, key_scale=ks, value_scale=vs)
    with pytest.raises(NotImplementedError, match="inference"):
        sdpa.attention(q.requires_grad_(), k8, v8, key_scale=ks, value_scale=vs)


def test_scales_and_values_are_read_as_given():
    """-128 (which quantize_kv never writes), a NaN key scale and an infinite value scale
    give what the formula gives on the dequantized K/V, NaN and infinities where it has them
    (docs/semantics.md)."""
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(1, 3, 3, 16, generator=gen)  # head 2 stays finite
    (k8, ks), (v8, vs) = sdpa.quantize_kv(torch.randn(1, 3, 9, 16, generator=gen)), \
        sdpa.quantize_kv(torch.randn(1, 3, 9, 16, generator=gen))
    k8[0, 2, 2, 5] = -128
    v8[0, 2, 4, :] = -128
    ks[0, 1, 6] = math.nan
    vs[0, 0, 3] = math.inf
    out = oracle.to64(sdpa.attention(q, k8, v8, key_scale=ks, value_scale=vs))
    # The plain formula (the oracle reads a NaN row as fully masked; PyTorch's formula,
    # like the library, carries the NaN).
    scores = oracle.to64(q) @ dequantized(k8, ks).transpose(-1, -2) / math.sqrt(16)
    reference = torch.softmax(scores, dim=-1) @ dequantized(v8, vs)
    assert torch.isnan(reference[0, 1]).all() and torch.isinf(reference[0, 0]).any()  # the cases are live
    assert torch.equal(torch.isnan(out), torch.isnan(reference))
    assert torch.equal(torch.isinf(out), torch.isinf(reference)) and torch.equal(out[torch.isinf(out)],
                                                                                 reference[torch.isinf(reference)])
    finite = torch.isfinite(reference)
    assert finite[0, 2].all()
    assert torch.all((out[finite] - reference[finite]).abs() <= tolerance(torch.float32, reference[finite]))


def test_paged_nhd_scale_errors_show_the_callers_layout():
    """An NHD call's scales go to the library swapped; a wrong shape is reported as the
    caller passed it (it showed the swapped shape before)."""
    q, pages = torch.randn(1, 2, 1, 8), torch.randn(3, 4, 2, 8)  # NHD: (pages, page_size, Hkv, E)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(pages), sdpa.quantize_kv(pages)
    with pytest.raises(ValueError, match=r"^key_scale: expected \(pages, page_size, Hkv\) = \(3, 4, 2\), "
                                         r"got shape \(3, 2, 4\)"):
        sdpa.paged_attention(q, k8, v8, [[0, 1]], [6], layout="NHD", key_scale=ks.transpose(1, 2), value_scale=vs)
    out = sdpa.paged_attention(q, k8, v8, [[0, 1]], [6], layout="NHD", key_scale=ks, value_scale=vs)
    rows = [(j // 4, j % 4) for j in range(6)]
    k64 = torch.stack([dequantized(k8, ks)[p, r] for p, r in rows], 1)  # (Hkv, 6, E)
    v64 = torch.stack([dequantized(v8, vs)[p, r] for p, r in rows], 1)
    reference, _, _ = oracle.extended_attention(oracle.to64(q), k64.unsqueeze(0), v64.unsqueeze(0))
    assert torch.all((oracle.to64(out) - reference).abs() <= tolerance(torch.float32, reference))


def test_a_scale_that_requires_grad_is_refused_not_silently_given_none():
    """A scale is an input like any other: one that requires grad would get no gradient,
    so the call is refused (it ran and left scale.grad None before)."""
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    k8, ks = sdpa.quantize_kv(k)
    ks = ks.requires_grad_()
    cu = [0, 5]
    calls = [lambda: sdpa.attention(q, k8, k, key_scale=ks),
             lambda: sdpa.scaled_dot_product_attention(q, k8, k, key_scale=ks),
             lambda: sdpa.varlen_attention(q[0].transpose(0, 1), k8[0].transpose(0, 1), k[0].transpose(0, 1),
                                           [0, 3], cu, key_scale=ks[0].transpose(0, 1)),
             lambda: sdpa.paged_attention(q, k8.transpose(1, 2), k.transpose(1, 2), [[0]], [5], layout="NHD",
                                          key_scale=ks.transpose(1, 2))]
    for call in calls:
        with pytest.raises(NotImplementedError, match="inference"):
            call()
    with torch.no_grad():  # and under no_grad they run
        for call in calls:
            call()


def test_layer_int8_cache_within_the_derived_bound():
    """A small model decodes the same tokens with a float32 cache and an int8 one; each
    output differs by at most the attention bound of docs/numerics.md carried through the
    output projection: |Δy_i| <= Σ_c |W_o[i, c]| · |Δo_c|."""
    embed, heads, kv_heads = 32, 4, 2
    D = embed // heads
    layer = sdpa.MultiheadAttention(embed, heads, num_kv_heads=kv_heads, batch_first=True, seed=3).eval()
    params = {name: np.asarray(value, dtype=np.float64) for name, value in layer.state_dict().items()}
    float_cache, int8_cache = layer.make_cache(1), layer.make_cache(1, dtype="int8")
    assert int8_cache.dtype == "int8" and float_cache.scales() is None
    rng = np.random.default_rng(4)
    differs = False
    for step in range(20):
        x = rng.standard_normal((1, 1, embed)).astype(np.float32)
        want, _ = layer(x, need_weights=False, cache=float_cache)
        got, _ = layer(x, need_weights=False, cache=int8_cache)
        # The keys and values the int8 cache stands for are the float cache's within s/2.
        keys, values = float_cache.keys().astype(np.float64), float_cache.values().astype(np.float64)
        key_scale, value_scale = int8_cache.scales()
        assert np.all(np.abs(int8_cache.keys() * key_scale[..., None] - keys) <= key_scale[..., None] / 2 + 1e-7)
        # Attention-level bound per (head, dim), from the query this step projects.
        q = (x[0, 0].astype(np.float64) @ params["q_proj.weight"].T + params["q_proj.bias"]).reshape(heads, D)
        delta_o = np.zeros(heads * D)
        for h in range(heads):
            hk = h // (heads // kv_heads)
            delta = np.abs(q[h]).sum() / math.sqrt(D) * key_scale[0, hk].max() / 2
            vmax = np.abs(values[0, hk]).max(axis=0)
            delta_o[h * D:(h + 1) * D] = np.expm1(2 * delta) * vmax + value_scale[0, hk].max() / 2 + 1e-5
        bound = np.abs(params["out_proj.weight"]) @ delta_o + 1e-5
        error = np.abs(got[0, 0].astype(np.float64) - want[0, 0].astype(np.float64))
        assert np.all(error <= bound), (step, (error / bound).max())
        differs |= bool(error.max() > 1e-7)
    assert differs  # the quantization is visible: the bound is not checked on identical outputs
    assert int8_cache.length == 20
    with pytest.raises(TypeError, match="^dtype: "):
        layer.make_cache(1, dtype="float16")


@pytest.mark.parametrize("which", ["both", "key", "value"])
def test_varlen_int8_matches_formula_per_sequence(which):
    """Packed (total_k, Hkv, E) int8 K/V with their (total_k, Hkv) scales, as quantize_kv
    of the packed buffers gives them; each sequence against the formula on its own rows."""
    gen = torch.Generator().manual_seed(13)
    Hq, Hkv, E, Ev = 4, 2, 24, 17
    lengths_q, lengths_k = [3, 1, 0, 6], [9, 40, 5, 6]
    cu_q, cu_k = np.cumsum([0] + lengths_q), np.cumsum([0] + lengths_k)
    q = torch.randn(cu_q[-1], Hq, E, generator=gen)
    k, v = torch.randn(cu_k[-1], Hkv, E, generator=gen), torch.randn(cu_k[-1], Hkv, Ev, generator=gen)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(k), sdpa.quantize_kv(v)
    key, key_scale, k64 = (k8, ks, dequantized(k8, ks)) if which != "value" else (k, None, oracle.to64(k))
    value, value_scale, v64 = (v8, vs, dequantized(v8, vs)) if which != "key" else (v, None, oracle.to64(v))
    out, lse = sdpa.varlen_attention(q, key, value, cu_q, cu_k, causal="bottom_right", key_scale=key_scale,
                                     value_scale=value_scale, return_lse=True)
    assert out.shape == (cu_q[-1], Hq, Ev) and lse.shape == (Hq, cu_q[-1])
    for b in (b for b in range(len(lengths_q)) if lengths_q[b] > 0):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        reference, _, reference_lse = oracle.extended_attention(
            oracle.to64(q[rows]).transpose(0, 1), k64[keys].transpose(0, 1), v64[keys].transpose(0, 1),
            causal="bottom_right")
        ours = oracle.to64(out[rows]).transpose(0, 1)
        assert torch.all((ours - reference).abs() <= tolerance(torch.float32, reference)), b
        assert torch.allclose(oracle.to64(lse[:, rows]), reference_lse, rtol=0, atol=1e-5), b


def test_varlen_int8_errors_name_the_argument():
    q, k = torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    (k8, ks), (v8, vs) = sdpa.quantize_kv(k), sdpa.quantize_kv(k)
    cu = [0, 3, 7]
    with pytest.raises(ValueError, match="^key_scale: .*int8 key.*got none"):
        sdpa.varlen_attention(q, k8, k, cu, cu)
    with pytest.raises(ValueError, match=r"^key_scale: expected \(total_k, Hkv\) = \(7, 2\), got shape \(2, 7\)"):
        sdpa.varlen_attention(q, k8, k, cu, cu, key_scale=ks.T)
    with pytest.raises(ValueError, match="^value_scale: expected no scale"):
        sdpa.varlen_attention(q, k, k, cu, cu, value_scale=vs)
    with pytest.raises(NotImplementedError, match="inference"):
        sdpa.varlen_attention(q.requires_grad_(), k8, v8, cu, cu, key_scale=ks, value_scale=vs)
