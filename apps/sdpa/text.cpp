// Cairo's text API with a named family: fontconfig resolves "DejaVu Sans" to the TrueType
// file, and Cairo rasterises it with FreeType. Metrics are unhinted, so a width measured
// here is the width drawn in any direction and at any position.
#include "text.h"

#include <numbers>
#include <string>

#include "picture.h"

namespace sdpa::cli {
namespace {

constexpr const char* kFamily = "DejaVu Sans";

void select_font(cairo_t* cr, Font font) {
  cairo_select_font_face(cr, kFamily, CAIRO_FONT_SLANT_NORMAL,
                         font.bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, font.size);
  cairo_font_options_t* options = cairo_font_options_create();
  cairo_font_options_set_antialias(options, CAIRO_ANTIALIAS_GRAY);
  cairo_font_options_set_hint_style(options, CAIRO_HINT_STYLE_SLIGHT);
  cairo_font_options_set_hint_metrics(options, CAIRO_HINT_METRICS_OFF);
  cairo_set_font_options(cr, options);
  cairo_font_options_destroy(options);
}

// A context to measure with: text extents need one, and a 1 x 1 surface is enough.
struct Measure {
  Picture scratch{1, 1};
  Context cr = draw_on(scratch);
  explicit Measure(Font font) { select_font(cr.get(), font); }
};

// The height of a capital above the baseline: what Across::middle centres on.
double cap_height(cairo_t* cr) {
  cairo_text_extents_t extents;
  cairo_text_extents(cr, "H", &extents);
  return -extents.y_bearing;
}

}  // namespace

double text_width(std::string_view text, Font font) {
  const Measure m(font);
  cairo_text_extents_t extents;
  cairo_text_extents(m.cr.get(), std::string(text).c_str(), &extents);
  return extents.x_advance;
}

double line_height(Font font) {
  const Measure m(font);
  cairo_font_extents_t extents;
  cairo_font_extents(m.cr.get(), &extents);
  return extents.ascent + extents.descent;
}

void draw_text(cairo_t* cr, double x, double y, std::string_view text, Font font, std::uint32_t colour, Along along,
               Across across, Direction direction) {
  if (text.empty()) return;
  const std::string utf8(text);
  cairo_save(cr);
  select_font(cr, font);
  set_colour(cr, colour);
  cairo_text_extents_t text_extents;
  cairo_text_extents(cr, utf8.c_str(), &text_extents);
  cairo_font_extents_t font_extents;
  cairo_font_extents(cr, &font_extents);

  // In the text's own frame: x along the reading direction, y down across it.
  cairo_translate(cr, x, y);
  if (direction == Direction::upright) cairo_rotate(cr, -std::numbers::pi / 2);
  const double start = along == Along::start    ? 0.0
                       : along == Along::centre ? -text_extents.x_advance / 2
                                                : -text_extents.x_advance;
  const double baseline = across == Across::top ? font_extents.ascent : cap_height(cr) / 2;
  cairo_move_to(cr, start, baseline);
  cairo_show_text(cr, utf8.c_str());
  cairo_restore(cr);
}

}  // namespace sdpa::cli

// Under LeakSanitizer (the sanitize preset): fontconfig keeps what it allocates parsing
// its configuration, and Cairo the pattern of each font face it resolves, for the life
// of the process, in places LeakSanitizer cannot see as reachable. They are allocated
// once per process, not per picture, and are not ours; every other allocation is still
// checked. The runtime looks this hook up by name; other builds never call it.
extern "C" const char* __lsan_default_suppressions() { return "leak:libfontconfig.so\n"; }
