"""The options object on every front: sdpa::Options bound once, the Python Options that
make_options builds from the public functions' keywords, and its flat form for the
torch.library custom ops (sdpa/_options.py) — every field round-trips, and a wrong-typed
keyword is named as the caller spelled it."""

import inspect
import math

import numpy as np
import pytest

import sdpa
from sdpa import _autograd, _core, _options

# A value other than sdpa::Options' default for every bound field (a new field must add one).
NON_DEFAULT_OPTIONS = dict(causal="bottom_right", scale=0.375, window_left=3, window_right=0, alignment="top_left",
                           softcap=2.5, dropout_p=0.25, seed=2**64 - 1, offset=2**63, backend="reference",
                           num_threads=2)


def test_every_bound_option_field_has_a_test_value():
    assert [name for name, _ in _options.FIELDS] == list(NON_DEFAULT_OPTIONS)
    defaults = _options.Options()
    assert all(getattr(defaults, name) != value for name, value in NON_DEFAULT_OPTIONS.items())


@pytest.mark.parametrize("changed", [None, *NON_DEFAULT_OPTIONS, "all"])
def test_options_flatten_and_unflatten_round_trip_every_field(changed):
    """Each field alone, and all at once, off its default: the flat form is what the custom
    ops' schema declares (int64 for the uint64 seed and offset), and unflatten (then the
    binding, to_core) gives every field back."""
    values = NON_DEFAULT_OPTIONS if changed == "all" else {} if changed is None else {
        changed: NON_DEFAULT_OPTIONS[changed]}
    options = _options.Options(**values)
    flat = _options.flatten(options)
    assert len(flat) == len(_options.FIELDS)
    for (name, kind), value in zip(_options.FIELDS, flat):
        if kind in ("int", "uint64"):
            assert isinstance(value, int) and -2**63 <= value < 2**63, (name, value)
    assert _options.unflatten(flat) == options
    core = _options.to_core(options)
    assert isinstance(core, _core.Options)
    for name, _ in _options.FIELDS:
        assert getattr(core, name) == getattr(options, name), name
    # The ops' schemas end with the same fields, in the same order.
    schema = _autograd.attention_forward._opoverload._schema
    assert [a.name for a in schema.arguments[-len(flat):]] == [name for name, _ in _options.FIELDS]


def test_unflatten_refuses_the_wrong_number_of_values():
    with pytest.raises(ValueError, match="options: expected"):
        _options.unflatten(_options.flatten(_options.Options())[:-1])


def _arrays(function):
    rng = np.random.default_rng(0)
    if function is sdpa.varlen_attention:
        x = rng.standard_normal((5, 2, 4))
        return (x, x, x, [0, 2, 5], [0, 2, 5])
    if function is sdpa.paged_attention:
        pages = rng.standard_normal((3, 2, 4, 4))
        return (rng.standard_normal((1, 2, 1, 4)), pages, pages, [[0, 1]], [5])
    x = rng.standard_normal((1, 2, 3, 4))
    return (x, x, x)


WRONG_TYPED_OPTIONS = [
    ("scale", "0.5", TypeError, "scale: expected a float or None, got str"),
    ("softcap", None, TypeError, "softcap: expected a float (0 = off), got NoneType"),
    ("window_size", 3, TypeError, "window_size: expected a pair (left, right) of ints, got 3"),
    ("window_size", (1.5, 0), TypeError, "window_size[0]: expected an int (-1 = unbounded), got float"),
    ("window_size", (0, "2"), TypeError, "window_size[1]: expected an int (-1 = unbounded), got str"),
    ("alignment", 1, ValueError, "alignment: expected None, 'top_left' or 'bottom_right', got 1"),
    ("dropout_p", "0.1", TypeError, "dropout_p: expected a float, got str"),
    ("seed", 1.5, TypeError, "seed: expected an int or None, got float"),
    ("causal", True, ValueError, "causal: expected None, 'top_left' or 'bottom_right', got True"),
    # Equal to a default but of another type: refused, not taken for the default (make_options'
    # shortcut for the default keywords compares types as well as values).
    ("window_size", (-1.0, -1), TypeError, "window_size[0]: expected an int (-1 = unbounded), got float"),
    ("dropout_p", False, TypeError, "dropout_p: expected a float, got bool"),
    ("softcap", False, TypeError, "softcap: expected a float (0 = off), got bool"),
    ("causal", "none", ValueError, "causal: expected None, 'top_left' or 'bottom_right', got 'none'"),
]


def _takes(function, keyword):
    return keyword in inspect.signature(function).parameters


@pytest.mark.parametrize("function,keyword,value,error,message", [
    (function, *case) for function in (sdpa.attention, sdpa.scaled_dot_product_attention, sdpa.varlen_attention,
                                       sdpa.paged_attention)
    for case in WRONG_TYPED_OPTIONS if _takes(function, case[0])], ids=lambda x: getattr(x, "__name__", str(x)[:20]))
def test_a_wrong_typed_option_names_the_python_argument(function, keyword, value, error, message):
    """The one builder of the options checks every public function's keywords the same way."""
    with pytest.raises(error) as raised:
        function(*_arrays(function), **{keyword: value})
    assert str(raised.value).startswith(message), str(raised.value)


def test_option_ranges_are_the_librarys_named_by_the_python_argument():
    x = np.zeros((1, 2, 3, 4))
    for keyword, value, message in (("scale", math.inf, "scale: expected a finite number"),
                                    ("dropout_p", 1.0, "dropout_p: expected a probability in [0, 1)"),
                                    ("softcap", -1.0, "softcap: expected a finite cap > 0"),
                                    ("window_size", (-2, 0), "window_size[0]: expected >= 0")):
        with pytest.raises(ValueError) as raised:
            sdpa.attention(x, x, x, **{keyword: value}, seed=0)
        assert str(raised.value).startswith(message), str(raised.value)


def test_calls_with_dropout_leave_the_options_cache_alone():
    # Each dropout call draws a new seed: its options never come again, and caching them
    # pushed out the options a model does call with again and again.
    q = np.random.default_rng(0).standard_normal((1, 1, 4, 8)).astype(np.float32)
    sdpa.attention(q, q, q)
    before = _options._cached_core.cache_info()
    for _ in range(3):
        sdpa.attention(q, q, q, dropout_p=0.5)
    after = _options._cached_core.cache_info()
    assert after.currsize == before.currsize and after.misses == before.misses
    sdpa.attention(q, q, q)
    assert _options._cached_core.cache_info().hits == after.hits + 1


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_the_default_keywords_shortcut_gives_what_the_checks_give(causal):
    """make_options returns a prebuilt Options for the default keywords, equal to the
    Options written out field by field, and to what the full checks give for the same
    values in other types (an int 0, a list window), which do not take the shortcut."""
    shortcut = _options.make_options(None, causal=causal)
    assert shortcut is _options._PLAIN[causal]
    written_out = _options.Options(causal=causal or "none", scale=None, window_left=-1, window_right=-1,
                                   alignment=None, softcap=0.0, dropout_p=0.0, seed=0)
    assert shortcut == written_out
    checked = _options.make_options(None, causal=causal, dropout_p=0, softcap=0, window_size=[-1, -1])
    assert checked is not shortcut and checked == written_out
