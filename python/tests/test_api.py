"""The Python surface: errors (every argument of attention, scaled_dot_product_attention,
varlen_attention and paged_attention, the score modifiers' included), autograd and
devices, seeds, and the contract's corner cases (fully masked rows, NaN, empty shapes)
against PyTorch. Zero copies and output buffers: test_zero_copy.py."""

import math
import warnings

import numpy as np
import pytest
import torch

import oracle
import sdpa
from oracle import packed


# --- errors -------------------------------------------------------------------------------

Q, K, V = packed(2, 4, 5, 8, seed=7), packed(2, 4, 6, 8, seed=8), packed(2, 4, 6, 3, seed=9)
QP, KP, VP = torch.randn(10, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)  # packed (total, H, E)
PAGES = torch.randn(4, 2, 4, 8)  # (pages, Hkv, page_size, E)
# Fields of structured arrays: float32 views whose byte strides (records of 6 and 5 bytes)
# are no whole number of elements, which DLPack cannot express.
FIELDS = {"query": np.zeros((2, 4, 5, 8), dtype=[("x", np.float32), ("pad", np.int16)])["x"],
          "out": np.zeros((2, 4, 5, 3), dtype=[("x", np.float32), ("pad", np.int8)])["x"]}
with pytest.warns(UserWarning):  # torch: the strided nested layout is a prototype
    NESTED = torch.nested.nested_tensor([torch.randn(3, 3), torch.randn(2, 3)])


def quantized(x):
    with warnings.catch_warnings():  # torch deprecates its quantized dtypes
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)

