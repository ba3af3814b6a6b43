"""What a small call costs besides the arithmetic (issue #15, "small problems"): the same
call through each layer, in one process, the layers' blocks taking turns.

    .venv/bin/python bench/call_overhead.py                # (1, 1, 1, 1) and (1, 12, 16, 64)
    .venv/bin/python bench/call_overhead.py --shape 1 12 32 64 --rounds 15

Per shape, the best over --rounds of a block's time per call (--calls calls a block), for:

  torch F.sdpa     torch.nn.functional.scaled_dot_product_attention(q, k, v)
  sdpa drop-in     sdpa.scaled_dot_product_attention(q, k, v): the common call's short
                   path (its few checks), the output's allocation
                   (torch.empty_like), the binding, the library
  sdpa out=        sdpa.attention(q, k, v, out=out): as bench/peers.py calls it
  ... general      the same two calls with the common call's short path declined
                   (`_common_call`, sdpa/_attention.py): every check of the general
                   path, as every call took it before the short path (+ ~0.1 µs for
                   swapping the function out and back)
  _core tensors    sdpa._core.forward on the tensors themselves (read through DLPack's C
                   exchange API where torch has one: python/src/tensor_argument.h) — the
                   binding and the library alone
  _core capsules   the same with torch.utils.dlpack.to_dlpack capsules, made in the loop

and, for a decode step against a paged cache (--paged B Hq Hkv S E PAGE; default 1 8 2 64
64 16: L = 1, the pages in shuffled order; under torch.no_grad(), as a model decodes):

  paged            sdpa.paged_attention(q, k_pages, v_pages, block_table, seq_lens): its
                   short path (`_common_paged`, sdpa/_sequences.py)
  paged general    the same with the short path declined
  _core paged      sdpa._core.forward_paged on the tensors themselves
  dense out=       sdpa.attention(q, k, v, out=out) against the same keys held contiguously

The best, not the median: the host's speed moves by 1.5x within minutes, and what is
compared is the work each layer adds. The difference of two rows is that layer's cost.
"""

from __future__ import annotations

import argparse

import torch
from peers import cpu_model, per_call  # bench/peers.py, beside this script

import sdpa
from sdpa import _attention, _core, _sequences
from sdpa._options import make_options, to_core


def _decline(*args, **kwargs):
    return None


def general_path(call, module=_attention, short_path="_common_call"):
    """call, with sdpa's short path for the common call (module.short_path) declined while
    it runs."""
    taken = getattr(module, short_path)

    def run():
        setattr(module, short_path, _decline)
        try:
            return call()
        finally:
            setattr(module, short_path, taken)
    return run


def callers(shape):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
    out = torch.empty(*shape)
    options = to_core(make_options(None))
    to_dlpack = torch.utils.dlpack.to_dlpack
    F = torch.nn.functional.scaled_dot_product_attention
    drop_in = lambda: sdpa.scaled_dot_product_attention(q, k, v)  # noqa: E731
    with_out = lambda: sdpa.attention(q, k, v, out=out)  # noqa: E731
    return {
        "torch F.sdpa": lambda: F(q, k, v),
        "sdpa drop-in": drop_in,
        "drop-in general": general_path(drop_in),
        "sdpa out=": with_out,
        "out= general": general_path(with_out),
        "_core tensors": lambda: _core.forward(q, k, v, None, None, None, out, None, None, options),
        "_core capsules": lambda: _core.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), None, None, None,
                                                to_dlpack(out), None, None, options),
    }


def paged_callers(shape):
    B, Hq, Hkv, S, E, page = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, 1, E, generator=g)
    k, v = (torch.randn(B, Hkv, S, E, generator=g) for _ in range(2))
    blocks = -(-S // page)
    order = torch.randperm(B * blocks, generator=g)
    k_pages, v_pages = (torch.zeros(B * blocks, Hkv, page, E) for _ in range(2))
    for b in range(B):
        for j in range(blocks):
            rows = slice(j * page, min(S, (j + 1) * page))
            n = rows.stop - rows.start
            k_pages[order[b * blocks + j], :, :n], v_pages[order[b * blocks + j], :, :n] = k[b, :, rows], v[b, :, rows]
    table = order.view(B, blocks).to(torch.int32)
    lens = torch.full((B,), S, dtype=torch.int32)
    out = torch.empty(B, Hq, 1, E)
    options = to_core(make_options(None))
    paged = lambda: sdpa.paged_attention(q, k_pages, v_pages, table, lens)  # noqa: E731
    return {
        "paged": paged,
        "paged general": general_path(paged, _sequences, "_common_paged"),
        "_core paged": lambda: _core.forward_paged(q, k_pages, v_pages, table, lens, None, None, out, None, options,
                                                   None, None),
        "dense out=": lambda: sdpa.attention(q, k, v, out=out),
    }


def best_per_call(named, rounds, calls):
    """The best over the rounds of each call's time per call, the calls' blocks taking turns."""
    for call in named.values():
        per_call(call, calls // 4)  # warm-up
    best = {name: float("inf") for name in named}
    for _ in range(rounds):
        for name, call in named.items():
            best[name] = min(best[name], per_call(call, calls))
    return best


def print_table(heading, table):
    names = list(next(iter(table.values())))
    print(f"| {heading} | " + " | ".join(names) + " |")
    print("|:--|" + "--:|" * len(names))
    for shape, best in table.items():
        print(f"| {shape} | " + " | ".join(f"{best[name] * 1e6:.2f}" for name in names) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=4, action="append", metavar=("B", "H", "L", "E"),
                        help="(B, H, L = S, E); repeatable (default: 1 1 1 1 and 1 12 16 64)")
    parser.add_argument("--paged", type=int, nargs=6, action="append", metavar=("B", "Hq", "Hkv", "S", "E", "PAGE"),
                        help="a paged decode step's shape; repeatable (default: 1 8 2 64 64 16)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    shapes = args.shape or [[1, 1, 1, 1], [1, 12, 16, 64]]
    paged_shapes = args.paged or [[1, 8, 2, 64, 64, 16]]

    print(f"{cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; sdpa {sdpa.__version__}; "
          f"torch tensors read in place: {_core.reads_in_place(torch.empty(0))}")
    print(f"best of {args.rounds} rounds of {args.calls} calls, per call (µs)\n")
    print_table("(B, H, L = S, E)", {tuple(shape): best_per_call(callers(shape), args.rounds, args.calls)
                                     for shape in shapes})
    print()
    with torch.no_grad():
        print_table("paged (B, Hq, Hkv, S, E, page)",
                    {tuple(shape): best_per_call(paged_callers(shape), args.rounds, args.calls)
                     for shape in paged_shapes})


if __name__ == "__main__":
    main()
