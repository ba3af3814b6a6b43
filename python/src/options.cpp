#include "options.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace sdpa_python {
namespace {

using sdpa::Options;

// An enumeration's values under their C++ names, which are the strings Python uses.
template <class E, std::size_t N>
using Names = std::array<std::pair<const char*, E>, N>;

constexpr Names<sdpa::Causal, 3> kCausal{
    {{"none", sdpa::Causal::none}, {"top_left", sdpa::Causal::top_left}, {"bottom_right", sdpa::Causal::bottom_right}}};
constexpr Names<sdpa::Alignment, 2> kAlignment{
    {{"top_left", sdpa::Alignment::top_left}, {"bottom_right", sdpa::Alignment::bottom_right}}};
constexpr Names<sdpa::Backend, 3> kBackend{
    {{"automatic", sdpa::Backend::automatic}, {"reference", sdpa::Backend::reference}, {"cpu", sdpa::Backend::cpu}}};

template <class E, std::size_t N>
E value_of(const Names<E, N>& names, const std::string& name, const char* argument, bool none_allowed) {
  for (const auto& [text, value] : names)
    if (name == text) return value;
  std::string expected = none_allowed ? "None" : "";
  for (std::size_t i = 0; i < N; ++i)
    expected += std::string(expected.empty() ? "" : i + 1 == N ? " or " : ", ") + "'" + names[i].first + "'";
  throw nb::value_error((std::string(argument) + ": expected " + expected + ", got '" + name + "'").c_str());
}

template <class E, std::size_t N>
std::string name_of(const Names<E, N>& names, E value) {
  for (const auto& [text, v] : names)
    if (v == value) return text;
  return "?";
}

// Binds the fields of sdpa::Options one line each, and lists each (name, type) in
// Options.fields as it goes, so that the binding is the one list of the scalar options.
class Fields {
 public:
  explicit Fields(nb::class_<Options>& options) : class_(options) {}

  // A number: type "float", "float?" (std::optional<double>), "int" or "uint64".
  template <class T>
  Fields& number(const char* name, T Options::*member, const char* type) {
    class_.def_rw(name, member);
    return record(name, type);
  }

  // An enumeration, as the string of its C++ name: type "str".
  template <class E, std::size_t N>
  Fields& choice(const char* name, E Options::*member, const Names<E, N>& names) {
    class_.def_prop_rw(
        name, [member, &names](const Options& o) { return name_of(names, o.*member); },
        [member, &names, name](Options& o, const std::string& value) {
          o.*member = value_of(names, value, name, /*none_allowed=*/false);
        });
    return record(name, "str");
  }

  // An optional enumeration: None when unset, type "str?".
  template <class E, std::size_t N>
  Fields& optional_choice(const char* name, std::optional<E> Options::*member, const Names<E, N>& names) {
    class_.def_prop_rw(
        name,
        [member, &names](const Options& o) -> std::optional<std::string> {
          if (!(o.*member)) return std::nullopt;
          return name_of(names, *(o.*member));
        },
        [member, &names, name](Options& o, const std::optional<std::string>& value) {
          o.*member = std::nullopt;
          if (value) o.*member = value_of(names, *value, name, /*none_allowed=*/true);
        },
        nb::arg("value").none());
    return record(name, "str?");
  }

  nb::list list() const { return list_; }

 private:
  Fields& record(const char* name, const char* type) {
    list_.append(nb::make_tuple(name, type));
    return *this;
  }

  nb::class_<Options>& class_;
  nb::list list_;
};

}  // namespace

sdpa::Causal causal_of(const std::string& causal, const char* argument) {
  return value_of(kCausal, causal, argument, /*none_allowed=*/false);
}

void register_options(nb::module_& m) {
  nb::class_<Options> options(m, "Options",
                              "sdpa::Options (include/sdpa/options.h) but its tensors; built by sdpa/_options.py (make_options, to_core).");
  options.def(nb::init<>());
  // One line per scalar field of sdpa::Options, in its order (a new option adds its line).
  Fields fields(options);
  fields.choice("causal", &Options::causal, kCausal)
      .number("scale", &Options::scale, "float?")
      .number("window_left", &Options::window_left, "int")
      .number("window_right", &Options::window_right, "int")
      .optional_choice("alignment", &Options::alignment, kAlignment)
      .number("softcap", &Options::softcap, "float")
      .number("dropout_p", &Options::dropout_p, "float")
      .number("seed", &Options::seed, "uint64")
      .number("offset", &Options::offset, "uint64")
      .choice("backend", &Options::backend, kBackend)
      .number("num_threads", &Options::num_threads, "int");
  options.attr("fields") = nb::tuple(fields.list());
  options.def("__repr__", [](nb::handle self) {
    std::string text = "Options(";
    const nb::tuple list = nb::borrow<nb::tuple>(self.type().attr("fields"));
    for (std::size_t i = 0; i < list.size(); ++i) {
      const nb::str name = nb::borrow<nb::str>(list[i][0]);
      text += std::string(i ? ", " : "") + name.c_str() + "=" + nb::repr(self.attr(name)).c_str();
    }
    return text + ")";
  });
}

}  // namespace sdpa_python
