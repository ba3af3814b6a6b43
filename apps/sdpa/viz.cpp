// `sdpa viz`: draws one matrix of a .npy file (the attention weights `sdpa run
// --weights` writes, or any other) as a heatmap PNG with a colour scale.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <new>

#include "commands.h"
#include "io/npy.h"
#include "io/output_files.h"
#include "plot.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

int viz_command(const VizArgs& args) {
  auto error = [](const std::string& message) {
    std::cerr << "sdpa: error: " << message << '\n';
    return kExitBadInput;
  };
  try {
    io::OutputFiles output;  // checked before the input is read
    output.add("--out", args.out);
    const Tensor t = io::read_npy(args.weights);
    const auto& shape = t.shape();
    if (shape.size() < 2 && !(shape.size() == 1 && shape[0] > 0)) {
      return error("--weights " + args.weights + ": expected a matrix (..., rows, cols), got rank " +
                   std::to_string(shape.size()));
    }
    // A vector is drawn as one row.
    const std::size_t rank = shape.size();
    const std::int64_t rows = rank == 1 ? 1 : shape[rank - 2], cols = shape[rank - 1];
    const std::size_t leading = rank >= 2 ? rank - 2 : 0;
    std::vector<std::int64_t> index = args.index;
    if (index.empty()) index.assign(leading, 0);
    if (index.size() != leading) {
      return error("--index: expected " + std::to_string(leading) + " leading indices for shape of rank " +
                   std::to_string(rank) + ", got " + std::to_string(index.size()));
    }
    std::int64_t offset = 0, step = rows * cols;
    for (std::size_t d = leading; d-- > 0;) {
      if (index[d] < 0 || index[d] >= shape[d]) {
        return error("--index: expected index " + std::to_string(d) + " in [0, " + std::to_string(shape[d]) +
                     "), got " + std::to_string(index[d]));
      }
      offset += index[d] * step;
      step *= shape[d];
    }
    if (rows == 0 || cols == 0) return error("--weights " + args.weights + ": expected a non-empty matrix");

    plot::Matrix m{rows, cols, {}};
    m.values.resize(static_cast<std::size_t>(rows * cols));
    for (std::int64_t i = 0; i < rows * cols; ++i) m.values[static_cast<std::size_t>(i)] = t.get(offset + i);

    plot::HeatmapSpec spec;
    spec.title = args.title;
    if (spec.title.empty()) {
      spec.title = std::filesystem::path(args.weights).filename().string();
      if (!index.empty()) {
        spec.title += " [";
        for (std::size_t d = 0; d < index.size(); ++d) spec.title += (d ? "," : "") + std::to_string(index[d]);
        spec.title += "]";
      }
    }
    spec.xlabel = args.xlabel;
    spec.ylabel = args.ylabel;
    spec.row_labels = !args.row_labels.empty() ? args.row_labels : args.labels;
    spec.col_labels = !args.col_labels.empty() ? args.col_labels : args.labels;
    if (!spec.row_labels.empty() && spec.row_labels.size() != static_cast<std::size_t>(rows)) {
      return error("--row-labels/--labels: expected " + std::to_string(rows) + " labels, got " +
                   std::to_string(spec.row_labels.size()));
    }
    if (!spec.col_labels.empty() && spec.col_labels.size() != static_cast<std::size_t>(cols)) {
      return error("--col-labels/--labels: expected " + std::to_string(cols) + " labels, got " +
                   std::to_string(spec.col_labels.size()));
    }
    if (!std::isnan(args.vmin)) spec.vmin = args.vmin;
    if (!std::isnan(args.vmax)) spec.vmax = args.vmax;
    if (spec.vmin && spec.vmax && !(*spec.vmax > *spec.vmin)) return error("--vmax: expected a value above --vmin");
    spec.annotate = !args.no_values;
    spec.colorbar_label = "value";
    output.write({encode_png(plot::heatmap(m, spec), "--out")});
    // On stderr: the PNG itself may be going to stdout (-o /dev/stdout).
    std::cerr << "wrote " << args.out << " (" << rows << " x " << cols << ")\n";
    return kExitOk;
  } catch (const Error& e) {
    return error(e.what());
  } catch (const std::bad_alloc&) {
    return error("not enough memory");
  } catch (const std::exception& e) {
    return error(e.what());
  }
}

}  // namespace sdpa::cli
