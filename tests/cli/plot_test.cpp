// The CLI's pictures: Cairo's PNG bytes decode to the pixels drawn, text is DejaVu Sans
// antialiased (a proportional font in grey levels, turned upright for axis labels), and
// the heatmap and bar chart put the data where it belongs (each cell's colour is the
// colour map at its value, each value is written in its cell, the colour bar runs from
// the low colour to the high one, each bar ends at its height).
#include "plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "picture.h"
#include "sdpa/error.h"
#include "text.h"

namespace {

using sdpa::cli::Picture;
namespace plot = sdpa::cli::plot;

// The bounding box of the pixels that are not white; {-1, -1, -1, -1} when there are none.
struct Box {
  int x0 = -1, y0 = -1, x1 = -1, y1 = -1;
  int width() const { return x1 - x0 + 1; }
  int height() const { return y1 - y0 + 1; }
};
Box ink_box(const Picture& p) {
  Box box;
  for (int y = 0; y < p.height(); ++y)
    for (int x = 0; x < p.width(); ++x)
      if (p.pixel(x, y) != 0xffffff) {
        if (box.x0 < 0 || x < box.x0) box.x0 = x;
        if (box.y0 < 0) box.y0 = y;
        box.x1 = std::max(box.x1, x);
        box.y1 = y;
      }
  return box;
}

// Text drawn in black on white: how many pixels are fully black and how many are grey
// (partly covered, the antialiasing).
struct Ink {
  int black = 0, grey = 0;
};
Ink ink_of(const Picture& p, int x0, int y0, int x1, int y1) {
  Ink ink;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const std::uint32_t c = p.pixel(x, y);
      ink.black += c == 0;
      ink.grey += c != 0 && c != 0xffffff;
    }
  return ink;
}

Picture text_picture(const std::string& text, sdpa::cli::Direction direction = sdpa::cli::Direction::flat) {
  Picture p(200, 200);
  const sdpa::cli::Context cr = sdpa::cli::draw_on(p);
  sdpa::cli::draw_text(cr.get(), 100, 100, text, sdpa::cli::Font{20}, 0x000000, sdpa::cli::Along::centre,
                       sdpa::cli::Across::middle, direction);
  return p;
}

TEST(PictureTest, PngBytesDecodeToThePixelsDrawn) {
  Picture image(7, 5);
  {
    const sdpa::cli::Context cr = sdpa::cli::draw_on(image);
    sdpa::cli::set_colour(cr.get(), 0x102030);
    cairo_paint(cr.get());
    sdpa::cli::set_colour(cr.get(), 0xff0000);
    cairo_rectangle(cr.get(), 0, 0, 1, 1);
    cairo_fill(cr.get());
    sdpa::cli::set_colour(cr.get(), 0x00ff00);
    cairo_rectangle(cr.get(), 6, 4, 1, 1);
    cairo_fill(cr.get());
  }
  const std::string bytes = sdpa::cli::encode_png(image, "test");
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  const Picture back = sdpa::cli::decode_png(bytes, "test");
  ASSERT_EQ(back.width(), 7);
  ASSERT_EQ(back.height(), 5);
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x) EXPECT_EQ(back.pixel(x, y), image.pixel(x, y)) << x << "," << y;
  EXPECT_EQ(back.pixel(0, 0), 0xff0000u);
  EXPECT_EQ(back.pixel(6, 4), 0x00ff00u);
  EXPECT_EQ(back.pixel(3, 2), 0x102030u);
  EXPECT_EQ(back.pixel(7, 0), 0u);  // outside
}

TEST(PictureTest, RejectsEmptyPicturesAndBytesThatAreNoPng) {
  EXPECT_THROW(Picture(0, 3), sdpa::Error);
  EXPECT_THROW(Picture(40000, 2), sdpa::Error);  // beyond Cairo's 32767 a side
  EXPECT_THROW(sdpa::cli::encode_png(Picture(), "empty"), sdpa::Error);
  EXPECT_THROW(sdpa::cli::decode_png("not a png", "bytes"), sdpa::Error);
  const std::string bytes = sdpa::cli::encode_png(Picture(4, 4), "x");
  EXPECT_THROW(sdpa::cli::decode_png(bytes.substr(0, bytes.size() / 2), "cut"), sdpa::Error);
  EXPECT_EQ(Picture(4, 4).pixel(2, 2), 0xffffffu);  // created white
}

