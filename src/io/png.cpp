// libpng's simplified API (png_image_*, libpng >= 1.6): no setjmp/longjmp error
// handling to get wrong, and errors come back as a message in the png_image.
#include "io/png.h"

#include <png.h>

#include <cstring>
#include <limits>

#include "io/output_files.h"
#include "sdpa/error.h"

namespace sdpa::io {

Image::Image(int w, int h, std::uint32_t fill) : width(w), height(h) {
  if (w < 0 || h < 0 || (w > 0 && h > std::numeric_limits<int>::max() / 3 / w)) {
    throw Error(
        ErrorKind::value, "image",
        "expected a size whose pixel count fits in an int, got " + std::to_string(w) + " x " + std::to_string(h));
  }
  rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  for (std::size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = static_cast<std::uint8_t>(fill >> 16);
    rgb[i + 1] = static_cast<std::uint8_t>(fill >> 8);
    rgb[i + 2] = static_cast<std::uint8_t>(fill);
  }
}

void Image::set(int x, int y, std::uint32_t c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  std::uint8_t* p = &rgb[(static_cast<std::size_t>(y) * width + x) * 3];
  p[0] = static_cast<std::uint8_t>(c >> 16);
  p[1] = static_cast<std::uint8_t>(c >> 8);
  p[2] = static_cast<std::uint8_t>(c);
}

std::uint32_t Image::get(int x, int y) const {
  if (x < 0 || y < 0 || x >= width || y >= height) return 0;
  const std::uint8_t* p = &rgb[(static_cast<std::size_t>(y) * width + x) * 3];
  return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | p[2];
}

std::string encode_png(const Image& image, const std::string& name) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3) {
    throw Error(
        ErrorKind::value, name,
        "expected a non-empty RGB image, got " + std::to_string(image.width) + " x " + std::to_string(image.height));
  }
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  std::string bytes;
  bool encoded = png_image_write_get_memory_size(png, size, 0, image.rgb.data(), 0, nullptr) != 0;
  if (encoded) {
    bytes.resize(size);
    encoded = png_image_write_to_memory(&png, bytes.data(), &size, 0, image.rgb.data(), 0, nullptr) != 0;
  }
  if (!encoded) {
    const std::string message = png.message;
    png_image_free(&png);
    throw Error(ErrorKind::value, name, "expected an image PNG can encode, got an error: " + message);
  }
  bytes.resize(size);
  return bytes;
}

void write_png(const std::string& path, const Image& image) { write_file(path, encode_png(image, path)); }

Image read_png(const std::string& path) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&png, path.c_str())) {
    throw Error(ErrorKind::value, path, std::string("expected a readable PNG file, got an error: ") + png.message);
  }
  png.format = PNG_FORMAT_RGB;
  Image image(static_cast<int>(png.width), static_cast<int>(png.height));
  if (!png_image_finish_read(&png, nullptr, image.rgb.data(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    throw Error(ErrorKind::value, path, "expected a readable PNG file, got an error: " + message);
  }
  return image;
}

}  // namespace sdpa::io
