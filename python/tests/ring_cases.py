"""sdpa.distributed.ring_attention under MPI: run by test_distributed.py as
`mpirun -np N python -m pytest ring_cases.py` (the name keeps plain pytest from collecting
it). Every test is collective: each rank builds the same global tensors from one seed, takes
its shard, and compares its rows of the ring's output and of the gradients with
sdpa.attention on the whole tensors (float64 within 1e-12, float32 within 1e-5 / 1e-4 of the
scale; the ordered exchange's float64 output bitwise equal)."""

import pytest
import torch

import sdpa
import sdpa.distributed as dist
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size


def _shard(x, rows):
    index = torch.cat([torch.arange(b, e, dtype=torch.long) for b, e in rows])
    return x.detach()[..., index, :].clone()


CASES = [
    # (dtype, Hq, Hkv, L, S, partition, keywords)
    (torch.float64, 4, 2, 37, 37, "zigzag", dict(causal="top_left")),
    (torch.float64, 2, 2, 29, 45, "zigzag", dict(causal="bottom_right")),
    (torch.float64, 3, 1, 50, 50, "contiguous", dict(window_size=(6, 2))),
    (torch.float64, 2, 2, 41, 41, "zigzag", dict(causal="top_left", softcap=3.0, dropout_p=0.25, seed=17)),
    (torch.float32, 4, 4, 64, 64, "zigzag", dict(causal="top_left")),
    (torch.float32, 2, 1, 33, 47, "contiguous", dict()),
    (torch.float64, 4, 1, 37, 37, "zigzag", dict(causal="top_left", exchange="all_gather")),
    # Attention sinks ("sinks": the shape of the sinks tensor, made below, requiring grad).
    (torch.float64, 4, 2, 37, 37, "zigzag", dict(causal="top_left", sinks=(4,))),
    (torch.float32, 4, 4, 64, 64, "zigzag", dict(causal="top_left", sinks=(2, 4))),
    # Bottom-right with L > S: the first queries see no key (output 0, lse = sink).
    (torch.float64, 2, 2, 45, 29, "contiguous", dict(causal="bottom_right", sinks=(2, 2))),
    # The ordered exchange: float64 bitwise (below), lengths not multiples of 2N or of 64.
    (torch.float64, 4, 2, 101, 101, "zigzag", dict(causal="top_left", exchange="ordered")),
    (torch.float64, 2, 2, 41, 70, "contiguous",
     dict(causal="bottom_right", dropout_p=0.25, seed=17, softcap=3.0, exchange="ordered")),
    (torch.float64, 2, 2, 90, 75, "zigzag", dict(causal="top_left", sinks=(2,), exchange="ordered")),
    (torch.float32, 2, 1, 33, 47, "zigzag", dict(window_size=(9, 4), exchange="ordered")),
]


