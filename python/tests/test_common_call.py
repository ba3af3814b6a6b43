"""The common call's short paths (sdpa/_attention.py, `_common_call`; sdpa/_sequences.py,
`_common_paged`): a model's call — plain torch tensors, no gradient, no keyword but causal,
scale, out and enable_gqa (a paged decode step's: layout, causal and scale) — skips the
general path's checks. It must give the general path's results to the bit, in the same
layout, and leave to the general path every call it cannot answer the same way: lazily
negated views, gradients, a head count torch refuses, a batch to broadcast, and every error.
"""

import numpy as np
import pytest
import torch

import oracle
import sdpa
from oracle import packed
from sdpa import _attention, _frameworks, _sequences


def refuse(*args, **kwargs):
    raise AssertionError("the general path ran")


def decline(*args, **kwargs):
    return None


def spy_on(monkeypatch, module, name):
    """The list of what module.name (a short path) returns, call by call, from now on."""
    tried = []
    short_path = getattr(module, name)

    def spy(*args, **kwargs):
        tried.append(short_path(*args, **kwargs))
        return tried[-1]
    monkeypatch.setattr(module, name, spy)
    return tried


@pytest.fixture
def general_path_refused(monkeypatch):
    """The general path raises (its first step, _prepare_qkv): a call that returns took the
    short one."""
    monkeypatch.setattr(_attention, "_prepare_qkv", refuse)


@pytest.fixture
def short_path_refused(monkeypatch):
    monkeypatch.setattr(_attention, "_common_call", decline)


def common_calls():
    """The calls the short path must take, by name: masks of both kinds, causal, scales,
    GQA, the (B, L, H, E) projection layout, out=."""
    B, Hq, Hkv, L, S, E = 2, 4, 2, 5, 7, 8
    q, k, v = packed(B, Hq, L, E, seed=1), packed(B, Hkv, S, E, seed=2), packed(B, Hkv, S, E, seed=3)
    k4, v4 = packed(B, Hq, S, E, seed=4), packed(B, Hq, S, E, seed=5)
    projected = packed(B, L, Hq, E, seed=6).transpose(1, 2)
    bool_mask = packed(L, S, seed=7) > 0
    float_mask = packed(B, 1, L, S, seed=8, dtype=torch.float64)
    F = sdpa.scaled_dot_product_attention
    return {
        "plain": lambda: F(q, k4, v4),
        "bool mask": lambda: F(q, k4, v4, attn_mask=bool_mask),
        "float64 mask": lambda: F(q, k4, v4, float_mask),
        "causal": lambda: F(q, k4, v4, is_causal=True),
        "scale 0.3": lambda: F(q, k4, v4, scale=0.3),
        "scale -2": lambda: F(q, k4, v4, scale=-2.0, is_causal=True),  # after 0.3: keyed by both
        "gqa": lambda: F(q, k, v, enable_gqa=True),
        "projection layout": lambda: F(projected, k, v, enable_gqa=True),
        "attention bottom_right": lambda: sdpa.attention(q, k, v, causal="bottom_right", scale=0.5),
        "attention out=": lambda: sdpa.attention(q, k, v, bool_mask, out=torch.empty(B, L, Hq, E).transpose(1, 2)),
    }


@pytest.mark.parametrize("name", list(common_calls()))
def test_the_common_call_takes_the_short_path_and_gives_the_general_paths_bits(name, monkeypatch):
    call = common_calls()[name]
    with monkeypatch.context() as m:
        m.setattr(_attention, "_prepare_qkv", refuse)
        short = call()
    with monkeypatch.context() as m:
        m.setattr(_attention, "_common_call", decline)
        general = call()
    assert torch.equal(short, general), name
    assert short.stride() == general.stride(), name


def test_the_short_paths_options_follow_causal_and_scale():
    """Calls that differ only in causal or scale, one after the other (the options are kept
    by those two), against the float64 oracle."""
    q, k, v = packed(1, 2, 6, 8, seed=10), packed(1, 2, 6, 8, seed=11), packed(1, 2, 6, 8, seed=12)
    for is_causal, scale in ((False, None), (True, None), (False, 0.25), (True, 0.25), (False, -1.5), (False, None)):
        ours = sdpa.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
        reference = oracle.torch_sdpa(q.double(), k.double(), v.double(), is_causal=is_causal, scale=scale)
        oracle.check_close("output", torch.float32, ours, reference)