BAD_CALLS = [
    # (call, exception, message the user sees)
    (lambda: sdpa.scaled_dot_product_attention(Q, K.double(), V), TypeError,
     "key: expected the query's dtype float32, got float64"),
    (lambda: sdpa.scaled_dot_product_attention(Q.int(), K, V), TypeError,
     "query: expected float16, bfloat16, float32 or float64, got int32"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V[:, :, :5]), ValueError,
     "value: expected sequence length S = 6 (the key's), got 5"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[..., :4], V), ValueError,
     "key: expected head dim E = 8 (the query's), got 4"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, attn_mask=torch.ones(3, 6, dtype=torch.bool)), ValueError,
     "attn_mask: expected a shape broadcastable to (2, 4, 5, 6), got (3, 6) (dim 0)"),
    (lambda: sdpa.attention(Q, K, V, torch.ones(3, 6, dtype=torch.bool)), ValueError,
     "mask: expected a shape broadcastable to (2, 4, 5, 6), got (3, 6) (dim 0)"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, attn_mask=torch.ones(5, 6, dtype=torch.int64)), TypeError,
     "attn_mask: expected bool or float16, bfloat16, float32 or float64, got int64"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, dropout_p=1.0), ValueError,
     "dropout_p: expected a probability in [0, 1), got 1.000000"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, dropout_p="0.1"), TypeError,
     "dropout_p: expected a float, got str"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, scale=math.nan), ValueError,
     "scale: expected a finite number, got nan"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[:, :3], V[:, :3], enable_gqa=True), ValueError,
     "key: expected a head count dividing the query's 4 (GQA), got 3"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[:, :2], V[:, :2]), ValueError,
     "key: expected 4 heads like the query, got 2 (pass enable_gqa=True for grouped-query attention)"),
    (lambda: sdpa.scaled_dot_product_attention(Q[0], K[0, :, :, :], V[:2, 0]), ValueError,
     "value: expected batch dims (4,) like the query, got (2,)"),
    (lambda: sdpa.attention(Q, K, V, causal=True), ValueError,
     "causal: expected None, 'top_left' or 'bottom_right', got True"),
    (lambda: sdpa.attention(Q, K, V, dropout_p=0.5, seed=-1), ValueError,
     "seed: expected an integer in [0, 2**64), got -1"),
    (lambda: sdpa.attention(Q, K, V, dropout_p=0.5, seed=1.5), TypeError, "seed: expected an int or None, got float"),
    (lambda: sdpa.attention(Q, K.numpy(), V), TypeError, "key: expected a torch.Tensor like the query"),
    (lambda: sdpa.attention(Q.numpy(), K, V), TypeError, "key: expected a NumPy array like the query"),
    (lambda: sdpa.attention(Q, K, V, out=torch.empty(2, 4, 5, 4)), ValueError,
     "out: expected shape (2, 4, 5, 3), got (2, 4, 5, 4)"),
    (lambda: sdpa.attention(Q, K, V, out=torch.empty(2, 4, 5, 3, dtype=torch.float64)), TypeError,
     "out: expected dtype float32, got float64"),
    (lambda: sdpa.attention(Q, K, V, out=torch.empty(1, 1, 1, 1).expand(2, 4, 5, 3)), ValueError,
     "out: expected an output whose elements do not overlap"),
    (lambda: sdpa.attention(Q, K, V.to("meta")), ValueError, "value: expected a CPU tensor, got device meta"),
    (lambda: sdpa.attention(np.array(["a"]), np.array(["a"]), np.array(["a"])), TypeError,
     "query: expected float16, float32 or float64 (bool for a mask), got <U1"),
    # Issue 12: these arrived as nanobind's "incompatible function arguments", OverflowError
    # or torch's RuntimeError instead of the library's form.
    (lambda: sdpa.attention(*(Q.double().numpy().astype(np.longdouble),) * 3), TypeError,
     f"query: expected float16, float32 or float64 (bool for a mask), got {np.dtype(np.longdouble)}"),
    (lambda: sdpa.attention(Q.numpy(), K.numpy(), V.numpy(), np.zeros((5, 6), np.longdouble)), TypeError,
     f"mask: expected float16, float32 or float64 (bool for a mask), got {np.dtype(np.longdouble)}"),
    (lambda: sdpa.attention(FIELDS["query"], K.numpy(), V.numpy()), ValueError,
     "query: expected strides that are whole elements of 4 bytes, got byte strides (960, 240, 48, 6)"),
    (lambda: sdpa.attention(Q.numpy(), K.numpy(), V.numpy(), out=FIELDS["out"]), ValueError,
     "out: expected strides that are whole elements of 4 bytes, got byte strides (300, 75, 15, 5)"),
    (lambda: sdpa.attention(Q, K, V, scale=10**400), ValueError, "scale: expected a finite number, got inf"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, scale=-10**400), ValueError,
     "scale: expected a finite number, got -inf"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, dropout_p=10**400), ValueError,
     "dropout_p: expected a probability in [0, 1), got inf"),
    (lambda: sdpa.attention(NESTED, NESTED, NESTED), TypeError,
     "query: expected a strided (dense) tensor, got a nested tensor"),
    (lambda: sdpa.scaled_dot_product_attention(Q[:1, :, :3, :3], Q[:1, :, :3, :3], Q[:1, :, :3, :3], NESTED),
     TypeError, "attn_mask: expected a strided (dense) tensor, got a nested tensor"),
    (lambda: sdpa.attention(quantized(Q), K, V), TypeError,
     "query: expected a tensor of plain numbers, got the quantized dtype torch.qint8"),
    # The score modifiers, varlen_attention and paged_attention: the message starts so.
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
def test_bad_input_raises_a_clear_error(call, exception, message):
    with pytest.raises(exception) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_output_overlapping_an_input_is_refused_and_nothing_is_written():
    """The library checks every argument before it writes: an out= buffer aliasing the
    query is refused, and the query is left as it was."""
    q = packed(2, 3, 5, 4, seed=10)
    before = q.clone()
    with pytest.raises(ValueError, match="out: expected a buffer apart from the inputs"):
        sdpa.attention(q, q, q, out=q)
    assert torch.equal(q, before)

    out = torch.full((2, 3, 5, 4), 7.0)
    with pytest.raises(ValueError):
        sdpa.attention(q, q, q[:, :, :4], out=out)  # S mismatch in value
    assert (out == 7.0).all(), "an output was written before the error"


def test_inputs_requiring_grad_get_gradients_and_no_grad_mode_detaches():
    """Inputs that require grad go through sdpa's autograd op (test_backward.py has the
    gradients); under no_grad or inference_mode the result is cut from the graph."""
    q = packed(1, 2, 3, 4).requires_grad_()
    out = sdpa.scaled_dot_product_attention(q, q.detach(), q.detach())
    assert out.requires_grad
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape
    with torch.no_grad():
        out = sdpa.scaled_dot_product_attention(q, q, q)
    oracle.check_close("output", torch.float32, out, oracle.torch_sdpa(*(q.detach().double(),) * 3))
    with torch.inference_mode():
        x = packed(1, 2, 3, 4)
        assert sdpa.scaled_dot_product_attention(x, x, x).shape == (1, 2, 3, 4)


