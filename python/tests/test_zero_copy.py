"""Zero copies, checked by pointer: torch and NumPy views of any strides go in and out as
they are (a plain torch.Tensor through torch's DLPack C exchange API), out= buffers are
written in place, the output takes the query's layout as torch's does, and what cannot be
written in place (a read-only array, a lazily negated view, a list) is refused, its memory
untouched."""

import numpy as np
import pytest
import torch

import oracle
import sdpa
from oracle import packed


def test_torch_views_go_in_and_out_without_a_copy():
    """(B, L, H, E) buffers, as a projection writes them, passed as transposed (B, H, L, E)
    views: the library reads those very buffers, and the tensor returned is the one it wrote."""
    B, L, S, H, E = 2, 7, 9, 4, 16
    q_buf, k_buf, v_buf = packed(B, L, H, E, seed=1), packed(B, S, H, E, seed=2), packed(B, S, H, E, seed=3)
    q, k, v = q_buf.transpose(1, 2), k_buf.transpose(1, 2), v_buf.transpose(1, 2)
    assert not q.is_contiguous()
    out = sdpa.scaled_dot_product_attention(q, k, v)
    seen = sdpa._core.last_call()
    assert seen["query"] == q_buf.data_ptr() and seen["key"] == k_buf.data_ptr() and seen["value"] == v_buf.data_ptr()
    assert seen["output"] == out.data_ptr()
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double())
    oracle.check_close("output", torch.float32, out, reference)


@pytest.mark.skipif("__dlpack_c_exchange_api__" not in torch.Tensor.__dict__,
                    reason="this torch has no DLPack C exchange API")
def test_torch_tensors_are_read_through_the_dlpack_exchange_api():
    """A plain torch.Tensor reaches the binding as it is and is read through its type's
    DLPack C exchange API (python/src/tensor_argument.h); what is read — pointer with the
    storage offset, dtype, shape, strides (transposed, expanded) — must be what a DLPack
    capsule of the same tensor says: the two give the same bits, into the caller's memory.
    Subclasses, NumPy arrays and capsules take nb::ndarray's import; a tensor the API
    refuses is a TypeError, not a crash; so is an output whose memory is read-only
    (torch's ReadOnlyTensorWrapper offers a const exchange API of its own). And the
    capsules `_Torch.export` makes for a torch without the API give the same bits."""
    core = sdpa._core
    assert core.reads_in_place(torch.empty(2)) and not core.reads_in_place(np.empty(2))
    assert not core.reads_in_place(torch.nn.Parameter(torch.empty(2)))  # a subclass keeps __dlpack__
    assert not core.reads_in_place(torch.utils.dlpack.to_dlpack(torch.empty(2)))
    g = torch.Generator().manual_seed(8)
    base = torch.randn(3, 2, 9, 16, generator=g)
    q = base[1:, :, 2:, :]  # a storage offset
    k = torch.randn(1, 2, 5, 16, generator=g).expand(2, 2, 5, 16)  # stride 0
    v = torch.randn(2, 5, 2, 8, generator=g).transpose(1, 2)  # transposed
    options = sdpa._options.to_core(sdpa._options.make_options(None))
    outputs = []
    for export in (lambda t: t, torch.utils.dlpack.to_dlpack):
        out = torch.full((2, 7, 2, 8), float("nan")).transpose(1, 2)
        core.forward(export(q), export(k), export(v), None, None, None, export(out), None, None, options)
        seen = core.last_call()
        assert (seen["query"], seen["key"], seen["value"], seen["output"]) == tuple(
            t.data_ptr() for t in (q, k, v, out))
        outputs.append(out)
    assert torch.equal(outputs[0], outputs[1])
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double())
    oracle.check_close("output", torch.float32, outputs[0], reference)
    sparse = torch.eye(4).to_sparse()
    with pytest.raises(TypeError):
        core.forward(sparse, sparse, sparse, None, None, None, torch.empty(4, 4), None, None, options)
    if hasattr(torch.utils.dlpack, "ReadOnlyTensorWrapper"):
        buffer = torch.zeros(2, 2, 7, 8)
        read_only = torch.utils.dlpack.ReadOnlyTensorWrapper(buffer)
        with pytest.raises(TypeError):
            core.forward(q, k, v, None, None, None, read_only, None, None, options)
        assert torch.equal(buffer, torch.zeros(2, 2, 7, 8))
        out = torch.empty(2, 2, 7, 8)  # read-only inputs are read through their const API
        core.forward(torch.utils.dlpack.ReadOnlyTensorWrapper(q.contiguous()), k, v, None, None, None, out, None,
                     None, options)
        assert torch.equal(out, outputs[0])
    fw = sdpa._frameworks._framework(q)
    fw.in_place = False  # the capsule path of a torch without the exchange API
    try:
        assert torch.equal(sdpa.attention(q, k, v), outputs[0])
    finally:
        fw.in_place = True


def test_out_buffer_is_written_in_place_in_any_layout():
    """out= a (B, L, H, Ev) buffer's transposed view: the result is that buffer, and the
    caller gets the (B, L, H·Ev) layout a following projection wants without a copy."""
    B, L, H, E = 2, 5, 3, 8
    q, k, v = packed(B, H, L, E, seed=4), packed(B, H, L, E, seed=5), packed(B, H, L, E, seed=6)
    buffer = torch.full((B, L, H, E), 7.0)
    result = sdpa.attention(q, k, v, causal="top_left", out=buffer.transpose(1, 2))
    assert result.data_ptr() == buffer.data_ptr() and sdpa._core.last_call()["output"] == buffer.data_ptr()
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double(), is_causal=True)
    oracle.check_close("output", torch.float32, buffer.transpose(1, 2), reference)


