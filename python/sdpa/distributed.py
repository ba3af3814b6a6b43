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

import operator
from typing import Optional

import torch

from . import _core, _options
from ._arguments import _sinks, _slopes
from ._autograd import (_core_options, _differentiable, _input, _lse_dtype, _lse_gradient, _op, _readable,
                        _sink_gradient_buffer, _traced, _view)
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


def _ring_forward_body(query, key, value, mask, alibi_slopes, sinks, comm, query_length, key_length, partition,
                       *options):
    """(output, lse) of this rank's query rows; see ring_attention."""
    rows = tuple(query.shape[:-1])
    out = torch.empty(rows + tuple(value.shape[-1:]), dtype=query.dtype)
    lse = torch.empty(rows, dtype=_lse_dtype(query))
    _core.ring_forward(comm, _input(query), _input(key), _input(value), _input(mask), _input(alibi_slopes),
                       _input(sinks), _view(out), _view(lse), query_length, key_length, partition,
                       _core_options(options))
    return out, lse


ring_forward = _op("ring_forward", "Tensor query, Tensor key, Tensor value, Tensor? mask, Tensor? alibi_slopes, "
                   "Tensor? sinks, int comm, int query_length, int key_length, str partition",
                   "(Tensor, Tensor)")(_ring_forward_body)


@ring_forward.register_fake
def _(query, key, value, mask, alibi_slopes, sinks, comm, query_length, key_length, partition, *options):
    rows = tuple(query.shape[:-1])
    return query.new_empty(rows + tuple(value.shape[-1:])), query.new_empty(rows, dtype=_lse_dtype(query))


def _ring_backward_body(grad_output, query, key, value, mask, alibi_slopes, sinks, output, lse, grad_lse, comm,
                        query_length, key_length, partition, *options):
    """(dq, dk, dv, dsinks) of this rank's shards; dsinks (empty without sinks) is summed over
    every rank's rows."""
    dq = torch.empty(query.shape, dtype=query.dtype)
    dk = torch.empty(key.shape, dtype=key.dtype)
    dv = torch.empty(value.shape, dtype=value.dtype)
    dsinks = _sink_gradient_buffer(sinks, query)
    _core.ring_backward(comm, _input(query), _input(key), _input(value), _input(mask), _input(alibi_slopes),
                        _input(sinks), _input(output), _input(lse), _view(_readable(grad_output).to(query.dtype)),
                        _view(_lse_gradient(grad_lse, lse)), _view(dq), _view(dk), _view(dv),
                        None if sinks is None else _view(dsinks), query_length, key_length, partition,
                        _core_options(options))
    return dq, dk, dv, dsinks


ring_backward = _op("ring_backward", "Tensor grad_output, Tensor query, Tensor key, Tensor value, Tensor? mask, "
                    "Tensor? alibi_slopes, Tensor? sinks, Tensor output, Tensor lse, Tensor? grad_lse, int comm, "
                    "int query_length, int key_length, str partition",
                    "(Tensor, Tensor, Tensor, Tensor)")(_ring_backward_body)


@ring_backward.register_fake
def _(grad_output, query, key, value, mask, alibi_slopes, sinks, output, lse, grad_lse, comm, query_length,
      key_length, partition, *options):
    dsinks = query.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dsinks


def _setup_context(ctx, inputs, output):
    query, key, value, mask, alibi_slopes, sinks, comm, query_length, key_length, partition, *options = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, alibi_slopes, sinks, out, lse)
    ctx.call = (comm, query_length, key_length, partition)
    ctx.options = options
    ctx.set_materialize_grads(False)


def _gradients(backward, ctx, grad_output, grad_lse):
    # Collective: every rank must reach it, so every rank's loss must depend on its ring
    # output or lse (a rank whose loss ignores them never runs this, and the others wait).
    # `backward`: the op or its body, as in sdpa/_autograd.py.
    query, key, value, mask, alibi_slopes, sinks, out, lse = ctx.saved_tensors
    if grad_output is None:
        grad_output = torch.zeros_like(out)
    dq, dk, dv, dsinks = backward(grad_output, query, key, value, mask, alibi_slopes, sinks, out, lse, grad_lse,
                                  *ctx.call, *ctx.options)
    return ((dq, dk, dv, None, None, (dsinks if ctx.needs_input_grad[5] else None), None, None, None, None)
            + (None,) * len(ctx.options))


_eager_ring = _differentiable("SdpaRingAttention", ring_forward, _ring_forward_body, _setup_context, _gradients,
                              ring_backward, _ring_backward_body)

# What the library reads: the query's dtypes, and bool for a key-padding mask. Anything else
# is refused here, with the other arguments' checks, before any rank reaches the library.
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)


def _prepared(fw, name, x):
    """A tensor argument as the binding takes it: a CPU torch tensor of a dtype the binding
    reads (fw.prepare checks the kind of tensor, as sdpa.attention does)."""
    x = fw.prepare(name, x)
    if x.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected float16, bfloat16, float32 or float64 (bool for a mask), got {x.dtype}")
    return x


def _length(name, n) -> Optional[int]:
    if n is None:
        return None
    try:
        return operator.index(n)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(n).__name__}") from None


