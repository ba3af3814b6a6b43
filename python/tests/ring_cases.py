"""sdpa.distributed.ring_attention under MPI: run by test_distributed.py as
`mpirun -np N python -m pytest ring_cases.py` (the name keeps plain pytest from collecting
it). Every test is collective: each rank builds the same global tensors from one seed, takes
its shard, and compares its rows of the ring's output and of the gradients with
sdpa.attention on the whole tensors (float64 within 1e-12, float32 within 1e-5 / 1e-4 of the
scale)."""

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
]


@pytest.mark.parametrize("dtype, Hq, Hkv, L, S, partition, keywords", CASES)
def test_ring_attention_matches_single_process(dtype, Hq, Hkv, L, S, partition, keywords):
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(2, Hq, L, 16, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(2, Hkv, S, 16, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(2, Hkv, S, 8, dtype=dtype, generator=g, requires_grad=True)
    grad = torch.randn(2, Hq, L, 8, dtype=dtype, generator=g)
    whole = sdpa.attention(q, k, v, **{n: x for n, x in keywords.items() if n != "exchange"})
    whole.backward(grad)

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
    for name, got, full, rows in (("dq", qs.grad, q.grad, q_rows), ("dk", ks.grad, k.grad, k_rows),
                                  ("dv", vs.grad, v.grad, k_rows)):
        want = _shard(full, rows)
        assert (got - want).abs().max().item() <= grad_tol * max(1.0, want.abs().max().item()), (name, RANK)


def test_global_lengths_default_to_the_sum_of_the_shards():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 24, 8, dtype=torch.float64, generator=g)
    whole = sdpa.attention(q, q, q, causal="top_left")
    rows = dist.shard_rows(24, SIZE, RANK, "zigzag")
    out = dist.ring_attention(_shard(q, rows), _shard(q, rows), _shard(q, rows), causal="top_left")
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
