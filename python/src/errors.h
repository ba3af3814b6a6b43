// How an sdpa::Error reaches Python, for both halves of sdpa._core (module.cpp,
// nn_module.cpp): as TypeError (ErrorKind::type) or ValueError, its message the library's
// "<argument>: expected ..., got ..." with the argument under its Python name.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <utility>
#include <vector>

#include "sdpa/error.h"

namespace sdpa_python {

namespace nb = nanobind;

// The library names an argument as its C++ caller wrote it: a parameter by its name
// (query, cu_seqlens_q), a scalar field of a struct by "<struct>.<field>" (options.scale,
// config.softcap, call.num_threads). Python's keywords are those names, so the one rule is
// that the struct prefix goes (docs/architecture.md, "How errors name an argument"). The
// exceptions are the arguments Python spells differently: window_size's two entries for the
// window's two sides, block_table for the blocks_per_sequence the binding derives from it,
// and `renames` for one call (mask → attn_mask, output → out).
using Renames = std::vector<std::pair<std::string, std::string>>;

inline std::string python_name(const std::string& argument, const Renames& renames) {
  std::string name = argument;
  for (const std::string prefix : {"options.", "config.", "call."}) {
    if (name.rfind(prefix, 0) == 0) {
      name = name.substr(prefix.size());
      break;
    }
  }
  for (const auto& [from, to] : renames)
    if (name == from) return to;
  if (name == "window_left") return "window_size[0]";
  if (name == "window_right") return "window_size[1]";
  if (name == "blocks_per_sequence") return "block_table";
  return name;
}

inline std::string python_message(const sdpa::Error& error, const Renames& renames) {
  const std::string& argument = error.argument();
  const std::string renamed = python_name(argument, renames);
  return renamed == argument ? error.what() : renamed + ": " + error.message();
}

[[noreturn]] inline void raise(const sdpa::Error& error, const Renames& renames) {
  const std::string message = python_message(error, renames);
  if (error.kind() == sdpa::ErrorKind::type) throw nb::type_error(message.c_str());
  throw nb::value_error(message.c_str());
}

}  // namespace sdpa_python
