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

--features times the issue #7 features against what a PyTorch user writes for the same
result, since torch's SDPA has none of them (with --backward: forward + backward through
autograd, the paged cache left out): a sliding window or ALiBi as an explicit
mask / bias (built once, outside the timing), softcapping in eager ops (Gemma 2's
reference code), varlen as the padded batch with a key-padding mask, a paged cache
gathered with index_select before SDPA.
"""
import argparse
import itertools
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


def feature_points(training):
    """(name, ours, theirs, our leaves, their leaves) for --features: two callables giving
    the same result, and (with `training`) the tensors each differentiates."""
    gen = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=gen).requires_grad_(training)

    # Sliding window at L = S = 8192, H = 4, E = 64 (bench --features's shape).
    q, k, v = (randn(1, 4, 8192, 64) for _ in range(3))
    i = torch.arange(8192)[:, None]
    j = torch.arange(8192)[None, :]
    for left, right, causal in ((256, 0, "bottom_right"), (256, 256, None)):
        band = (j >= i - left) & (j <= i + right)
        yield (f"window ({left}, {right}){' causal' if causal else ''} float32 H=4 L=S=8192 E=64",
               lambda left=left, right=right, causal=causal: sdpa.attention(q, k, v, causal=causal,
                                                                            window_size=(left, right)),
               lambda band=band: F.scaled_dot_product_attention(q, k, v, attn_mask=band), (q, k, v), (q, k, v))

    # ALiBi and softcapping at L = S = 2048, H = 16, E = 64.
    q, k, v = (randn(1, 16, 2048, 64) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-0.5 * (h + 1)) for h in range(16)])
    i = torch.arange(2048)[:, None]
    j = torch.arange(2048)[None, :]
    bias = -slopes[:, None, None] * (i - j).abs()  # (H, L, S), as FlashAttention's ALiBi at L = S
    yield ("ALiBi float32 H=16 L=S=2048 E=64", lambda: sdpa.attention(q, k, v, alibi_slopes=slopes),
           lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), (q, k, v), (q, k, v))

    def eager_softcap(cap=30.0):
        scores = q @ k.transpose(-2, -1) / 8.0
        return torch.softmax(cap * torch.tanh(scores / cap), dim=-1) @ v

    yield ("softcap 30 float32 H=16 L=S=2048 E=64", lambda: sdpa.attention(q, k, v, softcap=30.0), eager_softcap,
           (q, k, v), (q, k, v))

    # Varlen: 8 sequences of up to 2048 tokens, half the padded batch's tokens.
    padded = [randn(8, 8, 2048, 64) for _ in range(3)]
    keep = torch.zeros(8, 1, 1, 2048, dtype=torch.bool)
    for b, n in enumerate(VARLEN_LENGTHS):
        keep[b, ..., :n] = True
    with torch.no_grad():
        packed = [torch.cat([t[b, :, :n] for b, n in enumerate(VARLEN_LENGTHS)], dim=1).transpose(0, 1).contiguous()
                  .requires_grad_(training) for t in padded]  # (total, H, E)
    cu = torch.tensor([0] + list(itertools.accumulate(VARLEN_LENGTHS)), dtype=torch.int32)
    yield ("varlen 8 seqs (half padding) float32 H=8 Lmax=2048 E=64", lambda: sdpa.varlen_attention(*packed, cu, cu),
           lambda: F.scaled_dot_product_attention(*padded, attn_mask=keep), packed, padded)
    if training:
        return  # the paged cache is for decoding

    # Paged decoding: 8 sequences of 4096 keys in shuffled 16-row pages.
    B, Hq, Hkv, S, E, page = 8, 32, 8, 4096, 128, 16
    pages = B * S // page
    key_pages, value_pages = randn(pages, Hkv, page, E), randn(pages, Hkv, page, E)
    table = torch.randperm(pages, generator=gen).reshape(B, S // page)
    seq_lens = torch.full((B,), S, dtype=torch.int32)
    query = randn(B, Hq, 1, E)

    def gathered():
        def gather(p):  # (B, Hkv, S, E) from the pages
            return p[table].permute(0, 2, 1, 3, 4).reshape(B, Hkv, S, E)
        return F.scaled_dot_product_attention(query, gather(key_pages), gather(value_pages), enable_gqa=True)

    yield ("paged decode float32 B=8 Hq=32 Hkv=8 S=4096 E=128 page=16",
           lambda: sdpa.paged_attention(query, key_pages, value_pages, table, seq_lens), gathered, (), ())


VARLEN_LENGTHS = [2048, 1792, 1280, 1024, 768, 512, 256, 512]


def compare_features(repeats, training):
    """Rows of --features: times of ours and theirs (alternating), the largest output
    difference; with `training`, forward + backward through autograd."""
    rows = []
    for name_, ours, theirs, our_leaves, their_leaves in feature_points(training):
        print(f"\r{name_:60s}", end="", file=sys.stderr, flush=True)
        with torch.no_grad():
            a, b = ours(), theirs()
        if name_.startswith("varlen"):  # compare the real rows only
            b = torch.cat([b[n, :, :length] for n, length in enumerate(VARLEN_LENGTHS)], dim=1).transpose(0, 1)
        error = (a.double() - b.double()).abs().max().item()
        if training:
            ours_timed = lambda: _grad(ours, our_leaves)
            theirs_timed = lambda: _grad(theirs, their_leaves)
            ours_timed(), theirs_timed()  # warm-up
        else:
            ours_timed, theirs_timed = ours, theirs
        with torch.set_grad_enabled(training):
            ours_s, theirs_s = alternate(ours_timed, theirs_timed, repeats)
        rows.append(dict(name=name_, ours_ms=ours_s * 1e3, torch_ms=theirs_s * 1e3, ratio=theirs_s / ours_s,
                         max_abs_diff=error))
    print(file=sys.stderr)
    return rows


def _grad(fn, leaves):
    """Forward, then the gradients of Σ out (a dO of ones) with respect to `leaves`."""
    out = fn()
    return torch.autograd.grad(out.sum(), leaves)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip L = S = 8192")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each (median), at least 5")
    parser.add_argument("--filter", default="", help="only points whose name contains this")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--backward", action="store_true",
                        help="forward + backward through autograd (backward counted as 2.5x the forward)")
    parser.add_argument("--features", action="store_true",
                        help="window, ALiBi, softcap, varlen, paged against torch doing the same with what it has")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    info = sdpa.runtime_info()
    if args.features:
        rows = compare_features(max(args.repeats, 5), args.backward)
        if args.json:
            print(json.dumps(dict(torch=torch.__version__, sdpa=sdpa.__version__, threads=threads, points=rows),
                             indent=2))
            return
        print(f"sdpa {sdpa.__version__} vs torch {torch.__version__} doing the same with what it has, {threads} "
              f"threads, median of {max(args.repeats, 5)} alternating runs"
              f"{'; forward + backward (dO = ones) through autograd' if args.backward else ''}")
        print(f"| {'point':58s} | sdpa ms | torch ms | ratio | max abs diff |")
        print(f"|{'-' * 60}|--------:|---------:|------:|-------------:|")
        for r in rows:
            print(f"| {r['name']:58s} | {r['ours_ms']:7.2f} | {r['torch_ms']:8.2f} | {r['ratio']:5.2f}× | "
                  f"{r['max_abs_diff']:12.2e} |")
        return
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
