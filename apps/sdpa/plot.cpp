// Layout is computed from the measured text (text.h): every margin is sized to what it
// holds (the widest tick label, the title's height), so labels never overlap the plot
// whatever the matrix size or token strings. Cells, bars, ticks and frames lie on whole
// pixels, so a cell's pixels are exactly its colour and lines are sharp; only the text
// is antialiased.
#include "plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "sdpa/error.h"
#include "text.h"

namespace sdpa::cli::plot {
namespace {

// Sizes in pixels, near matplotlib's at 100 dpi (10 pt tick labels, 12 pt titles).
constexpr Font kTickFont{13};
constexpr Font kLabelFont{14};   // axis labels, legend, subtitles
constexpr Font kTitleFont{16};   // panel titles
constexpr Font kFigureFont{20};  // figure titles
constexpr Font kValueFont{11};   // the values written in heatmap cells
constexpr int kPad = 12;
constexpr int kTick = 5;
constexpr int kLabelGap = 4;       // between a tick mark and its label
constexpr int kMaxPlotSide = 480;  // plot area of a heatmap, pixels
constexpr int kMaxCell = 48;
constexpr int kMinPlotSide = 160;
constexpr std::uint32_t kBlack = 0x000000;
constexpr std::uint32_t kText = 0x222222;
constexpr std::uint32_t kGrid = 0xdddddd;
constexpr std::uint32_t kNanColour = 0x9a9a9a;

int width_of(std::string_view text, Font font) { return static_cast<int>(std::ceil(text_width(text, font))); }
int height_of(Font font) { return static_cast<int>(std::ceil(line_height(font))); }

// A rectangle of whole pixels: [x, x + w) x [y, y + h).
void fill_rect(cairo_t* cr, int x, int y, int w, int h, std::uint32_t colour) {
  if (w <= 0 || h <= 0) return;
  set_colour(cr, colour);
  cairo_rectangle(cr, x, y, w, h);
  cairo_fill(cr);
}

// A one-pixel frame just outside [x, x + w) x [y, y + h).
void draw_frame(cairo_t* cr, int x, int y, int w, int h, std::uint32_t colour) {
  fill_rect(cr, x - 1, y - 1, w + 2, 1, colour);
  fill_rect(cr, x - 1, y + h, w + 2, 1, colour);
  fill_rect(cr, x - 1, y - 1, 1, h + 2, colour);
  fill_rect(cr, x + w, y - 1, 1, h + 2, colour);
}

// Linear interpolation between two 0xRRGGBB colours.
std::uint32_t mix(std::uint32_t a, std::uint32_t b, double t) {
  std::uint32_t out = 0;
  for (int shift : {16, 8, 0}) {
    const double ca = (a >> shift) & 0xff, cb = (b >> shift) & 0xff;
    out |= static_cast<std::uint32_t>(std::lround(ca + (cb - ca) * t)) << shift;
  }
  return out;
}

// Perceived brightness (ITU-R BT.601 weights), to pick dark or light text on a cell.
double luminance(std::uint32_t c) {
  return (0.299 * ((c >> 16) & 0xff) + 0.587 * ((c >> 8) & 0xff) + 0.114 * (c & 0xff)) / 255.0;
}

// A number as set in type: a true minus sign (U+2212) rather than a hyphen, as matplotlib.
std::string typeset(std::string text) {
  if (!text.empty() && text[0] == '-') text.replace(0, 1, "\u2212");
  return text;
}

// "Nice" tick positions covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten,
// about `target` of them (Heckbert, "Nice numbers for graph labels", Graphics Gems 1990).
std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double f : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = f * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double eps = step * 1e-9;
  for (double t = std::ceil((lo - eps) / step) * step; t <= hi + eps; t += step) {
    ticks.push_back(std::abs(t) < eps ? 0.0 : t);
  }
  return ticks;
}

// The shortest of %.0f ... %.3f that tells neighbouring ticks apart; %g beyond that.
std::string tick_text(double value, double step) {
  char buf[32];
  int digits = 0;
  while (digits < 3 && std::abs(step * std::pow(10.0, digits) - std::round(step * std::pow(10.0, digits))) > 1e-6)
    ++digits;
  if (std::abs(value) >= 1e5 || (value != 0 && std::abs(value) < 1e-3)) {
    std::snprintf(buf, sizeof buf, "%.2g", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  }
  return typeset(buf);
}

// Every k-th label, k the smallest of 1, 2, 5, 10, 20, 50, ... that keeps labels
// `extent` pixels long, on cells `cell` pixels apart, at least `gap` pixels from each
// other (round strides read as an axis: 0, 8, 16 ... would be 0, 7, 14 otherwise).
int label_stride(double cell, int extent, int gap) {
  const double needed = (extent + gap) / std::max(cell, 1e-9);
  for (long long magnitude = 1;; magnitude *= 10)
    for (int f : {1, 2, 5})
      if (f * magnitude >= needed) return static_cast<int>(f * magnitude);
}

}  // namespace

std::uint32_t blues(double t) {
  // matplotlib's "Blues" (ColorBrewer, 9 classes), interpolated linearly.
  static constexpr std::array<std::uint32_t, 9> kStops = {0xf7fbff, 0xdeebf7, 0xc6dbef, 0x9ecae1, 0x6baed6,
                                                          0x4292c6, 0x2171b5, 0x08519c, 0x08306b};
  if (!(t > 0)) return kStops.front();  // NaN too (callers colour NaN separately)
  if (t >= 1) return kStops.back();
  const double x = t * (kStops.size() - 1);
  const auto i = static_cast<std::size_t>(x);
  return mix(kStops[i], kStops[i + 1], x - i);
}

Picture heatmap(const Matrix& m, const HeatmapSpec& spec) {
  if (m.rows <= 0 || m.cols <= 0 || m.values.size() != static_cast<std::size_t>(m.rows * m.cols)) {
    throw Error(ErrorKind::value, "heatmap",
                "expected a non-empty matrix, got " + std::to_string(m.rows) + " x " + std::to_string(m.cols));
  }
  if (!spec.row_labels.empty() && spec.row_labels.size() != static_cast<std::size_t>(m.rows)) {
    throw Error(ErrorKind::value, "heatmap.row_labels",
                "expected " + std::to_string(m.rows) + " labels, got " + std::to_string(spec.row_labels.size()));
  }
  if (!spec.col_labels.empty() && spec.col_labels.size() != static_cast<std::size_t>(m.cols)) {
    throw Error(ErrorKind::value, "heatmap.col_labels",
                "expected " + std::to_string(m.cols) + " labels, got " + std::to_string(spec.col_labels.size()));
  }

  // Colour range.
  double lo = INFINITY, hi = -INFINITY;
  for (double v : m.values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (lo >= 0 && hi <= 1) lo = 0, hi = 1;
  if (spec.vmin) lo = *spec.vmin;
  if (spec.vmax) hi = *spec.vmax;
  if (!(hi > lo)) hi = lo + 1;

  // Plot geometry: square cells when they fit, each side at least kMinPlotSide pixels;
  // more rows or columns than kMaxPlotSide pixels are box-averaged.
  const int shown_rows = static_cast<int>(std::min<std::int64_t>(m.rows, kMaxPlotSide));
  const int shown_cols = static_cast<int>(std::min<std::int64_t>(m.cols, kMaxPlotSide));
  const bool downsampled = shown_rows != m.rows || shown_cols != m.cols;
  const int cell = std::clamp(kMaxPlotSide / std::max(shown_rows, shown_cols), 1, kMaxCell);
  const int cell_h = std::max(cell, std::min(kMaxCell, kMinPlotSide / shown_rows));
  const int cell_w = std::max(cell, std::min(kMaxCell, kMinPlotSide / shown_cols));
  const int plot_w = shown_cols * cell_w, plot_h = shown_rows * cell_h;

  // Tick labels.
  auto labels_for = [](const std::vector<std::string>& given, std::int64_t n) {
    std::vector<std::string> labels;
    for (std::int64_t i = 0; i < n; ++i) labels.push_back(given.empty() ? std::to_string(i) : given[i]);
    return labels;
  };
  const std::vector<std::string> row_labels = labels_for(spec.row_labels, m.rows);
  const std::vector<std::string> col_labels = labels_for(spec.col_labels, m.cols);
  auto widest = [](const std::vector<std::string>& labels) {
    int w = 0;
    for (const std::string& s : labels) w = std::max(w, width_of(s, kTickFont));
    return w;
  };
  const int row_label_w = widest(row_labels), col_label_w = widest(col_labels);
  const int tick_label_h = height_of(kTickFont), axis_label_h = height_of(kLabelFont);
  const double row_pitch = static_cast<double>(plot_h) / m.rows, col_pitch = static_cast<double>(plot_w) / m.cols;
  const int row_stride = label_stride(row_pitch, tick_label_h, spec.row_labels.empty() ? 8 : 0);
  // Column labels lie flat when they fit side by side, else they are turned upright.
  const bool upright = spec.col_labels.empty() ? false : col_label_w + 4 > col_pitch;
  const int col_stride = upright                   ? label_stride(col_pitch, tick_label_h, 0)
                         : spec.col_labels.empty() ? label_stride(col_pitch, col_label_w, 14)
                                                   : label_stride(col_pitch, col_label_w, 4);
  const int col_label_band = upright ? col_label_w : tick_label_h;

  // Title (plus a note when downsampled).
  std::string title = spec.title;
  if (downsampled) {
    title += " (" + std::to_string(m.rows) + "\u00d7" + std::to_string(m.cols) + ", averaged)";
  }

  // Colour bar geometry and its tick labels.
  const std::vector<double> ticks = nice_ticks(lo, hi, 5);
  const double tick_step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  int tick_w = 0;
  for (double t : ticks) tick_w = std::max(tick_w, width_of(tick_text(t, tick_step), kTickFont));
  const int bar_w = 18;

  const int left = kPad + (spec.ylabel.empty() ? 0 : axis_label_h + kPad) + row_label_w + kTick + kLabelGap;
  const int top = kPad + (title.empty() ? 0 : height_of(kTitleFont) + kPad / 2);
  const int width = left + plot_w + 2 * kPad + bar_w + kTick + kLabelGap + tick_w +
                    (spec.colorbar_label.empty() ? 0 : kPad / 2 + axis_label_h) + kPad;
  const int height =
      top + plot_h + kTick + kLabelGap + col_label_band + (spec.xlabel.empty() ? 0 : kPad / 2 + axis_label_h) + kPad;
  const int title_w = width_of(title, kTitleFont) + 2 * kPad;
  Picture picture(std::max(width, title_w), height);
  const Context context = draw_on(picture);
  cairo_t* cr = context.get();

  // Cells.
  for (int r = 0; r < shown_rows; ++r) {
    const std::int64_t r0 = r * m.rows / shown_rows, r1 = (r + 1) * m.rows / shown_rows;
    for (int c = 0; c < shown_cols; ++c) {
      const std::int64_t c0 = c * m.cols / shown_cols, c1 = (c + 1) * m.cols / shown_cols;
      double sum = 0;
      std::int64_t count = 0;
      for (std::int64_t i = r0; i < r1; ++i)
        for (std::int64_t j = c0; j < c1; ++j)
          if (!std::isnan(m.at(i, j))) sum += m.at(i, j), ++count;
      const double value = count == 0 ? NAN : sum / count;
      const std::uint32_t colour = std::isnan(value) ? kNanColour : blues((value - lo) / (hi - lo));
      fill_rect(cr, left + c * cell_w, top + r * cell_h, cell_w, cell_h, colour);
    }
  }
  draw_frame(cr, left, top, plot_w, plot_h, kBlack);

  // Values in the cells, when every one fits.
  if (spec.annotate && !downsampled) {
    std::vector<std::string> texts;
    int widest_text = 0;
    for (double v : m.values) {
      char buf[32];
      std::snprintf(buf, sizeof buf, std::abs(v) < 10 ? "%.2f" : "%.3g", v);
      texts.push_back(typeset(buf));
      widest_text = std::max(widest_text, width_of(texts.back(), kValueFont));
    }
    if (widest_text + 6 <= cell_w && height_of(kValueFont) + 4 <= cell_h) {
      for (std::int64_t r = 0; r < m.rows; ++r)
        for (std::int64_t c = 0; c < m.cols; ++c) {
          const double v = m.at(r, c);
          if (v == 0) continue;  // masked positions stay blank, so the mask's shape shows
          const std::uint32_t bg = std::isnan(v) ? kNanColour : blues((v - lo) / (hi - lo));
          const std::uint32_t fg = luminance(bg) < 0.5 ? 0xffffff : 0x1a1a1a;
          draw_text(cr, left + (c + 0.5) * cell_w, top + (r + 0.5) * cell_h, texts[r * m.cols + c], kValueFont, fg,
                    Along::centre, Across::middle);
        }
    }
  }

  // Row ticks and labels (right-aligned), column ticks and labels.
  for (std::int64_t r = 0; r < m.rows; r += row_stride) {
    const int y = top + static_cast<int>((r + 0.5) * row_pitch);
    fill_rect(cr, left - kTick - 1, y, kTick, 1, kBlack);
    draw_text(cr, left - kTick - 1 - kLabelGap, y + 0.5, row_labels[r], kTickFont, kText, Along::end, Across::middle);
  }
  const int col_tick_y = top + plot_h + 1;
  for (std::int64_t c = 0; c < m.cols; c += col_stride) {
    const int x = left + static_cast<int>((c + 0.5) * col_pitch);
    fill_rect(cr, x, col_tick_y, 1, kTick, kBlack);
    if (upright) {
      // Reading bottom to top, the end of the label against the axis (as matplotlib's
      // rotation=90 tick labels).
      draw_text(cr, x + 0.5, col_tick_y + kTick + kLabelGap, col_labels[c], kTickFont, kText, Along::end,
                Across::middle, Direction::upright);
    } else {
      draw_text(cr, x + 0.5, col_tick_y + kTick + kLabelGap, col_labels[c], kTickFont, kText, Along::centre);
    }
  }

  // Axis labels and title.
  if (!spec.xlabel.empty()) {
    draw_text(cr, left + plot_w / 2.0, col_tick_y + kTick + kLabelGap + col_label_band + kPad / 2, spec.xlabel,
              kLabelFont, kText, Along::centre);
  }
  if (!spec.ylabel.empty()) {
    draw_text(cr, kPad, top + plot_h / 2.0, spec.ylabel, kLabelFont, kText, Along::centre, Across::top,
              Direction::upright);
  }
  if (!title.empty()) draw_text(cr, picture.width() / 2.0, kPad, title, kTitleFont, kBlack, Along::centre);

  // Colour bar: top = hi, bottom = lo.
  const int bar_x = left + plot_w + 2 * kPad;
  for (int y = 0; y < plot_h; ++y) {
    const double t = 1.0 - (y + 0.5) / plot_h;
    fill_rect(cr, bar_x, top + y, bar_w, 1, blues(t));
  }
  draw_frame(cr, bar_x, top, bar_w, plot_h, kBlack);
  for (double t : ticks) {
    const int y = top + static_cast<int>(std::lround((1.0 - (t - lo) / (hi - lo)) * (plot_h - 1)));
    fill_rect(cr, bar_x + bar_w + 1, y, kTick, 1, kBlack);
    draw_text(cr, bar_x + bar_w + 1 + kTick + kLabelGap, y + 0.5, tick_text(t, tick_step), kTickFont, kText,
              Along::start, Across::middle);
  }
  if (!spec.colorbar_label.empty()) {
    draw_text(cr, bar_x + bar_w + 1 + kTick + kLabelGap + tick_w + kPad / 2, top + plot_h / 2.0, spec.colorbar_label,
              kLabelFont, kText, Along::centre, Across::top, Direction::upright);
  }
  return picture;
}

Picture bar_chart(const BarChartSpec& spec) {
  if (spec.series.empty() || spec.series.front().values.empty()) {
    throw Error(ErrorKind::value, "bar_chart", "expected at least one non-empty series, got none");
  }
  const std::size_t n = spec.series.front().values.size();
  for (const BarSeries& s : spec.series) {
    if (s.values.size() != n) {
      throw Error(ErrorKind::value, "bar_chart",
                  "expected series of " + std::to_string(n) + " values, got " + std::to_string(s.values.size()) +
                      " in '" + s.name + "'");
    }
  }
  if (!(spec.ymax > spec.ymin)) throw Error(ErrorKind::value, "bar_chart", "expected ymax > ymin");

  const std::vector<double> ticks = nice_ticks(spec.ymin, spec.ymax, 5);
  const double tick_step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  int tick_w = 0;
  for (double t : ticks) tick_w = std::max(tick_w, width_of(tick_text(t, tick_step), kTickFont));
  const int tick_label_h = height_of(kTickFont), label_h = height_of(kLabelFont);
  const int slot = std::max(24, 420 / static_cast<int>(std::min<std::size_t>(n, 420)));
  const int plot_w = slot * static_cast<int>(n), plot_h = 300;

  const int title_h = height_of(kTitleFont);
  const int legend_h = label_h;
  const int left = kPad + label_h + kPad / 2 + tick_w + kLabelGap + kTick;
  const int top = kPad + title_h + (spec.subtitle.empty() ? 0 : 2 + label_h) + kPad / 2 + legend_h + kPad / 2;
  const int width = std::max({left + plot_w + 2 * kPad, width_of(spec.title, kTitleFont) + 2 * kPad,
                              width_of(spec.subtitle, kLabelFont) + 2 * kPad});
  const int height = top + plot_h + kTick + kLabelGap + tick_label_h + kPad / 2 + label_h + kPad;
  Picture picture(width, height);
  const Context context = draw_on(picture);
  cairo_t* cr = context.get();

  auto y_of = [&](double v) {
    const double t = (std::clamp(v, spec.ymin, spec.ymax) - spec.ymin) / (spec.ymax - spec.ymin);
    return top + static_cast<int>(std::lround((1.0 - t) * plot_h));
  };
  for (double t : ticks) {
    const int y = y_of(t);
    fill_rect(cr, left, y, plot_w, 1, kGrid);
    fill_rect(cr, left - kTick - 1, y, kTick, 1, kBlack);
    draw_text(cr, left - kTick - 1 - kLabelGap, y + 0.5, tick_text(t, tick_step), kTickFont, kText, Along::end,
              Across::middle);
  }

  // Bars: 80% of each slot, split evenly between the series.
  const int group = slot * 4 / 5;
  const int bar = std::max(1, group / static_cast<int>(spec.series.size()));
  for (std::size_t i = 0; i < n; ++i) {
    const int x0 = left + static_cast<int>(i) * slot + (slot - bar * static_cast<int>(spec.series.size())) / 2;
    for (std::size_t s = 0; s < spec.series.size(); ++s) {
      const double v = spec.series[s].values[i];
      if (std::isnan(v)) continue;
      const int y = y_of(v), base = y_of(std::max(spec.ymin, 0.0));
      fill_rect(cr, x0 + static_cast<int>(s) * bar, std::min(y, base), bar - 1, std::abs(base - y),
                spec.series[s].colour);
    }
    const int center = left + static_cast<int>(i) * slot + slot / 2;
    fill_rect(cr, center, top + plot_h + 1, 1, kTick, kBlack);
    if (n <= 40 || i % ((n + 39) / 40) == 0)
      draw_text(cr, center + 0.5, top + plot_h + 1 + kTick + kLabelGap, std::to_string(i), kTickFont, kText,
                Along::centre);
  }
  draw_frame(cr, left, top, plot_w, plot_h, kBlack);

  // Title, subtitle, legend (a row above the plot, so it never covers a bar).
  double y = kPad;
  draw_text(cr, picture.width() / 2.0, y, spec.title, kTitleFont, kBlack, Along::centre);
  y += title_h;
  if (!spec.subtitle.empty()) {
    y += 2;
    draw_text(cr, picture.width() / 2.0, y, spec.subtitle, kLabelFont, kText, Along::centre);
    y += label_h;
  }
  y += kPad / 2;
  const int swatch = static_cast<int>(std::lround(kLabelFont.size * 0.75));
  int legend_w = 0;
  for (const BarSeries& s : spec.series) legend_w += swatch + 6 + width_of(s.name, kLabelFont) + 2 * kPad;
  legend_w -= 2 * kPad;
  int x = left + plot_w / 2 - legend_w / 2;
  const double legend_middle = y + legend_h / 2.0;
  for (const BarSeries& s : spec.series) {
    fill_rect(cr, x, static_cast<int>(std::lround(legend_middle - swatch / 2.0)), swatch, swatch, s.colour);
    x += swatch + 6;
    draw_text(cr, x, legend_middle, s.name, kLabelFont, kText, Along::start, Across::middle);
    x += width_of(s.name, kLabelFont) + 2 * kPad;
  }

  draw_text(cr, left + plot_w / 2.0, top + plot_h + 1 + kTick + kLabelGap + tick_label_h + kPad / 2, spec.xlabel,
            kLabelFont, kText, Along::centre);
  draw_text(cr, kPad, top + plot_h / 2.0, spec.ylabel, kLabelFont, kText, Along::centre, Across::top,
            Direction::upright);
  return picture;
}

Picture figure(const std::vector<Picture>& panels, const std::string& title) {
  int width = kPad, height = 0;
  for (const Picture& p : panels) width += p.width() + kPad, height = std::max(height, p.height());
  const int title_h = title.empty() ? 0 : kPad + height_of(kFigureFont);
  width = std::max(width, width_of(title, kFigureFont) + 2 * kPad);
  Picture picture(width, title_h + height + kPad);
  const Context context = draw_on(picture);
  cairo_t* cr = context.get();
  if (!title.empty()) draw_text(cr, width / 2.0, kPad, title, kFigureFont, kBlack, Along::centre);
  int x = kPad;
  for (const Picture& p : panels) {
    if (!p.surface()) continue;
    cairo_set_source_surface(cr, p.surface(), x, title_h);
    cairo_rectangle(cr, x, title_h, p.width(), p.height());
    cairo_fill(cr);
    x += p.width() + kPad;
  }
  return picture;
}

}  // namespace sdpa::cli::plot
