#!/usr/bin/env python3
"""End-to-end tests of the `sdpa` command-line tool against a NumPy float64 attention.

Usage: test_cli.py PATH/TO/sdpa
   or: SDPA_CLI=PATH/TO/sdpa python -m pytest tests/cli/test_cli.py

Writes .npy inputs into a temporary directory, runs `sdpa run` / `check` / `info`, and
compares with `attention()` below, the literal formula in float64. Prints one line per
check and exits non-zero if any fails. Needs only the standard library and NumPy.
"""

import inspect
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

SDPA = None  # path of the binary, from argv[1]
TMP = None  # the temporary directory
FAILURES = []


# --- the oracle -------------------------------------------------------------------------


def attention(q, k, v, mask=None, causal="none", scale=None, window=(-1, -1), alignment=None, alibi=None,
              softcap=0.0, sinks=None):
    """softmax(q kᵀ·scale + mask) v in float64 with PyTorch semantics (bool mask: True =
    takes part; float mask: added). Fully masked rows give output 0, weights 0, lse -inf.
    Issue #7, as include/sdpa/options.h defines them: the score is
    softcap·tanh(scale·q·k / softcap) (softcap > 0) − slope[h]·|d(i) − j| (ALiBi slopes
    (Hq,) or (batch..., Hq)); query i sees key j only when d(i) − window[0] <= j <=
    d(i) + window[1] (−1 = unbounded; causal caps window[1] at 0), where d(i) = i
    (top-left) or i + S − L (bottom-right); the alignment defaults to the causal one, else
    bottom-right. Issue #17: attention sinks ((Hq,) or (batch..., Hq)) join every row's
    denominator as exp(sink - max) and take no value; a row with no key then gives output 0
    and lse = its sink. Returns (output, weights, lse)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    if group > 1:  # GQA: query head h reads KV head h // group
        k = np.repeat(k, group, axis=-3)
        v = np.repeat(v, group, axis=-3)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(E) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    if alignment is None:
        alignment = causal if causal != "none" else "bottom-right"
    diagonal = np.arange(L)[:, None] + (S - L if alignment == "bottom-right" else 0)  # d(i)
    j = np.arange(S)[None, :]
    if alibi is not None:
        slopes = np.asarray(alibi, dtype=np.float64)[..., None, None]  # (..., Hq, 1, 1)
        scores = scores - slopes * np.abs(diagonal - j)
    left, right = window
    if causal != "none":
        right = 0 if right < 0 else min(right, 0)
    visible = np.ones((L, S), dtype=bool)
    if left >= 0:
        visible &= j >= diagonal - left
    if right >= 0:
        visible &= j <= diagonal + right
    scores = np.where(visible, scores, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, -np.inf)
        else:
            scores = scores + mask.astype(np.float64)
    if causal != "none":
        shift = S - L if causal == "bottom-right" else 0
        visible = np.arange(S)[None, :] <= np.arange(L)[:, None] + shift
        scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)  # S = 0: a row that sees nothing
    sink = None
    if sinks is not None:
        sink = np.broadcast_to(np.asarray(sinks, dtype=np.float64)[..., None, None], row_max.shape)
        row_max = np.maximum(row_max, sink)
    fully_masked = row_max == -np.inf
    safe_max = np.where(fully_masked, 0.0, row_max)
    e = np.where(fully_masked, 0.0, np.exp(scores - safe_max))
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.where(fully_masked, 0.0, np.exp(sink - safe_max))
    weights = np.where(fully_masked, 0.0, e / np.where(total == 0, 1.0, total))
    with np.errstate(divide="ignore"):
        lse = np.where(fully_masked, -np.inf, safe_max + np.log(total))[..., 0]
    return weights @ v, weights, lse


# --- helpers ----------------------------------------------------------------------------


def path(name):
    return os.path.join(TMP, name)


def save(name, array):
    p = path(name)
    np.save(p, array)
    return p


def sdpa(*args):
    return subprocess.run([SDPA, *map(str, args)], capture_output=True, text=True, timeout=300)


def report(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(name)


def close(got, want, tol):
    """Max |got - want| / max(1, max|want|) <= tol; infinities must match exactly."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        return False, f"shape {got.shape}, expected {want.shape}"
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or not np.array_equal(got[~finite], want[~finite]):
        return False, "non-finite entries differ"
    err = np.max(np.abs(got[finite] - want[finite]), initial=0.0)
    ref = max(1.0, np.max(np.abs(want[finite]), initial=0.0))
    return err / ref <= tol, f"rel err {err / ref:.2e} (tol {tol:.0e})"


def run_and_compare(name, q, k, v, want, tol, extra=(), weights=False, lse=False):
    """Runs `sdpa run` on q, k, v (+ extra flags) and compares output / weights / lse."""
    args = ["run", "--query", save(f"{name}_q.npy", q), "--key", save(f"{name}_k.npy", k),
            "--value", save(f"{name}_v.npy", v), "--out", path(f"{name}_o.npy"), *extra]
    if weights:
        args += ["--weights", path(f"{name}_w.npy")]
    if lse:
        args += ["--lse", path(f"{name}_l.npy")]
    proc = sdpa(*args)
    if proc.returncode != 0:
        report(name, False, f"exit {proc.returncode}: {proc.stderr.strip()}")
        return
    out_want, w_want, lse_want = want
    results = []
    out = np.load(path(f"{name}_o.npy"))
    results.append(("output dtype", (out.dtype == q.dtype, f"{out.dtype}")))
    results.append(("output", close(out, out_want, tol)))
    if weights:
        results.append(("weights", close(np.load(path(f"{name}_w.npy")), w_want, tol)))
    if lse:
        lse_got = np.load(path(f"{name}_l.npy"))
        expected = np.float64 if q.dtype == np.float64 else np.float32
        results.append(("lse dtype", (lse_got.dtype == expected, f"{lse_got.dtype}")))
        results.append(("lse", close(lse_got, lse_want, max(tol, 1e-5))))
    ok = all(r[1][0] for r in results)
    report(name, ok, "; ".join(f"{label} {detail}" for label, (_, detail) in results))


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --- the checks -------------------------------------------------------------------------


