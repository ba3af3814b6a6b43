// Pictures: the PNG writer round-trips pixels through libpng, the built-in font draws
// every printable character, and the heatmap and bar chart put the data where it belongs
// (each cell's colour is the colour map at its value; each bar ends at its height).
#include "io/plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "io/font.h"
#include "io/png.h"
#include "sdpa/error.h"

namespace {

using sdpa::io::Image;

std::string temp_png(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

TEST(PngTest, WritesPixelsLibpngReadsBack) {
  Image image(7, 5, 0x102030);
  image.set(0, 0, 0xff0000);
  image.set(6, 4, 0x00ff00);
  image.set(7, 0, 0x0000ff);  // outside: ignored
  const std::string path = temp_png("sdpa_png_test.png");
  sdpa::io::write_png(path, image);
  const Image back = sdpa::io::read_png(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.width, 7);
  ASSERT_EQ(back.height, 5);
  EXPECT_EQ(back.rgb, image.rgb);
  EXPECT_EQ(back.get(0, 0), 0xff0000u);
  EXPECT_EQ(back.get(6, 4), 0x00ff00u);
}

TEST(PngTest, ReportsUnwritablePathsAndEmptyImages) {
  EXPECT_THROW(sdpa::io::write_png("/nonexistent-dir/x.png", Image(2, 2)), sdpa::Error);
  EXPECT_THROW(sdpa::io::write_png(temp_png("sdpa_empty.png"), Image()), sdpa::Error);
  EXPECT_THROW(sdpa::io::read_png("/nonexistent-dir/x.png"), sdpa::Error);
}

// Every printable ASCII glyph but the space has ink, no two glyphs are the same bitmap,
// and text advances 6 pixels per character at scale 1.
TEST(FontTest, EveryPrintableCharacterIsDrawnAndDistinct) {
  std::set<std::string> seen;  // the bitmaps' bytes (a set of vectors trips GCC 12's -Wstringop-overread)
  for (char c = 33; c < 127; ++c) {
    Image image(8, 10);
    sdpa::io::draw_text(image, 0, 0, std::string(1, c), 0x000000, 1);
    int ink = 0;
    for (int y = 0; y < 10; ++y)
      for (int x = 0; x < 8; ++x) ink += image.get(x, y) == 0;
    EXPECT_GT(ink, 0) << "'" << c << "' draws nothing";
    EXPECT_TRUE(seen.insert(std::string(image.rgb.begin(), image.rgb.end())).second)
        << "'" << c << "' looks like another glyph";
  }
  Image blank(8, 10);
  sdpa::io::draw_text(blank, 0, 0, " ", 0x000000, 1);
  EXPECT_EQ(blank.rgb, Image(8, 10).rgb);
  EXPECT_EQ(sdpa::io::text_width("abc", 1), 17);
  EXPECT_EQ(sdpa::io::text_width("abc", 2), 34);
  EXPECT_EQ(sdpa::io::text_width("", 2), 0);
}

// Upright text is the flat text turned a quarter counter-clockwise.
TEST(FontTest, VerticalTextIsTheRotatedFlatText) {
  const std::string text = "Query";
  const int w = sdpa::io::text_width(text, 1), h = sdpa::io::text_height(1);
  Image flat(w, h), upright(h, w);
  sdpa::io::draw_text(flat, 0, 0, text, 0, 1);
  sdpa::io::draw_text_vertical(upright, 0, 0, text, 0, 1);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) ASSERT_EQ(flat.get(x, y), upright.get(y, w - 1 - x)) << x << "," << y;
}

TEST(PlotTest, BluesRunsFromWhiteToDarkBlue) {
  EXPECT_EQ(sdpa::io::blues(0.0), 0xf7fbffu);
  EXPECT_EQ(sdpa::io::blues(1.0), 0x08306bu);
  EXPECT_EQ(sdpa::io::blues(0.5), 0x6baed6u);  // the middle stop
  EXPECT_EQ(sdpa::io::blues(-3.0), 0xf7fbffu);
  EXPECT_EQ(sdpa::io::blues(NAN), 0xf7fbffu);
}

// Finds the plot area as the largest block of non-white, non-black pixels: the cell at
// row r, column c must show blues(value).
TEST(PlotTest, HeatmapCellsShowTheColourOfTheirValues) {
  sdpa::io::Matrix m{3, 4, {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.05}};
  sdpa::io::HeatmapSpec spec;
  spec.title = "Test";
  spec.annotate = false;
  spec.row_labels = {"a", "b", "c"};
  const Image image = sdpa::io::heatmap(m, spec);
  // Locate the top-left cell: the first pixel of colour blues(0) scanning rows (the
  // colour bar's bottom is the same colour but lies to the right, below).
  int x0 = -1, y0 = -1;
  for (int y = 0; y < image.height && x0 < 0; ++y)
    for (int x = 0; x < image.width; ++x)
      if (image.get(x, y) == sdpa::io::blues(0.0) && image.get(x + 1, y) == sdpa::io::blues(0.0) &&
          image.get(x, y + 1) == sdpa::io::blues(0.0)) {
        x0 = x, y0 = y;
        break;
      }
  ASSERT_GE(x0, 0);
  int cell = 0;
  while (image.get(x0 + cell, y0) == sdpa::io::blues(0.0)) ++cell;
  ASSERT_GE(cell, 8);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(image.get(x0 + c * cell + cell / 2, y0 + r * cell + cell / 2), sdpa::io::blues(m.at(r, c)))
          << r << "," << c;
  // Something is written above the plot (the title) and left of it (labels).
  int ink_above = 0, ink_left = 0;
  for (int y = 0; y < y0 - 2; ++y)
    for (int x = 0; x < image.width; ++x) ink_above += image.get(x, y) != 0xffffff;
  for (int y = y0; y < y0 + 3 * cell; ++y)
    for (int x = 0; x < x0 - 8; ++x) ink_left += image.get(x, y) != 0xffffff;
  EXPECT_GT(ink_above, 20);
  EXPECT_GT(ink_left, 20);
}

TEST(PlotTest, LargeMatricesAreAveragedIntoABoundedImage) {
  sdpa::io::Matrix m{2000, 1500, std::vector<double>(3000000, 0.5)};
  m.values[0] = NAN;
  const Image image = sdpa::io::heatmap(m, {});
  EXPECT_LT(image.width, 1000);
  EXPECT_LT(image.height, 800);
}

TEST(PlotTest, RejectsEmptyMatricesAndMiscountedLabels) {
  EXPECT_THROW(sdpa::io::heatmap(sdpa::io::Matrix{0, 3, {}}, {}), sdpa::Error);
  sdpa::io::HeatmapSpec spec;
  spec.col_labels = {"x"};
  EXPECT_THROW(sdpa::io::heatmap(sdpa::io::Matrix{1, 2, {0, 1}}, spec), sdpa::Error);
  sdpa::io::BarChartSpec bars;
  EXPECT_THROW(sdpa::io::bar_chart(bars), sdpa::Error);
  bars.series = {{"a", {1, 2}, 0}, {"b", {1}, 0}};
  EXPECT_THROW(sdpa::io::bar_chart(bars), sdpa::Error);
}

// A single series: the bar of value v spans from the axis up to v of the plot height.
TEST(PlotTest, BarsEndAtTheirValues) {
  sdpa::io::BarChartSpec spec;
  spec.title = "bars";
  spec.series = {{"s", {0.25, 1.0, 0.5}, 0xff0000}};
  const Image image = sdpa::io::bar_chart(spec);
  // One entry per run of adjacent columns holding a bar (the legend's swatch, 14 pixels
  // tall, is not a bar).
  std::vector<int> tops, bottoms;
  bool in_bar = false;
  for (int x = 0; x < image.width; ++x) {
    int top = -1, bottom = -1;
    for (int y = 0; y < image.height; ++y)
      if (image.get(x, y) == 0xff0000) {
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
}

TEST(PlotTest, FigurePlacesPanelsSideBySide) {
  const Image a(100, 50, 0xff0000), b(80, 70, 0x00ff00);
  const Image f = sdpa::io::figure({a, b}, "T");
  EXPECT_GE(f.width, 180);
  EXPECT_GE(f.height, 70);
}

}  // namespace
