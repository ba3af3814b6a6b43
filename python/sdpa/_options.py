"""A call's options on the Python side, in the three forms they travel in:

  * `Options`, a NamedTuple with one field per scalar field of sdpa._core.Options (that is
    sdpa::Options, bound once in python/src/options.cpp), in the binding's order and with
    its defaults. sdpa/_api.py builds one per call (`_api._make_options`); torch.compile traces it
    (it cannot construct the binding's objects, so those are made only where the C++ library
    is called: `to_core`).
  * the flat scalars of the torch.library custom ops' schemas (`flatten`, `unflatten`,
    `SCHEMA`), which hold tensors and scalars only;
  * `to_core(options)`: the sdpa._core.Options every function of sdpa._core takes.

A new scalar option bound in options.cpp appears in all three with nothing to change here.
The tensor options (mask, alibi_slopes) travel beside the other tensors of a call.
"""

from __future__ import annotations

import collections

from . import _core

# (name, type) of each bound field; a type is the schema's ("float", "float?", "int", "str",
# "str?"), but "uint64", which a schema's int (int64) carries as two's complement.
FIELDS = tuple((name, kind) for name, kind in _core.Options.fields)
_NAMES = tuple(name for name, _ in FIELDS)
_UNSIGNED = frozenset(name for name, kind in FIELDS if kind == "uint64")
_DEFAULTS = _core.Options()

Options = collections.namedtuple("Options", _NAMES, defaults=[getattr(_DEFAULTS, name) for name in _NAMES])

# The options' part of a custom op's schema: "str causal, float? scale, ...".
SCHEMA = ", ".join(f"{'int' if kind == 'uint64' else kind} {name}" for name, kind in FIELDS)

_TWO_64 = 1 << 64


def flatten(options: Options) -> tuple:
    """The options as a custom op's trailing arguments (SCHEMA)."""
    return tuple(value - _TWO_64 if name in _UNSIGNED and value >= 1 << 63 else value
                 for name, value in zip(_NAMES, options))


def unflatten(values) -> Options:
    """The Options that `flatten` made `values` from."""
    values = tuple(values)
    if len(values) != len(_NAMES):
        raise ValueError(f"options: expected {len(_NAMES)} values ({SCHEMA}), got {len(values)}")
    return Options(*(value + _TWO_64 if name in _UNSIGNED and value < 0 else value
                     for name, value in zip(_NAMES, values)))


def to_core(options: Options) -> _core.Options:
    """The sdpa._core.Options (sdpa::Options) holding `options`."""
    core = _core.Options()
    for name, value in zip(_NAMES, options):
        setattr(core, name, value)
    return core
