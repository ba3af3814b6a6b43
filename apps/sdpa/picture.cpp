#include "picture.h"

#include <cstring>

#include "sdpa/error.h"

namespace sdpa::cli {
namespace {

std::shared_ptr<cairo_surface_t> own(cairo_surface_t* surface) {
  return std::shared_ptr<cairo_surface_t>(surface, cairo_surface_destroy);
}

}  // namespace

Picture::Picture(int w, int h) {
  if (w <= 0 || h <= 0) {
    throw Error(ErrorKind::value, "picture",
                "expected a positive size, got " + std::to_string(w) + " x " + std::to_string(h));
  }
  surface_ = own(cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h));
  if (const cairo_status_t status = cairo_surface_status(surface_.get()); status != CAIRO_STATUS_SUCCESS) {
    throw Error(ErrorKind::value, "picture",
                "expected a size Cairo can allocate, got " + std::to_string(w) + " x " + std::to_string(h) + ": " +
                    cairo_status_to_string(status));
  }
  const Context cr = draw_on(*this);
  set_colour(cr.get(), 0xffffff);
  cairo_paint(cr.get());
}

int Picture::width() const { return surface_ ? cairo_image_surface_get_width(surface_.get()) : 0; }
int Picture::height() const { return surface_ ? cairo_image_surface_get_height(surface_.get()) : 0; }

std::uint32_t Picture::pixel(int x, int y) const {
  if (x < 0 || y < 0 || x >= width() || y >= height()) return 0;
  cairo_surface_flush(surface_.get());  // drawing done through a context lands in the data
  const unsigned char* row = cairo_image_surface_get_data(surface_.get()) +
                             static_cast<std::ptrdiff_t>(y) * cairo_image_surface_get_stride(surface_.get());
  std::uint32_t value;  // RGB24: one native-endian 32-bit word per pixel, 0x00RRGGBB
  std::memcpy(&value, row + static_cast<std::ptrdiff_t>(x) * 4, sizeof value);
  return value & 0xffffff;
}

Context draw_on(const Picture& picture) {
  if (!picture.surface()) throw Error(ErrorKind::value, "picture", "expected a picture to draw on, got an empty one");
  return Context(cairo_create(picture.surface()), cairo_destroy);
}

void set_colour(cairo_t* cr, std::uint32_t rgb) {
  cairo_set_source_rgb(cr, ((rgb >> 16) & 0xff) / 255.0, ((rgb >> 8) & 0xff) / 255.0, (rgb & 0xff) / 255.0);
}

std::string encode_png(const Picture& picture, const std::string& name) {
  if (!picture.surface()) {
    throw Error(ErrorKind::value, name, "expected a non-empty picture, got 0 x 0");
  }
  std::string bytes;
  const cairo_status_t status = cairo_surface_write_to_png_stream(
      picture.surface(),
      [](void* closure, const unsigned char* data, unsigned int length) {
        static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
        return CAIRO_STATUS_SUCCESS;
      },
      &bytes);
  if (status != CAIRO_STATUS_SUCCESS) {
    throw Error(
        ErrorKind::value, name,
        std::string("expected a picture Cairo can encode as PNG, got an error: ") + cairo_status_to_string(status));
  }
  return bytes;
}

Picture decode_png(std::string_view bytes, const std::string& name) {
  struct Reader {
    std::string_view rest;
  } reader{bytes};
  const auto decoded = own(cairo_image_surface_create_from_png_stream(
      [](void* closure, unsigned char* data, unsigned int length) {
        auto& r = *static_cast<Reader*>(closure);
        if (r.rest.size() < length) return CAIRO_STATUS_READ_ERROR;
        std::memcpy(data, r.rest.data(), length);
        r.rest.remove_prefix(length);
        return CAIRO_STATUS_SUCCESS;
      },
      &reader));
  if (const cairo_status_t status = cairo_surface_status(decoded.get()); status != CAIRO_STATUS_SUCCESS) {
    throw Error(ErrorKind::value, name,
                std::string("expected a PNG Cairo can read, got an error: ") + cairo_status_to_string(status));
  }
  Picture picture(cairo_image_surface_get_width(decoded.get()), cairo_image_surface_get_height(decoded.get()));
  const Context cr = draw_on(picture);
  cairo_set_source_surface(cr.get(), decoded.get(), 0, 0);
  cairo_paint(cr.get());
  return picture;
}

}  // namespace sdpa::cli
