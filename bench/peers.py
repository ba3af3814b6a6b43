#!/usr/bin/env python3
"""sdpa against every CPU attention a user could pick instead (issue #15): PyTorch's
scaled_dot_product_attention, OpenVINO's CPU plugin and ONNX Runtime, in one process, on
the same inputs and the same thread count.

    .venv/bin/python bench/peers.py              # the whole grid
    .venv/bin/python bench/peers.py --quick      # the issue's points and a few others, shorter blocks
    .venv/bin/python bench/peers.py --filter decode

Each point's output is checked against the float64 oracle of the Python suite
(python/tests/oracle.py: the formula in float64, and DESIGN.md §4's tolerance: 1e-5 of the
output's scale for float32, twice the error of torch's own computation in the dtype for
bfloat16) before anything is timed; a peer that misses it is shown as "wrong", untimed.
Then every implementation is timed in blocks of calls (each block ≥ --block seconds, after a
warm-up), the blocks of the implementations taking turns, --rounds times, so that the
machine's drift hits all alike; a figure is the median over the rounds of a block's time per
call. Shown: GFLOP/s (FlashAttention's count, 4·B·Hq·L·S·E, half when causal with L = S) or,
for decoding (L ≤ 16), GB/s of K and V read; their fraction of the machine's FMA or
streaming-read probe (`sdpa bench`'s, apps/sdpa/probes.cpp, run by this script in the same
run); and each peer's time per call over sdpa's (> 1: sdpa is faster). For the small and
decoding points the time of the same call from C++ (`sdpa bench --small`) stands beside
sdpa's from Python: the difference is what the Python call adds.

How each is called, each in its fastest form for repeated calls (outputs preallocated where
the API allows, inputs bound once):

  sdpa         sdpa.attention(q, k, v, causal=..., out=out) on torch tensors (B, H, L, E).
  torch        torch.nn.functional.scaled_dot_product_attention (enable_gqa where Hq ≠ Hkv).
  OpenVINO     a one-op model, openvino.opset13.scaled_dot_product_attention, static shapes,
               compiled for "CPU" with INFERENCE_NUM_THREADS and INFERENCE_PRECISION_HINT f32
               (bf16 for the bfloat16 points: the model is float32, the plugin lowers it —
               on a CPU without bfloat16 arithmetic it stays f32, and the table says so); the
               inputs are bound once as shared-memory tensors. GQA: the fastest of three
               model forms (_openvino_models: K and V repeated in the model, a 5-D
               broadcast, or the group's queries as rows of one head).
  ORT Attn     ONNX Runtime, an opset-23 `Attention` model (4-D inputs; GQA by the head
               counts), intra-op threads = the thread count, thread spinning off, inputs and
               output bound once (IOBinding).
  ORT GQA      decoding only: ONNX Runtime's com.microsoft GroupQueryAttention with a KV cache
               (past and present sharing one buffer, as onnxruntime-genai runs it): the
               cache holds the first S − L keys and the L new keys arrive with the query.
               It is causal, bottom-right aligned, and takes B = 1 only when L > 1.

Decoding points with L > 1 are causal with the bottom-right alignment for every
implementation (the new queries see the cache and the new keys before them). The peers are
benchmark-only dependencies (bench/peers-requirements.txt), installed into this Python's
environment by the script when missing; `make test` never needs them.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "bench" / "peers-requirements.txt"


# --- the grid ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Point:
    group: str  # "issue", "small" or "decode"
    dtype: str  # "float32" or "bfloat16"
    B: int
    Hq: int
    Hkv: int
    L: int
    S: int
    E: int
    causal: bool = False  # top-left for L = S; decoding points with L > 1 are bottom-right
    quick: bool = False   # in --quick

    @property
    def decode(self) -> bool:
        return self.L <= 16 and self.S >= 4096

    @property
    def alignment(self):
        if self.decode:
            return "bottom_right" if self.L > 1 else None
        return "top_left" if self.causal else None

    def name(self) -> str:
        heads = f"H={self.Hq}" if self.Hq == self.Hkv else f"Hq={self.Hq} Hkv={self.Hkv}"
        return (f"{self.dtype} B={self.B} {heads} L={self.L} S={self.S} E={self.E}"
                f"{' causal' if self.alignment else ''}")

    def flops(self) -> float:
        return 4.0 * self.B * self.Hq * self.L * self.S * self.E * (0.5 if self.causal and self.L == self.S else 1.0)

    def kv_bytes(self) -> float:
        return 2.0 * self.B * self.Hkv * self.S * self.E * (4 if self.dtype == "float32" else 2)


def grid() -> list[Point]:
    points = [
        # The points of issue #15's table.
        Point("issue", "float32", 1, 16, 16, 2048, 2048, 64, quick=True),
        Point("issue", "float32", 1, 16, 16, 2048, 2048, 128, quick=True),
        Point("issue", "float32", 1, 16, 4, 2048, 2048, 128, causal=True, quick=True),
        Point("issue", "float32", 4, 12, 12, 512, 512, 64, quick=True),  # BERT-base
        Point("issue", "float32", 1, 32, 8, 1, 8192, 128, quick=True),
        Point("issue", "bfloat16", 1, 16, 16, 2048, 2048, 128, quick=True),
    ]
    # Small problems: a model's many small heads (BERT-sized heads, short sequences).
    for B, L, causal, quick in ((1, 16, False, False), (1, 32, False, True), (1, 64, False, False),
                                (1, 128, False, True), (1, 128, True, False), (8, 64, False, False),
                                (8, 128, False, True)):
        points.append(Point("small", "float32", B, 12, 12, L, L, 64, causal=causal, quick=quick))
    # Decoding: L new tokens against a cache of S, batched, GQA 32/8, E = 128.
    for B, L, S, quick in ((1, 1, 4096, False), (1, 1, 65536, True), (4, 1, 16384, False), (16, 1, 4096, True),
                           (1, 4, 32768, False), (1, 16, 8192, True), (4, 1, 65536, False)):
        points.append(Point("decode", "float32", B, 32, 8, L, S, 128, quick=quick))
    # bfloat16 K/V caches (and queries), the dtype most models decode in.
    for B, S, quick in ((1, 65536, True), (16, 4096, True), (1, 8192, False)):
        points.append(Point("decode", "bfloat16", B, 32, 8, 1, S, 128, quick=quick))
    return points


# --- environment ---------------------------------------------------------------------------

def ensure_peers() -> None:
    """Installs bench/peers-requirements.txt into this interpreter's environment when one of
    them is missing (idempotent: nothing is downloaded when all import)."""
    missing = [module for module in ("openvino", "onnxruntime", "onnx") if importlib.util.find_spec(module) is None]
    if not missing:
        return
    if sys.prefix == sys.base_prefix:
        sys.exit(f"peers.py: {', '.join(missing)} missing, and this Python is no virtual environment; run it with "
                 "the project's .venv/bin/python (scripts/python_env.sh makes it)")
    print(f"peers.py: installing {REQUIREMENTS.relative_to(ROOT)} into {sys.prefix}", file=sys.stderr)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                           str(REQUIREMENTS)])
    importlib.invalidate_caches()


def probes(cli: pathlib.Path, threads: int) -> dict:
    """The machine's probes (FMA, vdpbf16ps, streaming read) from `sdpa bench`, run now with
    the same thread count: a filter no point matches leaves only the probes."""
    if not cli.is_file():
        print(f"peers.py: {cli} not found (cmake --build --preset release): no fractions of peak", file=sys.stderr)
        return {}
    result = subprocess.run([str(cli), "bench", "--json", "--num-threads", str(threads), "--filter", "(probes only)"],
                            check=True, capture_output=True, text=True)
    return json.loads(result.stdout)["machine"]


def cxx_seconds(cli: pathlib.Path, threads: int, repeats: int) -> dict:
    """Seconds per call of the same small and decoding points from C++ (`sdpa bench --small`:
    no Python in the call), keyed by shape: what the Python call adds is the difference."""
    if not cli.is_file():
        return {}
    result = subprocess.run([str(cli), "bench", "--small", "--json", "--num-threads", str(threads), "--repeats",
                             str(repeats)], check=True, capture_output=True, text=True)
    return {(r["dtype"], r["batch"], r["heads_q"], r["heads_kv"], r["L"], r["S"], r["E"], r["causal"]): r["seconds"]
            for r in json.loads(result.stdout)["points"]}


def shape_key(p: Point):
    return (p.dtype, p.B, p.Hq, p.Hkv, p.L, p.S, p.E, p.alignment is not None)


def cpu_model() -> str:
    try:
        fields = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                                                   check=True).stdout.splitlines() if ":" in line)
        return (f"{fields['Model name'].strip()} (family {fields['CPU family'].strip()}, "
                f"model {fields['Model'].strip()})")
    except (OSError, subprocess.CalledProcessError, KeyError):
        return "unknown CPU"


# --- inputs and the oracle -----------------------------------------------------------------

class Inputs:
    """One point's tensors, (B, H, L, E) torch tensors in the point's dtype, and the float64
    reference output."""

    def __init__(self, p: Point):
        import torch

        gen = torch.Generator().manual_seed(0)
        dtype = getattr(torch, p.dtype)
        self.q = torch.randn(p.B, p.Hq, p.L, p.E, generator=gen).to(dtype)
        self.k = torch.randn(p.B, p.Hkv, p.S, p.E, generator=gen).to(dtype)
        self.v = torch.randn(p.B, p.Hkv, p.S, p.E, generator=gen).to(dtype)
        # The positions a query sees, for the implementations that take the causal band
        # as a mask (None: all).
        self.allowed = None
        if p.alignment is not None:
            self.allowed = oracle.allowed_positions(None, p.L, p.S, p.alignment)
        self.reference, self.naive, self.bound = self._reference(p)

    def _reference(self, p: Point):
        """The float64 output (python/tests/oracle.py's formula), and for a low-precision
        dtype torch's naive output in that dtype and the rounding bound (DESIGN.md §4), a KV
        head's group of query heads at a time (the formula holds (L, S) scores)."""
        import torch

        group = p.Hq // p.Hkv
        low = self.q.dtype != torch.float32
        outputs, naives, bound = [], [], 0.0
        for b in range(p.B):
            for h in range(p.Hkv):
                q, k, v = (t[b:b + 1, n * size:(n + 1) * size]
                           for t, n, size in ((self.q, h, group), (self.k, h, 1), (self.v, h, 1)))
                q64, k64, v64 = (oracle.to64(t) for t in (q, k, v))
                out, _, _ = oracle.extended_attention(q64, k64, v64, causal=p.alignment)
                outputs.append(out)
                if low:
                    naives.append(oracle.naive_low_precision(q, k, v, self.allowed, scale=None, enable_gqa=True)[0])
                    bound = max(bound, oracle.rounding_bound(self.q.dtype, q64, k64, v64, self.allowed, scale=None,
                                                             enable_gqa=True, reference=out))
        def whole(chunks):
            return torch.cat(chunks, dim=1).reshape(p.B, p.Hq, p.L, p.E)
        return whole(outputs), (whole(naives) if low else None), bound

    def judge(self, output):
        """(error, tolerance) of an output (B, Hq, L, E) against the reference."""
        error, tolerance, _ = oracle.judge(self.q.dtype, output, self.reference, self.naive, self.bound)
        return error, tolerance


# --- the implementations -------------------------------------------------------------------

NOT_DECODING = "decoding points only"


class Unavailable(Exception):
    """A peer that cannot run a point; the message says why (shown as n/a)."""


def sdpa_call(p: Point, x: Inputs, threads: int):
    import sdpa
    import torch

    out = torch.empty(p.B, p.Hq, p.L, p.E, dtype=x.q.dtype)
    return lambda: sdpa.attention(x.q, x.k, x.v, causal=p.alignment, out=out)


def torch_call(p: Point, x: Inputs, threads: int):
    import torch.nn.functional as F

    if p.decode and p.L > 1:  # bottom-right: torch's is_causal is top-left only
        return lambda: F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=x.allowed, enable_gqa=p.Hq != p.Hkv)
    return lambda: F.scaled_dot_product_attention(x.q, x.k, x.v, is_causal=p.causal, enable_gqa=p.Hq != p.Hkv)