def test_calls_the_short_path_cannot_answer_go_the_general_way(general_path_refused):
    """Each of these, taken by the short path, would be a wrong answer (negated values, no
    gradient, heads torch refuses, a batch not broadcast): with the general path refused,
    each must fail rather than return."""
    q, k, v = packed(2, 4, 5, 8, seed=20), packed(2, 4, 6, 8, seed=21), packed(2, 4, 6, 8, seed=22)
    kv2 = packed(2, 2, 6, 8, seed=23)
    F = sdpa.scaled_dot_product_attention
    calls = [
        lambda: F(torch._neg_view(q), k, v),
        lambda: F(q, k, v, attn_mask=torch._neg_view(packed(5, 6, seed=24))),
        lambda: F(q.clone().requires_grad_(), k, v),
        lambda: F(q, k, v, attn_mask=packed(5, 6, seed=25).requires_grad_()),
        lambda: F(q, kv2, kv2),  # Hq != Hkv without enable_gqa: torch's ValueError
        lambda: F(q, kv2, kv2, enable_gqa=None),  # (None is no GQA, as False)
        lambda: F(q, k[:1], v[:1]),  # a batch of 1 broadcast
        lambda: F(q[0], k[0], v[0]),  # rank 3
        lambda: F(q, k, v, dropout_p=0.5),
        lambda: sdpa.attention(q, k, v, out=torch._neg_view(torch.empty(2, 4, 5, 8))),
        lambda: sdpa.attention(torch.nn.Parameter(q), k, v),
        lambda: sdpa.attention(q.numpy(), k.numpy(), v.numpy()),
    ]
    for n, call in enumerate(calls):
        with pytest.raises(AssertionError, match="the general path ran"):
            call()
            pytest.fail(f"call {n} took the short path")


def test_what_the_general_path_gives_for_those_calls(short_path_refused):
    """...and what they give there: torch's answers (the short path refused, so a change to
    it cannot mask a change here)."""
    q, k, v = packed(2, 4, 5, 8, seed=20), packed(2, 4, 6, 8, seed=21), packed(2, 4, 6, 8, seed=22)
    kv2 = packed(2, 2, 6, 8, seed=23)
    reference = oracle.torch_sdpa(q.double(), k.double(), v.double())
    oracle.check_close("output", torch.float32, sdpa.scaled_dot_product_attention(torch._neg_view(-q), k, v),
                       reference)
    for enable_gqa in (False, None):
        with pytest.raises(ValueError, match="key: expected 4 heads like the query, got 2"):
            sdpa.scaled_dot_product_attention(q, kv2, kv2, enable_gqa=enable_gqa)
    broadcast = oracle.torch_sdpa(q.double(), k[:1].double(), v[:1].double())
    oracle.check_close("output", torch.float32, sdpa.scaled_dot_product_attention(q, k[:1], v[:1]), broadcast)
    leaf = q.clone().requires_grad_()
    sdpa.scaled_dot_product_attention(leaf, k, v).sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0


OUT = torch.full((1, 2, 4, 8), 7.0)  # an out= buffer the refused calls must leave alone