def check_gqa_bool_mask_bottom_right(rng):
    B, Hq, Hkv, L, S, E, Ev = 2, 6, 2, 5, 7, 8, 3
    q, k, v = randn(rng, B, Hq, L, E), randn(rng, B, Hkv, S, E), randn(rng, B, Hkv, S, Ev)
    mask = rng.random((1, 1, L, S)) < 0.7
    mask[0, 0, 2, :] = False  # a fully masked row: output 0, never NaN
    run_and_compare("a_gqa_bool_mask_bottom_right", q, k, v,
                    attention(q, k, v, mask, causal="bottom-right"), 1e-5,
                    ["--mask", save("a_mask.npy", mask), "--causal", "bottom-right"], lse=True)


def check_float_mask(rng):
    # float64 inputs, a float32 additive mask (a dtype other than the query's), a
    # negative scale and top-left causal.
    B, H, L, S, E = 2, 3, 6, 9, 16
    q, k, v = (randn(rng, B, H, n, E, dtype=np.float64) for n in (L, S, S))
    k, v = np.asfortranarray(k), v.astype(">f8")  # Fortran order and big-endian files
    mask = (2.0 * rng.standard_normal((B, 1, L, S))).astype(np.float32)
    mask[:, :, :, 0] = -np.inf
    run_and_compare("b_float_mask", q, k, v, attention(q, k, v, mask, causal="top-left", scale=-0.3), 1e-10,
                    ["--mask", save("b_mask.npy", mask), "--causal", "top-left", "--scale", "-0.3"], weights=True)


def check_ignore_polarity(rng):
    # Seed 001: mask == 1 marks positions to drop. As bool and as 0/1 float.
    B, H, L, S, E = 1, 2, 4, 6, 8
    q, k, v = randn(rng, B, H, L, E), randn(rng, B, H, S, E), randn(rng, B, H, S, E)
    drop = rng.random((L, S)) < 0.4
    want = attention(q, k, v, ~drop)
    run_and_compare("c_ignore_polarity_bool", q, k, v, want, 1e-5,
                    ["--mask", save("c_mask_bool.npy", drop), "--mask-polarity", "ignore"])
    run_and_compare("c_ignore_polarity_float", q, k, v, want, 1e-5,
                    ["--mask", save("c_mask_float.npy", drop.astype(np.float32)), "--mask-polarity", "ignore"])


def check_rank3_weights_lse(rng):
    N, L, S, E, Ev = 3, 5, 11, 8, 4
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 1e-2)):
        q, k, v = randn(rng, N, L, E, dtype=dtype), randn(rng, N, S, E, dtype=dtype), randn(rng, N, S, Ev, dtype=dtype)
        run_and_compare(f"d_rank3_weights_lse_{np.dtype(dtype).name}", q, k, v, attention(q, k, v), tol,
                        weights=True, lse=True)


def check_dropout(rng):
    # Philox dropout is a pure function of (seed, offset, b, h, i, j): the same seed
    # gives the same file, and the CPU backend agrees with the oracle.
    q, k, v = randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 13, 8), randn(rng, 1, 2, 13, 8)
    files = {"q": save("e_q.npy", q), "k": save("e_k.npy", k), "v": save("e_v.npy", v)}
    outs = []
    for tag, backend in (("1", "cpu"), ("2", "cpu"), ("3", "reference")):
        proc = sdpa("run", "--query", files["q"], "--key", files["k"], "--value", files["v"], "--dropout-p", "0.3",
                    "--seed", "7", "--offset", "3", "--backend", backend, "--out", path(f"e_o{tag}.npy"),
                    "--weights", path(f"e_w{tag}.npy"))
        if proc.returncode != 0:
            report("dropout_deterministic", False, proc.stderr.strip())
            return
        outs.append((np.load(path(f"e_o{tag}.npy")), np.load(path(f"e_w{tag}.npy"))))
    same = np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    ok_ref, detail = close(outs[0][0], outs[2][0].astype(np.float64), 1e-5)
    dropped = float(np.mean(outs[0][1] == 0))
    report("dropout_deterministic", same and ok_ref and 0.1 < dropped < 0.5,
           f"repeatable {same}, cpu vs reference {detail}, dropped fraction {dropped:.2f}")


