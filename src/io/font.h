// A tiny built-in bitmap font for the labels of the pictures: printable ASCII, 5 x 9
// pixels per glyph (cap height 7, two rows of descender), drawn at an integer scale.
// Written by hand so the plots need no font files or font libraries.
#pragma once

#include <cstdint>
#include <string_view>

#include "io/png.h"

namespace sdpa::io {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 9;   // rows 0..6 above the baseline, 7..8 descenders
inline constexpr int kGlyphAdvance = 6;  // one column of spacing

// Width and height in pixels of `text` drawn at `scale` (one line; no trailing spacing).
int text_width(std::string_view text, int scale);
inline int text_height(int scale) { return kGlyphHeight * scale; }

// Draws `text` with its top-left corner at (x, y). Characters outside printable ASCII
// are drawn as '?'. Pixels outside the image are skipped.
void draw_text(Image& image, int x, int y, std::string_view text, std::uint32_t colour, int scale);

// Draws `text` rotated a quarter turn counter-clockwise (reading bottom to top, as a
// y-axis label), with the bounding box's top-left corner at (x, y): the box is
// text_height wide and text_width tall.
void draw_text_vertical(Image& image, int x, int y, std::string_view text, std::uint32_t colour, int scale);

}  // namespace sdpa::io