def openvino_call(p: Point, x: Inputs, threads: int):
    """The fastest of the model forms below that OpenVINO compiles for this point (timed on
    a few calls), and a note when its precision hint does not hold on this CPU."""
    import openvino as ov
    import torch

    precision = "bf16" if p.dtype == "bfloat16" else "f32"
    core = ov.Core()
    arrays = [t.float().contiguous().numpy() for t in (x.q, x.k, x.v)]  # bfloat16 values held exactly
    best, note = None, None
    for form, model, shapes in _openvino_models(p, x):
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                     "INFERENCE_PRECISION_HINT": precision,
                                                     "PERFORMANCE_HINT": "LATENCY"})
        ran = str(compiled.get_property("INFERENCE_PRECISION_HINT"))  # "<Type: 'bfloat16'>" when it holds
        if precision == "bf16" and "bf16" not in ran and "bfloat16" not in ran:
            note = f"OpenVINO: the bf16 hint runs as {ran} on this CPU (no bfloat16 arithmetic)"
        request = compiled.create_infer_request()
        for name, array, shape in zip("qkv", arrays, shapes):
            request.set_tensor(name, ov.Tensor(array.reshape(shape), shared_memory=True))

        def call(request=request, arrays=arrays):  # the request reads `arrays` in place: keep them
            request.infer()
            return torch.from_numpy(request.get_output_tensor(0).data).reshape(p.B, p.Hq, p.L, p.E)

        call()
        seconds = min(per_call(call, 1) for _ in range(3))
        if best is None or seconds < best[0]:
            best = (seconds, call, form)
    if best[2] != "plain":
        note = (note + "; " if note else "") + f"OpenVINO form: {best[2]}"
    return best[1], note


