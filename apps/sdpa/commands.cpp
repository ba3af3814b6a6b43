// `sdpa run` and `sdpa info`. `sdpa check` lives in check.cpp.
#include "commands.h"
#ifdef SDPA_HAVE_MPI
#include "ring_run.h"
#endif

#include <algorithm>
#include <charconv>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include "io/file.h"
#include "io/npy.h"
#include "io/output_files.h"
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
  if (name == "automatic") return Backend::automatic;
  throw Error(ErrorKind::value, "--backend", "expected automatic, cpu or reference, got " + name);
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

Alignment parse_alignment(const std::string& name) {
  if (name == "top-left") return Alignment::top_left;
  if (name == "bottom-right") return Alignment::bottom_right;
  throw Error(ErrorKind::value, "--alignment", "expected top-left or bottom-right, got " + name);
}

// The tensors among the options, read from their .npy files; they outlive the call.
struct OptionTensors {
  std::optional<Tensor> mask, alibi_slopes, sinks, key_scale, value_scale;
};

Options make_options(const RunArgs& args, const OptionTensors& tensors) {
  Options options;
  if (tensors.mask) options.mask = tensors.mask->view();
  if (tensors.alibi_slopes) options.alibi_slopes = tensors.alibi_slopes->view();
  if (tensors.sinks) options.sinks = tensors.sinks->view();
  if (tensors.key_scale) options.key_scale = tensors.key_scale->view();
  if (tensors.value_scale) options.value_scale = tensors.value_scale->view();
  options.causal = parse_causal(args.causal);
  options.window_left = args.window_left;
  options.window_right = args.window_right;
  if (args.alignment) options.alignment = parse_alignment(*args.alignment);
  options.softcap = args.softcap;
  options.scale = args.scale;
  options.dropout_p = args.dropout_p;
  options.seed = args.seed;
  options.offset = args.offset;
  options.num_threads = args.num_threads;
  options.backend = parse_backend(args.backend);
  return options;
}

std::string_view trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// A command-line value, quoted for an error message as file text is (short, escaped).
std::string quote_arg(std::string_view text) { return io::quote_untrusted(text, 40); }

// The two ways of laying out K and V (packed varlen, paged) exclude each other and
// the per-position outputs and inputs they have no form for; checked before any file
// is read so that the message is about the flags.
void check_layout_flags(const RunArgs& args) {
  const bool varlen = args.cu_seqlens_q || args.cu_seqlens_k;
  const bool paged = args.block_table || args.seq_lens;
  if (varlen && paged) {
    const char* varlen_flag = args.cu_seqlens_q ? "--cu-seqlens-q" : "--cu-seqlens-k";
    const char* paged_flag = args.block_table ? "--block-table" : "--seq-lens";
    throw Error(ErrorKind::value, paged_flag,
                std::string("cannot be combined with ") + varlen_flag +
                    " (a run is either packed variable-length or paged, not both)");
  }
  if (varlen && !(args.cu_seqlens_q && args.cu_seqlens_k)) {
    throw Error(ErrorKind::value, args.cu_seqlens_q ? "--cu-seqlens-k" : "--cu-seqlens-q",
                std::string("required together with ") + (args.cu_seqlens_q ? "--cu-seqlens-q" : "--cu-seqlens-k") +
                    " (packed variable-length batches need both)");
  }
  if (paged && !(args.block_table && args.seq_lens)) {
    throw Error(ErrorKind::value, args.block_table ? "--seq-lens" : "--block-table",
                std::string("required together with ") + (args.block_table ? "--block-table" : "--seq-lens") +
                    " (a paged KV cache needs both)");
  }
  if (!varlen && !paged) return;
  const std::string mode = varlen ? "--cu-seqlens-q/--cu-seqlens-k" : "--block-table/--seq-lens";
  if (args.mask) throw Error(ErrorKind::value, "--mask", "not accepted with " + mode + " (no per-sequence mask form)");
  if (args.weights) {
    throw Error(ErrorKind::value, "--weights", "not available with " + mode + " (only the output and --lse are)");
  }
}

int report_error(const std::string& message) {
  std::cerr << "sdpa: error: " << message << '\n';
  return kExitBadInput;
}