@pytest.mark.parametrize("call,exception,message", [
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, scale=True), TypeError,
     "^scale: expected a float or None, got bool"),  # (after a scale of 1.0: the same key but for its type)
    (lambda q: sdpa.scaled_dot_product_attention(q.to(torch.int32), q, q), TypeError, "query: expected float16"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q[..., :3], q), ValueError, "^key: "),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, 3)), ValueError, "^attn_mask: "),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, scale=float("nan")), ValueError, "scale"),
    (lambda q: sdpa.scaled_dot_product_attention(q.to_sparse(), q, q), TypeError,
     "^query: expected a strided \\(dense\\) tensor, got layout torch.sparse_coo"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q.to("meta"), q), ValueError, "^key: expected a CPU tensor"),
    (lambda q: sdpa.attention(q, q, q, causal="left"), ValueError, "causal"),
    (lambda q: sdpa.attention(q, q, q, out=q), ValueError, "^out: "),
    (lambda q: sdpa.attention(q, q, q, torch.ones(3, 3, 3), out=OUT), ValueError, "^mask: "),
    (lambda q: sdpa.attention(q, q, q, out=OUT[..., :5]), ValueError, "^out: "),
    # A value of rank 0 (its last dim, asked for the output's shape, was an IndexError on
    # both paths), with and without a gradient wanted.
    (lambda q: sdpa.attention(q, q, torch.tensor(1.0)), ValueError, "^value: expected rank >= 2"),
    (lambda q: sdpa.attention(q.numpy(), q.numpy(), np.ones((), np.float32)), ValueError,
     "^value: expected rank >= 2"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, torch.tensor(1.0, requires_grad=True)), ValueError,
     "^value: expected rank >= 2"),
])
def test_a_refused_common_call_gets_the_general_paths_error(call, exception, message, monkeypatch):
    """The short path tries each (and gives up: None); the general path then runs and names
    the argument. Nothing is written: not the inputs, not an out= buffer."""
    q = packed(1, 2, 4, 8, seed=30)
    sdpa.scaled_dot_product_attention(q, q, q, scale=1.0)  # (the options kept for 1.0)
    before, out_before = q.clone(), OUT.clone()
    tried = spy_on(monkeypatch, _attention, "_common_call")
    with pytest.raises(exception, match=message):
        call(q)
    assert tried == [None]
    assert torch.equal(q, before) and torch.equal(OUT, out_before)



# --- paged_attention ---------------------------------------------------------------------------

def paged_case(layout="HND", Ev=8, dtype=torch.float32, table_dtype=torch.int32):
    """A decode step against a shuffled paged cache: B = 2, GQA 4/2, page_size 4, 6 pages."""
    q = packed(2, 4, 1, 8, seed=40, dtype=dtype)
    shape = (6, 2, 4) if layout == "HND" else (6, 4, 2)
    k_pages, v_pages = packed(*shape, 8, seed=41, dtype=dtype), packed(*shape, Ev, seed=42, dtype=dtype)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=table_dtype)
    lens = torch.tensor([9, 12], dtype=table_dtype)
    return q, k_pages, v_pages, table, lens


def common_paged_calls():
    """The paged calls the short path must take: both layouts, causal, a scale, Ev ≠ E,
    bfloat16, int64 tables, L = 3 against its sequence's end, a query whose size-1 dim has
    an odd stride (the output is packed all the same)."""
    P = sdpa.paged_attention
    hnd, nhd = paged_case(), paged_case("NHD")
    q3 = packed(2, 4, 3, 8, seed=43)
    # Contiguous, with a size-1 dim's stride that torch.empty_like would copy.
    odd = torch.empty(2 * 4 * 8 + 999).as_strided((2, 4, 1, 8), (32, 8, 999, 1)).copy_(hnd[0])
    return {
        "HND": lambda: P(*hnd),
        "NHD": lambda: P(*nhd, layout="NHD"),
        "scale": lambda: P(*hnd, scale=0.3),
        "Ev 5": lambda: P(*paged_case(Ev=5)),
        "bfloat16": lambda: P(*paged_case(dtype=torch.bfloat16)),
        "int64 tables": lambda: P(*paged_case(table_dtype=torch.int64)),
        "L 3 bottom_right": lambda: P(q3, *hnd[1:], causal="bottom_right"),
        "a size-1 dim's odd stride": lambda: P(odd, *hnd[1:]),
    }


@pytest.mark.parametrize("name", list(common_paged_calls()))
def test_the_common_paged_call_takes_the_short_path_and_gives_the_general_paths_bits(name, monkeypatch):
    call = common_paged_calls()[name]
    with monkeypatch.context() as m:
        m.setattr(_sequences, "_framework", refuse)  # the general path's first step
        short = call()
    with monkeypatch.context() as m:
        m.setattr(_sequences, "_common_paged", decline)
        general = call()
    assert torch.equal(short, general), name
    assert short.stride() == general.stride() and short.is_contiguous(), name


