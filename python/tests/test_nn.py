"""sdpa.MultiheadAttention against torch.nn.MultiheadAttention with the same weights, in
float64 (max error <= 1e-10): self- and cross-attention, kdim/vdim, key-padding and
attention masks (bool and float, causal), batch_first both ways, unbatched inputs, the
returned weights; weights loaded from the torch module, from state dicts (any float dtype,
bfloat16 included) and from safetensors files; decoding with the KV cache against one
causal pass; arguments the bindings cannot hold get the library's errors. Its gradients:
test_nn_autograd.py."""

import itertools
import json
import struct

import numpy as np
import pytest
import torch

import sdpa

TOL64 = 1e-10


def torch_mha(embed=16, heads=4, kdim=None, vdim=None, batch_first=True, bias=True, dtype=torch.float64):
    """A torch layer with random weights, biases included (torch starts them at 0)."""
    m = torch.nn.MultiheadAttention(embed, heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first)
    m = m.to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


def inputs(n, l, s, embed, kdim, vdim, batch_first, dtype=torch.float64):
    def shaped(length, width):
        return torch.randn((n, length, width) if batch_first else (length, n, width), dtype=dtype)

    return shaped(l, embed), shaped(s, kdim), shaped(s, vdim)


def max_err(a, b):
    return (a - b).abs().max().item()


# Masks in torch's polarity (bool True = masked out). No row is ever fully masked: key 0
# always stays (torch's MHA gives NaN there, sdpa 0; pinned separately below).
def attn_mask(kind, n, heads, l, s):
    if kind is None:
        return None
    causal = torch.triu(torch.ones(l, s, dtype=torch.bool), diagonal=1)
    if kind == "causal_bool":
        return causal
    if kind == "causal_float":
        return torch.zeros(l, s, dtype=torch.float64).masked_fill(causal, float("-inf"))
    if kind == "per_head_bool":  # (N·H, L, S)
        m = torch.rand(n * heads, l, s) < 0.4
        m[..., 0] = False
        return m
    if kind == "float":
        return torch.randn(l, s, dtype=torch.float64)
    raise ValueError(kind)


def padding_mask(kind, n, s):
    if kind is None:
        return None
    pad = torch.zeros(n, s, dtype=torch.bool)
    for b in range(n):
        pad[b, s - 1 - b:] = True  # batch b: its last b + 1 keys are padding
    pad[:, 0] = False
    if kind == "bool":
        return pad
    return torch.zeros(n, s, dtype=torch.float64).masked_fill(pad, float("-inf")) + torch.randn(n, s, dtype=torch.float64)


LAYOUTS = {
    "self": dict(embed=16, heads=4, kdim=None, vdim=None, l=6, s=6),
    "cross": dict(embed=16, heads=4, kdim=None, vdim=None, l=5, s=7),
    "cross_kvdim": dict(embed=12, heads=3, kdim=8, vdim=20, l=7, s=4),
}
MASKS = [None, "causal_bool", "causal_float", "per_head_bool", "float"]
PADDINGS = [None, "bool", "float"]


def compatible(mask, padding):
    # torch deprecates mixing a bool and a float mask in one call; sdpa accepts it.
    if mask is None or padding is None:
        return True
    return ("bool" in mask) == (padding == "bool")


CASES = [c for c in itertools.product([True, False], LAYOUTS, MASKS, PADDINGS) if compatible(c[2], c[3])]


def torch_layer_and_ours(layout, batch_first, n):
    """torch's layer for LAYOUTS[layout], sdpa's with the same weights, and float64
    inputs for a batch of n."""
    cfg = LAYOUTS[layout]
    kdim, vdim = cfg["kdim"] or cfg["embed"], cfg["vdim"] or cfg["embed"]
    ref = torch_mha(cfg["embed"], cfg["heads"], cfg["kdim"], cfg["vdim"], batch_first)
    return ref, sdpa.MultiheadAttention.from_torch(ref), inputs(n, cfg["l"], cfg["s"], cfg["embed"], kdim, vdim,
                                                                 batch_first)