// A real outline font, not a bitmap one: glyphs have grey edges (antialiasing), widths
// follow the letters (proportional: "iiii" is narrower than "WWWW"), and the measured
// width is the width drawn.
TEST(TextTest, DrawsAntialiasedProportionalText) {
  const sdpa::cli::Font font{20};
  EXPECT_LT(sdpa::cli::text_width("iiii", font), 0.5 * sdpa::cli::text_width("WWWW", font));
  EXPECT_NEAR(sdpa::cli::text_width("abab", font), 2 * sdpa::cli::text_width("ab", font), 1e-9);
  EXPECT_NEAR(sdpa::cli::text_width("Query", {40}), 2 * sdpa::cli::text_width("Query", font), 1e-6);
  EXPECT_EQ(sdpa::cli::text_width("", font), 0);
  EXPECT_GT(sdpa::cli::line_height(font), 20);  // ascent + descent of DejaVu Sans: 1.16 em
  EXPECT_LT(sdpa::cli::line_height(font), 26);

  const Picture p = text_picture("Attention");
  const Ink ink = ink_of(p, 0, 0, p.width(), p.height());
  EXPECT_GT(ink.black, 40);
  EXPECT_GT(ink.grey, 40) << "no antialiased edges";
  const Box box = ink_box(p);
  EXPECT_NEAR(box.width(), sdpa::cli::text_width("Attention", font), 3);
  EXPECT_NEAR((box.x0 + box.x1 + 1) / 2.0, 100, 2);  // centred on the anchor
  EXPECT_NEAR(box.y0 + 0.72 * 20 / 2, 100, 2.5);     // capitals centred on it (cap height 0.73 em)
  // Non-ASCII text is drawn (UTF-8): the open box the demo labels spaces with.
  const Ink open_box = ink_of(text_picture("\u2423"), 0, 0, 200, 200);
  EXPECT_GT(open_box.black + open_box.grey, 10);
}

// Upright text is the flat text turned a quarter counter-clockwise: its ink box has the
// flat one's sides swapped, and its first letter is at the bottom.
TEST(TextTest, UprightTextIsTheFlatTextTurned) {
  const Picture flat = text_picture("Query"), upright = text_picture("Query", sdpa::cli::Direction::upright);
  const Box f = ink_box(flat), u = ink_box(upright);
  EXPECT_NEAR(u.width(), f.height(), 1);
  EXPECT_NEAR(u.height(), f.width(), 1);
  EXPECT_NEAR((u.y0 + u.y1 + 1) / 2.0, 100, 2);
  // The turn's sense: reading bottom to top, the capital Q is at the bottom, and the
  // tops of the letters face left, so the ink reaches further left there than at the
  // top, where the lower-case y is.
  int leftmost_bottom = 1000, leftmost_top = 1000;
  for (int y = u.y0; y <= u.y1; ++y)
    for (int x = u.x0; x <= u.x1; ++x)
      if (upright.pixel(x, y) != 0xffffff) {
        if (y > u.y1 - u.height() / 5) leftmost_bottom = std::min(leftmost_bottom, x);
        if (y < u.y0 + u.height() / 5) leftmost_top = std::min(leftmost_top, x);
      }
  EXPECT_LT(leftmost_bottom, leftmost_top) << "the capital Q should be at the bottom, reaching highest (leftmost)";
}

TEST(PlotTest, BluesRunsFromWhiteToDarkBlue) {
  EXPECT_EQ(plot::blues(0.0), 0xf7fbffu);
  EXPECT_EQ(plot::blues(1.0), 0x08306bu);
  EXPECT_EQ(plot::blues(0.5), 0x6baed6u);  // the middle stop
  EXPECT_EQ(plot::blues(-3.0), 0xf7fbffu);
  EXPECT_EQ(plot::blues(NAN), 0xf7fbffu);
}

// The top-left cell of a heatmap: the first 3 x 3 block of `colour` scanning rows (the
// colour bar's bottom is the same colour but lies to the right, below).
std::pair<int, int> find_block(const Picture& image, std::uint32_t colour) {
  for (int y = 0; y < image.height(); ++y)
    for (int x = 0; x < image.width(); ++x)
      if (image.pixel(x, y) == colour && image.pixel(x + 2, y) == colour && image.pixel(x, y + 2) == colour &&
          image.pixel(x + 2, y + 2) == colour)
        return {x, y};
  return {-1, -1};
}

