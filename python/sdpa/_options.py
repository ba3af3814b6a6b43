"""A call's options on the Python side, in the three forms they travel in:

  * `Options`, a NamedTuple with one field per scalar field of sdpa._core.Options (that is
    sdpa::Options, bound once in python/src/options.cpp), in the binding's order and with
    its defaults. The public functions build one per call (`make_options`, below; the
    common call's short path takes its binding object from `causal_and_scale`, kept by
    causal and scale); torch.compile traces it (it cannot construct the binding's
    objects, so those are made only where the C++ library is called: `to_core`).
  * the flat scalars of the torch.library custom ops' schemas (`flatten`, `unflatten`,
    `SCHEMA`), which hold tensors and scalars only;
  * `to_core(options)`: the sdpa._core.Options every function of sdpa._core takes.

A new scalar option bound in options.cpp appears in all three with nothing to change here;
its keyword goes into `make_options` (the keywords of the public functions, below).
The tensor options (mask, alibi_slopes) travel beside the other tensors of a call.
"""

from __future__ import annotations

import atexit
import collections
import functools
import math
import numbers

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
    """The sdpa._core.Options (sdpa::Options) holding `options`. Cached: a model calls with
    the same few options thousands of times, and setting the fields one by one costs
    microseconds, as much as a small head's computation. The binding takes it by const
    reference and the object never leaves this module, so a cached one is never changed.
    Not a call with dropout: each draws a new seed, so its options never come again and
    would only push the others out. (Equal options share an entry: -0.0 and 0.0 do, which
    is harmless, as the library gives no option a meaning that depends on a zero's sign.)"""
    if options.dropout_p > 0:
        return _make_core(options)
    return _cached_core(options)


def _make_core(options: Options) -> _core.Options:
    core = _core.Options()
    for name, value in zip(_NAMES, options):
        setattr(core, name, value)
    return core


_cached_core = functools.lru_cache(maxsize=256)(_make_core)

# Emptied before the interpreter tears the extension down, which reports every object of
# its types still alive then as a leak.
atexit.register(_cached_core.cache_clear)


_CAUSAL = {None: "none", "top_left": "top_left", "bottom_right": "bottom_right"}
_UINT64_END = 1 << 64
_INT64_END = 1 << 63

# Python numbers become the C++ library's double, int64_t and uint64_t here, so that a
# value those cannot hold gets the library's kind of error naming the argument, not
# nanobind's "incompatible function arguments" or float()'s OverflowError. The ranges that
# mean something (p < 1, window >= -1, ...) stay the library's to check.


def _real(name, value, expected="a float") -> float:
    """A Python number as a float. An int beyond the float range becomes ±inf, which the
    library refuses in its own words wherever a value must be finite."""
    if type(value) is float:  # the common case, before the ABC's (slower) isinstance
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _power_of_two(n: int) -> str:
    return "0" if n == 0 else ("-" if n < 0 else "") + f"2**{abs(n).bit_length() - 1}"


def _integer(name, value, *, low=-_INT64_END, end=_INT64_END, expected="an int") -> int:
    """An int in [low, end): int64 unless told (low and end are 0 or powers of two)."""
    if type(value) is int and low <= value < end:  # the common case, before the ABC's isinstance
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    value = int(value)
    if not low <= value < end:
        shown = str(value) if value.bit_length() <= 256 else f"an int of {value.bit_length()} bits"
        raise ValueError(f"{name}: expected an integer in [{_power_of_two(low)}, {_power_of_two(end)}), got {shown}")
    return value


def _seed_value(name, seed, expected="an int") -> int:
    """A Philox seed: a uint64."""
    return _integer(name, seed, low=0, end=_UINT64_END, expected=expected)


def _dropout(dropout_p) -> float:
    return _real("dropout_p", dropout_p)  # the range is checked by the library


def _scale(scale):
    if scale is None:
        return None
    return _real("scale", scale, "a float or None")  # finiteness is checked by the library


def _seed(fw, seed, dropout_p: float) -> int:
    if seed is None:
        # p = 0 draws nothing, so inference does not advance the caller's generator.
        return fw.draw_seed() if dropout_p > 0 else 0
    return _seed_value("seed", seed, "an int or None")