def npy_bytes(descr, shape, data=b"", magic=b"\x93NUMPY"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    header += " " * (-(len(header) + 11) % 64) + "\n"
    return magic + b"\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data


def check_hostile_files(rng):
    k, v = save("h_k.npy", randn(rng, 1, 4, 8)), save("h_v.npy", randn(rng, 1, 4, 8))
    good = npy_bytes("<f4", (1, 3, 8), randn(rng, 1, 3, 8).tobytes())
    hostile = {
        "truncated": good[:30],
        "bad_magic": b"\x93NUMPX" + good[6:],
        "int32_dtype": npy_bytes("<i4", (1, 3, 8), np.zeros((1, 3, 8), np.int32).tobytes()),
        "shape_overflow": npy_bytes("<f4", (2**40, 2**40, 2**40), b"\0" * 64),
        "short_data": npy_bytes("<f4", (1, 3, 8), b"\0" * 50),
        "empty_file": b"",
    }
    for name, content in hostile.items():
        p = path(f"hostile_{name}.npy")
        with open(p, "wb") as f:
            f.write(content)
        out = path(f"hostile_{name}_out.npy")
        # As the query, and (a different code path in the CLI) as the mask.
        for role, args in (("query", ["--query", p, "--key", k, "--value", v]),
                           ("mask", ["--query", save("h_q.npy", randn(rng, 1, 3, 8)), "--key", k, "--value", v,
                                     "--mask", p])):
            proc = sdpa("run", *args, "--out", out, "--lse", path(f"hostile_{name}_lse.npy"))
            ok = (proc.returncode == 2 and proc.stderr.startswith("sdpa: error: ") and p in proc.stderr
                  and not os.path.exists(out) and not os.path.exists(path(f"hostile_{name}_lse.npy")))
            report(f"hostile_{name}_as_{role}", ok, f"exit {proc.returncode}, stderr {proc.stderr.strip()!r}")
    # A missing file behaves the same.
    missing = path("does_not_exist.npy")
    proc = sdpa("run", "--query", missing, "--key", k, "--value", v, "--out", path("missing_out.npy"))
    report("missing_file", proc.returncode == 2 and missing in proc.stderr and not os.path.exists(path("missing_out.npy")),
           f"exit {proc.returncode}, stderr {proc.stderr.strip()!r}")


def check_bad_arguments(rng):
    # Library errors (shapes) and usage errors (flags) exit 2 and write nothing.
    q, k, v = save("x_q.npy", randn(rng, 1, 3, 5, 8)), save("x_k.npy", randn(rng, 1, 2, 4, 8)), save(
        "x_v.npy", randn(rng, 1, 2, 4, 8))
    q2 = save("x_q2.npy", randn(rng, 1, 2, 5, 8))
    out = path("x_out.npy")
    cases = {
        "gqa_heads_not_dividing": ["--query", q, "--key", k, "--value", v],
        "bad_causal_value": ["--query", q, "--key", k, "--value", v, "--causal", "sideways"],
        "dropout_out_of_range": ["--query", q2, "--key", k, "--value", v, "--dropout-p", "1.5"],
        "negative_seed_not_wrapped": ["--query", q2, "--key", k, "--value", v, "--dropout-p", "0.5", "--seed", "-1"],
        "mask_not_broadcastable": ["--query", q2, "--key", k, "--value", v, "--mask",
                                   save("x_mask.npy", np.ones((3, 5, 4), dtype=bool))],
    }
    for name, args in cases.items():
        proc = sdpa("run", *args, "--out", out)
        report(f"bad_arguments_{name}", proc.returncode == 2 and proc.stderr.startswith("sdpa: error: ")
               and not os.path.exists(out),
               f"exit {proc.returncode}, stderr {proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else ''!r}")


# --- issue #7: window, ALiBi, softcap, varlen, paged ----------------------------------------


def check_sliding_window(rng):
    # Both alignments, with and without causal, L < S and L > S (bottom-right then has
    # rows that see nothing: output 0, lse -inf).
    B, Hq, Hkv, E = 2, 4, 2, 8
    for L, S in ((5, 9), (7, 4)):
        q, k, v = randn(rng, B, Hq, L, E), randn(rng, B, Hkv, S, E), randn(rng, B, Hkv, S, E)
        for alignment in ("top-left", "bottom-right"):
            for causal in ("none", alignment):
                for window in ((2, 1), (0, -1), (-1, 3)):
                    name = f"f_window_{L}x{S}_{alignment}_causal_{causal}_{window[0]}_{window[1]}"
                    flags = ["--window-left", window[0], "--window-right", window[1], "--alignment", alignment]
                    if causal != "none":
                        flags += ["--causal", causal]
                    run_and_compare(name, q, k, v, attention(q, k, v, causal=causal, window=window, alignment=alignment),
                                    1e-5, flags, weights=True, lse=True)
    # No --alignment: the causal one, else bottom-right.
    q, k, v = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 6, 8), randn(rng, 1, 2, 6, 8)
    run_and_compare("f_window_default_alignment", q, k, v, attention(q, k, v, window=(1, 1)), 1e-5,
                    ["--window-left", 1, "--window-right", 1], lse=True)
    run_and_compare("f_window_default_alignment_causal_top_left", q, k, v,
                    attention(q, k, v, causal="top-left", window=(2, -1)), 1e-5,
                    ["--window-left", 2, "--causal", "top-left"], lse=True)


def check_huge_window_is_unbounded(rng):
    # A window side of 2^63 - 1 is valid (>= 0) and reaches every key: it must equal -1.
    # d(i) + window_right (and d(i) - window_left, d(i) < 0 under bottom-right with
    # L > S) overflow int64 if computed as written.
    big = 2**63 - 1
    q, k, v = randn(rng, 1, 2, 7, 8), randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 4, 8)
    for alignment in ("top-left", "bottom-right"):
        for window in ((big, big), (big, -1), (-1, big), (big, 0), (0, big)):
            want = attention(q, k, v, window=tuple(-1 if w == big else w for w in window), alignment=alignment)
            run_and_compare(f"f_window_huge_{alignment}_{window[0]}_{window[1]}", q, k, v, want, 1e-5,
                            ["--window-left", window[0], "--window-right", window[1], "--alignment", alignment],
                            lse=True)


def check_alibi(rng):
    B, Hq, Hkv, L, S, E = 2, 4, 2, 5, 8, 8
    q, k, v = randn(rng, B, Hq, L, E), randn(rng, B, Hkv, S, E), randn(rng, B, Hkv, S, E)
    slopes = 2.0 ** -np.arange(1, Hq + 1)  # the ALiBi paper's geometric slopes, float64
    run_and_compare("g_alibi_heads", q, k, v, attention(q, k, v, alibi=slopes), 1e-5,
                    ["--alibi-slopes", save("g_slopes.npy", slopes)], weights=True, lse=True)
    per_batch = rng.random((B, Hq)).astype(np.float32)
    run_and_compare("g_alibi_per_batch_top_left_causal", q, k, v,
                    attention(q, k, v, causal="top-left", alibi=per_batch), 1e-5,
                    ["--alibi-slopes", save("g_slopes_b.npy", per_batch), "--causal", "top-left"], lse=True)
    run_and_compare("g_alibi_window_top_left", q, k, v,
                    attention(q, k, v, alibi=slopes, window=(2, 2), alignment="top-left"), 1e-5,
                    ["--alibi-slopes", save("g_slopes.npy", slopes), "--window-left", 2, "--window-right", 2,
                     "--alignment", "top-left"], lse=True)
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    run_and_compare("g_alibi_float64", q64, k64, v64, attention(q64, k64, v64, alibi=slopes, scale=0.7), 1e-10,
                    ["--alibi-slopes", save("g_slopes.npy", slopes), "--scale", 0.7], lse=True)


