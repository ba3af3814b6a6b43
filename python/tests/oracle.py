"""What the tests compare against: PyTorch in float64, the tolerance rule of DESIGN.md §4,
an independent Philox4x32-10, and bookkeeping of the errors seen (printed at the end of the
run by conftest.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LOW_PRECISION = (torch.bfloat16, torch.float16)


# --- bookkeeping -----------------------------------------------------------------------

@dataclasses.dataclass
class ErrorStats:
    checks: int = 0
    worst_error: float = 0.0  # max |ours - reference|
    worst_ratio: float = 0.0  # max error / tolerance (must stay <= 1)
    worst_naive_ratio: float = 0.0  # low precision: max error / torch's own error in the dtype


STATS: dict[str, ErrorStats] = {}
EXAMPLES: dict[str, int] = {}  # hypothesis examples run, per test
BOUND_DECIDED: dict[str, int] = {}  # checks passed on the rounding bound, not 2 × torch's error


def count_example(test: str) -> None:
    EXAMPLES[test] = EXAMPLES.get(test, 0) + 1


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def record(key: str, error: float, tolerance: float, naive_error: float | None = None) -> None:
    s = STATS.setdefault(key, ErrorStats())
    s.checks += 1
    s.worst_error = max(s.worst_error, error)
    s.worst_ratio = max(s.worst_ratio, error / tolerance)
    if naive_error is not None and naive_error > 0:
        s.worst_naive_ratio = max(s.worst_naive_ratio, error / naive_error)


# --- conversions -----------------------------------------------------------------------

def to_torch(x) -> torch.Tensor:
    """A torch tensor with x's values (NumPy views with negative strides are packed)."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.array(x, copy=True, order="C"))


def to64(x) -> torch.Tensor:
    """A float64 copy with exactly x's values (every input dtype embeds in float64)."""
    return to_torch(x).detach().to(torch.float64)


def packed(*shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """A contiguous tensor of standard normals drawn in float64 from a generator seeded by
    `seed`, rounded to dtype (the same draws at every dtype)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def data_pointer(x) -> int:
    return x.data_ptr() if isinstance(x, torch.Tensor) else x.__array_interface__["data"][0]


# --- masks ----------------------------------------------------------------------------

def allowed_positions(mask, L: int, S: int, causal: str | None) -> torch.Tensor:
    """Where a query may look, as a bool tensor broadcastable to (..., L, S): the mask's
    True / finite entries, intersected with the causal band."""
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal is not None:
        i = torch.arange(L).unsqueeze(1)
        j = torch.arange(S).unsqueeze(0)
        allowed = j <= i + (S - L if causal == "bottom_right" else 0)
    if mask is not None:
        m = to_torch(mask)
        allowed = allowed & (m if m.dtype == torch.bool else m != -math.inf)
    return allowed


def combined_mask(mask, L: int, S: int, causal: str | None, dtype=torch.float64):
    """One mask with the causal band folded in, for torch, which refuses mask + is_causal.
    bool stays bool; a float mask gets -inf outside the band, in `dtype`."""
    if causal is None:
        if mask is None:
            return None
        m = to_torch(mask)
        return m if m.dtype == torch.bool else m.to(dtype)
    band = allowed_positions(None, L, S, causal)
    if mask is None:
        return band
    m = to_torch(mask)
    if m.dtype == torch.bool:
        return m & band
    return m.to(dtype).masked_fill(~band, -math.inf)


# --- PyTorch ----------------------------------------------------------------------------

@contextlib.contextmanager
def low_precision_math():
    """torch's math backend computing in the input dtype (its default upcasts half and
    bfloat16 to float32): the naive implementation in that dtype of DESIGN.md §4."""
    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        yield
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(before)


def torch_sdpa(q, k, v, **kwargs):
    """torch.nn.functional.scaled_dot_product_attention on its math backend: torch's own
    reference, and the one with no known wrong answers here (its CPU flash kernel gives NaN
    for scale=0 with is_causal=True: 0 · -inf)."""
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def torch_math(q, k, v, mask=None, *, scale=None, enable_gqa=False, dropout_p=0.0, dropout_mask=None):
    """torch's math backend: (output, weights), the weights before 1/(1-p) scaling."""
    if mask is not None and mask.dtype == torch.bool:
        # The op takes an additive mask: F.scaled_dot_product_attention converts bool masks
        # before it calls the op (a bool passed straight in would be added as 0/1).
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, -math.inf)
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=False, dropout_mask=dropout_mask, scale=scale,
        enable_gqa=enable_gqa)


