#!/usr/bin/env python3
"""A tiny causal language model trained with sdpa's attention, step for step against torch's.

    .venv/bin/python examples/tiny_lm.py               # 300 steps, about 20 s on 2 cores
    .venv/bin/python examples/tiny_lm.py --steps 1000 --sample 400

A character-level model of examples/data/sonnets.txt (seven of Shakespeare's sonnets):
token and position embeddings, two pre-norm transformer blocks whose attention is causal
grouped-query attention (4 query heads sharing 2 key/value heads) and an MLP, and a linear
head. Two copies are built from the same seed and trained on the same batches with AdamW:
one calls sdpa.scaled_dot_product_attention (forward and backward are sdpa's), the other
torch.nn.functional.scaled_dot_product_attention. Dropout is 0, so both compute the same
function; they differ only in float32 rounding.

Checks (the exit status is 1 if one fails; `make test` runs this):
  * the loss falls: the last 20 steps average below half the first step's loss (which is
    about ln 60, the loss of a uniform guess over the characters);
  * at every step the two losses agree to 1e-3 relative, and after the last step every
    parameter agrees to 1e-3 relative (float32 rounding differences, amplified by
    training; in practice they stay near 1e-5).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import sdpa

TEXT = pathlib.Path(__file__).resolve().parent / "data" / "sonnets.txt"


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)); the attention function is the argument."""

    def __init__(self, width: int, heads: int, kv_heads: int, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        # No bias on the keys: it shifts every score of a query alike, so its gradient is 0
        # in exact arithmetic, and AdamW would turn the rounding noise there into full-size
        # steps that differ between any two implementations. (None on Q, V either, as LLaMA.)
        self.query = nn.Linear(width, width, bias=False)
        self.key_value = nn.Linear(width, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, length, width = x.shape
        h = self.norm1(x)
        # (B, L, H, D) projections viewed as (B, H, L, D): strided, as a model hands them over.
        q = self.query(h).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.key_value(h).view(batch, length, 2, self.kv_heads, self.head_dim).unbind(2)
        a = self.attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, context: int, attention, width=64, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(data: torch.Tensor, steps: int, batch: int, context: int, seed: int):
    """(input, target) windows of the text, the same sequence for both models."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, len(data) - context - 1, (batch,), generator=gen)
        window = torch.stack([data[s:s + context + 1] for s in start.tolist()])
        yield window[:, :-1], window[:, 1:]


def sample(model, chars, prompt: str, length: int, context: int, seed: int) -> str:
    """Characters drawn from the model (temperature 0.8), sdpa's attention in inference."""
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([[index[c] for c in prompt]])
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(length):
            logits = model(ids[:, -context:])[0, -1] / 0.8
            next_id = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return "".join(chars[i] for i in ids[0].tolist())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=200, help="characters to generate at the end (0: none)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, for losses and parameters")
    args = parser.parse_args()

    text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    models, optimizers = {}, {}
    for name, attention in (("sdpa", sdpa.scaled_dot_product_attention), ("torch", F.scaled_dot_product_attention)):
        torch.manual_seed(args.seed)  # the same initial weights for both
        models[name] = TinyLM(len(chars), args.context, attention)
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=args.lr)
    print(f"{len(text)} characters, vocabulary {len(chars)}, "
          f"{sum(p.numel() for p in models['sdpa'].parameters())} parameters, {args.steps} steps")

    losses = {name: [] for name in models}
    worst = 0.0
    seconds = dict.fromkeys(models, 0.0)
    for step, (x, y) in enumerate(batches(data, args.steps, args.batch, args.context, args.seed)):
        for name, model in models.items():
            start = time.perf_counter()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizers[name].zero_grad()
            loss.backward()
            optimizers[name].step()
            seconds[name] += time.perf_counter() - start
            losses[name].append(loss.item())
        ours, theirs = losses["sdpa"][-1], losses["torch"][-1]
        worst = max(worst, abs(ours - theirs) / abs(theirs))
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss sdpa {ours:.5f}  torch {theirs:.5f}  |diff| {abs(ours - theirs):.2e}")

    params = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
                 for a, b in zip(models["sdpa"].parameters(), models["torch"].parameters()))
    first, last = losses["sdpa"][0], sum(losses["sdpa"][-20:]) / len(losses["sdpa"][-20:])
    print(f"loss {first:.3f} (ln {len(chars)} = {math.log(len(chars)):.3f}) -> {last:.3f} (mean of the last 20 steps)")
    print(f"largest relative difference sdpa vs torch: loss {worst:.2e} (any step), parameters {params:.2e} (end)")
    print(f"time in forward+backward+step: sdpa {seconds['sdpa']:.2f} s, torch {seconds['torch']:.2f} s")
    if args.sample:
        print("sample:\n" + sample(models["sdpa"], chars, "Shall I ", args.sample, args.context, args.seed))

    failures = []
    if not last < 0.5 * first:
        failures.append(f"the loss did not fall enough: {first:.3f} -> {last:.3f}")
    if worst > args.tolerance:
        failures.append(f"losses differ from torch's by {worst:.2e} > {args.tolerance:g} (relative)")
    if params > args.tolerance:
        failures.append(f"parameters differ from torch's by {params:.2e} > {args.tolerance:g} (relative)")
    for failure in failures:
        print("FAILED: " + failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