// The flag that sets what the library calls `name`: "--" and the name with '_' → '-'.
std::string flag_of(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

// The library names the argument at fault as its C++ caller wrote it ("options.dropout_p",
// "key", "cu_seqlens_q"), and the flags of `run` are those names by one rule
// (docs/architecture.md, "How errors name an argument"): the "options." prefix goes and the
// rest is flag_of's; a file's flag comes with its path. The pages are the --key and --value
// files, and blocks_per_sequence is --block-table's row length. Errors from the .npy reader
// already name the file and pass through unchanged, as do those about what the CLI makes
// itself (the outputs).
std::string cli_message(const Error& error, const RunArgs& args) {
  const std::string& argument = error.argument();
  const std::string& detail = error.message();
  const std::string options_prefix = "options.";
  if (argument.rfind(options_prefix, 0) == 0) return flag_of(argument.substr(options_prefix.size())) + ": " + detail;
  std::string name = argument;
  if (name == "key_pages") name = "key";
  if (name == "value_pages") name = "value";
  if (name == "blocks_per_sequence") name = "block_table";
  const std::optional<std::string> file = name == "query"          ? args.query
                                          : name == "key"          ? args.key
                                          : name == "value"        ? args.value
                                          : name == "mask"         ? args.mask
                                          : name == "alibi_slopes" ? args.alibi_slopes
                                          : name == "sinks"        ? args.sinks
                                          : name == "key_scale"    ? args.key_scale
                                          : name == "value_scale"  ? args.value_scale
                                                                   : std::nullopt;
  if (file) return flag_of(name) + " " + *file + ": " + detail;
  for (const char* list : {"cu_seqlens_q", "cu_seqlens_k", "block_table", "seq_lens"})
    if (name == list) return flag_of(name) + ": " + detail;
  return error.what();
}

}  // namespace

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag) {
  if (trim(text).empty()) {
    throw Error(ErrorKind::value, flag, "expected a comma-separated list of integers, got an empty list");
  }
  std::vector<std::int64_t> values;
  std::string_view rest = text;
  for (std::size_t index = 0;; ++index) {
    const std::size_t comma = rest.find(',');
    const std::string_view entry = trim(rest.substr(0, comma));
    const std::string where = " at entry " + std::to_string(index) + " of " + quote_arg(text);
    if (entry.empty()) throw Error(ErrorKind::value, flag, "expected an integer" + where + ", got an empty entry");
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(entry.data(), entry.data() + entry.size(), value);
    if (error == std::errc::result_out_of_range) {
      throw Error(ErrorKind::value, flag,
                  "expected a 64-bit integer" + where + ", got " + quote_arg(entry) + " (out of range)");
    }
    if (error != std::errc() || end != entry.data() + entry.size()) {
      throw Error(ErrorKind::value, flag, "expected an integer" + where + ", got " + quote_arg(entry));
    }
    values.push_back(value);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return values;
}

std::pair<std::vector<std::int64_t>, std::int64_t> parse_int_table(const std::string& text, const std::string& flag) {
  if (trim(text).empty()) {
    throw Error(ErrorKind::value, flag,
                "expected rows of comma-separated integers separated by ';' (e.g. \"0,3;1,2\"), got an empty table");
  }
  std::vector<std::int64_t> entries;
  std::int64_t row_length = -1;
  std::string_view rest = text;
  for (std::size_t row = 0;; ++row) {
    const std::size_t semicolon = rest.find(';');
    const std::string row_text(rest.substr(0, semicolon));
    std::vector<std::int64_t> values;
    try {
      values = parse_int_list(row_text, flag);
    } catch (const Error& e) {
      // Say which row: "--block-table: row 1: expected an integer, ..."
      throw Error(ErrorKind::value, flag, "row " + std::to_string(row) + ": " + e.message());
    }
    if (row_length >= 0 && static_cast<std::int64_t>(values.size()) != row_length) {
      throw Error(ErrorKind::value, flag,
                  "expected every row to have " + std::to_string(row_length) + " entries (as row 0), got " +
                      std::to_string(values.size()) + " in row " + std::to_string(row));
    }
    row_length = static_cast<std::int64_t>(values.size());
    entries.insert(entries.end(), values.begin(), values.end());
    if (semicolon == std::string_view::npos) break;
    rest.remove_prefix(semicolon + 1);
  }
  return {std::move(entries), row_length};
}

int run_command(const RunArgs& args) {
#ifdef SDPA_HAVE_MPI
  std::optional<MpiSession> mpi;  // --ring: ends after the error report (ring_run.h)
#endif
  try {
    check_layout_flags(args);
    if (args.ring) {
      for (const auto& [given, flag] : {std::pair{args.mask.has_value(), "--mask"}, {args.weights.has_value(), "--weights"},
                                        {args.cu_seqlens_q.has_value(), "--cu-seqlens-q"},
                                        {args.block_table.has_value(), "--block-table"}})
        if (given) throw Error(ErrorKind::value, flag, "not accepted with --ring (each rank holds a slice of the sequence)");
#ifdef SDPA_HAVE_MPI
      OptionTensors tensors;
      if (args.alibi_slopes) tensors.alibi_slopes = io::read_npy(*args.alibi_slopes);
      if (args.sinks) tensors.sinks = io::read_npy(*args.sinks);
      if (args.key_scale) tensors.key_scale = io::read_npy(*args.key_scale);  // int8 K/V: refused by the ring
      if (args.value_scale) tensors.value_scale = io::read_npy(*args.value_scale);
      mpi.emplace();
      ring_run(args, make_options(args, tensors));
      return kExitOk;
#else
      throw Error(ErrorKind::value, "--ring", "not available: this sdpa was built without MPI (scripts/setup.sh)");
#endif
    }
    // Every output path is checked before any file is read (io/output_files.h: the same
    // file twice, a directory, a missing folder are refused before any work).
    io::OutputFiles outputs;
    outputs.add("--out", args.out);
    if (args.weights) outputs.add("--weights", *args.weights);
    if (args.lse) outputs.add("--lse", *args.lse);
    // The integer lists are parsed before any file is read: a typo costs nothing.
    std::optional<VarlenSequences> sequences;
    if (args.cu_seqlens_q) {
      sequences = VarlenSequences{parse_int_list(*args.cu_seqlens_q, "--cu-seqlens-q"),
                                  parse_int_list(*args.cu_seqlens_k, "--cu-seqlens-k")};
    }
    std::optional<PagedKV> cache;
    if (args.block_table) {
      cache.emplace();
      std::tie(cache->block_table, cache->blocks_per_sequence) = parse_int_table(*args.block_table, "--block-table");
      cache->seq_lens = parse_int_list(*args.seq_lens, "--seq-lens");
    }

    const Tensor query = io::read_npy(args.query);
    const Tensor key = io::read_npy(args.key);
    const Tensor value = io::read_npy(args.value);
    OptionTensors tensors;
    if (args.mask) {
      tensors.mask = io::read_npy(*args.mask);
      if (args.mask_polarity == "ignore") tensors.mask = to_attend_mask(*tensors.mask);
    }
    if (args.alibi_slopes) tensors.alibi_slopes = io::read_npy(*args.alibi_slopes);
    if (args.sinks) tensors.sinks = io::read_npy(*args.sinks);
    if (args.key_scale) tensors.key_scale = io::read_npy(*args.key_scale);
    if (args.value_scale) tensors.value_scale = io::read_npy(*args.value_scale);
    const Options options = make_options(args, tensors);
    // Everything is computed before the first file is written: an error leaves nothing.
    const Returns returns{args.weights.has_value(), args.lse.has_value()};
    ForwardResult result;
    if (sequences) {
      result = forward_varlen(query.view(), key.view(), value.view(), *sequences, options, returns);
    } else if (cache) {
      cache->key_pages = key.view();
      cache->value_pages = value.view();
      result = forward_paged(query.view(), *cache, options, returns);
    } else {
      result = forward(query.view(), key.view(), value.view(), options, returns);
    }

    std::vector<std::string> files{io::encode_npy(result.output, "--out")};
    if (args.weights) files.push_back(io::encode_npy(result.weights, "--weights"));
    if (args.lse) files.push_back(io::encode_npy(result.lse, "--lse"));
    outputs.write({files.begin(), files.end()});
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