TEST(PlotTest, HeatmapCellsShowTheColourOfTheirValues) {
  plot::Matrix m{3, 4, {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.05}};
  plot::HeatmapSpec spec;
  spec.title = "Test";
  spec.annotate = false;
  spec.row_labels = {"a", "b", "c"};
  const Picture image = plot::heatmap(m, spec);
  const auto [x0, y0] = find_block(image, plot::blues(0.0));
  ASSERT_GE(x0, 0);
  int cell = 0;
  while (image.pixel(x0 + cell, y0) == plot::blues(0.0)) ++cell;
  ASSERT_GE(cell, 8);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) {
      // Every pixel of the cell, not only its centre: no text, no blending.
      for (int dy = 0; dy < cell; ++dy)
        for (int dx = 0; dx < cell; ++dx)
          ASSERT_EQ(image.pixel(x0 + c * cell + dx, y0 + r * cell + dy), plot::blues(m.at(r, c)))
              << r << "," << c << " +" << dx << "," << dy;
    }
  // The plot is framed in black.
  EXPECT_EQ(image.pixel(x0 - 1, y0 + cell), 0u);
  EXPECT_EQ(image.pixel(x0 + 4 * cell, y0 + cell), 0u);
  // Antialiased text above the plot (the title) and left of it (labels).
  const Ink above = ink_of(image, 0, 0, image.width(), y0 - 2);
  const Ink left = ink_of(image, 0, y0, x0 - 8, y0 + 3 * cell);
  EXPECT_GT(above.black + above.grey, 20);
  EXPECT_GT(above.grey, 5);
  EXPECT_GT(left.black + left.grey, 20);
}

// With values written in: a cell holding a value has pixels of another colour than its
// own (the digits, dark on light cells and light on dark ones); a zero (masked) cell is
// left blank.
TEST(PlotTest, AnnotatedCellsCarryTheirValues) {
  plot::Matrix m{2, 2, {0.0, 0.25, 0.9, 0.5}};
  plot::HeatmapSpec spec;
  const Picture image = plot::heatmap(m, spec);
  const auto [x0, y0] = find_block(image, plot::blues(0.0));
  ASSERT_GE(x0, 0);
  int cell = 0;
  while (image.pixel(x0 + cell, y0) == plot::blues(0.0)) ++cell;
  ASSERT_GE(cell, 30);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) {
      const std::uint32_t background = plot::blues(m.at(r, c));
      int text = 0, lighter = 0;
      for (int dy = 0; dy < cell; ++dy)
        for (int dx = 0; dx < cell; ++dx) {
          const std::uint32_t p = image.pixel(x0 + c * cell + dx, y0 + r * cell + dy);
          if (p != background) ++text, lighter += (p & 0xff) > (background & 0xff);
        }
      if (m.at(r, c) == 0) {
        EXPECT_EQ(text, 0) << "a masked cell stays blank";
      } else {
        EXPECT_GT(text, 15) << r << "," << c;
        // Light digits on the dark cell (0.9), dark ones on the light cells.
        if (m.at(r, c) > 0.8) {
          EXPECT_GT(lighter, text / 2);
        } else {
          EXPECT_LT(lighter, text / 2);
        }
      }
    }
}

// The colour bar: a column right of the plot whose colour goes from blues(1) at the top
// to blues(0) at the bottom, darker all the way up.
TEST(PlotTest, ColourBarRunsFromHighAtTheTopToLow) {
  plot::Matrix m{4, 4, std::vector<double>(16, 0.0)};
  m.values[5] = 0.4;
  plot::HeatmapSpec spec;
  spec.annotate = false;
  const Picture image = plot::heatmap(m, spec);
  // The rightmost column holding a strong blue (text is grey) is inside the bar.
  const auto blue = [](std::uint32_t c) { return static_cast<int>(c & 0xff) - static_cast<int>(c >> 16) > 80; };
  int bar_x = -1, top = -1;
  for (int x = image.width() - 1; x >= 0 && bar_x < 0; --x)
    for (int y = 0; y < image.height(); ++y)
      if (blue(image.pixel(x, y))) {
        bar_x = x, top = y;
        break;
      }
  ASSERT_GE(bar_x, 0);
  bar_x -= 4;  // away from the bar's edge
  int bottom = top;
  while (image.pixel(bar_x, bottom + 1) != 0u) ++bottom;  // down to the black frame
  EXPECT_GT(bottom - top, 100);
  const auto luma = [](std::uint32_t c) { return ((c >> 16) & 0xff) + ((c >> 8) & 0xff) + (c & 0xff); };
  EXPECT_LT(std::abs(static_cast<int>(luma(image.pixel(bar_x, top))) - static_cast<int>(luma(plot::blues(1.0)))), 8);
  EXPECT_LT(std::abs(static_cast<int>(luma(image.pixel(bar_x, bottom))) - static_cast<int>(luma(plot::blues(0.0)))), 8);
  for (int y = top; y < bottom; ++y) EXPECT_LE(luma(image.pixel(bar_x, y)), luma(image.pixel(bar_x, y + 1))) << y;
  // Tick labels right of the bar.
  const Ink labels = ink_of(image, bar_x + 12, top - 8, image.width(), bottom + 8);
  EXPECT_GT(labels.black + labels.grey, 30);
}

