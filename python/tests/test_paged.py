"""sdpa.paged_attention, the paged KV cache: equal to attention against the same keys held
contiguously through oracle.extended_attention (by hypothesis; torch and NumPy, both page
layouts, pages shuffled, slopes, softcap, lse), block-table entries past a sequence's end
never read, lazily negated integer tables, forward only, torch.compile. Errors: test_api.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sdpa
from conftest import examples
from modifiers import F64, SIDE, check_lse, check_output, convert, slopes_for, slopes_of_sequence
from test_conformance import NUMPY_DTYPES, TORCH_DTYPES


# --- paged KV cache -------------------------------------------------------------------------------

@dataclasses.dataclass
class Paged:
    lib: str
    dtype: torch.dtype
    seq_lens: tuple
    L: int
    page_size: int
    heads_q: int
    heads_kv: int
    E: int
    Ev: int
    layout: str
    causal: str | None
    window: tuple
    slopes: str | None
    softcap: float
    spare_blocks: int
    table_kind: str
    data_seed: int


@st.composite
def paged_configs(draw, lib="torch"):
    batch = draw(st.integers(1, 3))
    seq_lens = tuple(draw(st.one_of(st.integers(0, 40), st.sampled_from([1, 16, 17]))) for _ in range(batch))
    heads_kv = draw(st.integers(1, 2))
    E = draw(st.sampled_from([1, 8, 16]))
    return Paged(lib, draw(st.sampled_from(TORCH_DTYPES if lib == "torch" else tuple(NUMPY_DTYPES))), seq_lens,
                 draw(st.sampled_from([1, 1, 2, 5])), draw(st.sampled_from([1, 4, 16])), heads_kv * draw(
                     st.sampled_from([1, 2, 4])), heads_kv, E, draw(st.one_of(st.just(E), st.just(4))),
                 draw(st.sampled_from(["HND", "NHD"])), draw(st.sampled_from([None, "bottom_right", "top_left"])),
                 (draw(SIDE), draw(SIDE)), draw(st.sampled_from([None, "heads", "batch"])),
                 draw(st.sampled_from([0.0, 4.0])), draw(st.integers(0, 2)),
                 draw(st.sampled_from(["int32", "int64", "list"])), draw(st.integers(0, 2**32 - 1)))


def make_paged(cfg: Paged):
    """Contiguous per-sequence K, V (float64) and the same scattered over shuffled pages."""
    g = torch.Generator().manual_seed(cfg.data_seed)
    P = cfg.page_size
    blocks = [-(-n // P) for n in cfg.seq_lens]
    per_sequence = max(blocks, default=0) + cfg.spare_blocks
    pages = sum(blocks) + 2  # two pages no sequence uses
    order = torch.randperm(pages, generator=g)
    keys = [torch.randn(cfg.heads_kv, n, cfg.E, generator=g, dtype=F64) for n in cfg.seq_lens]
    values = [torch.randn(cfg.heads_kv, n, cfg.Ev, generator=g, dtype=F64) for n in cfg.seq_lens]
    k_pages = torch.randn(pages, cfg.heads_kv, P, cfg.E, generator=g, dtype=F64) * 1e3  # garbage where unused
    v_pages = torch.randn(pages, cfg.heads_kv, P, cfg.Ev, generator=g, dtype=F64) * 1e3
    table = torch.full((len(cfg.seq_lens), per_sequence), int(pages - 1), dtype=torch.int64)
    used = 0
    for b, n in enumerate(cfg.seq_lens):
        for block in range(blocks[b]):
            page = int(order[used])
            used += 1
            table[b, block] = page
            rows = slice(block * P, min(n, (block + 1) * P))
            count = rows.stop - rows.start
            k_pages[page, :, :count] = keys[b][:, rows]
            v_pages[page, :, :count] = values[b][:, rows]
    q = torch.randn(len(cfg.seq_lens), cfg.heads_q, cfg.L, cfg.E, generator=g, dtype=F64)
    slopes = slopes_for(len(cfg.seq_lens), cfg.heads_q, cfg.slopes, seed=cfg.data_seed)
    return q, keys, values, k_pages, v_pages, table, slopes


def paged_inputs(cfg: Paged, q, k_pages, v_pages, table, slopes):
    if cfg.layout == "NHD":
        k_pages, v_pages = k_pages.transpose(1, 2).contiguous(), v_pages.transpose(1, 2).contiguous()
    q, k_pages, v_pages = (convert(t, cfg.dtype, cfg.lib) for t in (q, k_pages, v_pages))
    lens = list(cfg.seq_lens)
    if cfg.table_kind == "list":
        table = table.tolist()
    else:
        dtype = torch.int32 if cfg.table_kind == "int32" else torch.int64
        table, lens = table.to(dtype), torch.tensor(lens, dtype=dtype)
        if cfg.lib == "numpy":
            table, lens = table.numpy(), lens.numpy()
    return q, k_pages, v_pages, table, lens, None if slopes is None else convert(slopes, F64, cfg.lib)


@settings(max_examples=examples(60))
@given(cfg=paged_configs("torch"), return_lse=st.booleans())
def test_paged_equals_attention_on_contiguous_keys(cfg, return_lse):
    oracle.count_example("extensions: paged_attention")
    run_paged(cfg, return_lse)


@settings(max_examples=examples(25))
@given(cfg=paged_configs("numpy"))
def test_paged_on_numpy_equals_attention_on_contiguous_keys(cfg):
    oracle.count_example("extensions: paged_attention on NumPy arrays")
    run_paged(cfg, False)


def run_paged(cfg, return_lse):
    q64, keys, values, k_pages, v_pages, table, slopes64 = make_paged(cfg)
    q, kp, vp, table, lens, slopes = paged_inputs(cfg, q64, k_pages, v_pages, table, slopes64)
    result = sdpa.paged_attention(q, kp, vp, table, lens, layout=cfg.layout, causal=cfg.causal,
                                  window_size=cfg.window, alibi_slopes=slopes, softcap=cfg.softcap,
                                  return_lse=return_lse)
    ours = result[0] if return_lse else result
    assert tuple(ours.shape) == (len(cfg.seq_lens), cfg.heads_q, cfg.L, cfg.Ev)
    seen = sdpa._core.last_call()
    assert seen["key"] == oracle.data_pointer(kp) and seen["value"] == oracle.data_pointer(vp)
    assert seen["output"] == oracle.data_pointer(ours)
    options = dict(causal=cfg.causal, window=cfg.window, softcap=cfg.softcap)
    for b in range(len(cfg.seq_lens)):
        # The same keys held contiguously, in the same dtype (their values as given).
        k_b = convert(keys[b][None], cfg.dtype, cfg.lib)
        v_b = convert(values[b][None], cfg.dtype, cfg.lib)
        _, lse = check_output("paged output", cfg.dtype, ours[b:b + 1], q[b:b + 1], k_b, v_b, None,
                              slopes_of_sequence(slopes, b), **options)
        if return_lse:
            check_lse(result[1][b:b + 1], lse, cfg.dtype)
        if cfg.dtype == F64 and cfg.lib == "torch":  # and the library's own contiguous call
            contiguous = sdpa.attention(q[b:b + 1], k_b, v_b, causal=cfg.causal, window_size=cfg.window,
                                        alibi_slopes=slopes_of_sequence(slopes, b), softcap=cfg.softcap)
            assert (contiguous - ours[b:b + 1]).abs().max().item() <= 1e-12


def test_paged_block_table_entries_past_the_end_are_not_read():
    """Entries past a sequence's last page may hold anything (-1, huge indices): they are
    not read, so they are not refused either."""
    k_pages, v_pages = torch.randn(3, 1, 4, 8), torch.randn(3, 1, 4, 8)
    q = torch.randn(2, 2, 1, 8)
    table = torch.tensor([[2, -1, 10**9], [0, 1, -7]], dtype=torch.int64)
    out = sdpa.paged_attention(q, k_pages, v_pages, table, [3, 6])
    keys = [k_pages[2, :, :3], torch.cat([k_pages[0], k_pages[1, :, :2]], dim=-2)]
    values = [v_pages[2, :, :3], torch.cat([v_pages[0], v_pages[1, :, :2]], dim=-2)]
    for b in range(2):
        expected = sdpa.attention(q[b:b + 1], keys[b][None], values[b][None])
        assert torch.allclose(out[b:b + 1], expected, atol=1e-6)


def test_lazily_negated_integer_tables_are_read_as_their_values():
    """Issue 12: DLPack exported a torch._neg_view's memory as it is, so the library read the
    negatives of the block table and the sequence lengths (here: -1 instead of page 1)."""
    k_pages, v_pages = torch.randn(3, 1, 4, 8), torch.randn(3, 1, 4, 8)
    q = torch.randn(1, 2, 1, 8)
    table, lengths = torch.tensor([[1, 2]]), torch.tensor([6])
    expected = sdpa.paged_attention(q, k_pages, v_pages, table, lengths)
    got = sdpa.paged_attention(q, k_pages, v_pages, torch._neg_view(-table), torch._neg_view(-lengths))
    assert torch.equal(got, expected)
    packed_q, packed_kv = torch.randn(5, 2, 8), torch.randn(7, 2, 8)
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
    assert torch.equal(sdpa.varlen_attention(packed_q, packed_kv, packed_kv, torch._neg_view(-cu_q),
                                             torch._neg_view(-cu_k)),
                       sdpa.varlen_attention(packed_q, packed_kv, packed_kv, cu_q, cu_k))


def test_paged_attention_is_forward_only():
    q = torch.randn(1, 1, 1, 4, requires_grad=True)
    pages = torch.randn(2, 1, 4, 4)
    with pytest.raises(NotImplementedError, match="paged_attention: forward only"):
        sdpa.paged_attention(q, pages, pages, [[0, 1]], [5])
    with torch.no_grad():
        assert sdpa.paged_attention(q, pages, pages, [[0, 1]], [5]).shape == (1, 1, 1, 4)
    with torch.inference_mode():
        assert sdpa.paged_attention(q.detach(), pages, pages, [[0, 1]], [5]).shape == (1, 1, 1, 4)


def test_paged_under_torch_compile_matches_eager():
    q, pages = torch.randn(2, 4, 1, 8), torch.randn(6, 4, 2, 8)  # NHD: (pages, page_size, Hkv, E)
    table, lens = torch.tensor([[5, 0, 2], [1, 3, 4]], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32)

    def decode(q, pages):
        return sdpa.paged_attention(q, pages, pages, table, lens, layout="NHD", causal="bottom_right",
                                    softcap=20.0)

    compiled = torch.compile(decode, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, pages), decode(q, pages))
