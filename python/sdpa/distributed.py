"""Ring attention across MPI processes: exact attention over a sequence split along its length.

    from mpi4py import MPI
    import sdpa.distributed
    out = sdpa.distributed.ring_attention(q_shard, k_shard, v_shard, comm=MPI.COMM_WORLD, causal="top_left")

Every rank of `comm` calls it with its own shards of Q, K and V, (..., H, rows, E), torch tensors,
and gets its rows of the output of attention over the whole sequence, the same as
sdpa.attention on the whole tensors would give (docs/distributed.md). Differentiable: the
gradients flow through a torch.library custom op pair (forward, backward) like sdpa.attention's,
dK and dV summed over every rank's queries as they travel back around the ring.

`shard_rows(length, ranks, rank, partition)` tells which global rows a rank holds: zigzag
(the default, balanced under a causal mask) cuts the sequence into 2N chunks and gives rank r
chunks r and 2N-1-r; contiguous gives rank r one run of rows. Needs mpi4py and an sdpa
built with MPI (sdpa._core.has_distributed).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _core, _options
from ._autograd import _core_options, _lse_dtype, _lse_gradient, _op, _readable
from ._frameworks import _Torch

__all__ = ["ring_attention", "shard_rows"]


def shard_rows(length: int, ranks: int, rank: int, partition: str = "zigzag") -> list[tuple[int, int]]:
    """The global rows [begin, end) rank `rank` of `ranks` holds, in the order its shard stores them."""
    if partition == "contiguous":
        return [(rank * length // ranks, (rank + 1) * length // ranks)]
    if partition == "zigzag":
        parts = 2 * ranks
        return [(c * length // parts, (c + 1) * length // parts) for c in (rank, parts - 1 - rank)]
    raise ValueError(f"partition: expected 'zigzag' or 'contiguous', got {partition!r}")


def _comm_handle(comm) -> int:
    return comm.py2f()


@_op("ring_forward", "Tensor query, Tensor key, Tensor value, Tensor? mask, Tensor? alibi_slopes, int comm, "
     "int query_length, int key_length, str partition", "(Tensor, Tensor)")
def ring_forward(query, key, value, mask, alibi_slopes, comm, query_length, key_length, partition, *options):
    """(output, lse) of this rank's query rows; see ring_attention."""
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.ring_forward(comm, _readable(query), _readable(key), _readable(value), _readable(mask),
                       _readable(alibi_slopes), out, lse, query_length, key_length, partition,
                       _core_options(options))
    return out, lse


@ring_forward.register_fake
def _(query, key, value, mask, alibi_slopes, comm, query_length, key_length, partition, *options):
    rows = tuple(query.shape[:-1])
    return query.new_empty(rows + tuple(value.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query))


@_op("ring_backward", "Tensor grad_output, Tensor query, Tensor key, Tensor value, Tensor? mask, "
     "Tensor? alibi_slopes, Tensor output, Tensor lse, Tensor? grad_lse, int comm, int query_length, "
     "int key_length, str partition", "(Tensor, Tensor, Tensor)")
def ring_backward(grad_output, query, key, value, mask, alibi_slopes, output, lse, grad_lse, comm, query_length,
                  key_length, partition, *options):
    """(dq, dk, dv) of this rank's shards."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    _core.ring_backward(comm, _readable(query), _readable(key), _readable(value), _readable(mask),
                        _readable(alibi_slopes), _readable(output), _readable(lse),
                        _readable(grad_output).to(query.dtype), _lse_gradient(grad_lse, lse), dq, dk, dv,
                        query_length, key_length, partition, _core_options(options))
    return dq, dk, dv


@ring_backward.register_fake
def _(grad_output, query, key, value, mask, alibi_slopes, output, lse, grad_lse, comm, query_length, key_length,
      partition, *options):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, mask, alibi_slopes, comm, query_length, key_length, partition, *options = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, alibi_slopes, out, lse)
    ctx.call = (comm, query_length, key_length, partition)
    ctx.options = options
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_output, grad_lse):
    # Collective: every rank must reach it, so every rank's loss must depend on its ring
    # output or lse (a rank whose loss ignores them never runs this, and the others wait).
    query, key, value, mask, alibi_slopes, out, lse = ctx.saved_tensors
    if grad_output is None:
        grad_output = torch.zeros_like(out)
    dq, dk, dv = ring_backward(grad_output, query, key, value, mask, alibi_slopes, out, lse, grad_lse, *ctx.call,
                               *ctx.options)
    return (dq, dk, dv, None, None, None, None, None, None) + (None,) * len(ctx.options)


ring_forward.register_autograd(_backward, setup_context=_setup_context)


def ring_attention(query, key, value, *, comm=None, causal=None, partition: str = "zigzag", exchange: str = "ring",
                   query_length: Optional[int] = None, key_length: Optional[int] = None,
                   key_padding_mask=None, scale=None, dropout_p=0.0, seed=None, window_size=(-1, -1),
                   alignment=None, alibi_slopes=None, softcap=0.0, return_lse=False):
    """Attention over a sequence split across the ranks of `comm` (an mpi4py communicator;
    default MPI.COMM_WORLD). query (..., Hq, Lr, E), key (..., Hkv, Sr, E), value
    (..., Hkv, Sr, Ev): this rank's shards under `partition` of the global lengths
    `query_length`, `key_length` (default: the sums of the shards' lengths over the ranks).
    `exchange`: "ring" (K/V shards pass around the ring, overlapped with the compute; memory
    O(shard)) or "all_gather" (every K/V shard gathered once first, as Llama 3's context
    parallelism; wins when K/V are small next to Q, GQA/MQA). `key_padding_mask`: bool, this rank's keys, (Sr,) or (..., 1, 1, Sr), True = the key
    takes part. The other keywords are sdpa.attention's, seen on global positions; with
    dropout and no seed, rank 0 draws one for all. Returns this rank's output rows (and lse
    with return_lse). Collective: every rank must call it, with the same keywords."""
    if not _core.has_distributed:
        raise RuntimeError("sdpa.distributed: this sdpa was built without MPI (install openmpi: scripts/setup.sh)")
    from mpi4py import MPI

    if comm is None:
        comm = MPI.COMM_WORLD
    if partition not in ("zigzag", "contiguous"):
        raise ValueError(f"partition: expected 'zigzag' or 'contiguous', got {partition!r}")
    if exchange not in ("ring", "all_gather"):
        raise ValueError(f"exchange: expected 'ring' or 'all_gather', got {exchange!r}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if query_length is None:
        query_length = comm.allreduce(int(query.shape[-2]))
    if key_length is None:
        key_length = comm.allreduce(int(key.shape[-2]))
    options = _options.make_options(_Torch(), causal=causal, scale=scale, dropout_p=dropout_p, seed=seed,
                                    window_size=window_size, alignment=alignment, softcap=softcap)
    if options.dropout_p > 0 and seed is None:  # one seed for the whole problem
        options = options._replace(seed=comm.bcast(options.seed, root=0))
    slopes = None if alibi_slopes is None else torch.as_tensor(alibi_slopes)
    out, lse = ring_forward(query, key, value, key_padding_mask, slopes, _comm_handle(comm), int(query_length),
                            int(key_length), f"{partition}:{exchange}", *_options.flatten(options))
    return (out, lse) if return_lse else out
