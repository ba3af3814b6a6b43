"""sdpa.patch_torch(): torch code that calls torch.nn.functional.scaled_dot_product_attention
runs on sdpa without being edited.

    with sdpa.patch_torch() as patch:       # for a block
        y = layer(x)                        # torch.nn.TransformerEncoderLayer, a transformers model, ...
    print(patch.counts)                     # {'sdpa': 6, 'torch': 0}

    patch = sdpa.patch_torch()              # for the whole process, until
    patch.restore()

Calls whose tensors are all plain CPU tensors of a dtype sdpa computes go to
sdpa.scaled_dot_product_attention (the same signature and semantics); every other call
(another device, a tensor subclass or a fake tensor, a keyword sdpa does not know, a call
under torch.compile's tracing, or one the library refuses) goes to torch's own function,
unchanged. Both are counted. Code that bound the function before the patch (`from
torch.nn.functional import scaled_dot_product_attention`) keeps torch's.
"""

from __future__ import annotations

import functools

# torch's signature (torch.nn.functional.scaled_dot_product_attention): six positional
# parameters, then scale and enable_gqa, keyword-only.
_POSITIONAL = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_PARAMETERS = _POSITIONAL + ("scale", "enable_gqa")


class TorchPatch:
    """One installed patch: `counts` says how many calls went where; `restore()` (or the end
    of its `with` block) puts back the function it replaced. Patches nest: each restores
    the one it found, and the latest must go first."""

    def __init__(self):
        import torch
        import torch.nn.functional as functional

        self._torch = torch
        self._functional = functional
        self._original = functional.scaled_dot_product_attention
        self.counts = {"sdpa": 0, "torch": 0}
        self._dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

        def routed(*args, **kwargs):
            return self._route(args, kwargs)

        # torch's name and docstring, so help() and error messages still read as torch's.
        self._routed = functools.update_wrapper(routed, self._original)
        functional.scaled_dot_product_attention = self._routed

    @property
    def active(self) -> bool:
        return self._functional.scaled_dot_product_attention is self._routed

    def restore(self):
        """Puts back torch's function (the one this patch replaced). Restoring twice is
        harmless; restoring while a later patch is still installed is a RuntimeError."""
        current = self._functional.scaled_dot_product_attention
        if current is self._original:
            return
        if current is not self._routed:
            raise RuntimeError("patch_torch: a later patch of torch.nn.functional.scaled_dot_product_attention is "
                               "installed; restore it first")
        self._functional.scaled_dot_product_attention = self._original

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def _arguments(self, args, kwargs):
        """The call's arguments by name, or None when they are not torch's signature."""
        if len(args) > len(_POSITIONAL) or not set(kwargs) <= set(_PARAMETERS):
            return None
        named = dict(zip(_POSITIONAL, args))
        if set(named) & set(kwargs):
            return None
        named.update(kwargs)
        return named if {"query", "key", "value"} <= set(named) else None

    def _plain_cpu_tensor(self, x, dtypes) -> bool:
        torch = self._torch
        # Exact types: a subclass (or a fake / functorch-wrapped tensor) has its own
        # dispatch, which a DLPack read would bypass.
        return (type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type == "cpu"
                and x.layout == torch.strided and not x.is_nested and x.dtype in dtypes)

    def _sdpa_takes(self, named) -> bool:
        if self._torch.compiler.is_compiling():
            return False  # traced graphs keep torch's op (and a count would count tracing)
        dtypes = self._dtypes
        if not all(self._plain_cpu_tensor(named[name], dtypes) for name in ("query", "key", "value")):
            return False
        mask = named.get("attn_mask")
        return mask is None or self._plain_cpu_tensor(mask, dtypes + (self._torch.bool,))

    def _route(self, args, kwargs):
        named = self._arguments(args, kwargs)
        if named is not None and self._sdpa_takes(named):
            from ._attention import scaled_dot_product_attention

            # With dropout, sdpa draws its seed from torch's generator before the library
            # checks the call; a refused call must leave that generator as torch alone would.
            rng_state = self._torch.get_rng_state() if named.get("dropout_p") else None
            try:
                output = scaled_dot_product_attention(**named)
            except (TypeError, ValueError, NotImplementedError):
                # The library refuses what it cannot compute before doing anything; torch
                # then computes it, or raises its own error for a call that is wrong.
                if rng_state is not None:
                    self._torch.set_rng_state(rng_state)
            else:
                self.counts["sdpa"] += 1
                return output
        self.counts["torch"] += 1
        return self._original(*args, **kwargs)


def patch_torch() -> TorchPatch:
    """Routes torch.nn.functional.scaled_dot_product_attention's CPU calls to sdpa, from now
    until the returned patch's `restore()`, or for a `with` block. Returns the patch, whose
    `counts` are {'sdpa': calls sdpa computed, 'torch': calls left to torch}.

    Differences from torch's function are sdpa's (docs/semantics.md, "Python"): dropout
    draws its mask with sdpa's generator (seeded from torch's), and a mask together with
    is_causal is accepted."""
    return TorchPatch()
