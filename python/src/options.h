// sdpa::Options as sdpa._core.Options: bound once here, taken whole by every function of
// sdpa._core (module.cpp), built once in Python (sdpa/_options.py `make_options`).
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "sdpa/options.h"

namespace sdpa_python {

namespace nb = nanobind;

// Registers sdpa._core.Options: each scalar field of sdpa::Options under its C++ name, and
// `Options.fields`, the (name, type) pairs in binding order — type one of "float",
// "float?", "int", "uint64", "str", "str?" — from which sdpa/_autograd.py derives the custom
// ops' flat schemas. Enumerations are their C++ names as strings ("top_left", "automatic";
// an unset alignment is None). The tensor fields (mask, alibi_slopes) are not bound: they
// travel beside the other tensors of a call, as DLPack arrays.
void register_options(nb::module_& m);

// "none", "top_left" or "bottom_right" as sdpa::Causal; a ValueError naming `argument`
// otherwise.
sdpa::Causal causal_of(const std::string& causal, const char* argument = "causal");

}  // namespace sdpa_python
