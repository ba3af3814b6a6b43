// PNG output through libpng: the pictures `sdpa demo` and `sdpa viz` write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sdpa::io {

// An 8-bit RGB raster, row-major, 3 bytes per pixel, origin at the top left.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> rgb;  // width * height * 3

  Image() = default;
  // Filled with one colour (white by default).
  Image(int width, int height, std::uint32_t fill = 0xffffff);

  // 0xRRGGBB at (x, y); writes outside the image are ignored (so drawing code can clip
  // by doing nothing).
  void set(int x, int y, std::uint32_t rgb_colour);
  std::uint32_t get(int x, int y) const;
};

// The bytes of `image` as an 8-bit RGB PNG. Throws sdpa::Error naming `name` for an
// empty image or an encoder error.
std::string encode_png(const Image& image, const std::string& name);

// Writes encode_png(image) to `path` as io::write_file does (output_files.h). Throws
// sdpa::Error naming `path` if it cannot.
void write_png(const std::string& path, const Image& image);

// Reads an 8-bit RGB or RGBA PNG back (alpha dropped); for tests. Throws sdpa::Error.
Image read_png(const std::string& path);

}  // namespace sdpa::io
