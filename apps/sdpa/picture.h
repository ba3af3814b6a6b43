// A picture the CLI draws (`sdpa demo`, `sdpa viz`): a Cairo image surface, 8-bit RGB,
// white when created, and its PNG bytes as Cairo encodes them. The bytes are written by
// the caller through io::OutputFiles / io::write_file, so a picture is written as safely
// as any other output (src/io/output_files.h).
#pragma once

#include <cairo.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace sdpa::cli {

// Copies share one surface (a picture is drawn once, then only read and painted).
class Picture {
 public:
  Picture() = default;  // empty: no surface, 0 x 0
  // A white width x height picture. Throws sdpa::Error for a size that is not positive
  // or that Cairo cannot allocate (above 32767 pixels a side).
  Picture(int width, int height);

  int width() const;
  int height() const;
  // 0xRRGGBB at (x, y); 0 outside the picture.
  std::uint32_t pixel(int x, int y) const;
  // The surface to draw on or to paint from; null for an empty picture.
  cairo_surface_t* surface() const { return surface_.get(); }

 private:
  std::shared_ptr<cairo_surface_t> surface_;
};

// A drawing context on a picture, destroyed with it going out of scope.
using Context = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;
Context draw_on(const Picture& picture);

// Sets the colour Cairo draws with to 0xRRGGBB (exact: each channel is v / 255).
void set_colour(cairo_t* cr, std::uint32_t rgb);

// The bytes of `picture` as an 8-bit RGB PNG (cairo_surface_write_to_png_stream). Throws
// sdpa::Error naming `name` for an empty picture or an encoder error.
std::string encode_png(const Picture& picture, const std::string& name);

// A PNG read back (cairo_image_surface_create_from_png_stream), transparent pixels over
// white; for tests. Throws sdpa::Error naming `name` for bytes that are not a PNG.
Picture decode_png(std::string_view bytes, const std::string& name);

}  // namespace sdpa::cli