@pytest.mark.parametrize("batch_first,layout,mask_kind,padding_kind", CASES)
def test_matches_torch_multihead_attention_in_float64(batch_first, layout, mask_kind, padding_kind):
    cfg = LAYOUTS[layout]
    n, heads = 3, cfg["heads"]
    ref, ours, (q, k, v) = torch_layer_and_ours(layout, batch_first, n)
    if layout == "self":
        k = v = q
    mask = attn_mask(mask_kind, n, heads, cfg["l"], cfg["s"])
    pad = padding_mask(padding_kind, n, cfg["s"])
    expected, expected_w = ref(q, k, v, key_padding_mask=pad, attn_mask=mask)
    got, got_w = ours(q, k, v, key_padding_mask=pad, attn_mask=mask)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    assert got.shape == expected.shape
    assert max_err(got, expected) <= TOL64
    assert got_w.shape == expected_w.shape
    assert max_err(got_w, expected_w) <= TOL64


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_weights_per_head_averaged_or_none(need_weights, average):
    ref = torch_mha(batch_first=False)
    ours = sdpa.MultiheadAttention.from_torch(ref)
    q, k, v = inputs(2, 5, 8, 16, 16, 16, batch_first=False)
    expected, expected_w = ref(q, k, v, need_weights=need_weights, average_attn_weights=average)
    got, got_w = ours(q, k, v, need_weights=need_weights, average_attn_weights=average)
    assert max_err(got, expected) <= TOL64
    if not need_weights:
        assert got_w is None and expected_w is None
    else:
        assert got_w.shape == expected_w.shape
        assert max_err(got_w, expected_w) <= TOL64


def test_unbatched_inputs_with_masks():
    ref = torch_mha()
    ours = sdpa.MultiheadAttention.from_torch(ref)
    x = torch.randn(6, 16, dtype=torch.float64)
    mask = attn_mask("causal_bool", 1, 4, 6, 6)
    pad = torch.tensor([False, False, False, False, True, True])
    expected, expected_w = ref(x, x, x, key_padding_mask=pad, attn_mask=mask)
    got, got_w = ours(x, x, x, key_padding_mask=pad, attn_mask=mask)
    assert got.shape == (6, 16) and got_w.shape == (6, 6)
    assert max_err(got, expected) <= TOL64 and max_err(got_w, expected_w) <= TOL64


def test_eval_mode_fast_path_agrees():
    ref = torch_mha(batch_first=True).eval()
    ours = sdpa.MultiheadAttention.from_torch(ref)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.inference_mode():
        expected, _ = ref(x, x, x, need_weights=False)
        got, _ = ours(x, need_weights=False)  # key and value default to the query
    assert max_err(got, expected) <= TOL64


def test_is_causal_alone_is_the_causal_mask():
    ref = torch_mha()
    ours = sdpa.MultiheadAttention.from_torch(ref)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    expected, _ = ref(x, x, x, attn_mask=attn_mask("causal_bool", 2, 4, 7, 7), is_causal=True)
    got, _ = ours(x, x, x, is_causal=True)  # torch wants the mask too; sdpa builds it
    assert max_err(got, expected) <= TOL64


def test_float32_layer_agrees_with_torch():
    ref = torch_mha(dtype=torch.float32)
    ours = sdpa.MultiheadAttention.from_torch(ref)
    assert ours.dtype == "float32"
    q, k, v = inputs(2, 6, 6, 16, 16, 16, True, dtype=torch.float32)
    expected, _ = ref(q, k, v, attn_mask=attn_mask("causal_bool", 2, 4, 6, 6))
    got, _ = ours(q, k, v, attn_mask=attn_mask("causal_bool", 2, 4, 6, 6))
    assert got.dtype == torch.float32
    assert max_err(got, expected) <= 1e-5 * max(1.0, expected.abs().max().item())


def test_numpy_in_numpy_out():
    ref = torch_mha(batch_first=False)
    ours = sdpa.MultiheadAttention.from_torch(ref)
    q, k, v = inputs(2, 4, 5, 16, 16, 16, batch_first=False)
    pad = padding_mask("bool", 2, 5)
    expected, expected_w = ref(q, k, v, key_padding_mask=pad)
    got, got_w = ours(q.numpy(), k.numpy(), v.numpy(), key_padding_mask=pad.numpy())
    assert isinstance(got, np.ndarray) and isinstance(got_w, np.ndarray)
    assert got.flags.c_contiguous
    assert np.abs(got - expected.detach().numpy()).max() <= TOL64
    assert np.abs(got_w - expected_w.detach().numpy()).max() <= TOL64


def test_fully_masked_rows_give_the_output_bias():
    # torch's MHA gives NaN for a query that may see no key; sdpa gives attention 0, so
    # the layer's output there is out_proj.bias (docs/semantics.md).
    ref = torch_mha()
    ours = sdpa.MultiheadAttention.from_torch(ref)
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[1, :] = True  # query 1 sees nothing
    got, weights = ours(x, x, x, attn_mask=mask)
    assert torch.isfinite(got).all()
    assert max_err(got[0, 1], ref.out_proj.bias.detach()) <= TOL64
    assert weights[0, 1].abs().max().item() == 0