@pytest.mark.parametrize("grad", [False, True])
def test_output_takes_the_query_layout_as_torchs_does(grad):
    """torch's CPU SDPA gives its output the query's memory order where its fused kernel
    runs (4-D, Ev = E, no dropout): a (B, L, H, E) projection viewed as (B, H, L, E) gets
    an output whose transpose(1, 2) is contiguous, so a model's .view(B, L, H * E) works.
    sdpa's output must be laid out the same (with and without autograd), and be right; and
    its gradients as torch's where the inputs come from such projections (torch's are
    always in (B, L, H, E) order; sdpa's in their input's: no copy on the way back)."""
    B, L, H, Hkv, E = 2, 6, 4, 2, 8
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, L, H, E, generator=g).transpose(1, 2).requires_grad_(grad)
    kv = torch.randn(B, L, 2, Hkv, E, generator=g)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    mask = torch.randn(L, L, generator=g)
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}):
        ours = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        assert ours.stride() == theirs.stride() == (L * H * E, E, H * E, 1), kwargs
        assert ours.transpose(1, 2).view(B, L, H * E).data_ptr() == ours.data_ptr()
        oracle.check_close("output", torch.float32, ours.detach(), theirs.detach().double())
    # A packed query keeps a packed output; so do dropout and Ev != E (torch's math path).
    packed_q = q.detach().contiguous()
    for args, kwargs in (((packed_q, k, v), {}), ((q, k, v), {"dropout_p": 0.5}), ((q, k, v[..., :5]), {})):
        ours = sdpa.scaled_dot_product_attention(*args, enable_gqa=True, **kwargs)
        theirs = torch.nn.functional.scaled_dot_product_attention(*args, enable_gqa=True, **kwargs)
        assert ours.is_contiguous() and ours.stride() == theirs.stride(), kwargs
    if grad:  # the gradient flows through the strided output; the gradients in their inputs' order
        k, v = k.requires_grad_(), v.requires_grad_()
        out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        dq, dk, dv = torch.autograd.grad(out.square().sum(), (q, k, v))
        torchs = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert [t.stride() for t in (dq, dk, dv)] == [t.stride() for t in torch.autograd.grad(
            torchs.square().sum(), (q, k, v))] == [q.stride(), (L * Hkv * E, E, Hkv * E, 1), (L * Hkv * E, E, Hkv * E, 1)]
        q64 = q.detach().double().requires_grad_()
        reference = torch.nn.functional.scaled_dot_product_attention(q64, k.double(), v.double(), enable_gqa=True)
        (dq64,) = torch.autograd.grad(reference.square().sum(), q64)
        oracle.check_close("grad_query", torch.float32, dq, dq64)


def test_numpy_views_go_in_without_a_copy():
    """Negative strides, a read-only broadcast view and a Fortran-ordered array."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 6, 8))[:, :, ::-1]  # negative stride over L
    k = np.broadcast_to(rng.standard_normal((1, 3, 5, 8)), (2, 3, 5, 8))  # read-only, stride 0
    v = np.asfortranarray(rng.standard_normal((2, 3, 5, 4)))
    out = sdpa.scaled_dot_product_attention(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    seen = sdpa._core.last_call()
    for name, array in (("query", q), ("key", k), ("value", v), ("output", out)):
        assert seen[name] == array.__array_interface__["data"][0], name
    reference = oracle.torch_sdpa(oracle.to64(q), oracle.to64(k), oracle.to64(v))
    oracle.check_close("output", torch.float64, out, reference)


def test_read_only_numpy_out_is_refused_not_copied():
    q = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="out: expected a writable array"):
        sdpa.attention(q, q, q, out=np.broadcast_to(np.zeros((1, 3, 4)), (2, 3, 4)))


def lazily_negated_views():
    """(view, its memory): torch views whose memory holds the negatives of their values."""
    buffer = torch.zeros(2, 3, 5, 4)
    complex_buffer = torch.zeros(2, 3, 5, 4, dtype=torch.complex64)
    return [(torch._neg_view(buffer), buffer), (complex_buffer.conj().imag, complex_buffer)]


@pytest.mark.parametrize("case", [0, 1], ids=["neg_view", "conj_imag"])
def test_lazily_negated_out_is_refused_and_its_memory_left_alone(case):
    """Issue 12: out= a torch._neg_view or z.conj().imag was resolved into a temporary copy,
    the library wrote the copy, and the caller's buffer never saw the result."""
    view, memory = lazily_negated_views()[case]
    assert view.is_neg()
    q = packed(2, 3, 5, 4, seed=40)
    with pytest.raises(TypeError, match=r"^out: expected a tensor whose memory holds its values, got a view with "
                                        r"torch's lazy negative bit"):
        sdpa.attention(q, q, q, out=view)
    assert (memory == 0).all()


def test_lazily_negated_inputs_are_read_as_their_values():
    """An input with the negative bit is resolved (a copy, read once): the values count."""
    q, k, v = packed(1, 2, 5, 4, seed=41), packed(1, 2, 6, 4, seed=42), packed(1, 2, 6, 3, seed=43)
    out = sdpa.attention(torch._neg_view(-q), k, torch._neg_view(-v))
    assert torch.equal(out, sdpa.attention(q, k, v))


def test_out_that_is_not_an_array_is_refused_not_copied():
    """np.asarray would turn a list into a new array, which the library would fill and the
    caller would never see."""
    q = np.ones((1, 3, 4))
    with pytest.raises(TypeError, match="^out: expected a NumPy array like the query, got builtins.list"):
        sdpa.attention(q, q, q, out=np.zeros((1, 3, 4)).tolist())
