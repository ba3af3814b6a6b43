// The sdpa command-line tool's subcommands. main.cpp parses the command line into these
// argument structs; each command returns the process exit code.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sdpa::cli {

// Exit codes: 0 success, 1 a check found a mismatch, 2 bad input (a file, a shape, a
// flag) — the same code CLI11 usage errors are mapped to in main.cpp.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;

// `sdpa run`: one attention call on .npy files.
struct RunArgs {
  std::string query, key, value;
  std::optional<std::string> mask;
  std::string mask_polarity = "attend";  // attend (PyTorch) | ignore (seed 001: true = drop)
  std::string causal = "none";           // none | top-left | bottom-right
  std::optional<double> scale;
  double dropout_p = 0.0;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  int num_threads = 0;
  std::string backend = "automatic";  // automatic | cpu | reference
  std::string out;
  std::optional<std::string> weights;
  std::optional<std::string> lse;
  // Issue #7: FlashAttention's sliding window, ALiBi and softcap (Options' fields).
  std::int64_t window_left = -1;  // -1 = unbounded
  std::int64_t window_right = -1;
  std::optional<std::string> alignment;     // top-left | bottom-right; unset: the library's default
  double softcap = 0.0;                     // 0 = off
  std::optional<std::string> alibi_slopes;  // .npy, (Hq,) or (batch..., Hq)
  std::optional<std::string> sinks;         // .npy, (Hq,) or (batch..., Hq)
  // int8 key / value .npy files take their float32 scales (Options::key_scale,
  // value_scale): the key's (value's) shape without the last dim.
  std::optional<std::string> key_scale, value_scale;
  // Packed variable-length batches (forward_varlen): the integer lists as typed,
  // "0,3,10"; parsed by run_command so that a malformed list is reported like any
  // other bad input (exit 2, the flag named, nothing written).
  std::optional<std::string> cu_seqlens_q, cu_seqlens_k;
  // Paged KV cache (forward_paged): "0,3;1,2" (rows ';', entries ',') and "5,7".
  std::optional<std::string> block_table, seq_lens;
  // Ring attention under mpirun (sdpa::distributed, ring_run.h): each rank reads and
  // writes only its rows; partition zigzag | contiguous.
  bool ring = false;
  std::string partition = "zigzag";
  std::string exchange = "auto";  // auto (ordered for float64, else ring) | ring | all-gather | ordered
};
int run_command(const RunArgs& args);

// Parses a comma-separated list of 64-bit integers ("0,3,10"; spaces around entries are
// allowed). Throws sdpa::Error naming `flag` on an empty list or entry, a non-number or
// a value outside int64.
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag);

// Parses a block table "0,3;1,2": rows separated by ';', entries by ','. Every row must
// have the same length (blocks per sequence). Returns the row-major entries and the row
// length. Throws sdpa::Error naming `flag` otherwise.
std::pair<std::vector<std::int64_t>, std::int64_t> parse_int_table(const std::string& text, const std::string& flag);

// `sdpa check`: random configurations, CPU backend against the float64 oracle.
struct CheckArgs {
  int cases = 200;
  std::uint64_t seed = 0;
  bool verbose = false;
  bool backward = false;  // also compare the gradients (dQ, dK, dV, a float mask's)
};
int check_command(const CheckArgs& args);

// `sdpa info`: what the library found on this machine.
int info_command();

// `sdpa bench`: the benchmark grid with the machine's peaks measured in the same run.
struct BenchArgs {
  bool quick = false;  // skip L = S = 8192
  bool small = false;  // the small problems and batched decoding instead (per-call cost)
  bool json = false;
  int repeats = 3;
  int threads = 0;
  std::string filter;     // run only the points whose name contains it
  bool backward = false;  // time forward + backward (training) instead of the forward
  // The work the issue #7 features skip, against the call they replace: sliding window
  // vs full attention, varlen vs the padded batch, paged vs contiguous decoding, and
  // what ALiBi and softcapping cost.
  bool features = false;
};
int bench_command(const BenchArgs& args);

// `sdpa demo`: seed 003's walkthrough on "the cat ate the rat" (embeddings, projections,
// RoPE, scores, scaling, mask, softmax, output), seed 004's pictures and scaling
// experiment written as PNG files into `out_dir`, the CPU path against the oracle.
struct DemoArgs {
  std::string out_dir = "build/demo";
  bool pictures = true;
};
int demo_command(const DemoArgs& args);

// `sdpa viz`: a heatmap of any weight matrix from a .npy file.
struct VizArgs {
  std::string weights;
  std::string out;
  std::vector<std::int64_t> index;  // leading indices picking one matrix; default all 0
  std::string title, xlabel = "Key position", ylabel = "Query position";
  std::vector<std::string> row_labels, col_labels, labels;
  double vmin = std::numeric_limits<double>::quiet_NaN();  // NaN = from the data
  double vmax = std::numeric_limits<double>::quiet_NaN();
  bool no_values = false;
};
int viz_command(const VizArgs& args);

}  // namespace sdpa::cli