@pytest.mark.parametrize("dtype, Hq, Hkv, L, S, partition, keywords", CASES)
def test_ring_attention_matches_single_process(dtype, Hq, Hkv, L, S, partition, keywords):
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(2, Hq, L, 16, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(2, Hkv, S, 16, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(2, Hkv, S, 8, dtype=dtype, generator=g, requires_grad=True)
    grad = torch.randn(2, Hq, L, 8, dtype=dtype, generator=g)
    keywords = dict(keywords)
    sinks = None
    if "sinks" in keywords:
        sinks = (2 * torch.randn(keywords["sinks"], dtype=dtype, generator=g)).requires_grad_()
        keywords["sinks"] = sinks
    whole = sdpa.attention(q, k, v, **{n: x for n, x in keywords.items() if n != "exchange"})
    whole.backward(grad)
    whole_sinks_grad = None
    if sinks is not None:
        whole_sinks_grad = sinks.grad.clone()
        sinks.grad = None

    q_rows, k_rows = dist.shard_rows(L, SIZE, RANK, partition), dist.shard_rows(S, SIZE, RANK, partition)
    qs, ks, vs = _shard(q, q_rows), _shard(k, k_rows), _shard(v, k_rows)
    for t in (qs, ks, vs):
        t.requires_grad_()
    out = dist.ring_attention(qs, ks, vs, comm=COMM, partition=partition, query_length=L, key_length=S, **keywords)
    out.backward(_shard(grad, q_rows))

    forward_tol = 1e-12 if dtype == torch.float64 else 1e-5
    grad_tol = 1e-12 if dtype == torch.float64 else 1e-4
    expected = _shard(whole, q_rows)
    assert (out - expected).abs().max().item() <= forward_tol * max(1.0, expected.abs().max().item()), RANK
    if keywords.get("exchange") == "ordered" and dtype == torch.float64:
        assert torch.equal(out.detach(), expected.detach()), ("not bitwise the single-process output", RANK)
    for name, got, full, rows in (("dq", qs.grad, q.grad, q_rows), ("dk", ks.grad, k.grad, k_rows),
                                  ("dv", vs.grad, v.grad, k_rows)):
        want = _shard(full, rows)
        assert (got - want).abs().max().item() <= grad_tol * max(1.0, want.abs().max().item()), (name, RANK)
    if sinks is not None:  # summed over every rank's rows: the whole gradient on every rank
        assert (sinks.grad - whole_sinks_grad).abs().max().item() <= grad_tol * max(
            1.0, whole_sinks_grad.abs().max().item()), ("dsinks", RANK)


def test_global_lengths_default_to_the_sum_of_the_shards():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 24, 8, dtype=torch.float64, generator=g)
    whole = sdpa.attention(q, q, q, causal="top_left")
    rows = dist.shard_rows(24, SIZE, RANK, "zigzag")
    out = dist.ring_attention(_shard(q, rows), _shard(q, rows), _shard(q, rows), causal="top_left")
    assert (out - _shard(whole, rows)).abs().max().item() <= 1e-12


def test_lengths_and_seed_left_to_be_found_on_some_ranks_only():
    # Rank 0 gives the global lengths and leaves the dropout seed to be drawn; the others
    # leave the lengths to be summed and give the seed rank 0 draws. Before the fix the ranks
    # that summed a length entered an allreduce that rank 0 never did, and rank 0 a seed
    # broadcast alone: the call waited for ever (every test runs under a timeout).
    g = torch.Generator().manual_seed(6)
    L = 24
    q = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=g)
    torch.manual_seed(1234)
    drawn = int(torch.randint(0, (1 << 63) - 1, (), dtype=torch.int64))  # what rank 0's call draws
    whole = sdpa.attention(q, q, q, causal="top_left", dropout_p=0.2, seed=drawn)
    torch.manual_seed(1234)
    rows = dist.shard_rows(L, SIZE, RANK, "zigzag")
    keywords = dict(query_length=L, key_length=L, seed=None) if RANK == 0 else dict(seed=drawn)
    out = dist.ring_attention(_shard(q, rows), _shard(q, rows), _shard(q, rows), causal="top_left",
                              dropout_p=0.2, **keywords)
    assert (out - _shard(whole, rows)).abs().max().item() <= 1e-12


def test_key_padding_mask_travels_with_its_keys():
    g = torch.Generator().manual_seed(9)
    L = 30
    q = torch.randn(2, 2, L, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 2, L, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, 2, L, 8, dtype=torch.float64, generator=g)
    keep = torch.rand(2, 1, 1, L, generator=g) < 0.7
    whole = sdpa.attention(q, k, v, keep, causal="top_left")
    rows = dist.shard_rows(L, SIZE, RANK, "zigzag")
    index = torch.cat([torch.arange(b, e, dtype=torch.long) for b, e in rows])
    out = dist.ring_attention(_shard(q, rows), _shard(k, rows), _shard(v, rows), causal="top_left",
                              key_padding_mask=keep[..., index].contiguous())
    assert (out - _shard(whole, rows)).abs().max().item() <= 1e-12


def test_a_bad_shard_on_one_rank_is_an_error_on_every_rank():
    L = 8 * SIZE
    rows = L // SIZE + (1 if RANK == SIZE - 1 else 0)
    q = torch.zeros(1, 2, rows, 8)
    k = torch.zeros(1, 2, L // SIZE, 8)
    with pytest.raises(ValueError, match="query: expected 8 rows"):
        dist.ring_attention(q, k, k, partition="contiguous", query_length=L, key_length=L)


def test_sinks_with_the_lse_returned():
    # The lse contains the sinks, as sdpa.attention's; a loss on it reaches the sinks.
    g = torch.Generator().manual_seed(21)
    L = 26
    q = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=g)
    sinks = torch.tensor([0.7, -1.2], dtype=torch.float64, requires_grad=True)
    out, lse = sdpa.attention(q, q, q, causal="top_left", sinks=sinks, return_lse=True)
    (lse.sum() + out.sum()).backward()
    expected_grad = sinks.grad.clone()
    rows = dist.shard_rows(L, SIZE, RANK, "zigzag")
    ring_sinks = sinks.detach().clone().requires_grad_()
    ring_out, ring_lse = dist.ring_attention(_shard(q, rows), _shard(q, rows), _shard(q, rows), causal="top_left",
                                             sinks=ring_sinks, return_lse=True)
    assert (ring_lse - _shard(lse.unsqueeze(-1), rows).squeeze(-1)).abs().max().item() <= 1e-12
    (ring_lse.sum() + ring_out.sum()).backward()
    assert (ring_sinks.grad - expected_grad).abs().max().item() <= 1e-12


