#!/usr/bin/env python3
"""sdpa against torch.nn.functional.scaled_dot_product_attention on the CPU.

Same inputs, same process, same thread count; the two are timed alternately (A B A B …)
so that the machine's drift hits both alike, and each figure is the median of
--repeats runs. Prints GFLOP/s (FlashAttention's count: 4·B·Hq·L·S·E, half when causal
with L = S) for both and the ratio ours/torch, over the grid of issue #4.

    .venv/bin/python bench/compare.py            # full grid (L = S up to 8192)
    .venv/bin/python bench/compare.py --quick    # L = S in {512, 2048}
    .venv/bin/python bench/compare.py --backward # training: forward + backward through autograd

--backward times loss = Σ out ∘ dO, then loss.backward(), through torch's autograd on both
sides (ours: sdpa's custom op and its C++ backward), and counts the backward as 2.5 times
the forward's FLOPs (FlashAttention); the decode points are skipped.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import sdpa


def grid(quick):
    lengths = [512, 2048] if quick else [512, 2048, 8192]
    for dtype in (torch.float32, torch.bfloat16):
        for heads_kv in (16, 4):
            for length in lengths:
                for dim in (64, 128):
                    for causal in (False, True):
                        yield dict(dtype=dtype, heads_q=16, heads_kv=heads_kv, L=length, S=length, E=dim,
                                   causal=causal)
    for dtype in (torch.float32, torch.bfloat16):
        for keys in (4096, 65536):
            yield dict(dtype=dtype, heads_q=32, heads_kv=8, L=1, S=keys, E=128, causal=False)


def name(p):
    return (f"{str(p['dtype']).replace('torch.', ''):8s} Hq={p['heads_q']} Hkv={p['heads_kv']} "
            f"L={p['L']} S={p['S']} E={p['E']}{' causal' if p['causal'] else ''}")


def flops(p):
    return 4.0 * p["heads_q"] * p["L"] * p["S"] * p["E"] * (0.5 if p["causal"] and p["L"] == p["S"] else 1.0)


def alternate(ours, theirs, repeats):
    """Median seconds of `repeats` calls of each, timed A B A B so that the machine's drift
    hits both alike."""
    times = {ours: [], theirs: []}
    for _ in range(repeats):
        for fn in (ours, theirs):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    return statistics.median(times[ours]), statistics.median(times[theirs])


def measure(p, repeats):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, p["heads_q"], p["L"], p["E"], generator=gen).to(p["dtype"])
    k = torch.randn(1, p["heads_kv"], p["S"], p["E"], generator=gen).to(p["dtype"])
    v = torch.randn(1, p["heads_kv"], p["S"], p["E"], generator=gen).to(p["dtype"])
    gqa = p["heads_q"] != p["heads_kv"]
    ours = lambda: sdpa.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], enable_gqa=gqa)
    theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], enable_gqa=gqa)
    with torch.no_grad():
        error = (ours().double() - theirs().double()).abs().max().item()  # also the warm-up
        return (*alternate(ours, theirs, repeats), error)


def measure_backward(p, repeats):
    """Median seconds of forward + backward for ours and torch's (alternating), and the
    largest gradient difference."""
    gen = torch.Generator().manual_seed(0)
    leaves = [torch.randn(1, p[h], p[n], p["E"], generator=gen).to(p["dtype"]).requires_grad_()
              for h, n in (("heads_q", "L"), ("heads_kv", "S"), ("heads_kv", "S"))]
    dout = torch.randn(1, p["heads_q"], p["L"], p["E"], generator=gen).to(p["dtype"])
    gqa = p["heads_q"] != p["heads_kv"]

    def step(attention):
        out = attention(*leaves, is_causal=p["causal"], enable_gqa=gqa)
        return torch.autograd.grad(out, leaves, dout)

    ours = lambda: step(sdpa.scaled_dot_product_attention)
    theirs = lambda: step(F.scaled_dot_product_attention)
    error = max((a.double() - b.double()).abs().max().item() for a, b in zip(ours(), theirs()))  # + warm-up
    return (*alternate(ours, theirs, repeats), error)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip L = S = 8192")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each (median), at least 5")
    parser.add_argument("--filter", default="", help="only points whose name contains this")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--backward", action="store_true",
                        help="forward + backward through autograd (backward counted as 2.5x the forward)")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    info = sdpa.runtime_info()
    rows = []
    points = [p for p in grid(args.quick) if args.filter in name(p)]
    if args.backward:
        points = [p for p in points if p["L"] > 16]  # training shapes only
    for n, p in enumerate(points):
        print(f"\r[{n}/{len(points)}] {name(p):60s}", end="", file=sys.stderr, flush=True)
        ours, theirs, error = (measure_backward if args.backward else measure)(p, max(args.repeats, 5))
        counted = flops(p) * (3.5 if args.backward else 1.0)
        rows.append(dict(name=name(p), ours_ms=ours * 1e3, torch_ms=theirs * 1e3,
                         ours_gflops=counted / ours / 1e9, torch_gflops=counted / theirs / 1e9,
                         ratio=theirs / ours, max_abs_diff=error))
    print(file=sys.stderr)
    if args.json:
        print(json.dumps(dict(torch=torch.__version__, sdpa=sdpa.__version__, threads=threads,
                              kernel=info["cpu_kernel"], points=rows), indent=2))
        return
    print(f"sdpa {sdpa.__version__} ({info['cpu_kernel']}) vs torch {torch.__version__}, {threads} threads, "
          f"median of {max(args.repeats, 5)} alternating runs")
    if args.backward:
        print("forward + backward through autograd; GFLOP/s count the backward as 2.5x the forward")
    print(f"| {'point':48s} | sdpa GFLOP/s | torch GFLOP/s | ratio | max abs diff |")
    print(f"|{'-' * 50}|-------------:|--------------:|------:|-------------:|")
    for r in rows:
        print(f"| {r['name']:48s} | {r['ours_gflops']:12.1f} | {r['torch_gflops']:13.1f} | "
              f"{r['ratio']:4.2f}× | {r['max_abs_diff']:12.2e} |")


if __name__ == "__main__":
    main()