def check_sinks(rng):
    # gpt-oss's attention sinks from a .npy file, (Hq,) and (batch, Hq), with GQA, causal,
    # a window that leaves rows with no key (output 0, lse = the sink), and float64.
    B, Hq, Hkv, L, S, E = 2, 4, 2, 6, 5, 8
    q, k, v = randn(rng, B, Hq, L, E), randn(rng, B, Hkv, S, E), randn(rng, B, Hkv, S, E)
    sinks = np.array([0.5, -1.0, 2.0, 1.0], dtype=np.float32)
    run_and_compare("s_sinks_heads", q, k, v, attention(q, k, v, sinks=sinks), 1e-5,
                    ["--sinks", save("s_sinks.npy", sinks)], weights=True, lse=True)
    per_batch = (3 * rng.random((B, Hq)) - 1).astype(np.float32)
    run_and_compare("s_sinks_per_batch_window", q, k, v,
                    attention(q, k, v, causal="top-left", window=(0, 0), sinks=per_batch), 1e-5,
                    ["--sinks", save("s_sinks_b.npy", per_batch), "--causal", "top-left", "--window-left", 0,
                     "--window-right", 0], weights=True, lse=True)
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    run_and_compare("s_sinks_float64", q64, k64, v64, attention(q64, k64, v64, sinks=sinks.astype(np.float64)), 1e-10,
                    ["--sinks", save("s_sinks64.npy", sinks.astype(np.float64))], lse=True)


def quantize(x):
    """Symmetric int8 per row, as sdpa.quantize_kv: scale = max|row| / 127 (float32),
    q = round(x / scale), ties to even; a zero row gets scale 0."""
    scale = (np.abs(x.astype(np.float64)).max(axis=-1) / 127).astype(np.float32)
    safe = np.where(scale == 0, 1, scale).astype(np.float64)[..., None]
    return np.clip(np.rint(x / safe), -127, 127).astype(np.int8), scale


def check_int8_kv(rng):
    # Quantized K/V: int8 .npy files with --key-scale / --value-scale, against the formula
    # on what they stand for (scale · q, exact in float64); GQA decode and prefill, K alone.
    B, Hq, Hkv, S, E = 2, 4, 2, 300, 16
    for L, causal in ((1, "none"), (5, "bottom-right")):
        q, k, v = randn(rng, B, Hq, L, E), randn(rng, B, Hkv, S, E), randn(rng, B, Hkv, S, E)
        (k8, ks), (v8, vs) = quantize(k), quantize(v)
        kd, vd = k8 * ks[..., None].astype(np.float64), v8 * vs[..., None].astype(np.float64)
        run_and_compare(f"int8_kv_L{L}", q, k8, v8, attention(q, kd, vd, causal=causal), 1e-5,
                        ["--key-scale", save(f"i8_ks{L}.npy", ks), "--value-scale", save(f"i8_vs{L}.npy", vs),
                         "--causal", causal], lse=True)
    run_and_compare("int8_key_only", q, k8, v, attention(q, kd, v, causal=causal), 1e-5,
                    ["--key-scale", save("i8_ks.npy", ks), "--causal", causal])
    out = path("i8_bad_o.npy")
    expect_usage_error("int8_key_without_scale",
                       ["--query", save("i8_q.npy", q), "--key", save("i8_k.npy", k8), "--value",
                        save("i8_v.npy", v), "--out", out], "--key-scale", [out])
    expect_usage_error("int8_scale_of_the_wrong_shape",
                       ["--query", path("i8_q.npy"), "--key", path("i8_k.npy"), "--value", path("i8_v.npy"),
                        "--key-scale", save("i8_ks_bad.npy", ks[..., :-1]), "--out", out], "--key-scale", [out])


def check_softcap(rng):
    # Scores of a few hundred, so that the cap matters.
    B, H, L, S, E = 1, 3, 6, 10, 16
    q, k, v = 6 * randn(rng, B, H, L, E), 6 * randn(rng, B, H, S, E), randn(rng, B, H, S, E)
    for cap in (5.0, 30.0):
        run_and_compare(f"h_softcap_{cap:g}", q, k, v, attention(q, k, v, softcap=cap), 1e-5,
                        ["--softcap", cap], weights=True, lse=True)
    slopes = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    run_and_compare("h_softcap_alibi_window_causal", q, k, v,
                    attention(q, k, v, causal="bottom-right", softcap=20.0, alibi=slopes, window=(3, -1)), 1e-5,
                    ["--softcap", 20, "--alibi-slopes", save("h_slopes.npy", slopes), "--causal", "bottom-right",
                     "--window-left", 3], lse=True)


def varlen_reference(q, k, v, cu_q, cu_k, alibi=None, **options):
    """Each sequence attended alone with attention() and packed again."""
    Hq, Ev = q.shape[0], v.shape[-1]
    out = np.zeros((Hq, q.shape[1], Ev))
    lse = np.full((Hq, q.shape[1]), -np.inf)
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        slopes = None if alibi is None else (alibi if alibi.ndim == 1 else alibi[b])
        o, _, l = attention(q[:, rows], k[:, keys], v[:, keys], alibi=slopes, **options)
        out[:, rows], lse[:, rows] = o, l
    return out, None, lse