def write_safetensors(path, tensors, metadata=None):
    """The huggingface/safetensors layout, written independently of sdpa: 8-byte header
    length, JSON header padded to 8 bytes, then the data in order."""
    codes = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_loads_torch_weights_from_a_safetensors_file(tmp_path):
    ref = torch_mha(batch_first=True)
    path = tmp_path / "model.safetensors"
    state = {"encoder.attn." + k: v for k, v in ref.state_dict().items()}
    state["encoder.position_ids"] = torch.arange(6)  # an int64 tensor elsewhere in the file
    write_safetensors(path, state, {"format": "pt"})
    ours = sdpa.MultiheadAttention.from_safetensors(path, 16, 4, prefix="encoder.attn.", batch_first=True,
                                                    dtype="float64")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert max_err(ours(x, x, x)[0], ref(x, x, x)[0]) <= TOL64


def test_saved_weights_load_back_and_into_torch(tmp_path):
    ours = sdpa.MultiheadAttention(16, 4, batch_first=True, dtype="float64", seed=3)
    ours.load_state_dict({k: torch.randn(*v.shape, dtype=torch.float64) for k, v in ours.state_dict().items()})
    path = tmp_path / "layer.safetensors"
    ours.save_safetensors(path, {"note": "x"})
    again = sdpa.MultiheadAttention(16, 4, batch_first=True, dtype="float64", seed=4)
    again.load_safetensors(path)
    for name, value in ours.state_dict().items():
        assert np.array_equal(again.state_dict()[name], value), name
    # sdpa's names map onto torch's: in_proj_weight = [W_q; W_k; W_v].
    sd = ours.state_dict()
    ref = torch_mha(batch_first=True)
    ref.load_state_dict({
        "in_proj_weight": torch.from_numpy(np.concatenate([sd["q_proj.weight"], sd["k_proj.weight"], sd["v_proj.weight"]])),
        "in_proj_bias": torch.from_numpy(np.concatenate([sd["q_proj.bias"], sd["k_proj.bias"], sd["v_proj.bias"]])),
        "out_proj.weight": torch.from_numpy(sd["out_proj.weight"]),
        "out_proj.bias": torch.from_numpy(sd["out_proj.bias"]),
    })
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert max_err(again(x)[0], ref(x, x, x)[0]) <= TOL64


@pytest.mark.parametrize("layout", ["half_split", "interleaved"])
def test_kv_cache_decoding_equals_one_causal_pass(layout):
    layer = sdpa.MultiheadAttention(32, 8, num_kv_heads=2, rope={"layout": layout}, batch_first=True,
                                    dtype=torch.float64, seed=5).eval()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    whole, _ = layer(x, is_causal=True, need_weights=False)
    cache = layer.make_cache(batch=2)
    steps = [layer(x[:, :4], is_causal=True, cache=cache, need_weights=False)[0]]  # prefill
    for t in range(4, 10):
        steps.append(layer(x[:, t:t + 1], is_causal=True, cache=cache, need_weights=False)[0])
    assert cache.length == 10
    assert max_err(torch.cat(steps, dim=1), whole) <= 1e-12


def test_window_alibi_softcap_layer_matches_the_formula():
    """The layer's window_size, alibi_slopes and softcap, against torch's projections
    around the float64 formula (oracle.extended_attention), with torch's weights."""
    import oracle

    ref = torch_mha()
    slopes = [0.5, 0.25, 0.125, 0.0625]
    ours = sdpa.MultiheadAttention(16, 4, batch_first=True, dtype="float64", window_size=(2, 1), alibi_slopes=slopes,
                                   softcap=1.5)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    q, k, v = torch.nn.functional.linear(x, ref.in_proj_weight, ref.in_proj_bias).chunk(3, dim=-1)
    heads = lambda t: t.reshape(2, 7, 4, 4).transpose(1, 2)
    for causal, is_causal in ((None, False), ("top_left", True)):
        o, _, _ = oracle.extended_attention(heads(q), heads(k), heads(v), causal=causal, window=(2, 1),
                                            slopes=torch.tensor(slopes, dtype=torch.float64), softcap=1.5)
        expected = ref.out_proj(o.transpose(1, 2).reshape(2, 7, 16))
        got, _ = ours(x, x, x, is_causal=is_causal, need_weights=False)
        assert max_err(got, expected.detach()) <= TOL64
    config = ours._core.config()
    assert config["window_size"] == (2, 1) and config["alibi_slopes"] == slopes and config["softcap"] == 1.5
    with pytest.raises(ValueError, match=r"^window_size\[0\]"):
        sdpa.MultiheadAttention(16, 4, window_size=(-2, 0))
    with pytest.raises(ValueError, match="^alibi_slopes"):
        sdpa.MultiheadAttention(16, 4, alibi_slopes=[0.5])


