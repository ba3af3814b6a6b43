// sdpa: the command-line front end. Parses arguments with CLI11 and dispatches to the
// commands in commands.cpp; every computation goes through the public API.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "commands.h"
#include "sdpa/sdpa.h"

namespace {

// Every numeric flag goes through one of these before CLI11 converts it: CLI11 2.1
// takes an empty value ("--scale \"\"", a script's unset variable) as 0, saturates an
// unsigned value beyond 2^64 - 1, wraps a negative one, and reads integers with a
// leading 0 as octal (--seed 010 would be seed 8). The whole text must be one decimal
// number of the flag's type, within [low, high]; an integer is handed on in canonical
// form. The error names the flag (exit 2). Ranges the library defines (dropout in
// [0, 1), window >= -1) are left to its one validation point, whose errors run_command
// words with the flag's name.
template <typename T>
CLI::Validator number(T low, T high, const std::string& kind) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string got = text.empty() ? "an empty value" : "'" + text + "'";
        std::string_view digits = text;
        if (digits.size() > 1 && digits[0] == '+' && digits[1] != '-') digits.remove_prefix(1);
        T value{};
        const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (error == std::errc::result_out_of_range) return "expected " + kind + ", got " + got + " (out of range)";
        if (error != std::errc() || end != digits.data() + digits.size()) return "expected " + kind + ", got " + got;
        if constexpr (std::is_floating_point_v<T>) {
          if (!std::isfinite(value)) return "expected " + kind + ", got " + got;
        }
        if (value < low || value > high) return "expected " + kind + ", got " + got;
        if constexpr (std::is_integral_v<T>) text = std::to_string(value);
        return {};
      },
      "");
}

constexpr double kLargest = std::numeric_limits<double>::max();
constexpr std::int64_t kLargestInt64 = std::numeric_limits<std::int64_t>::max();

const CLI::Validator kFinite = number<double>(-kLargest, kLargest, "a finite number");
const CLI::Validator kUint64 =
    number<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max(), "an integer in [0, 2^64 - 1]");
const CLI::Validator kInt64 =
    number<std::int64_t>(std::numeric_limits<std::int64_t>::min(), kLargestInt64, "a 64-bit integer");
// The library's own limit, checked here too because `bench` starts its probes' threads
// before any library call.
const CLI::Validator kThreads = number<int>(
    0, sdpa::Options::kMaxThreads, "an integer in [0, " + std::to_string(sdpa::Options::kMaxThreads) + "] (0 = all)");
const CLI::Validator kCount = number<int>(0, std::numeric_limits<int>::max(), "an integer >= 0");
const CLI::Validator kRepeats = number<int>(1, 1000000, "an integer in [1, 1000000]");
const CLI::Validator kIndex = number<std::int64_t>(0, kLargestInt64, "an integer >= 0");

using sdpa::cli::BenchArgs;
using sdpa::cli::CheckArgs;
using sdpa::cli::RunArgs;

// Holds what the `run` flags parse into; the optional ones are resolved after parsing
// because CLI11 2.1 (Debian 12) has no std::optional support.
struct RunFlags {
  RunArgs args;
  std::string mask, weights, lse, alignment, alibi_slopes, sinks, key_scale, value_scale, cu_seqlens_q, cu_seqlens_k,
      block_table, seq_lens;
  double scale = 0.0;
  CLI::Option* mask_option = nullptr;
  CLI::Option* scale_option = nullptr;
  CLI::Option* weights_option = nullptr;
  CLI::Option* lse_option = nullptr;
  CLI::Option* alignment_option = nullptr;
  CLI::Option* alibi_slopes_option = nullptr;
  CLI::Option* sinks_option = nullptr;
  CLI::Option* key_scale_option = nullptr;
  CLI::Option* value_scale_option = nullptr;
  CLI::Option* cu_seqlens_q_option = nullptr;
  CLI::Option* cu_seqlens_k_option = nullptr;
  CLI::Option* block_table_option = nullptr;
  CLI::Option* seq_lens_option = nullptr;