def _causal(causal) -> str:
    if isinstance(causal, str) and causal in _CAUSAL:
        return _CAUSAL[causal]
    if causal is None:
        return "none"
    hint = ""
    if isinstance(causal, bool):
        # The two libraries people port from disagree on what True means.
        hint = " (torch's is_causal=True is 'top_left', FlashAttention's causal=True is 'bottom_right')"
    raise ValueError(f"causal: expected None, 'top_left' or 'bottom_right', got {causal!r}{hint}")


def _alignment(alignment):
    if alignment is None:
        return None
    if isinstance(alignment, str) and alignment in ("top_left", "bottom_right"):
        return alignment
    raise ValueError(f"alignment: expected None, 'top_left' or 'bottom_right', got {alignment!r}")


def _window(window_size) -> tuple[int, int]:
    """(left, right) as ints; -1 leaves a side unbounded (the library checks the range)."""
    if window_size is None:
        return -1, -1
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair (left, right) of ints, got {window_size!r}") from None
    # The range (>= -1) is checked by the library.
    expected = "an int (-1 = unbounded)"
    return (_integer("window_size[0]", left, expected=expected), _integer("window_size[1]", right, expected=expected))


def _softcap(softcap) -> float:
    return _real("softcap", softcap, "a float (0 = off)")  # the range (finite, >= 0) is checked by the library


def _reals(name, values) -> list[float]:
    """A list or tuple of numbers, each a float as _real makes it."""
    return [_real(f"{name}[{n}]", x) for n, x in enumerate(values)]


def make_options(fw, *, causal=None, scale=None, dropout_p=0.0, seed=None, window_size=(-1, -1),
                 alignment=None, softcap=0.0) -> Options:
    """The keywords of every public function as the one Options of the call (sdpa::Options'
    scalar fields). Each is checked for its type here, the error naming the
    keyword as the caller spelled it; the ranges are the library's to check. `seed` None
    draws one from the caller's framework (`fw`) when dropout_p > 0. The fields no public
    function takes (offset, backend, num_threads) keep sdpa::Options' defaults."""
    if (scale is None and seed is None and alignment is None and type(dropout_p) is float and dropout_p == 0.0
            and type(softcap) is float and softcap == 0.0 and type(window_size) is tuple and window_size == (-1, -1)
            and type(window_size[0]) is int and type(window_size[1]) is int and (causal is None or type(causal) is str)):
        # The common call (a model's thousands): the keywords' defaults but causal, whose
        # Options the checks below made once (_PLAIN); building them costs microseconds.
        plain = _PLAIN.get(causal)
        if plain is not None:
            return plain
    return _checked_options(fw, causal, scale, dropout_p, seed, window_size, alignment, softcap)


def _checked_options(fw, causal, scale, dropout_p, seed, window_size, alignment, softcap) -> Options:
    dropout_p = _dropout(dropout_p)
    window_left, window_right = _window(window_size)
    return Options(causal=_causal(causal), scale=_scale(scale), window_left=window_left, window_right=window_right,
                   alignment=_alignment(alignment), softcap=_softcap(softcap), dropout_p=dropout_p,
                   seed=_seed(fw, seed, dropout_p))


# make_options' result for each causal value, every other keyword at its default.
_PLAIN = {causal: _checked_options(None, causal, None, 0.0, None, (-1, -1), None, 0.0) for causal in _CAUSAL}


@functools.lru_cache(maxsize=64, typed=True)
def causal_and_scale(causal, scale) -> _core.Options:
    """to_core(make_options(None, causal=causal, scale=scale)): the options of a call that
    gives no other keyword (a model's: at most a few (causal, scale) pairs), kept by those
    two, so that such a call neither checks nor hashes the other fields (the common call's
    short path, sdpa/_attention.py). Raises as make_options does (nothing is kept then).
    typed: a bool scale, which make_options refuses, is not the float it equals."""
    return to_core(make_options(None, causal=causal, scale=scale))


atexit.register(causal_and_scale.cache_clear)  # (as _cached_core's, above)