# --- dropout seeds --------------------------------------------------------------------------

def test_dropout_seed_none_draws_from_torchs_generator():
    q, k, v = packed(1, 2, 8, 4, seed=11), packed(1, 2, 8, 4, seed=12), packed(1, 2, 8, 4, seed=13)
    torch.manual_seed(5)
    a = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    assert torch.equal(sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5), a)
    assert not torch.equal(a, b), "each call draws a fresh seed"
    state = torch.get_rng_state()
    sdpa.scaled_dot_product_attention(q, k, v)
    assert torch.equal(torch.get_rng_state(), state), "dropout_p = 0 draws nothing"


@pytest.mark.parametrize("call", [
    lambda q, bad: sdpa.attention(q, bad, q, dropout_p=0.5),
    lambda q, bad: sdpa.scaled_dot_product_attention(q, bad, q, dropout_p=0.5),
    lambda q, bad: sdpa.varlen_attention(q[0], bad[0], q[0], torch.tensor([0, 2], dtype=torch.int32),
                                         torch.tensor([0, 2], dtype=torch.int32), dropout_p=0.5),
])
def test_a_call_refused_for_its_tensors_draws_no_seed(call):
    # The options (and the seed drawn for dropout) come after the tensors' checks: a
    # rejected call leaves torch's generator where it was.
    q = torch.randn(1, 2, 4, 8)
    bad = np.ones((1, 2, 4, 8), np.float32)  # a NumPy key with a torch query
    state = torch.get_rng_state()
    with pytest.raises(TypeError, match="key"):
        call(q, bad)
    assert torch.equal(torch.get_rng_state(), state)


def test_dropout_seed_none_draws_from_numpys_generator():
    q = np.random.default_rng(1).standard_normal((2, 8, 4))
    np.random.seed(3)
    a = sdpa.attention(q, q, q, dropout_p=0.5)
    np.random.seed(3)
    assert np.array_equal(sdpa.attention(q, q, q, dropout_p=0.5), a)


def test_explicit_seed_is_reproducible_across_frameworks():
    """The mask depends on (seed, b, h, i, j) only: a torch and a NumPy call agree."""
    q, k, v = packed(2, 3, 6, 4, seed=14), packed(2, 3, 7, 4, seed=15), packed(2, 3, 7, 5, seed=16)
    a = sdpa.attention(q, k, v, dropout_p=0.3, seed=2**64 - 1)
    b = sdpa.attention(q.numpy(), k.numpy(), v.numpy(), dropout_p=0.3, seed=2**64 - 1)
    assert np.array_equal(a.numpy(), b)


# --- corner cases of the contract, against PyTorch ---------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_fully_masked_rows_give_zero_weights_zero_and_lse_minus_inf(dtype):
    q, k, v = packed(1, 2, 4, 8, dtype=dtype, seed=17), packed(1, 2, 5, 8, dtype=dtype, seed=18), packed(
        1, 2, 5, 3, dtype=dtype, seed=19)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1] = False
    float_mask = torch.zeros(4, 5, dtype=dtype).masked_fill(~mask, -math.inf)
    for m in (mask, float_mask):
        out, weights, lse = sdpa.attention(q, k, v, m, return_weights=True, return_lse=True)
        assert (out[..., 1, :] == 0).all() and (weights[..., 1, :] == 0).all()
        assert torch.isneginf(lse[..., 1]).all() and torch.isfinite(lse[..., [0, 2, 3]]).all()
        assert torch.isfinite(out).all()
        # torch's math backend (>= 2.5) agrees on the zeros
        torch_out = oracle.torch_sdpa(q.double(), k.double(), v.double(), attn_mask=oracle.combined_mask(m, 4, 5, None))
        assert (torch_out[..., 1, :] == 0).all()
    # bottom-right causal with L > S: the first L - S queries see no key
    out = sdpa.attention(q, k[:, :, :2], v[:, :, :2], causal="bottom_right")
    assert (out[..., :2, :] == 0).all() and (out[..., 2:, :] != 0).any()