def naive_low_precision(q, k, v, mask, *, scale, enable_gqa, dropout_p=0.0, dropout_mask=None):
    """(output, weights) of torch's math backend run in q's dtype; a float mask is given in
    that dtype, as torch requires."""
    q, k, v = (to_torch(t) for t in (q, k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    with low_precision_math():
        return torch_math(q, k, v, mask, scale=scale, enable_gqa=enable_gqa, dropout_p=dropout_p,
                          dropout_mask=dropout_mask)


# --- the tolerance rule (DESIGN.md §4, docs/numerics.md) -------------------------------

def max_error(ours, reference: torch.Tensor) -> float:
    if reference.numel() == 0:
        return 0.0
    return (to64(ours) - reference).abs().max().item()


def max_abs(reference: torch.Tensor) -> float:
    return reference.abs().max().item() if reference.numel() else 0.0


# Unit roundoff (half an ulp at 1) of the low-precision dtypes.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def rounding_bound(dtype, q64, k64, v64, mask64, *, scale, enable_gqa, reference, dropout_p=0.0,
                   dropout_mask=None) -> float:
    """u · max over outputs of (Σ_j w_ij |v_jc| + |o_ic|): to first order, how far rounding
    the weights and the output to `dtype` may move an output, i.e. what DESIGN.md's naive
    implementation in that dtype is entitled to. On large tensors 2 × the measured naive
    error estimates it; on a handful of elements one naive run can be lucky (error 4e-5
    where rounding the weights can cost 1e-3), so this bound is the rule's floor there."""
    if reference.numel() == 0:
        return 0.0
    # Σ_j w_ij |v_j| is attention with the same weights on |V|: torch's math on |V| (GQA,
    # broadcasting and dropout handled as for the output itself).
    weighted, _ = torch_math(q64, k64, v64.abs(), mask64, scale=scale, enable_gqa=enable_gqa, dropout_p=dropout_p,
                             dropout_mask=dropout_mask)
    weighted = torch.broadcast_to(weighted, reference.shape)
    return UNIT_ROUNDOFF[dtype] * (weighted + reference.abs()).max().item()


def judge(dtype, ours, reference: torch.Tensor, naive=None, bound: float = 0.0) -> tuple[float, float, float | None]:
    """(error, tolerance, naive error) of DESIGN.md §4 for `ours` against the float64
    `reference`. float64: 1e-10 · max(1, max|ref|); float32: 1e-5 · max(1, max|ref|);
    bfloat16 and float16: 2 × the error of `naive` (torch's own computation in that dtype),
    floor 1e-5 — and floor `bound`, the first-order rounding bound of that naive computation
    (rounding_bound), which keeps a lucky naive run on a few elements from setting the bar.
    The naive error is None for float32 and float64. (bench/peers.py judges the peers by it.)"""
    error = max_error(ours, reference)
    naive_error = None
    if dtype == torch.float64:
        tolerance = 1e-10 * max(1.0, max_abs(reference))
    elif dtype == torch.float32:
        tolerance = 1e-5 * max(1.0, max_abs(reference))
    else:
        naive_error = max_error(naive, reference)
        tolerance = max(2.0 * naive_error, 1e-5, bound)
    return error, tolerance, naive_error


def check_close(what: str, dtype, ours, reference: torch.Tensor, naive=None, bound: float = 0.0) -> None:
    """Asserts that `ours` is within judge's tolerance of `reference`, and records the error."""
    assert tuple(to_torch(ours).shape) == tuple(reference.shape), (what, to_torch(ours).shape, reference.shape)
    error, tolerance, naive_error = judge(dtype, ours, reference, naive, bound)
    if naive_error is not None and error > max(2.0 * naive_error, 1e-5):
        BOUND_DECIDED[f"{what} {dtype_name(dtype)}"] = BOUND_DECIDED.get(f"{what} {dtype_name(dtype)}", 0) + 1
    record(f"{what} {dtype_name(dtype)}", error, tolerance, naive_error)
    assert error <= tolerance, f"{what} ({dtype_name(dtype)}): max error {error:.3g} > tolerance {tolerance:.3g}"


# --- Philox4x32-10, written from docs/semantics.md ("Dropout") --------------------------

_M32 = np.uint64(0xFFFFFFFF)


def _mix64(x: int) -> int:
    x &= (1 << 64) - 1
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return x ^ (x >> 31)


def philox4x32_10(c0, c1, c2, c3, key: int):
    """The four 32-bit output words for counters (c0, c1, c2, c3) (arrays) and a 64-bit key."""
    c = [np.asarray(x, dtype=np.uint64) & _M32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _M32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    return c


def dropout_keep(p: float, seed: int, offset: int, batch: int, heads: int, L: int, S: int) -> np.ndarray:
    """keep[b, h, i, j] of semantics.md: word(seed ^ mix64(offset); j/4, i, h, b)[j % 4] >=
    round(p · 2³²)."""
    key = seed ^ _mix64(offset)
    b, h, i, j = np.meshgrid(np.arange(batch), np.arange(heads), np.arange(L), np.arange(S), indexing="ij")
    words = philox4x32_10(j // 4, i, h, b, key)
    word = np.choose(j % 4, words)
    threshold = min(int(p * 2.0**32 + 0.5), 0xFFFFFFFF)
    return word >= threshold


# --- FlashAttention's extensions: window, ALiBi, softcap (issue #7) ----------------------

def extended_attention(q, k, v, mask=None, *, scale=None, causal=None, window=(-1, -1), alignment=None,
                       slopes=None, softcap=0.0, sinks=None):
    """(output, weights, lse) of include/sdpa/options.h's formula, literally, in the dtype of
    q (float64 for the reference; a low-precision dtype gives the naive computation in that
    dtype), differentiable by torch.autograd:

        s = softcap · tanh(scale · q·k / softcap)    (softcap > 0; else scale · q·k)
            − slope[h] · |d(i) − j|                   (ALiBi)
            + mask                                    (float mask; bool/causal/window: −inf)

    d(i) = i (top_left) or i + S − L (bottom_right); alignment None is the causal one when
    causal, else bottom_right. The window keeps d(i) − left <= j <= d(i) + right (−1:
    unbounded). Shapes (..., H, L, E) with GQA by repeating K/V heads; slopes (Hq,) or
    (batch..., Hq). Attention sinks ((Hq,) or (batch..., Hq), gpt-oss's) are one more
    logit per row in the softmax with no value: the weights are softmax over [scores, sink]
    without the sink's column, lse includes it. Fully masked rows give 0, and lse −inf
    (the sink with sinks)."""
    dtype = q.dtype
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.ndim >= 3 and k.ndim >= 3 and q.ndim == k.ndim and q.shape[-3] != k.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alignment is None:
        alignment = causal if causal is not None else "bottom_right"
    i = torch.arange(L).unsqueeze(1)
    j = torch.arange(S).unsqueeze(0)
    diagonal = i + (S - L if alignment == "bottom_right" else 0)
    if slopes is not None:
        slopes = to_torch(slopes).to(dtype)
        scores = scores - slopes[..., None, None] * (diagonal - j).abs().to(dtype)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal is not None:
        allowed = allowed & (j <= i + (S - L if causal == "bottom_right" else 0))
    left, right = window
    if left >= 0:
        allowed = allowed & (j >= diagonal - left)
    if right >= 0:
        allowed = allowed & (j <= diagonal + right)
    if mask is not None:
        m = to_torch(mask)
        if m.dtype == torch.bool:
            allowed = allowed & m
        else:
            allowed = allowed & (m != -math.inf)
            scores = scores + torch.where(m == -math.inf, torch.zeros((), dtype=dtype), m.to(dtype))
    allowed = torch.broadcast_to(allowed, scores.shape)
    scores = scores.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    if sinks is not None:
        sink = to_torch(sinks).to(dtype)[..., None, None].expand(scores.shape[:-1] + (1,))
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1, keepdim=True)
    finite = torch.isfinite(lse)
    shifted = scores - torch.where(finite, lse, torch.zeros((), dtype=dtype))
    weights = torch.where(allowed & finite, torch.exp(shifted), torch.zeros((), dtype=dtype))
    return weights @ v, weights, lse.squeeze(-1)
