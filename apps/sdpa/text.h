// Text in the CLI's pictures: DejaVu Sans (a TrueType font, Debian's fonts-dejavu-core),
// found through fontconfig by Cairo's text API, antialiased in grey levels. Sizes are in
// pixels. Text is placed by an anchor point: along the reading direction at its start,
// centre or end; across it at the top of the line box or centred on the capitals, so
// that a label sits level with a tick mark whatever letters it has.
#pragma once

#include <cairo.h>

#include <cstdint>
#include <string_view>

namespace sdpa::cli {

struct Font {
  double size = 13;  // pixels per em
  bool bold = false;
};

enum class Along { start, centre, end };
enum class Across { top, middle };
enum class Direction {
  flat,     // left to right
  upright,  // a quarter turn counter-clockwise: bottom to top, as a y-axis label
};

// The advance width of `text` (UTF-8) in pixels: how far it reaches along its direction.
double text_width(std::string_view text, Font font);
// The height of a line of the font (ascent + descent): how far text reaches across its
// direction.
double line_height(Font font);

// Draws `text` in `colour` (0xRRGGBB) anchored at (x, y) as described above. Upright
// text's line box lies right of x for Across::top (its tops of letters face left).
void draw_text(cairo_t* cr, double x, double y, std::string_view text, Font font, std::uint32_t colour,
               Along along = Along::start, Across across = Across::top, Direction direction = Direction::flat);

}  // namespace sdpa::cli