  RunArgs resolve() const {
    RunArgs resolved = args;
    if (*mask_option) resolved.mask = mask;
    if (*scale_option) resolved.scale = scale;
    if (*weights_option) resolved.weights = weights;
    if (*lse_option) resolved.lse = lse;
    if (*alignment_option) resolved.alignment = alignment;
    if (*alibi_slopes_option) resolved.alibi_slopes = alibi_slopes;
    if (*sinks_option) resolved.sinks = sinks;
    if (*key_scale_option) resolved.key_scale = key_scale;
    if (*value_scale_option) resolved.value_scale = value_scale;
    // The integer lists stay text here: run_command parses them, so a malformed one is
    // reported like any other bad input.
    if (*cu_seqlens_q_option) resolved.cu_seqlens_q = cu_seqlens_q;
    if (*cu_seqlens_k_option) resolved.cu_seqlens_k = cu_seqlens_k;
    if (*block_table_option) resolved.block_table = block_table;
    if (*seq_lens_option) resolved.seq_lens = seq_lens;
    return resolved;
  }
};

void add_run_command(CLI::App& app, RunFlags& flags) {
  // A flag that sets a field of sdpa::Options is named after it, '_' → '-' (--dropout-p,
  // --num-threads): the library's errors name the field, and run_command names the flag by
  // that one rule (docs/architecture.md, "How errors name an argument").
  CLI::App* run = app.add_subcommand("run", "Compute attention on .npy files: softmax(Q K^T * scale + mask) V");
  RunArgs& a = flags.args;
  run->add_option("--query,-q", a.query,
                  "Query (..., Hq, L, E), float16/32/64 .npy; packed (Hq, total_q, E) with --cu-seqlens-q")
      ->required();
  run->add_option("--key,-k", a.key,
                  "Key (..., Hkv, S, E), float or int8 (with --key-scale); Hq a multiple of Hkv (GQA). "
                  "Packed (Hkv, total_k, E) with --cu-seqlens-k; pages (pages, Hkv, page_size, E) with --block-table")
      ->required();
  run->add_option("--value,-v", a.value,
                  "Value (..., Hkv, S, Ev), float or int8 (with --value-scale); packed (Hkv, total_k, Ev) or pages "
                  "(pages, Hkv, page_size, Ev) as --key")
      ->required();
  flags.mask_option =
      run->add_option("--mask,-m", flags.mask, "Mask .npy broadcastable to (..., Hq, L, S), bool or float");
  run->add_option("--mask-polarity", a.mask_polarity,
                  "attend: bool true = takes part, float added (PyTorch); ignore: true/nonzero = dropped (seed 001)")
      ->check(CLI::IsMember({"attend", "ignore"}))
      ->capture_default_str();
  run->add_option("--causal", a.causal, "Causal alignment: none, top-left (PyTorch is_causal), bottom-right (KV cache)")
      ->check(CLI::IsMember({"none", "top-left", "bottom-right"}))
      ->capture_default_str();
  flags.scale_option =
      run->add_option("--scale", flags.scale, "Multiplies Q K^T (default 1/sqrt(E))")->transform(kFinite);
  run->add_option("--window-left", a.window_left,
                  "Sliding window: query i sees keys j >= d(i) - N, d(i) its diagonal key (-1 = unbounded)")
      ->transform(kInt64)
      ->capture_default_str();
  run->add_option("--window-right", a.window_right,
                  "Sliding window: query i sees keys j <= d(i) + N (-1 = unbounded; causal caps it at 0)")
      ->transform(kInt64)
      ->capture_default_str();
  flags.alignment_option =
      run->add_option("--alignment", flags.alignment,
                      "Diagonal for the window and ALiBi: top-left d(i) = i, bottom-right d(i) = i + S - L "
                      "(default: the --causal alignment, else bottom-right)")
          ->check(CLI::IsMember({"top-left", "bottom-right"}));
  run->add_option("--softcap", a.softcap, "Logit softcapping: scores become X * tanh(scores / X) (0 = off)")
      ->transform(kFinite)
      ->capture_default_str();
  flags.alibi_slopes_option =
      run->add_option("--alibi-slopes", flags.alibi_slopes,
                      "ALiBi slopes .npy, float32/64, (Hq,) or (batch..., Hq): adds -slope[h] * |d(i) - j|");
  flags.sinks_option = run->add_option(
      "--sinks", flags.sinks,
      "Attention sinks .npy, float32/64, (Hq,) or (batch..., Hq): one logit per query head in every row's "
      "softmax denominator, with no value (gpt-oss)");
  flags.key_scale_option =
      run->add_option("--key-scale", flags.key_scale,
                      "Scales .npy of an int8 --key (sdpa.quantize_kv), float32, the key's shape without its last dim: "
                      "key = scale * q per (token, head)");
  flags.value_scale_option =
      run->add_option("--value-scale", flags.value_scale, "Scales .npy of an int8 --value, as --key-scale");
  run->add_option("--dropout-p", a.dropout_p, "Dropout probability on the weights, in [0, 1)")
      ->transform(kFinite)
      ->capture_default_str();
  run->add_option("--seed", a.seed, "Dropout seed (Philox4x32-10)")->transform(kUint64)->capture_default_str();
  run->add_option("--offset", a.offset, "Dropout counter offset")->transform(kUint64)->capture_default_str();
  run->add_option("--num-threads", a.num_threads, "CPU threads (0 = OpenMP default)")
      ->transform(kThreads)
      ->capture_default_str();
  run->add_option("--backend", a.backend, "automatic, cpu or reference (the float64 oracle)")
      ->check(CLI::IsMember({"automatic", "cpu", "reference"}))
      ->capture_default_str();
  run->add_option("--out,-o", a.out, "Output .npy (..., Hq, L, Ev), the query's dtype")->required();
  flags.weights_option =
      run->add_option("--weights", flags.weights, "Also write the attention weights (..., Hq, L, S)");
  flags.lse_option = run->add_option("--lse", flags.lse, "Also write the row log-sum-exp (..., Hq, L)");
  flags.cu_seqlens_q_option =
      run->add_option("--cu-seqlens-q", flags.cu_seqlens_q,
                      "Packed variable-length batch: query offsets, e.g. 0,3,10 (with --cu-seqlens-k; no --mask "
                      "or --weights); output (Hq, total_q, Ev)");
  flags.cu_seqlens_k_option =
      run->add_option("--cu-seqlens-k", flags.cu_seqlens_k, "Packed variable-length batch: key offsets, e.g. 0,5,12");
  flags.block_table_option =
      run->add_option("--block-table", flags.block_table,
                      "Paged KV cache: pages of each sequence, rows ';' entries ',', e.g. \"0,3;1,2\" (with "
                      "--seq-lens; no --mask or --weights)");
  flags.seq_lens_option =
      run->add_option("--seq-lens", flags.seq_lens, "Paged KV cache: keys in each sequence, e.g. 5,7");
  run->add_flag("--ring", a.ring,
                "Under mpirun: split the sequence across the ranks (ring attention); each rank reads and writes "
                "only its rows (no --mask, --weights, varlen or paged flags). float64 inputs give the "
                "single-process output file's bytes (the ordered exchange)");
  run->add_option("--partition", a.partition, "With --ring: zigzag (balanced when causal) or contiguous")
      ->check(CLI::IsMember({"zigzag", "contiguous"}))
      ->capture_default_str();
  run->add_option("--exchange", a.exchange,
                  "With --ring: ring (K/V passed around, memory O(shard)), all-gather (K/V gathered once; "
                  "GQA/MQA), ordered (K/V broadcast in key order, softmax state carried: finite float64 inputs "
                  "on the cpu backend give the single-process run's bytes) or auto (ordered for float64 "
                  "inputs on the cpu backend, else ring)")
      ->check(CLI::IsMember({"auto", "ring", "all-gather", "ordered"}))
      ->capture_default_str();
}

