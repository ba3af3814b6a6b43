"""The caller's framework: inputs checked and outputs allocated as torch tensors or NumPy
arrays, so that the C++ library reads and writes the caller's memory in place (DLPack) and
nothing is copied. The public functions (sdpa/_attention.py, _sequences.py, _quantize.py)
and the layers (sdpa/nn.py) take the query's framework for the whole call."""

from __future__ import annotations

import functools
import sys

import numpy as np

from . import _core


def _torch_module():
    # torch is optional: it is only touched when the caller passes torch tensors, and then it
    # is already imported.
    return sys.modules.get("torch")


def _is_torch_tensor(x) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


class _Torch:
    """Inputs and outputs as torch tensors (CPU, strided layout)."""

    def __init__(self):
        # Made on the first torch call (_framework keeps it; it holds no state of a call):
        # torch is imported by then (the caller's tensors are torch's), and so is
        # torch.utils.dlpack (torch.from_dlpack comes from it).
        self.torch = _torch_module()
        self._to_dlpack = self.torch.utils.dlpack.to_dlpack
        self._cpu = self.torch.device("cpu")  # (torch.empty parses a device string each call)

    @functools.cached_property
    def in_place(self) -> bool:
        """Whether the binding reads a plain torch.Tensor itself: where torch offers DLPack
        1.3's C exchange API (torch 2.15 does), no capsule to make (export, below). Asked
        on the first untraced call that needs it, not when the framework is made: a
        process's first sdpa call may come inside torch.compile, whose trace cannot enter
        the binding (fullgraph=True failed on it)."""
        return _core.reads_in_place(self.torch.empty(0))

    def compiling(self) -> bool:
        """Whether torch.compile traces this call. Asked once for a call's checks: it is
        the costliest of them (about 0.3 µs, four times a tensor's attribute read)."""
        return self.torch.compiler.is_compiling()

    def prepare(self, name, x, output=False, compiling=None):
        """x as the library can read it (`output`: write it) in place, or the error that says
        why not. The one place where a torch argument's kind of tensor is checked.
        `compiling`: self.compiling() when the caller has asked it already."""
        torch = self.torch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like the query, got {type(x).__module__}.{type(x).__name__}")
        # A nested tensor reports layout torch.strided (unless it is jagged) but has no sizes.
        if x.is_nested:
            raise TypeError(f"{name}: expected a strided (dense) tensor, got a nested tensor")
        if x.layout != torch.strided:
            raise TypeError(f"{name}: expected a strided (dense) tensor, got layout {x.layout}")
        if x.is_quantized:  # DLPack has no quantized types
            raise TypeError(f"{name}: expected a tensor of plain numbers, got the quantized dtype {x.dtype}")
        if not x.is_cpu:  # (is_cpu: a fraction of device.type's time, for every tensor of every call)
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device} (sdpa has no GPU backend yet)")
        # A tensor that requires grad stays attached: _run sends it through the autograd op
        # (sdpa/_autograd.py), or detaches it (a view, no copy) when no gradient is wanted.
        # (Under torch.compile the custom op resolves the bits below, and the checks would
        # break the graph.)
        if self.compiling() if compiling is None else compiling:
            return x
        # A lazily negated view (torch._neg_view, z.conj().imag) holds -x in memory, and
        # DLPack exports that memory as it is. An input is resolved (a negated copy, read
        # once); an output cannot be: the library would write the copy, which the caller
        # never sees (or, unresolved, the memory, which the caller reads negated).
        if output and (x.is_neg() or x.is_conj()):
            bit = "negative bit (torch._neg_view, z.conj().imag)" if x.is_neg() else "conjugate bit (z.conj())"
            raise TypeError(f"{name}: expected a tensor whose memory holds its values, got a view with torch's lazy "
                            f"{bit}, which the library cannot write in place")
        if x.is_neg():
            x = x.resolve_neg()
        return x

    def empty(self, shape, dtype):
        return self.torch.empty(tuple(shape), dtype=dtype, device=self._cpu)

    def output_like(self, query, value, dropout_p):
        return output_like(self.torch, query, value, dropout_p)

    def packed_like(self, query, value):
        """A packed output of the query's shape but for its last dim, the value's (Ev), in the
        query's dtype: what varlen and paged calls return. torch.empty_like where Ev = E (half
        torch.empty's cost with a shape built from slices), told the packed order: it would
        copy the strides of a dense query, a size-1 dim's odd one included."""
        value_dim = last_dim(value)
        if value_dim == query.shape[-1]:
            return self.torch.empty_like(query, memory_format=self.torch.contiguous_format)
        return query.new_empty(tuple(query.shape[:-1]) + (value_dim,))

    def export(self, x):
        """x (prepared) as the binding takes it outside autograd: a plain tensor as it is,
        which the binding reads through torch's DLPack C exchange API (python/src/
        tensor_argument.h), or, with an older torch, as a DLPack capsule from torch's C
        exporter — Tensor.__dlpack__, which the binding would call, spends ~4 µs a tensor
        in Python on checks `prepare` has made (layout, device, the lazy bits) or that do
        not apply (requires_grad: no gradient is wanted here), as much as a small problem's
        whole computation (docs/performance.md, "Small problems"). A subclass keeps its own
        __dlpack__, detached."""
        if x is None:
            return None
        if type(x) is self.torch.Tensor:
            return x if self.in_place else self._to_dlpack(x)
        return x.detach()

    def lse_dtype(self, query):
        return self.torch.float64 if query.dtype == self.torch.float64 else self.torch.float32

    def broadcast_to(self, x, shape):
        return x.expand(*shape)

    def unsqueeze(self, x):
        return x.unsqueeze(0)

    def swap(self, x, a, b):
        return x.transpose(a, b)  # a view: (total, H, E) as (H, total, E)

    def draw_seed(self) -> int:
        # From torch's default CPU generator, so torch.manual_seed makes dropout reproducible.
        return int(self.torch.randint(0, (1 << 63) - 1, (), dtype=self.torch.int64))


