#!/usr/bin/env python3
"""Writes a seed corpus of valid and edge-case .npy files for the npy fuzzer.

Pure standard library (no NumPy), so the corpus can be made on any machine that builds
the fuzzer; binary seeds are generated rather than committed.

Usage: make_corpus.py OUTPUT_DIR
"""

import os
import struct
import sys


def npy(descr, shape, payload, fortran=False, version=1):
    """Returns the bytes of a .npy file laid out as NumPy writes it."""
    if len(shape) == 1:
        shape_text = "(%d,)" % shape[0]
    else:
        shape_text = "(" + ", ".join(str(d) for d in shape) + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    preamble = 10 if version == 1 else 12
    # NumPy pads with spaces so that the data starts at a multiple of 64 bytes.
    total = (preamble + len(header) + 1 + 63) // 64 * 64
    header = header + " " * (total - preamble - len(header) - 1) + "\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("ascii") + payload


def seeds():
    yield "f4_2x3.npy", npy("<f4", (2, 3), struct.pack("<6f", 0, 1, 2, 3, 4, 5))
    yield "f8_4.npy", npy("<f8", (4,), struct.pack("<4d", -1.5, 0.0, 1e300, float("inf")))
    yield "f2_3.npy", npy("<f2", (3,), struct.pack("<3e", 1.0, -2.5, 65504.0))
    yield "f4_big_endian.npy", npy(">f4", (2, 2), struct.pack(">4f", 1, 2, 3, 4))
    yield "f8_big_endian.npy", npy(">f8", (2,), struct.pack(">2d", 0.5, -0.25))
    yield "f2_big_endian.npy", npy(">f2", (2,), struct.pack(">2e", 0.5, -0.25))
    yield "bool_5.npy", npy("|b1", (5,), bytes([1, 0, 1, 1, 0]))
    yield "f8_fortran_2x3x2.npy", npy("<f8", (2, 3, 2), struct.pack("<12d", *range(12)), fortran=True)
    yield "f4_version2.npy", npy("<f4", (1, 2), struct.pack("<2f", 7, 8), version=2)
    yield "f4_version3.npy", npy("<f4", (2,), struct.pack("<2f", 7, 8), version=3)
    yield "f4_scalar.npy", npy("<f4", (), struct.pack("<f", 3.25))
    yield "f4_empty.npy", npy("<f4", (0,), b"")
    yield "f8_empty_middle.npy", npy("<f8", (2, 0, 3), b"")
    yield "f4_native_marker.npy", npy("=f4", (1,), struct.pack("=f", 1.0))


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: make_corpus.py OUTPUT_DIR\n")
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