void add_check_command(CLI::App& app, CheckArgs& args) {
  CLI::App* check = app.add_subcommand("check", "Compare the CPU backend with the float64 oracle on random cases");
  check->add_option("--cases", args.cases, "Number of random configurations")->transform(kCount)->capture_default_str();
  check->add_option("--seed", args.seed, "Random seed (the run is deterministic given it)")
      ->transform(kUint64)
      ->capture_default_str();
  check->add_flag("--verbose", args.verbose, "Print every case");
  check->add_flag("--backward", args.backward,
                  "Also compare the gradients (dQ, dK, dV and a float mask's) of a random dO");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sdpa: exact scaled dot-product attention, softmax(Q K^T * scale + mask) V", "sdpa"};
  app.set_version_flag("--version", std::string("sdpa ") + sdpa::version());
  app.require_subcommand(1);
  // Usage errors read like every other error of the tool.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("sdpa: error: ") + e.what() + "\nRun with --help for more information.\n";
  });

  BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand("bench", "Benchmark the forward over the grid, with FMA/bf16/stream probes");
  bench->add_flag("--quick", bench_args.quick, "Skip the L = S = 8192 points");
  bench->add_flag("--small", bench_args.small,
                  "Small problems (L = S <= 128, B = 1 and 8) and batched decoding instead: where a call's fixed "
                  "cost shows");
  bench->add_flag("--json", bench_args.json, "Print the results as JSON");
  bench->add_option("--repeats", bench_args.repeats, "Timed runs per point (median)")
      ->transform(kRepeats)
      ->capture_default_str();
  bench->add_option("--num-threads", bench_args.threads, "Threads (0 = all)")
      ->transform(kThreads)
      ->capture_default_str();
  bench->add_option("--filter", bench_args.filter,
                    "Only the points whose name contains this, e.g. 'float32 Hq=16 Hkv=4'");
  bench->add_flag("--backward", bench_args.backward,
                  "Time forward + backward (training; backward counted as 2.5x the forward's FLOPs)");
  bench->add_flag("--features", bench_args.features,
                  "Time the skipped work instead: window vs full, varlen vs padded, paged vs contiguous, "
                  "ALiBi and softcap (--backward adds their training times)");

  RunFlags run_flags;
  CheckArgs check_args;
  add_run_command(app, run_flags);
  add_check_command(app, check_args);
  app.add_subcommand("info", "Print the version, CPU features, chosen kernel and thread count");
  sdpa::cli::DemoArgs demo_args;
  CLI::App* demo = app.add_subcommand(
      "demo", "Seed 003's walkthrough on \"the cat ate the rat\", step by step, and seed 004's pictures as PNG files");
  demo->add_option("--out-dir", demo_args.out_dir, "Folder for the PNG files")->capture_default_str();
  demo->add_flag("!--no-pictures", demo_args.pictures, "Print the walkthrough only");
  sdpa::cli::VizArgs viz_args;
  CLI::App* viz = app.add_subcommand("viz", "Draw a weight matrix (.npy) as a PNG heatmap with a colour scale");
  viz->add_option("--weights,-w", viz_args.weights, "Matrix (..., L, S) .npy, e.g. from sdpa run --weights")
      ->required();
  viz->add_option("--out,-o", viz_args.out, "PNG file to write")->required();
  viz->add_option("--index", viz_args.index, "Leading indices of the matrix to draw, e.g. 0,3 (default: all 0)")
      ->delimiter(',')
      ->transform(kIndex);
  viz->add_option("--title", viz_args.title, "Title (default: the file name and index)");
  viz->add_option("--xlabel", viz_args.xlabel, "x-axis label")->capture_default_str();
  viz->add_option("--ylabel", viz_args.ylabel, "y-axis label")->capture_default_str();
  viz->add_option("--labels", viz_args.labels, "Token labels for rows and columns, comma-separated")->delimiter(',');
  viz->add_option("--row-labels", viz_args.row_labels, "Row labels, comma-separated")->delimiter(',');
  viz->add_option("--col-labels", viz_args.col_labels, "Column labels, comma-separated")->delimiter(',');
  viz->add_option("--vmin", viz_args.vmin, "Bottom of the colour scale (default: from the data)")->transform(kFinite);
  viz->add_option("--vmax", viz_args.vmax, "Top of the colour scale (default: from the data)")->transform(kFinite);
  viz->add_flag("--no-values", viz_args.no_values, "Do not write the values into the cells");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; any usage error exits 2, like bad input files.
    const int code = app.exit(e);
    return code == 0 ? 0 : sdpa::cli::kExitBadInput;
  }

  if (app.got_subcommand("run")) return sdpa::cli::run_command(run_flags.resolve());
  if (app.got_subcommand("check")) return sdpa::cli::check_command(check_args);
  if (app.got_subcommand("bench")) return sdpa::cli::bench_command(bench_args);
  if (app.got_subcommand("demo")) return sdpa::cli::demo_command(demo_args);
  if (app.got_subcommand("viz")) return sdpa::cli::viz_command(viz_args);
  return sdpa::cli::info_command();
}
