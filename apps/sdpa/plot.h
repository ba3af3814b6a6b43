// The CLI's figures, as seed 004 draws them with matplotlib: attention heatmaps in the
// "Blues" colour map with a colour bar, token labels and the value written in each cell
// (its imshow figures), and grouped bar charts (its scaled-vs-unscaled softmax
// experiment). Panels are Pictures (picture.h); figure() puts several side by side under
// a common title. Drawn with Cairo, text in DejaVu Sans (text.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "picture.h"

namespace sdpa::cli::plot {

// A rows x cols matrix of doubles, row-major.
struct Matrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<double> values;
  double at(std::int64_t r, std::int64_t c) const { return values[static_cast<std::size_t>(r * cols + c)]; }
};

struct HeatmapSpec {
  std::string title;
  std::string xlabel = "Key position";
  std::string ylabel = "Query position";
  // Tick labels; empty = the indices 0, 1, 2, ... (thinned out when they would overlap).
  std::vector<std::string> row_labels;
  std::vector<std::string> col_labels;
  // Colour range; default: the finite data's range, widened to [0, 1] when the data lie
  // in it (attention weights), so pictures of weights are comparable with each other.
  std::optional<double> vmin, vmax;
  std::string colorbar_label = "weight";
  // Writes each value into its cell when the cells are large enough for the text;
  // exact zeros (masked positions) are left blank.
  bool annotate = true;
};

// Draws a heatmap of `m` (rows = queries, top to bottom; columns = keys, left to right)
// in the "Blues" colour map (white = low, dark blue = high), with a title, axis labels,
// tick labels and a colour bar. NaN cells are grey. A matrix larger than the plot area
// is box-averaged down to it (the title says so). Throws sdpa::Error on an empty matrix
// or label lists of the wrong length.
Picture heatmap(const Matrix& m, const HeatmapSpec& spec);

struct BarSeries {
  std::string name;
  std::vector<double> values;
  std::uint32_t colour = 0x1f77b4;  // 0xRRGGBB
};

struct BarChartSpec {
  std::string title;
  std::string subtitle;  // a second, smaller line under the title
  std::string xlabel = "Key index";
  std::string ylabel = "Attention weight";
  std::vector<BarSeries> series;  // all the same length; drawn side by side per index
  double ymin = 0.0;
  double ymax = 1.0;
};

// Grouped bars with a y grid, a legend and axis labels. Values outside [ymin, ymax] are
// clipped to the axis.
Picture bar_chart(const BarChartSpec& spec);

// Places `panels` left to right, top-aligned, on a white canvas under `title`.
Picture figure(const std::vector<Picture>& panels, const std::string& title);

// The Blues colour map at t in [0, 1] (matplotlib's, from ColorBrewer), as 0xRRGGBB.
std::uint32_t blues(double t);

}  // namespace sdpa::cli::plot
