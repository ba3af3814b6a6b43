#!/usr/bin/env python3
"""End-to-end tests of the `sdpa` command-line tool against a NumPy float64 attention.

Usage: test_cli.py PATH/TO/sdpa

Writes .npy inputs into a temporary directory, runs `sdpa run` / `check` / `info`, and
compares with `attention()` below, the literal formula in float64. Prints one line per
check and exits non-zero if any fails. Needs only the standard library and NumPy.
"""

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


def attention(q, k, v, mask=None, causal="none", scale=None):
    """softmax(q kᵀ·scale + mask) v in float64 with PyTorch semantics (bool mask: True =
    takes part; float mask: added). Fully masked rows give output 0, weights 0, lse -inf.
    Returns (output, weights, lse)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    if group > 1:  # GQA: query head h reads KV head h // group
        k = np.repeat(k, group, axis=-3)
        v = np.repeat(v, group, axis=-3)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(E) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
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
    row_max = scores.max(axis=-1, keepdims=True)
    fully_masked = row_max == -np.inf
    safe_max = np.where(fully_masked, 0.0, row_max)
    e = np.where(fully_masked, 0.0, np.exp(scores - safe_max))
    total = e.sum(axis=-1, keepdims=True)
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
        proc = sdpa("run", "--query", files["q"], "--key", files["k"], "--value", files["v"], "--dropout", "0.3",
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
        "dropout_out_of_range": ["--query", q2, "--key", k, "--value", v, "--dropout", "1.5"],
        "negative_seed_not_wrapped": ["--query", q2, "--key", k, "--value", v, "--dropout", "0.5", "--seed", "-1"],
        "mask_not_broadcastable": ["--query", q2, "--key", k, "--value", v, "--mask",
                                   save("x_mask.npy", np.ones((3, 5, 4), dtype=bool))],
    }
    for name, args in cases.items():
        proc = sdpa("run", *args, "--out", out)
        report(f"bad_arguments_{name}", proc.returncode == 2 and proc.stderr.startswith("sdpa: error: ")
               and not os.path.exists(out),
               f"exit {proc.returncode}, stderr {proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else ''!r}")


def check_check_command():
    proc = sdpa("check", "--cases", "50")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    report("check_50_cases", proc.returncode == 0, last)


def check_info_and_version():
    info, version = sdpa("info"), sdpa("--version")
    number = version.stdout.strip().split()[-1] if version.stdout.strip() else "?"
    ok = info.returncode == 0 and version.returncode == 0 and number in info.stdout and "version" in info.stdout
    report("info_prints_version", ok, f"--version {version.stdout.strip()!r}")


def main():
    global SDPA, TMP
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PATH/TO/sdpa")
    SDPA = os.path.abspath(sys.argv[1])
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="sdpa_cli_") as tmp:
        TMP = tmp
        check_gqa_bool_mask_bottom_right(rng)
        check_float_mask(rng)
        check_ignore_polarity(rng)
        check_rank3_weights_lse(rng)
        check_dropout(rng)
        check_hostile_files(rng)
        check_bad_arguments(rng)
        check_check_command()
        check_info_and_version()
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