def _agree(comm, error: Optional[BaseException]):
    """Collective: raises on every rank when this call's Python checks failed on any rank.
    The lowest failing rank raises its own error; the others an error of the same kind
    (TypeError, ValueError, else RuntimeError) with its message and "(on rank k)". Without
    this, one rank's refusal would leave the others waiting in the library's first
    collective (docs/distributed.md, "Errors: never a hang")."""
    failures = comm.allgather(None if error is None else (type(error).__name__, str(error)))
    failed = [(rank, f) for rank, f in enumerate(failures) if f is not None]
    if not failed:
        return
    rank, (kind, message) = failed[0]
    if rank == comm.rank:
        raise error
    cls = {"TypeError": TypeError, "ValueError": ValueError}.get(kind, RuntimeError)
    raise cls(f"{message} (on rank {rank})")


def ring_attention(query, key, value, *, comm=None, causal=None, partition: str = "zigzag", exchange: str = "ring",
                   query_length: Optional[int] = None, key_length: Optional[int] = None,
                   key_padding_mask=None, scale=None, dropout_p=0.0, seed=None, window_size=(-1, -1),
                   alignment=None, alibi_slopes=None, softcap=0.0, sinks=None, return_lse=False):
    """Attention over a sequence split across the ranks of `comm` (an mpi4py communicator;
    default MPI.COMM_WORLD). query (..., Hq, Lr, E), key (..., Hkv, Sr, E), value
    (..., Hkv, Sr, Ev): this rank's shards under `partition` of the global lengths
    `query_length`, `key_length` (default: the sums of the shards' lengths over the ranks).
    `exchange`: "ring" (K/V shards pass around the ring, overlapped with the compute; memory
    O(shard)), "all_gather" (every K/V shard gathered once first, as Llama 3's context
    parallelism; wins when K/V are small next to Q, GQA/MQA) or "ordered" (K/V chunks
    broadcast in global key order, each row's softmax state carried from chunk to chunk:
    for finite float64 inputs on the CPU backend, outputs and lse bitwise sdpa.attention's on
    the whole sequence; its backward is the ring's). `key_padding_mask`: bool, this rank's keys, (Sr,) or (..., 1, 1, Sr), True =
    the key takes part. The other keywords are sdpa.attention's, seen on global positions:
    `alibi_slopes` and `sinks` ((Hq,) or (batch..., Hq), the same on every rank; a list becomes
    float64, as in sdpa.attention), the sinks differentiable (their gradient summed over every
    rank's rows); with dropout and no seed, rank 0 draws one for all. Returns this rank's
    output rows (and lse with return_lse). Collective: every rank must call it, with the same
    keywords; an argument refused on one rank raises on every rank (the others' errors end
    with "(on rank k)")."""
    if not _core.has_distributed:
        raise RuntimeError("sdpa.distributed: this sdpa was built without MPI (install openmpi: scripts/setup.sh)")
    from mpi4py import MPI

    if comm is None:
        comm = MPI.COMM_WORLD
    # Every check that can refuse this rank's arguments, then one agreement: no rank goes on
    # to a collective (the lengths' allreduce, the library's own agreement) while another
    # has raised.
    error = None
    try:
        if partition not in ("zigzag", "contiguous"):
            raise ValueError(f"partition: expected 'zigzag' or 'contiguous', got {partition!r}")
        if exchange not in ("ring", "all_gather", "ordered"):
            raise ValueError(f"exchange: expected 'ring', 'all_gather' or 'ordered', got {exchange!r}")
        fw = _Torch()
        query, key, value = (_prepared(fw, name, x) for name, x in (("query", query), ("key", key), ("value", value)))
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() < 2:
                raise ValueError(f"{name}: expected a tensor of rank >= 2 ((..., seq, dim)), got shape "
                                 f"{tuple(x.shape)}")
        mask = None if key_padding_mask is None else _prepared(fw, "key_padding_mask", key_padding_mask)
        slopes, sink_logits = _slopes(fw, alibi_slopes), _sinks(fw, sinks)
        for name, x in (("alibi_slopes", slopes), ("sinks", sink_logits)):
            if x is not None and x.dtype not in (torch.float32, torch.float64):
                raise TypeError(f"{name}: expected float32 or float64, got {x.dtype}")
        options = _options.make_options(fw, causal=causal, scale=scale, dropout_p=dropout_p, seed=seed,
                                        window_size=window_size, alignment=alignment, softcap=softcap)
        lengths = [_length(name, n) for name, n in (("query_length", query_length), ("key_length", key_length))]
    except Exception as e:  # noqa: BLE001 -- every refusal, whatever its kind, reaches every rank
        error = e
    _agree(comm, error)
    # One collective that every rank enters whatever its keywords (one entered only by the
    # ranks that left a length or the seed to be found would wait for ever): the shards'
    # lengths and each rank's seed. Ranks that still disagree (a length given on one rank
    # only, and wrong) are then refused on every rank by the library's agreement.
    shared = comm.allgather((int(query.shape[-2]), int(key.shape[-2]), options.seed))
    query_length = sum(lr for lr, _, _ in shared) if lengths[0] is None else lengths[0]
    key_length = sum(sr for _, sr, _ in shared) if lengths[1] is None else lengths[1]
    if options.dropout_p > 0 and seed is None:  # one seed for the whole problem: rank 0's
        options = options._replace(seed=shared[0][2])
    op = ring_forward if _traced(query, key, value, mask, slopes, sink_logits) else _eager_ring
    out, lse = op(query, key, value, mask, slopes, sink_logits, _comm_handle(comm), query_length, key_length,
                  f"{partition}:{exchange}", *_options.flatten(options))
    return (out, lse) if return_lse else out