def check_varlen(rng):
    # Sequences of query lengths 3, 7, 0, 2 against keys 5, 7, 4, 1 (an empty query
    # sequence, L > S in the last one), GQA 4:2, Ev != E.
    cu_q, cu_k = [0, 3, 10, 10, 12], [0, 5, 12, 16, 17]
    Hq, Hkv, E, Ev = 4, 2, 8, 5
    q, k, v = randn(rng, Hq, cu_q[-1], E), randn(rng, Hkv, cu_k[-1], E), randn(rng, Hkv, cu_k[-1], Ev)
    lists = ["--cu-seqlens-q", ",".join(map(str, cu_q)), "--cu-seqlens-k", ",".join(map(str, cu_k))]
    run_and_compare("i_varlen", q, k, v, varlen_reference(q, k, v, cu_q, cu_k), 1e-5, lists, lse=True)
    for causal in ("top-left", "bottom-right"):
        run_and_compare(f"i_varlen_causal_{causal}", q, k, v, varlen_reference(q, k, v, cu_q, cu_k, causal=causal),
                        1e-5, [*lists, "--causal", causal], lse=True)
    slopes = rng.random((len(cu_q) - 1, Hq))
    run_and_compare("i_varlen_window_alibi_softcap", q, k, v,
                    varlen_reference(q, k, v, cu_q, cu_k, alibi=slopes, window=(2, 1), softcap=3.0), 1e-5,
                    [*lists, "--alibi-slopes", save("i_slopes.npy", slopes), "--window-left", 2, "--window-right", 1,
                     "--softcap", 3], lse=True)
    # An empty key sequence (its queries see nothing: output 0, lse -inf), on the oracle
    # backend as well as the CPU one.
    cu_q0, cu_k0 = [0, 4, 4, 9], [0, 0, 3, 11]
    q0, k0, v0 = randn(rng, Hq, 9, E), randn(rng, Hkv, 11, E), randn(rng, Hkv, 11, Ev)
    for backend in ("cpu", "reference"):
        run_and_compare(f"i_varlen_empty_keys_{backend}", q0, k0, v0,
                        varlen_reference(q0, k0, v0, cu_q0, cu_k0, causal="bottom-right", window=(1, -1)), 1e-5,
                        ["--cu-seqlens-q", "0,4,4,9", "--cu-seqlens-k", "0,0,3,11", "--causal", "bottom-right",
                         "--window-left", 1, "--backend", backend], lse=True)
    # Spaces around entries are accepted; float64 stays float64.
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    run_and_compare("i_varlen_float64_spaces", q64, k64, v64, varlen_reference(q64, k64, v64, cu_q, cu_k), 1e-10,
                    ["--cu-seqlens-q", " 0, 3,10 ,10,12", "--cu-seqlens-k", "0,5,12,16,17 "], lse=True)


