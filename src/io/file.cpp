#include "io/file.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "sdpa/error.h"

namespace sdpa::io {

std::vector<char> read_file(const std::string& path, const std::string& description) {
  const std::string expected = "expected a readable " + description + " file, got ";
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(ErrorKind::value, path, expected + "an error: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::value, path, expected + "a file that cannot be opened");
  // Allocating the file's size is safe: it is what is actually on disk.
  std::vector<char> contents(static_cast<std::size_t>(file_size));
  in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (static_cast<std::uintmax_t>(in.gcount()) != file_size) {
    throw Error(ErrorKind::value, path,
                "expected to read " + std::to_string(file_size) + " bytes, got " + std::to_string(in.gcount()));
  }
  return contents;
}

std::string quote_untrusted(std::string_view text, std::size_t limit) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > limit) out += "...";
  return out + "'";
}

}  // namespace sdpa::io