def _openvino_models(p: Point, x: Inputs):
    """(form, model, input shapes) of each one-op model that computes the point. Opset 13's
    op wants K and V heads broadcastable to Q's, so GQA (Hq ≠ Hkv) has three forms:
      repeat  K and V broadcast over the group inside the model (transformers' repeat_kv);
      5-D     Q as (B, Hkv, G, L, E) against K, V as (B, Hkv, 1, S, E);
      rows    without the causal band, the group's queries as one head's rows:
              Q as (B, Hkv, G·L, E) (the decoding mask tiled over the group)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    f32 = ov.Type.f32
    G = p.Hq // p.Hkv
    mask = None if not (p.decode and p.L > 1) else x.allowed.numpy()

    def model(q_shape, kv_shape, prepare=None, mask=mask):
        q, k, v = (ops.parameter(shape, f32, name=name)
                   for name, shape in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)))
        keys, values = (prepare(k), prepare(v)) if prepare else (k, v)
        if mask is not None:
            out = ops.scaled_dot_product_attention(q, keys, values, attention_mask=ops.constant(mask))
        else:
            out = ops.scaled_dot_product_attention(q, keys, values, causal=p.causal and not p.decode)
        return ov.Model([out], [q, k, v]), (q_shape, kv_shape, kv_shape)

    kv = [p.B, p.Hkv, p.S, p.E]
    if G == 1:
        yield ("plain", *model([p.B, p.Hq, p.L, p.E], kv))
        return

    def repeat(t):
        grouped = ops.unsqueeze(t, np.array([2], np.int64))
        wide = ops.broadcast(grouped, np.array([p.B, p.Hkv, G, p.S, p.E], np.int64))
        return ops.reshape(wide, np.array([p.B, p.Hq, p.S, p.E], np.int64), special_zero=False)

    yield ("repeat", *model([p.B, p.Hq, p.L, p.E], kv, repeat))
    yield ("5-D", *model([p.B, p.Hkv, G, p.L, p.E], [p.B, p.Hkv, 1, p.S, p.E]))
    if not p.causal or p.decode:
        rows_mask = None if mask is None else np.tile(mask, (G, 1))
        yield ("rows", *model([p.B, p.Hkv, G * p.L, p.E], kv, mask=rows_mask))


def _ort_session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3  # its warnings would tear the progress line
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 — ORT raises its own exception types
        text = str(error)
        if "NOT_IMPLEMENTED" in text:  # no kernel for the dtype: the op's ONNX function body has none either
            text = "no CPU kernel for this dtype (" + text.split("NOT_IMPLEMENTED :", 1)[1].strip() + ")"
        raise Unavailable(_first_line(text)) from None


def _first_line(error) -> str:
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return text[text.find("]") + 1:].strip() if text.startswith("[") else text


def ort_attention_call(p: Point, x: Inputs, threads: int):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    import torch

    if p.dtype != "float32":
        # Built anyway, so that the reason shown is ONNX Runtime's own.
        element = TensorProto.BFLOAT16
    else:
        element = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", element, [p.B, p.Hq, p.L, p.E]),
              helper.make_tensor_value_info("k", element, [p.B, p.Hkv, p.S, p.E]),
              helper.make_tensor_value_info("v", element, [p.B, p.Hkv, p.S, p.E])]
    names, initializers = ["q", "k", "v"], []
    attributes = {"is_causal": int(p.causal and not p.decode)}
    if p.decode and p.L > 1:
        initializers.append(onnx.numpy_helper.from_array(x.allowed.numpy(), "mask"))
        names.append("mask")
    node = helper.make_node("Attention", names, ["y"], **attributes)
    graph = helper.make_graph([node], "attention", inputs,
                              [helper.make_tensor_value_info("y", element, [p.B, p.Hq, p.L, p.E])], initializers)
    session = _ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), threads)
    arrays = [t.contiguous().numpy() for t in (x.q, x.k, x.v)]
    out = np.empty((p.B, p.Hq, p.L, p.E), np.float32)
    binding = session.io_binding()
    for name, array in zip("qkv", arrays):
        binding.bind_cpu_input(name, array)
    binding.bind_output("y", "cpu", 0, np.float32, out.shape, out.ctypes.data)

    def call(keep=arrays):  # the binding reads `arrays` in place: keep them
        session.run_with_iobinding(binding)
        return torch.from_numpy(out)

    return call, None


def ort_gqa_call(p: Point, x: Inputs, threads: int):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import torch

    if not p.decode:
        raise Unavailable(NOT_DECODING)
    if p.L > 1 and p.B > 1:
        raise Unavailable("GroupQueryAttention takes B = 1 only when L > 1 with a cache")
    if p.dtype != "float32":
        raise Unavailable("float32 only here")
    info = lambda name, shape, element=TensorProto.FLOAT: helper.make_tensor_value_info(name, element, shape)
    past = [p.B, p.Hkv, p.S, p.E]  # the whole cache: the first S - L rows, then room for the new keys
    inputs = [info("q", [p.B, p.L, p.Hq * p.E]), info("k", [p.B, p.L, p.Hkv * p.E]), info("v", [p.B, p.L, p.Hkv * p.E]),
              info("past_k", past), info("past_v", past), info("seqlens_k", [p.B], TensorProto.INT32),
              info("total", [], TensorProto.INT32)]
    outputs = [info("y", [p.B, p.L, p.Hq * p.E]), info("present_k", past), info("present_v", past)]
    node = helper.make_node("GroupQueryAttention", [i.name for i in inputs], [o.name for o in outputs],
                            domain="com.microsoft", num_heads=p.Hq, kv_num_heads=p.Hkv)
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    session = _ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                                   helper.make_opsetid("com.microsoft", 1)]), threads)
    # (B, L, H·E): the layout the op takes; the new keys are the cache's last L rows.
    tokens = lambda t: t.transpose(1, 2).reshape(p.B, p.L, -1).contiguous().numpy()
    q, k_new, v_new = tokens(x.q), tokens(x.k[:, :, p.S - p.L:]), tokens(x.v[:, :, p.S - p.L:])
    cache_k = ort.OrtValue.ortvalue_from_numpy(x.k.contiguous().numpy().copy())
    cache_v = ort.OrtValue.ortvalue_from_numpy(x.v.contiguous().numpy().copy())
    out = np.empty((p.B, p.L, p.Hq * p.E), np.float32)
    binding = session.io_binding()
    bound = (("q", q), ("k", k_new), ("v", v_new), ("seqlens_k", np.full(p.B, p.S - 1, np.int32)),
             ("total", np.array(p.S, np.int32)))
    for name, array in bound:
        binding.bind_cpu_input(name, array)
    # One buffer for past and present: the op writes the new keys in place, as in decoding.
    binding.bind_ortvalue_input("past_k", cache_k)
    binding.bind_ortvalue_input("past_v", cache_v)
    binding.bind_ortvalue_output("present_k", cache_k)
    binding.bind_ortvalue_output("present_v", cache_v)
    binding.bind_output("y", "cpu", 0, np.float32, out.shape, out.ctypes.data)

    def call(keep=bound):  # the binding reads them in place: keep them
        session.run_with_iobinding(binding)
        return torch.from_numpy(out).reshape(p.B, p.L, p.Hq, p.E).transpose(1, 2)

    return call, None


IMPLEMENTATIONS = {"sdpa": sdpa_call, "torch": torch_call, "OpenVINO": openvino_call,
                   "ORT Attn": ort_attention_call, "ORT GQA": ort_gqa_call}
PEERS = [name for name in IMPLEMENTATIONS if name != "sdpa"]


# --- timing --------------------------------------------------------------------------------

def per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def time_blocks(calls: dict, rounds: int, block: float) -> dict:
    """Median seconds per call of each callable: after a warm-up, `rounds` rounds in which
    each takes its turn for one block of calls lasting about `block` seconds."""
    sizes = {}
    for name, fn in calls.items():
        warm = per_call(fn, 1)
        warm = min(warm, per_call(fn, 2))  # first calls build plans, fault pages in
        sizes[name] = max(1, math.ceil(block / max(warm, 1e-7)))
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            if sizes[name] > 1:
                fn()  # wakes this runtime's threads after another runtime's block
            times[name].append(per_call(fn, sizes[name]))
    return {name: statistics.median(t) for name, t in times.items()}


# --- main ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Cell:
    seconds: float | None = None
    error: float | None = None
    tolerance: float | None = None
    why: str | None = None  # n/a or wrong: the reason
    note: str | None = None  # how it ran (OpenVINO's model form, its precision)


def measure(p: Point, threads: int, rounds: int, block: float) -> dict:
    import torch

    x = Inputs(p)
    cells, calls = {}, {}
    with torch.no_grad():
        for name, make in IMPLEMENTATIONS.items():
            try:
                made = make(p, x, threads)
                fn, note = made if isinstance(made, tuple) else (made, None)
                output = fn()
            except Unavailable as error:
                cells[name] = Cell(why=f"n/a: {error}")
                continue
            except Exception as error:  # noqa: BLE001 — a peer's own failure is a result, shown as such
                cells[name] = Cell(why=f"n/a: {_first_line(error)}")
                continue
            error, tolerance = x.judge(output)
            cells[name] = Cell(error=error, tolerance=tolerance, note=note)
            if not error <= tolerance:
                cells[name].why = f"wrong: error {error:.2g} > tolerance {tolerance:.2g}"
                continue
            calls[name] = fn
        for name, seconds in time_blocks(calls, rounds, block).items():
            cells[name].seconds = seconds
    return cells


def rate(p: Point, seconds: float, machine: dict) -> tuple[str, float | None]:
    """("123.4 GFLOP/s", fraction of the probe) or GB/s for decoding."""
    if p.decode:
        gbs = p.kv_bytes() / seconds / 1e9
        peak = machine.get("stream_read_gbs")
        return f"{gbs:.1f} GB/s", (gbs / peak if peak else None)
    gflops = p.flops() / seconds / 1e9
    peak = machine.get("fma_peak_gflops")
    # bfloat16: the probe of the arithmetic sdpa runs it on (vdpbf16ps, or FMA where it widens).
    if p.dtype == "bfloat16" and machine.get("bfloat16_on_vdpbf16ps") and machine.get("bf16_dot_peak_gflops"):
        peak = machine["bf16_dot_peak_gflops"]
    return f"{gflops:.1f} GFLOP/s", (gflops / peak if peak else None)


def duration(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def print_tables(rows, machine, args, cxx):
    import onnxruntime
    import openvino
    import sdpa
    import torch

    names = list(IMPLEMENTATIONS)
    print(f"sdpa {sdpa.__version__} ({sdpa.runtime_info()['cpu_kernel']}), torch {torch.__version__}, "
          f"OpenVINO {openvino.__version__.split('-')[0]}, ONNX Runtime {onnxruntime.__version__}; "
          f"{args.threads} threads; {cpu_model()}")
    if machine:
        bf16 = machine["bf16_dot_peak_gflops"]
        if not bf16:
            bf16_text = "none on this CPU (bfloat16 points: % of FMA)"
        elif not machine.get("bfloat16_on_vdpbf16ps"):
            bf16_text = f"{bf16:.1f} GFLOP/s (not taken by sdpa here: bfloat16 widened, its points % of FMA)"
        else:
            bf16_text = f"{bf16:.1f} GFLOP/s"
        print(f"probes: FMA {machine['fma_peak_gflops']:.1f} GFLOP/s, vdpbf16ps {bf16_text}, "
              f"stream read {machine['stream_read_gbs']:.1f} GB/s")
    print(f"median of {args.rounds} rounds of ≥ {args.block:g} s blocks per implementation, taking turns")
    print()
    print("Rates (GFLOP/s; GB/s of K and V for decoding) and % of the probe:")
    print("| point | " + " | ".join(names) + " |")
    print("|:--|" + "--:|" * len(names))
    for p, cells in rows:
        shown = []
        for name in names:
            c = cells[name]
            if c.seconds is None:
                shown.append("—" if c.why == f"n/a: {NOT_DECODING}" else "n/a" if c.why.startswith("n/a") else "wrong")
                continue
            text, fraction = rate(p, c.seconds, machine)
            shown.append(text.split()[0] + (f" ({100 * fraction:.0f}%)" if fraction else ""))
        print(f"| {p.name()} | " + " | ".join(shown) + " |")
    print()
    print("Time per call: sdpa from Python, the same point from C++ (sdpa bench --small, no Python in the call),")
    print("and each peer's time over sdpa's from Python (> 1: sdpa is faster):")
    print("| point | sdpa | sdpa C++ | " + " | ".join(PEERS) + " |")
    print("|:--|--:|--:|" + "--:|" * len(PEERS))
    reasons = {}
    for p, cells in rows:
        ours = cells["sdpa"].seconds
        shown = [duration(ours), duration(cxx.get(shape_key(p)))]
        for name in PEERS:
            c = cells[name]
            if c.why == f"n/a: {NOT_DECODING}":
                shown.append("—")
            elif c.seconds is None:
                mark = reasons.setdefault((name, c.why), f"[{len(reasons) + 1}]")
                shown.append(f"{'n/a' if c.why.startswith('n/a') else 'wrong'} {mark}")
            else:
                shown.append(f"{c.seconds / ours:.2f}×" if ours else "—")
        print(f"| {p.name()} | " + " | ".join(shown) + " |")
    for (name, why), mark in reasons.items():
        print(f"{mark} {name}: {why}")
    for p, cells in rows:
        said = [f"{name}: {c.note}" for name, c in cells.items() if c.note]
        if said:
            print(f"{p.name()}: {'; '.join(said)}")
    worst = {}
    for _, cells in rows:
        for name, c in cells.items():
            if c.error is not None and c.tolerance:
                worst[name] = max(worst.get(name, 0.0), c.error / c.tolerance)
    print("checks against the float64 oracle, worst error / tolerance: " +
          ", ".join(f"{name} {value:.2g}" for name, value in worst.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer points, 3 rounds of shorter blocks")
    parser.add_argument("--filter", default="", help="only points whose name (or group) contains this")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every implementation")
    parser.add_argument("--rounds", type=int, default=None, help="timed blocks per implementation (default 7, quick 3)")
    parser.add_argument("--block", type=float, default=None, help="seconds per block (default 0.3, quick 0.1)")
    parser.add_argument("--cli", type=pathlib.Path, default=ROOT / "build" / "release" / "sdpa",
                        help="the sdpa CLI whose `bench` gives the probes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.block = args.block or (0.1 if args.quick else 0.3)
    # Every runtime reads its thread count at start-up: sdpa and torch from OpenMP's.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    ensure_peers()

    global oracle
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    import oracle  # noqa: E402 — the Python suite's float64 oracle and tolerance rule
    import torch

    torch.set_num_threads(args.threads)
    points = [p for p in grid() if (p.quick or not args.quick) and (args.filter in p.name() or args.filter == p.group)]
    machine = probes(args.cli, args.threads)
    if machine:  # the arithmetic of the module timed here (the CLI's build could differ)
        import sdpa

        machine["bfloat16_on_vdpbf16ps"] = sdpa.runtime_info()["bfloat16_on_vdpbf16ps"]
    cxx = {}
    if any(p.group != "issue" for p in points):
        print("peers.py: sdpa bench --small (the C++ figures)", file=sys.stderr)
        cxx = cxx_seconds(args.cli, args.threads, args.rounds)
    rows = []
    for n, p in enumerate(points):
        print(f"\r[{n}/{len(points)}] {p.name():60s}", end="", file=sys.stderr, flush=True)
        rows.append((p, measure(p, args.threads, args.rounds, args.block)))
    print(file=sys.stderr)
    if args.json:
        print(json.dumps(dict(machine=machine, cpu=cpu_model(), threads=args.threads, points=[
            dict(name=p.name(), **dataclasses.asdict(p), cxx_seconds=cxx.get(shape_key(p)),
                 cells={name: dataclasses.asdict(c) for name, c in cells.items()})
            for p, cells in rows]), indent=2))
        return
    print_tables(rows, machine, args, cxx)


if __name__ == "__main__":
    main()