def test_the_eager_twin_gives_the_custom_ops_bits():
    # Outside torch.compile ring_attention takes the op pair's torch.autograd.Function twin
    # (sdpa/_autograd.py, _differentiable): the same bodies, so the same bits as the custom
    # op in the output, the lse and every gradient (dropout's mask and the sinks' too).
    from sdpa import _options
    g = torch.Generator().manual_seed(23)
    L = 30
    rows = dist.shard_rows(L, SIZE, RANK, "zigzag")
    q, k, v = (_shard(torch.randn(1, 2, L, 8, dtype=torch.float64, generator=g), rows).requires_grad_()
               for _ in range(3))
    sinks = torch.tensor([0.3, -0.8], dtype=torch.float64, requires_grad=True)
    flat = _options.flatten(_options.Options(causal="top_left", dropout_p=0.25, seed=5))
    results = []
    for op in (dist.ring_forward, dist._eager_ring):
        out, lse = op(q, k, v, None, None, sinks, dist._comm_handle(COMM), L, L, "zigzag:ring", *flat)
        results.append((out, lse) + torch.autograd.grad(out.square().sum() + lse.sin().sum(), (q, k, v, sinks)))
    assert type(results[1][0].grad_fn).__name__ == "SdpaRingAttentionBackward"
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_alibi_slopes_as_a_list_are_float64_as_in_sdpa_attention():
    # sdpa.attention takes a list of slopes as float64; ring_attention made it float32, whose
    # rounding (~1e-8 of a slope, times distances up to L) moved the output far above 1e-12.
    g = torch.Generator().manual_seed(13)
    L = 40
    q = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=g)
    slopes = [0.1234567890123, 0.0987654321987]
    whole = sdpa.attention(q, k, k, causal="top_left", alibi_slopes=slopes)
    rows = dist.shard_rows(L, SIZE, RANK, "zigzag")
    out = dist.ring_attention(_shard(q, rows), _shard(k, rows), _shard(k, rows), causal="top_left",
                              alibi_slopes=slopes)
    assert (out - _shard(whole, rows)).abs().max().item() <= 1e-12


def _refused_on_the_last_rank(bad, match, kind=(TypeError, ValueError), **keywords):
    """ring_attention with `bad` as the last rank's query: every rank raises (none is left
    waiting), the last with its own error, the others with it and "(on rank N-1)"."""
    culprit = SIZE - 1
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(kind, match=match) as info:
        dist.ring_attention(bad if RANK == culprit else q, q, q, query_length=4 * SIZE, key_length=4 * SIZE,
                            **keywords)
    if RANK != culprit:
        assert str(info.value).endswith(f"(on rank {culprit})"), str(info.value)


@pytest.mark.parametrize("bad, match", [
    ([[0.0] * 8] * 4, "query: expected a torch.Tensor"),         # not a tensor
    (torch.zeros(8), "query: expected a tensor of rank >= 2"),   # rank 1: no sequence dim
    (torch.zeros(1, 2, 4, 8, device="meta"), "query: expected a CPU tensor"),  # not in CPU memory (as a GPU's)
    (torch.zeros(1, 2, 4, 8, dtype=torch.int32), "query: expected float16"),  # a dtype the library cannot read
])
def test_a_python_argument_refused_on_one_rank_is_an_error_on_every_rank(bad, match):
    _refused_on_the_last_rank(bad, match)


def test_a_keyword_refused_on_one_rank_is_an_error_on_every_rank():
    culprit = SIZE - 1
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(TypeError, match="scale") as info:
        dist.ring_attention(q, q, q, scale="big" if RANK == culprit else None)
    if RANK != culprit:
        assert str(info.value).endswith(f"(on rank {culprit})"), str(info.value)
    # The communicator is still usable: the next call on every rank works.
    out = dist.ring_attention(q, q, q)
    assert out.shape == q.shape