def paged_case(rng, seq_lens, page_size, Hkv, E, Ev):
    """Contiguous per-sequence K, V and the same keys scattered into shuffled pages.
    Returns (keys, values, key_pages, value_pages, block_table text). Rows of a page past
    the end of its sequence, the spare pages and the unused block table entries are
    filled with NaN / point at a NaN page: reading them would show in the output."""
    blocks = [-(-n // page_size) for n in seq_lens]
    per_row = max(blocks) + 1  # one unused entry at least in every row
    spare = 2
    pages = sum(blocks) + spare
    order = rng.permutation(pages)  # page order[n] holds the n-th used block
    key_pages = np.full((pages, Hkv, page_size, E), np.nan, dtype=np.float32)
    value_pages = np.full((pages, Hkv, page_size, Ev), np.nan, dtype=np.float32)
    keys, values, table, used = [], [], [], 0
    for n in seq_lens:
        K, V = randn(rng, Hkv, n, E), randn(rng, Hkv, n, Ev)
        keys.append(K)
        values.append(V)
        row = []
        for block in range(-(-n // page_size)):
            page = order[used]
            used += 1
            rows = slice(block * page_size, min(n, (block + 1) * page_size))
            count = rows.stop - rows.start
            key_pages[page, :, :count] = K[:, rows]
            value_pages[page, :, :count] = V[:, rows]
            row.append(page)
        row += [order[-1]] * (per_row - len(row))  # a spare (NaN) page: must not be read
        table.append(row)
    text = ";".join(",".join(map(str, row)) for row in table)
    return keys, values, key_pages, value_pages, text


def check_paged(rng):
    seq_lens, page_size, Hq, Hkv, L, E, Ev = [5, 7, 1], 2, 4, 2, 3, 8, 6
    keys, values, key_pages, value_pages, table = paged_case(rng, seq_lens, page_size, Hkv, E, Ev)
    q = randn(rng, len(seq_lens), Hq, L, E)
    slopes = rng.random((len(seq_lens), Hq)).astype(np.float32)
    lens = ",".join(map(str, seq_lens))
    cases = {
        "plain": ({}, []),
        "causal_bottom_right": ({"causal": "bottom-right"}, ["--causal", "bottom-right"]),
        "window_alibi_softcap": ({"window": (2, -1), "alibi": slopes, "softcap": 4.0},
                                 ["--window-left", 2, "--alibi-slopes", save("j_slopes.npy", slopes), "--softcap", 4]),
    }
    for name, (options, flags) in cases.items():
        outs, lses = [], []
        for b in range(len(seq_lens)):
            opts = dict(options)
            if "alibi" in opts:
                opts["alibi"] = opts["alibi"][b]
            o, _, l = attention(q[b], keys[b], values[b], **opts)
            outs.append(o)
            lses.append(l)
        run_and_compare(f"j_paged_{name}", q, key_pages, value_pages, (np.stack(outs), None, np.stack(lses)), 1e-5,
                        ["--block-table", table, "--seq-lens", lens, *flags], lse=True)
    # An empty sequence, pages of one row and pages longer than any sequence; GQA 3:1;
    # top-left causal; the oracle backend too.
    for page_size in (1, 16):
        seq_lens = [0, 7, 2, 16]
        keys, values, key_pages, value_pages, table = paged_case(rng, seq_lens, page_size, 1, E, E)
        q = randn(rng, len(seq_lens), 3, 5, E)
        want = [attention(q[b], keys[b], values[b], causal="top-left") for b in range(len(seq_lens))]
        for backend in ("cpu", "reference"):
            run_and_compare(f"j_paged_page_size_{page_size}_{backend}", q, key_pages, value_pages,
                            (np.stack([w[0] for w in want]), None, np.stack([w[2] for w in want])), 1e-5,
                            ["--block-table", table, "--seq-lens", ",".join(map(str, seq_lens)), "--causal", "top-left",
                             "--backend", backend], lse=True)


def check_varlen_and_paged_dropout(rng):
    # Dropout in a packed or paged batch draws as batch element b of a padded
    # (batch, Hq, L, S) call: the same rows as a plain run on zero-padded inputs whose
    # padded keys a bool mask removes.
    seq_q, seq_k, Hq, Hkv, E = [3, 5, 2], [4, 6, 6], 4, 2, 8
    B, Lmax, Smax = len(seq_q), max(seq_q), max(seq_k)
    q = np.zeros((B, Hq, Lmax, E), np.float32)
    k = np.zeros((B, Hkv, Smax, E), np.float32)
    v = np.zeros((B, Hkv, Smax, E), np.float32)
    mask = np.zeros((B, 1, 1, Smax), dtype=bool)
    for b in range(B):
        q[b, :, :seq_q[b]] = randn(rng, Hq, seq_q[b], E)
        k[b, :, :seq_k[b]] = randn(rng, Hkv, seq_k[b], E)
        v[b, :, :seq_k[b]] = randn(rng, Hkv, seq_k[b], E)
        mask[b, ..., :seq_k[b]] = True
    dropout = ["--dropout-p", 0.4, "--seed", 11, "--offset", 5]
    proc = sdpa("run", "--query", save("k_q.npy", q), "--key", save("k_k.npy", k), "--value", save("k_v.npy", v),
                "--mask", save("k_mask.npy", mask), "--out", path("k_dense.npy"), *dropout)
    if proc.returncode != 0:
        report("varlen_dropout_padded_dense", False, proc.stderr.strip())
        return
    dense = np.load(path("k_dense.npy")).astype(np.float64)
    # Packed varlen.
    cu_q, cu_k = np.concatenate([[0], np.cumsum(seq_q)]), np.concatenate([[0], np.cumsum(seq_k)])
    packed = lambda t, lens: np.concatenate([t[b, :, :lens[b]] for b in range(B)], axis=1)
    want = np.concatenate([dense[b, :, :seq_q[b]] for b in range(B)], axis=1)
    run_and_compare("k_varlen_dropout_padded_dense", packed(q, seq_q), packed(k, seq_k), packed(v, seq_k),
                    (want, None, None), 1e-5,
                    ["--cu-seqlens-q", ",".join(map(str, cu_q)), "--cu-seqlens-k", ",".join(map(str, cu_k)), *dropout])
    # Paged: every sequence has Lmax queries (the padded query rows of the dense run).
    keys = [k[b, :, :seq_k[b]] for b in range(B)]
    values = [v[b, :, :seq_k[b]] for b in range(B)]
    _, _, key_pages, value_pages, table = paged_case(rng, seq_k, 4, Hkv, E, E)
    rows = [list(map(int, r.split(","))) for r in table.split(";")]
    for b in range(B):  # paged_case drew its own keys: put these in their place
        for j in range(seq_k[b]):
            key_pages[rows[b][j // 4], :, j % 4] = keys[b][:, j]
            value_pages[rows[b][j // 4], :, j % 4] = values[b][:, j]
    run_and_compare("k_paged_dropout_padded_dense", q, key_pages, value_pages, (dense, None, None), 1e-5,
                    ["--block-table", table, "--seq-lens", ",".join(map(str, seq_k)), *dropout])


def expect_usage_error(name, args, flag, outputs):
    """`sdpa run *args` exits 2, says `flag` (or one of a tuple of flags, where more than
    one names the fault fairly) in stderr, and writes none of `outputs`."""
    for p in outputs:
        if os.path.exists(p):
            os.remove(p)
    proc = sdpa("run", *args)
    err = proc.stderr.strip()
    flags = flag if isinstance(flag, tuple) else (flag,)
    ok = (proc.returncode == 2 and err.startswith("sdpa: error: ") and any(f in err for f in flags)
          and not any(os.path.exists(p) for p in outputs))
    report(name, ok, f"exit {proc.returncode}, stderr {err.splitlines()[0] if err else ''!r}")


def check_issue7_errors(rng):
    Hq, Hkv, E = 2, 1, 4
    q, k, v = (save(f"y_{n}.npy", randn(rng, h, 6, E)) for n, h in (("q", Hq), ("k", Hkv), ("v", Hkv)))
    q4 = save("y_q4.npy", randn(rng, 2, Hq, 3, E))
    kp, vp = save("y_kp.npy", randn(rng, 4, Hkv, 2, E)), save("y_vp.npy", randn(rng, 4, Hkv, 2, E))
    out, lse = path("y_out.npy"), path("y_lse.npy")
    files = ["--query", q, "--key", k, "--value", v, "--out", out, "--lse", lse]  # packed (H, total, E)
    k4, v4 = save("y_k4.npy", randn(rng, 2, Hkv, 5, E)), save("y_v4.npy", randn(rng, 2, Hkv, 5, E))
    dense = ["--query", q4, "--key", k4, "--value", v4, "--out", out, "--lse", lse]  # valid for a plain run
    paged_files = ["--query", q4, "--key", kp, "--value", vp, "--out", out, "--lse", lse]
    varlen = ["--cu-seqlens-q", "0,2,6", "--cu-seqlens-k", "0,3,6"]
    paged = ["--block-table", "0,1;2,3", "--seq-lens", "3,4"]
    cases = [
        # Malformed integer lists.
        ("cu_seqlens_q_empty_entry", [*files, "--cu-seqlens-q", "0,,6", "--cu-seqlens-k", "0,3,6"], "--cu-seqlens-q"),
        ("cu_seqlens_q_trailing_comma", [*files, "--cu-seqlens-q", "0,2,6,", "--cu-seqlens-k", "0,3,6"],
         "--cu-seqlens-q"),
        ("cu_seqlens_k_not_a_number", [*files, "--cu-seqlens-q", "0,2,6", "--cu-seqlens-k", "0,three,6"],
         "--cu-seqlens-k"),
        ("cu_seqlens_k_float", [*files, "--cu-seqlens-q", "0,2,6", "--cu-seqlens-k", "0,3.0,6"], "--cu-seqlens-k"),
        ("cu_seqlens_k_overflow", [*files, "--cu-seqlens-q", "0,2,6", "--cu-seqlens-k", "0,99999999999999999999,6"],
         "--cu-seqlens-k"),
        ("cu_seqlens_q_empty_list", [*files, "--cu-seqlens-q", "", "--cu-seqlens-k", "0,3,6"], "--cu-seqlens-q"),
        ("block_table_ragged", [*paged_files, "--block-table", "0,1;2", "--seq-lens", "3,4"], "--block-table"),
        ("block_table_empty_row", [*paged_files, "--block-table", "0,1;;2,3", "--seq-lens", "3,4"], "--block-table"),
        ("block_table_not_a_number", [*paged_files, "--block-table", "0,1;2,x", "--seq-lens", "3,4"],
         "--block-table"),
        ("seq_lens_empty_entry", [*paged_files, "--block-table", "0,1;2,3", "--seq-lens", "3,,4"], "--seq-lens"),
        ("seq_lens_overflow", [*paged_files, "--block-table", "0,1;2,3", "--seq-lens", "3,18446744073709551616"],
         "--seq-lens"),
        # Flags that do not go together.
        ("varlen_and_paged", [*files, *varlen, *paged], "--block-table"),
        ("only_cu_seqlens_q", [*files, "--cu-seqlens-q", "0,2,6"], "--cu-seqlens-k"),
        ("only_cu_seqlens_k", [*files, "--cu-seqlens-k", "0,3,6"], "--cu-seqlens-q"),
        ("only_block_table", [*paged_files, "--block-table", "0,1;2,3"], "--seq-lens"),
        ("only_seq_lens", [*paged_files, "--seq-lens", "3,4"], "--block-table"),
        ("varlen_weights", [*files, *varlen, "--weights", path("y_w.npy")], "--weights"),
        ("varlen_mask", [*files, *varlen, "--mask", save("y_mask.npy", np.ones((6, 6), dtype=bool))], "--mask"),
        ("paged_weights", [*paged_files, *paged, "--weights", path("y_w.npy")], "--weights"),
        ("paged_mask", [*paged_files, *paged, "--mask", save("y_mask.npy", np.ones((6, 6), dtype=bool))], "--mask"),
        ("bad_alignment_value", [*dense, "--alignment", "middle"], "--alignment"),
        ("window_left_not_a_number", [*dense, "--window-left", "two"], "--window-left"),
        # The library's checks, named as flags (sdpa::Error -> exit 2).
        ("alignment_contradicts_causal", [*dense, "--causal", "top-left", "--alignment", "bottom-right"],
         ("--alignment", "--causal")),
        ("window_left_below_minus_one", [*dense, "--window-left", "-2"], "--window-left"),
        ("window_right_below_minus_one", [*dense, "--window-right", "-5"], "--window-right"),
        ("softcap_negative", [*dense, "--softcap", "-1"], "--softcap"),
        ("softcap_infinite", [*dense, "--softcap", "inf"], "--softcap"),
        ("alibi_slopes_wrong_heads", [*dense, "--alibi-slopes", save("y_slopes3.npy", np.ones(3, np.float32))],
         "--alibi-slopes"),
        ("alibi_slopes_float16", [*dense, "--alibi-slopes", save("y_slopes16.npy", np.ones(Hq, np.float16))],
         "--alibi-slopes"),
        ("sinks_wrong_heads", [*dense, "--sinks", save("y_sinks3.npy", np.ones(3, np.float32))], "--sinks"),
        ("sinks_beyond_float32", [*dense, "--sinks", save("y_sinks_big.npy", np.full(Hq, 1e39))], "--sinks"),
        ("cu_seqlens_q_not_ending_at_total", [*files, "--cu-seqlens-q", "0,2,5", "--cu-seqlens-k", "0,3,6"],
         "--cu-seqlens-q"),
        ("cu_seqlens_k_decreasing", [*files, "--cu-seqlens-q", "0,2,4,6", "--cu-seqlens-k", "0,4,3,6"],
         "--cu-seqlens-k"),
        ("block_table_page_out_of_range", [*paged_files, "--block-table", "0,1;2,9", "--seq-lens", "3,4"],
         "--block-table"),
        ("seq_lens_beyond_block_table", [*paged_files, "--block-table", "0,1;2,3", "--seq-lens", "3,5"],
         ("--seq-lens", "--block-table")),
        ("seq_lens_negative", [*paged_files, "--block-table", "0,1;2,3", "--seq-lens", "3,-1"], "--seq-lens"),
        ("seq_lens_count_not_batch", [*paged_files, "--block-table", "0,1;2,3", "--seq-lens", "3"],
         ("--seq-lens", "--block-table")),
        ("cu_seqlens_count_mismatch", [*files, "--cu-seqlens-q", "0,2,6", "--cu-seqlens-k", "0,1,3,6"],
         ("--cu-seqlens-q", "--cu-seqlens-k")),
    ]
    for name, args, flag in cases:
        expect_usage_error(f"issue7_error_{name}", args, flag, [out, lse, path("y_w.npy")])


def check_option_errors_name_the_flag(rng):
    # The library names an Options field ("options.dropout_p"); the CLI names the flag by one
    # rule ("--" and the field, '_' -> '-'), with the library's message after it. The
    # backend's values are the library's names ("automatic", not "auto").
    q, k, v = (save(f"z_{n}.npy", randn(rng, 1, 2, 4, 8)) for n in "qkv")
    out = path("z_out.npy")
    files = ["--query", q, "--key", k, "--value", v, "--out", out]
    cases = [
        ("dropout_p_one", [*files, "--dropout-p", "1"], "--dropout-p: expected a probability in [0, 1)"),
        ("scale_beyond_float32", [*files, "--scale", "1e39"], "--scale: expected a number finite in float32"),
        ("window_left_below_minus_one", [*files, "--window-left", "-3"], "--window-left: expected >= 0"),
        ("backend_auto_is_not_a_name", [*files, "--backend", "auto"], "--backend"),
    ]
    for name, args, message in cases:
        expect_usage_error(f"option_error_{name}", args, message, [out])
    q, k, v = randn(rng, 1, 2, 3, 4), randn(rng, 1, 2, 5, 4), randn(rng, 1, 2, 5, 4)
    run_and_compare("z_backend_automatic", q, k, v, attention(q, k, v), 1e-5, ["--backend", "automatic"])


def check_run_help_documents_issue7_flags():
    proc = sdpa("run", "--help")
    flags = ["--window-left", "--window-right", "--alignment", "--softcap", "--alibi-slopes", "--sinks", "--cu-seqlens-q",
             "--cu-seqlens-k", "--block-table", "--seq-lens"]
    missing = [f for f in flags if f not in proc.stdout]
    report("run_help_issue7_flags", proc.returncode == 0 and not missing, f"missing {missing}" if missing else "")


def check_check_command():
    proc = sdpa("check", "--cases", "50")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    report("check_50_cases", proc.returncode == 0, last)


def check_bench_small():
    """`sdpa bench --small` times the small problems and the batched decoding points of
    issue #15 (bench/peers.py's grid), each as its shape says: a small point in GFLOP/s, a
    decoding point with L > 1 causal (bottom-right) in GB/s, and as a fraction of the
    stream reads timed beside its runs."""
    import json

    found = {}
    for name, wanted in (("small", "L=16 S=16 "), ("decode", "L=16 S=8192 ")):
        proc = sdpa("bench", "--small", "--json", "--repeats", "1", "--filter", wanted)
        points = json.loads(proc.stdout)["points"] if proc.returncode == 0 else []
        found[name] = points[0] if len(points) == 1 else None
    small, decode = found["small"], found["decode"]
    ok = (small is not None and decode is not None
          and (small["batch"], small["heads_q"], small["L"], small["S"], small["E"], small["causal"]) ==
          (1, 12, 16, 16, 64, False) and small["gflops"] > 0 and "gbs" not in small
          and (decode["heads_q"], decode["heads_kv"], decode["L"], decode["S"], decode["causal"]) == (32, 8, 16, 8192, True)
          and decode["gbs"] > 0 and "fraction_of_stream_beside" not in small
          and 0 < decode["fraction_of_stream_beside"] < 10)
    report("bench_small_grid", ok, f"{found}")


def check_info_and_version():
    info, version = sdpa("info"), sdpa("--version")
    number = version.stdout.strip().split()[-1] if version.stdout.strip() else "?"
    ok = info.returncode == 0 and version.returncode == 0 and number in info.stdout and "version" in info.stdout
    report("info_prints_version", ok, f"--version {version.stdout.strip()!r}")


CHECKS = [
    check_gqa_bool_mask_bottom_right,
    check_float_mask,
    check_ignore_polarity,
    check_rank3_weights_lse,
    check_dropout,
    check_hostile_files,
    check_bad_arguments,
    check_sliding_window,
    check_huge_window_is_unbounded,
    check_alibi,
    check_sinks,
    check_softcap,
    check_varlen,
    check_paged,
    check_varlen_and_paged_dropout,
    check_issue7_errors,
    check_option_errors_name_the_flag,
    check_run_help_documents_issue7_flags,
    check_check_command,
    check_bench_small,
    check_info_and_version,
    check_int8_kv,
]


def run_check(check):
    """Runs one check with its own generator, so that it sees the same data alone (pytest)
    as in the full run."""
    if inspect.signature(check).parameters:
        check(np.random.default_rng(0))
    else:
        check()


def main():
    global SDPA, TMP
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PATH/TO/sdpa")
    SDPA = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="sdpa_cli_") as tmp:
        TMP = tmp
        for check in CHECKS:
            run_check(check)
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    sys.exit(1 if FAILURES else 0)


# --- under pytest -----------------------------------------------------------------------
# `python -m pytest tests/cli/test_cli.py` runs each check as its own test, against the
# binary named by $SDPA_CLI (default: build/release/sdpa, the release preset's).

DEFAULT_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "release", "sdpa")


def _pytest_case(check):
    def test(tmp_path):
        global SDPA, TMP
        SDPA = os.path.abspath(os.environ.get("SDPA_CLI", DEFAULT_BINARY))
        assert os.access(SDPA, os.X_OK), f"no sdpa binary at {SDPA}: set SDPA_CLI=PATH/TO/sdpa"
        TMP = str(tmp_path)
        FAILURES.clear()
        run_check(check)
        assert not FAILURES, f"failed: {', '.join(FAILURES)}"

    test.__name__ = test.__qualname__ = "test_" + check.__name__[len("check_"):]
    return test


for _check in CHECKS:
    globals()["test_" + _check.__name__[len("check_"):]] = _pytest_case(_check)


if __name__ == "__main__":
    main()