def test_errors_name_the_argument():
    layer = sdpa.MultiheadAttention(16, 4, batch_first=True, dtype="float64")
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="query"):
        layer(x.float())
    with pytest.raises(ValueError, match="query"):
        layer(torch.randn(2, 3, 15, dtype=torch.float64))
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_heads"):
        sdpa.MultiheadAttention(10, 3)
    with pytest.raises(NotImplementedError):
        sdpa.MultiheadAttention(16, 4, add_bias_kv=True)
    state = layer.state_dict()
    state["out_proj.weight"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match=r"out_proj.weight: expected shape \(16, 16\)"):
        layer.load_state_dict(state)
    del state["out_proj.weight"]
    with pytest.raises(ValueError, match="out_proj.weight"):
        layer.load_state_dict(state)


# --- arguments the bindings' C++ types cannot hold (issue 12) ------------------------------

LAYER = sdpa.MultiheadAttention(16, 4, batch_first=True, dropout=0.5, dtype="float64")
X = torch.randn(2, 3, 16, dtype=torch.float64)

BAD_LAYER_CALLS = [
    # (call, exception, what the message starts with). These were nanobind's "incompatible
    # function arguments", an OverflowError, or silently truncated (16.5 heads as 16).
    (lambda: sdpa.MultiheadAttention(16, 4, seed=-1), ValueError, "seed: expected an integer in [0, 2**64), got -1"),
    (lambda: sdpa.MultiheadAttention(16, 4, seed=2**64), ValueError,
     "seed: expected an integer in [0, 2**64), got 18446744073709551616"),
    (lambda: sdpa.MultiheadAttention(2**63, 4), ValueError,
     "embed_dim: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: sdpa.MultiheadAttention(16.5, 4), TypeError, "embed_dim: expected an int, got float"),
    (lambda: sdpa.MultiheadAttention(16, 4, dropout=10**400), ValueError,
     "dropout: expected a probability in [0, 1), got inf"),
    (lambda: sdpa.MultiheadAttention(16, 4, window_size=(2**63, 0)), ValueError,
     "window_size[0]: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: sdpa.MultiheadAttention(16, 4, rope={"base": 10**400}), ValueError,
     "rope.base: expected a finite base > 0, got inf"),
    (lambda: sdpa.MultiheadAttention(16, 4, rope={"layout": 1}), TypeError, "rope.layout: expected a str, got int"),
    (lambda: sdpa.MultiheadAttention(16, 4, rope={"layout": "spiral"}), ValueError,
     "rope.layout: expected 'half_split' or 'interleaved', got 'spiral'"),
    (lambda: sdpa.MultiheadAttention(16, 4, init=None), TypeError, "init: expected a str, got NoneType"),
    (lambda: LAYER(X, seed=2**64), ValueError, "seed: expected an integer in [0, 2**64), got 18446744073709551616"),
    (lambda: LAYER(X, seed=1.5), TypeError, "seed: expected an int or None, got float"),
    (lambda: LAYER(X, position_offset=2**63), ValueError,
     "position_offset: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: LAYER(X, num_threads=2**31), ValueError,
     "num_threads: expected an integer in [-2**31, 2**31), got 2147483648"),
    (lambda: LAYER(X, num_threads=-1), ValueError,
     "num_threads: expected an integer in [0, 4096] (0 = default), got -1"),
    (lambda: LAYER(X, num_threads=5000), ValueError,
     "num_threads: expected an integer in [0, 4096] (0 = default), got 5000"),
    (lambda: LAYER(X, cache="cache"), TypeError, "cache: expected a KVCache from make_cache, got str"),
    (lambda: LAYER(X, attn_mask=torch.zeros(5, 3, 3, dtype=torch.bool)), ValueError,
     "attn_mask: expected a shape broadcastable to (2, 4, 3, 3), got (5, 3, 3)"),
    # An int8 mask is neither bool nor additive float: it was added as a float mask.
    (lambda: LAYER(X, key_padding_mask=torch.zeros(2, 3, dtype=torch.int8)), TypeError,
     "key_padding_mask: expected bool, float16, bfloat16, float32 or float64, got int8"),
    (lambda: LAYER(X, attn_mask=torch.zeros(3, 3, dtype=torch.int8), key_padding_mask=torch.zeros(2, 3)), TypeError,
     "attn_mask: expected bool, float16, bfloat16, float32 or float64, got int8"),
    (lambda: LAYER.make_cache(2**63), ValueError,
     "batch: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: LAYER.make_cache(2).truncate(2**63), ValueError,
     "length: expected an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: LAYER.make_cache(2).truncate(1.0), TypeError, "length: expected an int, got float"),
    (lambda: LAYER(torch.nested.nested_tensor([X[0], X[1, :2]], layout=torch.jagged)), TypeError,
     "query: expected a strided (dense) tensor, got a nested tensor"),
    (lambda: LAYER.load_state_dict({**LAYER.state_dict(), "out_proj.bias": np.array([None] * 16)}), TypeError,
     "out_proj.bias: expected a tensor or array of floats, got object"),
    # int8 reaches the layer (it is a quantized K/V dtype): integers are no weights.
    (lambda: LAYER.load_state_dict({**LAYER.state_dict(), "out_proj.bias": np.zeros(16, np.int8)}), TypeError,
     "out_proj.bias: expected a floating-point tensor, got int8"),
]


@pytest.mark.parametrize("call,exception,message", BAD_LAYER_CALLS, ids=[m for _, _, m in BAD_LAYER_CALLS])
def test_layer_arguments_get_the_librarys_errors(call, exception, message):
    with pytest.raises(exception) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


# --- checkpoints in other dtypes (issue 12) -------------------------------------------------

def test_bfloat16_state_dict_loads_as_the_float32_weights_rounded_to_bfloat16():
    """bfloat16, the usual checkpoint dtype, failed with torch's "unsupported ScalarType
    BFloat16" (NumPy has none). It loads as its values: exactly the float32 weights rounded
    to bfloat16."""
    ref = torch_mha(dtype=torch.float32)
    rounded = {name: w.detach().to(torch.bfloat16) for name, w in ref.state_dict().items()}
    from_bf16 = sdpa.MultiheadAttention(16, 4, batch_first=True)
    from_bf16.load_state_dict(rounded)
    from_f32 = sdpa.MultiheadAttention(16, 4, batch_first=True)
    from_f32.load_state_dict({name: w.float() for name, w in rounded.items()})
    for name, value in from_f32.state_dict().items():
        assert np.array_equal(from_bf16.state_dict()[name], value), name
    assert not np.array_equal(from_f32.state_dict()["out_proj.weight"], ref.out_proj.weight.detach().numpy())
    x = torch.randn(2, 5, 16)
    assert torch.equal(from_bf16(x)[0], from_f32(x)[0])

    # A whole bfloat16 module: a float32 layer (the layer computes in float32 or float64).
    layer = sdpa.MultiheadAttention.from_torch(ref.to(torch.bfloat16))
    assert layer.dtype == "float32"
    assert torch.equal(layer(x)[0], from_f32(x)[0])


def test_weights_in_any_float_dtype_or_layout_load_as_their_values():
    """float16 / float8 tensors, lazily negated views (which NumPy refused), np.longdouble,
    big-endian arrays and fields of structured arrays: each loads its values."""
    weights = {name: torch.from_numpy(w) for name, w in sdpa.MultiheadAttention(16, 4, dtype="float64").state_dict()
               .items()}
    record = np.zeros((16, 16), dtype=[("w", np.float64), ("tag", np.int8)])  # 9-byte records
    record["w"] = weights["out_proj.weight"].numpy()
    variants = {
        "float16": lambda w: w.half(),
        "float8": lambda w: w.to(torch.float8_e4m3fn),
        "neg_view": lambda w: torch._neg_view(-w),
        "longdouble": lambda w: w.numpy().astype(np.longdouble),
        "big_endian": lambda w: w.numpy().astype(">f8"),
        "structured_field": lambda w: record["w"] if w.shape == (16, 16) else w,
    }

    def values(x):  # float64, as the values the entry stands for
        return x.resolve_neg().double().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)

    for variant, convert in variants.items():
        state = {name: convert(w) for name, w in weights.items()}
        layer = sdpa.MultiheadAttention(16, 4, dtype="float64", seed=1)
        layer.load_state_dict(state)
        for name, value in layer.state_dict().items():
            assert np.array_equal(value, values(state[name])), (variant, name)
