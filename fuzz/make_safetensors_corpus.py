#!/usr/bin/env python3
"""Writes a seed corpus of valid and edge-case .safetensors files for the fuzzer.

Pure standard library, laid out as huggingface/safetensors writes files: an 8-byte
little-endian header length, a JSON header padded with spaces to 8 bytes, the data.

Usage: make_safetensors_corpus.py OUTPUT_DIR
"""

import json
import os
import struct
import sys


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, payload bytes)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(p for _, _, _, p in tensors)


def seeds():
    yield "f32_2x3", safetensors([("w", "F32", [2, 3], struct.pack("<6f", *range(6)))])
    yield "mha", safetensors(
        [
            ("in_proj_weight", "F32", [6, 2], struct.pack("<12f", *range(12))),
            ("in_proj_bias", "F32", [6], struct.pack("<6f", *range(6))),
            ("out_proj.weight", "F64", [2, 2], struct.pack("<4d", 1, 2, 3, 4)),
            ("out_proj.bias", "F16", [2], struct.pack("<2e", 0.5, -1)),
        ],
        {"format": "pt"},
    )
    yield "all_dtypes", safetensors(
        [
            ("a", "BF16", [2], b"\x80\x3f\x00\x40"),
            ("b", "BOOL", [3], b"\x01\x00\x01"),
            ("c", "I64", [1], struct.pack("<q", 7)),
            ("d", "U8", [2], b"\x01\x02"),
            ("e", "F8_E4M3", [1], b"\x38"),
        ]
    )
    yield "scalar_and_empty", safetensors([("s", "F32", [], struct.pack("<f", 1)), ("e", "F64", [0, 3], b"")])
    yield "metadata_only", safetensors([], {"k": "v"})


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: make_safetensors_corpus.py OUTPUT_DIR\n")
        return 2
    os.makedirs(argv[1], exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(argv[1], name + ".safetensors"), "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