class _NumPy:
    """Inputs and outputs as NumPy arrays (anything np.asarray accepts comes in)."""

    def compiling(self) -> bool:
        return False

    def prepare(self, name, x, output=False, compiling=None):
        """x as an array the library can read (`output`: write) in place, or the error that
        says why not. The one place where a NumPy argument's kind of array is checked."""
        if _is_torch_tensor(x):
            raise TypeError(f"{name}: expected a NumPy array like the query, got a torch.Tensor")
        if output and not isinstance(x, np.ndarray):
            # np.asarray would make a new array: the result would go there, not to the caller.
            kind = f"{type(x).__module__}.{type(x).__name__}"
            raise TypeError(f"{name}: expected a NumPy array like the query, got {kind}")
        a = np.asarray(x)  # an ndarray passes through untouched
        # DLPack (and so the binding) has no extended precision (np.longdouble, float128).
        extended = a.dtype.itemsize > {"f": 8, "c": 16}.get(a.dtype.kind, a.dtype.itemsize)
        if a.dtype.kind not in "biufc" or not a.dtype.isnative or extended:
            raise TypeError(f"{name}: expected float16, float32 or float64 (bool for a mask), got {a.dtype}")
        # DLPack strides count elements; a field of a structured array steps over the other
        # fields, by a byte count that is no multiple of its own size. (Dims of size 1 have
        # no step to express, as NumPy's own DLPack export rules.)
        if a.size > 1 and any(n > 1 and s % a.itemsize for n, s in zip(a.shape, a.strides)):
            raise ValueError(f"{name}: expected strides that are whole elements of {a.itemsize} bytes, got byte "
                             f"strides {a.strides} (a field of a structured array?)")
        if output and not a.flags.writeable:
            raise ValueError(f"{name}: expected a writable array, got a read-only one")
        return a

    def empty(self, shape, dtype):
        return np.empty(tuple(shape), dtype=dtype)

    def output_like(self, query, value, dropout_p):
        return self.packed_like(query, value)

    def packed_like(self, query, value):
        return np.empty(tuple(query.shape[:-1]) + (last_dim(value),), dtype=query.dtype)

    def export(self, x):
        return x  # NumPy's __dlpack__ is C

    def lse_dtype(self, query):
        return np.float64 if query.dtype == np.float64 else np.float32

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, tuple(shape))

    def unsqueeze(self, x):
        return x[np.newaxis]

    def swap(self, x, a, b):
        return np.swapaxes(x, a, b)  # a view: (total, H, E) as (H, total, E)

    def draw_seed(self) -> int:
        # From NumPy's global generator, so np.random.seed makes dropout reproducible.
        return int(np.random.randint(0, (1 << 63) - 1, dtype=np.int64))


def last_dim(value):
    """Ev, the value's last dim: 0 for a value of rank 0, which the library then refuses
    by name (its shape[-1] would raise IndexError first, naming nothing)."""
    return value.shape[-1] if value.ndim else 0


def output_like(torch, query, value, dropout_p):
    """The output buffer (..., Hq, L, Ev) of a torch call, laid out as PyTorch's CPU
    scaled_dot_product_attention lays out its own: where its fused kernel runs (rank 4, the
    last dim innermost, Ev = E, no dropout) in the query's memory order
    (torch.empty_like), so that the output of a (B, L, H, E) projection viewed as (B, H, L,
    E) has a contiguous .transpose(1, 2) — a model's .view(B, L, H * E) works as with
    torch, and nothing is copied — and elsewhere packed, as torch's math path leaves it."""
    value_dim = last_dim(value)
    if query.dim() == 4 and query.shape[-1] == value_dim and query.stride(-1) == 1 and dropout_p == 0:
        return torch.empty_like(query)
    return query.new_empty(tuple(query.shape[:-1]) + (value_dim,))  # its dtype and device


def _framework(query):
    global _TORCH
    if not _is_torch_tensor(query):
        return _NumPy()
    if _TORCH is None:
        _TORCH = _Torch()
    return _TORCH


_TORCH = None


def torch_in_place(query):
    """The torch framework where a short path can take the call (sdpa/_attention.py,
    sdpa/_sequences.py): torch there, not traced by torch.compile (asked before any tensor
    attribute, whose bool would break the traced graph), and its tensors read in place by
    the binding (torch's DLPack C exchange API); else None."""
    fw = _TORCH if _TORCH is not None else _framework(query)  # (made by the first torch call)
    if not isinstance(fw, _Torch) or fw.torch.compiler.is_compiling():
        return None
    return fw if fw.in_place else None