def test_the_short_paged_call_against_the_float64_oracle(monkeypatch):
    """The keys gathered from the pages, attended densely in float64 (the general path
    refused: the short one answers)."""
    monkeypatch.setattr(_sequences, "_framework", refuse)
    q, k_pages, v_pages, table, lens = paged_case()
    ours = sdpa.paged_attention(q, k_pages, v_pages, table, lens, causal="bottom_right", scale=0.7)
    for b in range(2):
        n = int(lens[b])
        rows = [(int(table[b, j // 4]), j % 4) for j in range(n)]
        k = torch.stack([k_pages[p, :, r] for p, r in rows], dim=1).double()  # (Hkv, n, E)
        v = torch.stack([v_pages[p, :, r] for p, r in rows], dim=1).double()
        reference = oracle.torch_sdpa(q[b].double(), k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), scale=0.7)
        oracle.check_close("output", torch.float32, ours[b], reference)


def test_paged_calls_the_short_path_cannot_answer_go_the_general_way(monkeypatch):
    """Lazily negated views (the tables' memory holds the negatives: the library would
    refuse those but for zeros, so for the tables this holds twice over), gradients,
    NumPy, lists as tables, and any keyword past layout, causal and scale: with the
    general path refused, each must fail rather than return."""
    monkeypatch.setattr(_sequences, "_framework", refuse)
    q, k_pages, v_pages, table, lens = paged_case()
    P = sdpa.paged_attention
    neg = torch._neg_view
    calls = [
        lambda: P(neg(q), k_pages, v_pages, table, lens),
        lambda: P(q, neg(k_pages), v_pages, table, lens),
        lambda: P(q, k_pages, neg(v_pages), table, lens),
        lambda: P(q, k_pages, v_pages, neg(-table), lens),
        lambda: P(q, k_pages, v_pages, table, neg(-lens)),
        lambda: P(q.clone().requires_grad_(), k_pages, v_pages, table, lens),
        lambda: P(q, k_pages.clone().requires_grad_(), v_pages, table, lens),
        lambda: P(q, k_pages, v_pages.clone().requires_grad_(), table, lens),
        lambda: P(q.numpy(), k_pages.numpy(), v_pages.numpy(), table.numpy(), lens.numpy()),
        lambda: P(q, k_pages, v_pages, table.tolist(), lens),
        lambda: P(q, k_pages, v_pages, table, lens, return_lse=True),
        lambda: P(q, k_pages, v_pages, table, lens, softcap=5.0),
        lambda: P(q, k_pages, v_pages, table, lens, window_size=(2, 0)),
        lambda: P(q, k_pages, v_pages, table, lens, sinks=torch.zeros(4)),
        lambda: P(q, k_pages, v_pages, table, lens, alignment="top_left"),
        lambda: P(q, k_pages, v_pages, table, lens, alibi_slopes=torch.ones(4)),
        # (Float pages: a gate that let a scale through would answer, not fail in the library.)
        lambda: P(q, k_pages, v_pages, table, lens, key_scale=torch.ones(6, 2, 4)),
        lambda: P(q, k_pages, v_pages, table, lens, value_scale=torch.ones(6, 2, 4)),
        lambda: P(torch.nn.Parameter(q, requires_grad=False), k_pages, v_pages, table, lens),
    ]
    for n, call in enumerate(calls):
        with pytest.raises(AssertionError, match="the general path ran"):
            call()
            pytest.fail(f"call {n} took the short path")


def test_negated_tables_read_as_their_values_on_the_general_path():
    q, k_pages, v_pages, table, lens = paged_case()
    want = sdpa.paged_attention(q, k_pages, v_pages, table, lens)
    got = sdpa.paged_attention(q, k_pages, v_pages, torch._neg_view(-table), torch._neg_view(-lens))
    assert torch.equal(got, want)


@pytest.mark.parametrize("change,exception,message", [
    (lambda a: a.update(query=a["query"].to(torch.int32)), TypeError, "^query: expected float16"),
    (lambda a: a.update(value_pages=a["value_pages"].double()), TypeError, "^value_pages: "),
    (lambda a: a.update(value_pages=a["value_pages"][:, :, :2]), ValueError,
     "^value_pages: expected \\(6, 2, 4, Ev\\)"),
    (lambda a: a.update(block_table=torch.tensor([[0, 1, 7], [3, 4, 5]], dtype=torch.int32)), ValueError,
     "^block_table: expected page indices in \\[0, 6\\)"),
    (lambda a: a.update(seq_lens=torch.tensor([9, 13], dtype=torch.int32)), ValueError, "^seq_lens: "),
    (lambda a: a.update(block_table=a["block_table"].float()), TypeError, "^block_table: expected int32 or int64"),
    (lambda a: a.update(block_table=a["block_table"].to("meta")), ValueError, "^block_table: expected a CPU tensor"),
    (lambda a: a.update(query=a["query"][0]), ValueError, "^query: expected rank 4"),
    (lambda a: a.update(query=a["query"].to_sparse()), TypeError, "^query: expected a strided"),
    (lambda a: a.update(value_pages=torch.tensor(1.0)), ValueError, "^value_pages: expected rank 4"),  # (IndexError)
    (lambda a: a.update(key_pages=torch.tensor(1.0)), ValueError, "^key_pages: expected rank 4"),
    (lambda a: {"layout": "XYZ"}, ValueError, "^layout: "),
    (lambda a: {"layout": "NHD"}, ValueError, "^seq_lens: .* = 6\\]"),  # HND pages read as NHD: page_size 2
    (lambda a: {"causal": True}, ValueError, "^causal: "),
    (lambda a: {"scale": float("nan")}, ValueError, "scale"),
])
def test_a_refused_paged_call_gets_the_general_paths_error(change, exception, message, monkeypatch):
    """The short path tries each and gives up (None); the general path names the argument.
    Nothing is written: not the inputs."""
    q, k_pages, v_pages, table, lens = paged_case()
    args = dict(query=q, key_pages=k_pages, value_pages=v_pages, block_table=table, seq_lens=lens)
    keywords = change(args) or {}
    before = {name: x.clone() for name, x in args.items() if x.layout == torch.strided and x.device.type == "cpu"}
    tried = spy_on(monkeypatch, _sequences, "_common_paged")
    with pytest.raises(exception, match=message):
        sdpa.paged_attention(**args, **keywords)
    assert tried == [None]
    assert all(torch.equal(args[name], x) for name, x in before.items())


def test_the_common_paged_call_under_torch_compile():
    """Traced (the short path steps aside, the general path's custom op runs), the whole
    graph compiles and gives eager's bits."""
    q, k_pages, v_pages, table, lens = paged_case("NHD")

    def decode(q, k_pages, v_pages):
        return sdpa.paged_attention(q, k_pages, v_pages, table, lens, layout="NHD", causal="bottom_right")

    with torch.no_grad():
        eager = decode(q, k_pages, v_pages)  # (first: sdpa's torch framework made outside the trace)
        compiled = torch.compile(decode, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(q, k_pages, v_pages), eager)


@pytest.mark.parametrize("which", ["drop-in", "paged"])
def test_a_processs_first_call_may_come_inside_torch_compile(which, monkeypatch):
    """The first torch call makes sdpa's torch framework (_frameworks._TORCH); made inside
    a trace, it must not enter the binding, which torch.compile(fullgraph=True) refused
    ("a process's first sdpa call": _TORCH forgotten for the test)."""
    monkeypatch.setattr(_frameworks, "_TORCH", None)
    torch._dynamo.reset()
    q, k_pages, v_pages, table, lens = paged_case()
    if which == "drop-in":
        def call(q):
            return sdpa.scaled_dot_product_attention(q, q, q)
    else:
        def call(q):
            return sdpa.paged_attention(q, k_pages, v_pages, table, lens)
    with torch.no_grad():
        compiled = torch.compile(call, backend="aot_eager", fullgraph=True)(q)
        assert _frameworks._TORCH is not None
        assert torch.equal(compiled, call(q))