TEST(PlotTest, LargeMatricesAreAveragedIntoABoundedImage) {
  plot::Matrix m{2000, 1500, std::vector<double>(3000000, 0.5)};
  m.values[0] = NAN;
  const Picture image = plot::heatmap(m, {});
  EXPECT_LT(image.width(), 1000);
  EXPECT_LT(image.height(), 800);
  // The averaged cells show the mean, 0.5.
  EXPECT_GE(find_block(image, plot::blues(0.5)).first, 0);
}

TEST(PlotTest, RejectsEmptyMatricesAndMiscountedLabels) {
  EXPECT_THROW(plot::heatmap(plot::Matrix{0, 3, {}}, {}), sdpa::Error);
  plot::HeatmapSpec spec;
  spec.col_labels = {"x"};
  EXPECT_THROW(plot::heatmap(plot::Matrix{1, 2, {0, 1}}, spec), sdpa::Error);
  plot::BarChartSpec bars;
  EXPECT_THROW(plot::bar_chart(bars), sdpa::Error);
  bars.series = {{"a", {1, 2}, 0}, {"b", {1}, 0}};
  EXPECT_THROW(plot::bar_chart(bars), sdpa::Error);
  bars.series = {{"a", {1}, 0}};
  bars.ymax = bars.ymin;
  EXPECT_THROW(plot::bar_chart(bars), sdpa::Error);
}

// A single series: the bar of value v spans from the axis up to v of the plot height.
TEST(PlotTest, BarsEndAtTheirValues) {
  plot::BarChartSpec spec;
  spec.title = "bars";
  spec.series = {{"s", {0.25, 1.0, 0.5}, 0xff0000}};
  const Picture image = plot::bar_chart(spec);
  // One entry per run of adjacent columns holding a bar (the legend's swatch is not one).
  std::vector<int> tops, bottoms;
  bool in_bar = false;
  for (int x = 0; x < image.width(); ++x) {
    int top = -1, bottom = -1;
    for (int y = 0; y < image.height(); ++y)
      if (image.pixel(x, y) == 0xff0000) {
        if (top < 0) top = y;
        bottom = y;
      }
    const bool bar = top >= 0 && bottom - top > 20;
    if (bar && !in_bar) tops.push_back(top), bottoms.push_back(bottom);
    in_bar = bar;
  }
  ASSERT_EQ(tops.size(), 3u);
  const double full = bottoms[1] - tops[1] + 1;
  EXPECT_NEAR((bottoms[0] - tops[0] + 1) / full, 0.25, 0.01);
  EXPECT_NEAR((bottoms[2] - tops[2] + 1) / full, 0.5, 0.01);
  EXPECT_EQ(bottoms[0], bottoms[1]);  // on one axis
}

// Panels keep their pixels, left to right under the title.
TEST(PlotTest, FigurePlacesPanelsSideBySide) {
  const Picture a(100, 50), b(80, 70);
  for (const auto& [p, colour] : {std::pair{a, 0xff0000u}, std::pair{b, 0x00ff00u}}) {
    const sdpa::cli::Context cr = sdpa::cli::draw_on(p);
    sdpa::cli::set_colour(cr.get(), colour);
    cairo_paint(cr.get());
  }
  const Picture f = plot::figure({a, b}, "Two panels");
  EXPECT_GE(f.width(), 180);
  EXPECT_GE(f.height(), 70);
  const auto [ax, ay] = find_block(f, 0xff0000);
  const auto [bx, by] = find_block(f, 0x00ff00);
  ASSERT_GE(ax, 0);
  ASSERT_GE(bx, 0);
  EXPECT_EQ(ay, by);  // top-aligned
  EXPECT_EQ(f.pixel(ax + 99, ay + 49), 0xff0000u);
  EXPECT_EQ(f.pixel(ax + 100, ay + 49), 0xffffffu);
  EXPECT_EQ(f.pixel(bx + 79, by + 69), 0x00ff00u);
  EXPECT_GT(bx, ax + 99);  // b right of a
  const Ink title = ink_of(f, 0, 0, f.width(), ay);
  EXPECT_GT(title.black, 20);
  EXPECT_GT(title.grey, 20);
}

}  // namespace
