#!/usr/bin/env python3
"""End-to-end tests of the picture commands: `sdpa demo` (exit 0 means its float64
walkthrough, the CPU path and the KV-cache decode all agreed) writes its four PNG files,
and `sdpa viz` draws a .npy matrix, with its errors reported as usage errors (exit 2).

Usage: test_pictures.py PATH/TO/sdpa
Needs the standard library and NumPy (to write the .npy input).
"""

import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature and CRC."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path + ": not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, path + ": no IHDR first"
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert crc == zlib.crc32(data[12 : 16 + length]), path + ": bad IHDR CRC"
    return struct.unpack(">II", data[16:24])


def run(sdpa, *args):
    return subprocess.run([sdpa, *args], capture_output=True, text=True, timeout=300)


def main(argv):
    sdpa = argv[1]
    failures = []

    def check(name, ok, detail=""):
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
        if not ok:
            failures.append(name)

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "demo")
        r = run(sdpa, "demo", "--out-dir", out_dir)
        check("demo exits 0 (all its agreement checks hold)", r.returncode == 0, r.stdout[-2000:] + r.stderr)
        for step in ["Step 0.", "Step 3. Rotary", "Step 6. Causal mask", "Step 8. Output", "CPU vs float64 oracle"]:
            check("demo prints " + step, step in r.stdout)
        for name in ["heatmap_no_mask.png", "heatmap_causal.png", "attention_heatmaps.png", "scaling_softmax.png"]:
            path = os.path.join(out_dir, name)
            ok = os.path.exists(path)
            check("demo writes " + name, ok)
            if ok:
                w, h = png_size(path)
                check(name + " has a plausible size", 300 <= w <= 3000 and 200 <= h <= 2000, "%dx%d" % (w, h))

        weights = np.random.default_rng(0).random((2, 3, 5, 7))
        npy = os.path.join(tmp, "w.npy")
        np.save(npy, weights)
        png = os.path.join(tmp, "heat.png")
        r = run(sdpa, "viz", "--weights", npy, "-o", png, "--index", "1,2", "--col-labels", "a,b,c,d,e,f,g")
        check("viz exits 0", r.returncode == 0, r.stderr)
        check("viz writes a PNG", os.path.exists(png) and png_size(png)[0] > 100)
        for args, needle in [
            (["--index", "2,0"], "--index"),
            (["--index", "0"], "--index"),
            (["--labels", "a,b"], "labels"),
            (["--vmin", "1", "--vmax", "0"], "--vmax"),
        ]:
            r = run(sdpa, "viz", "--weights", npy, "-o", png, *args)
            check("viz rejects " + " ".join(args), r.returncode == 2 and needle in r.stderr, r.stderr)
        r = run(sdpa, "viz", "--weights", os.path.join(tmp, "missing.npy"), "-o", png)
        check("viz names a missing file", r.returncode == 2 and "missing.npy" in r.stderr, r.stderr)

    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