def test_a_minus_1e9_mask_is_not_fully_masked():
    """Seeds 001 and 004 write -1e9. Added to the scores it is a number, not a removal: a row
    that is -1e9 everywhere is the unmasked softmax (the shift cancels), never a zero row."""
    q, k, v = (packed(1, 3, 4, seed=20, dtype=torch.float64), packed(1, 5, 4, seed=21, dtype=torch.float64),
               packed(1, 5, 2, seed=22, dtype=torch.float64))
    mask = torch.zeros(3, 5, dtype=torch.float64)
    mask[0] = -1e9
    mask[1, 2:] = -1e9
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    oracle.check_close("output", torch.float64, out, oracle.torch_sdpa(q, k, v, attn_mask=mask))
    unmasked = oracle.torch_sdpa(q, k, v)
    assert (out[0, 0] - unmasked[0, 0]).abs().max() < 1e-6 and (out[0, 0] != 0).all()


def test_nan_in_the_query_propagates_to_its_row_only():
    """pytorch#141128 was the bug of turning NaN into zeros."""
    q, k, v = packed(1, 2, 4, 8, seed=23, dtype=torch.float64), packed(1, 2, 6, 8, seed=24), packed(1, 2, 6, 8, seed=25)
    k, v = k.double(), v.double()
    q[0, 1, 2, 3] = math.nan
    out = sdpa.scaled_dot_product_attention(q, k, v)
    reference = oracle.torch_sdpa(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(reference))
    assert torch.isnan(out[0, 1, 2]).all() and torch.isfinite(out[0, 0]).all()
    finite = ~torch.isnan(reference)
    oracle.check_close("output", torch.float64, out[finite], reference[finite])


@pytest.mark.parametrize("L,S,batch", [(0, 5, 2), (4, 0, 2), (4, 5, 0), (0, 0, 1)])
def test_empty_shapes_give_correctly_shaped_results(L, S, batch):
    q, k, v = torch.randn(batch, 2, L, 8), torch.randn(batch, 2, S, 8), torch.randn(batch, 2, S, 3)
    out, weights, lse = sdpa.attention(q, k, v, return_weights=True, return_lse=True)
    assert out.shape == (batch, 2, L, 3) and weights.shape == (batch, 2, L, S) and lse.shape == (batch, 2, L)
    if S == 0:  # every row fully masked
        assert (out == 0).all() and torch.isneginf(lse).all()
    torch_out = oracle.torch_sdpa(q.double(), k.double(), v.double())
    assert torch_out.shape == out.shape
    assert np.array_equal(sdpa.attention(q.numpy(), k.numpy(), v.numpy()).shape, out.shape)


def test_rank3_with_enable_gqa_reads_dim_0_as_heads_like_torch():
    """torch's enable_gqa splits dim -3 into groups even at rank 3; sdpa's rank 3 is
    (batch, seq, dim), so the drop-in function reads (heads, seq, dim) there."""
    q, k, v = packed(6, 5, 8, seed=26), packed(2, 7, 8, seed=27), packed(2, 7, 4, seed=28)
    out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double(), enable_gqa=True, is_causal=True)
    oracle.check_close("output", torch.float32, out, reference)
    with pytest.raises(ValueError, match="key: expected batch dims"):
        sdpa.scaled_dot_product_attention(q, k, v)  # without it, dim 0 is a batch dim


def test_mask_and_is_causal_both_apply():
    """torch refuses attn_mask with is_causal=True; sdpa applies both."""
    q, k, v = packed(2, 2, 6, 8, seed=29), packed(2, 2, 6, 8, seed=30), packed(2, 2, 6, 8, seed=31)
    padding = torch.tensor([True, True, True, True, False, False])
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=padding, is_causal=True)
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double(), attn_mask=padding & torch.ones(6, 6).tril().bool())
    oracle.check_close("output", torch.float32, out, reference)
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding, is_causal=True)


def test_package_metadata():
    assert sdpa.__version__ == "0.1.0"
    info = sdpa.runtime_info()
    assert info["version"] == sdpa.__version__ and info["max_threads"] >= 1
    # Which arithmetic bfloat16 runs on, said twice: as a flag and in the kernel's name.
    assert info["bfloat16_on_vdpbf16ps"] is ("bfloat16 on vdpbf16ps" in info["cpu_kernel"])
    for function in (sdpa.scaled_dot_product_attention, sdpa.attention):
        assert "Raises" in function.__doc__
