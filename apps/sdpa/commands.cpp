// `sdpa run` and `sdpa info`. `sdpa check` lives in check.cpp.
#include "commands.h"

#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "io/npy.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

namespace {

Causal parse_causal(const std::string& name) {
  if (name == "top-left") return Causal::top_left;
  if (name == "bottom-right") return Causal::bottom_right;
  if (name == "none") return Causal::none;
  throw Error(ErrorKind::value, "--causal", "expected none, top-left or bottom-right, got " + name);
}

Backend parse_backend(const std::string& name) {
  if (name == "cpu") return Backend::cpu;
  if (name == "reference") return Backend::reference;
  if (name == "auto") return Backend::automatic;
  throw Error(ErrorKind::value, "--backend", "expected auto, cpu or reference, got " + name);
}

// Seed 001 marks the positions to *drop* with true/1; the library follows PyTorch
// (true = takes part, float added). Under --mask-polarity ignore the mask becomes a bool
// "attend" mask: attend = !m for bool masks, attend = (m == 0) for float masks (a
// nonzero float, NaN included, drops the position rather than being added).
Tensor to_attend_mask(const Tensor& ignore_mask) {
  Tensor attend(DType::boolean, ignore_mask.shape());
  const std::int64_t count = ignore_mask.numel();
  for (std::int64_t i = 0; i < count; ++i) attend.set(i, ignore_mask.get(i) == 0.0 ? 1.0 : 0.0);
  return attend;
}

Options make_options(const RunArgs& args, const Tensor* mask) {
  Options options;
  if (mask != nullptr) options.mask = mask->view();
  options.causal = parse_causal(args.causal);
  options.scale = args.scale;
  options.dropout_p = args.dropout;
  options.seed = args.seed;
  options.offset = args.offset;
  options.num_threads = args.threads;
  options.backend = parse_backend(args.backend);
  return options;
}

// Two outputs naming the same file would silently keep only the last one written.
void check_distinct_outputs(const RunArgs& args) {
  if (args.weights && *args.weights == args.out)
    throw Error(ErrorKind::value, "--weights", "expected a path different from --out, got " + args.out);
  if (args.lse && *args.lse == args.out)
    throw Error(ErrorKind::value, "--lse", "expected a path different from --out, got " + args.out);
  if (args.lse && args.weights && *args.lse == *args.weights)
    throw Error(ErrorKind::value, "--lse", "expected a path different from --weights, got " + *args.lse);
}

// Writes every (path, tensor) pair; if one write fails, removes the files already
// written so that a failed run leaves no output behind, then rethrows.
void write_all(const std::vector<std::pair<std::string, const Tensor*>>& files) {
  std::vector<std::string> written;
  try {
    for (const auto& [path, tensor] : files) {
      io::write_npy(path, *tensor);
      written.push_back(path);
    }
  } catch (...) {
    std::error_code ignored;
    for (const std::string& path : written) std::filesystem::remove(path, ignored);
    throw;
  }
}

int report_error(const std::string& message) {
  std::cerr << "sdpa: error: " << message << '\n';
  return kExitBadInput;
}

// The library names the C++ argument at fault ("options.dropout_p", "key"); a CLI user
// typed a flag and a file, so the message names those instead. Errors from the .npy
// reader already name the file and pass through unchanged.
std::string cli_message(const Error& error, const RunArgs& args) {
  const std::string& argument = error.argument();
  const std::string what = error.what();
  const std::string detail = what.size() > argument.size() + 2 ? what.substr(argument.size() + 2) : what;
  const auto file = [](const char* flag, const std::string& path) { return std::string(flag) + " " + path; };
  std::string label;
  if (argument == "query") label = file("--query", args.query);
  if (argument == "key") label = file("--key", args.key);
  if (argument == "value") label = file("--value", args.value);
  if (argument == "mask" && args.mask) label = file("--mask", *args.mask);
  if (argument == "options.dropout_p") label = "--dropout";
  if (argument == "options.scale") label = "--scale";
  if (argument == "options.num_threads") label = "--threads";
  return label.empty() ? what : label + ": " + detail;
}

}  // namespace

int run_command(const RunArgs& args) {
  try {
    check_distinct_outputs(args);
    const Tensor query = io::read_npy(args.query);
    const Tensor key = io::read_npy(args.key);
    const Tensor value = io::read_npy(args.value);
    std::optional<Tensor> mask;
    if (args.mask) {
      mask = io::read_npy(*args.mask);
      if (args.mask_polarity == "ignore") mask = to_attend_mask(*mask);
    }
    const Options options = make_options(args, mask ? &*mask : nullptr);
    // Everything is computed before the first file is written: an error leaves nothing.
    const ForwardResult result = forward(query.view(), key.view(), value.view(), options,
                                         Returns{args.weights.has_value(), args.lse.has_value()});

    std::vector<std::pair<std::string, const Tensor*>> files{{args.out, &result.output}};
    if (args.weights) files.emplace_back(*args.weights, &result.weights);
    if (args.lse) files.emplace_back(*args.lse, &result.lse);
    write_all(files);
    return kExitOk;
  } catch (const Error& e) {
    return report_error(cli_message(e, args));
  } catch (const std::bad_alloc&) {
    return report_error("not enough memory for these shapes");
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
}

int info_command() {
  const RuntimeInfo info = runtime_info();
  std::cout << "version:      " << info.version << '\n'
            << "cpu features: " << (info.cpu_features.empty() ? "(none detected)" : info.cpu_features) << '\n'
            << "cpu kernel:   " << info.cpu_kernel << '\n'
            << "max threads:  " << info.max_threads << '\n';
  return kExitOk;
}

}  // namespace sdpa::cli
