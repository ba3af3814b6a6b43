// Part of a .npy file by positioned reads (pread): a ring rank reads only its own rows of
// Q, K and V, never the whole file. The header is parsed and checked as read_npy does
// (npy_format.h); then each (matrix, row range) of the payload is one read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "io/npy.h"
#include "io/npy_format.h"
#include "sdpa/error.h"

namespace sdpa::io {

using npy_format::byte_swap;
using npy_format::check_bools;
using npy_format::kMagic;
using npy_format::parse_layout;
using npy_format::read_le;
using npy_format::shape_text;

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& message) {
  throw Error(ErrorKind::value, name, message);
}

// A .npy file opened for positioned reads, its layout parsed from the preamble and header
// alone.
struct OpenNpy {
  // Closed however the constructor ends (a member's destructor runs when the body throws).
  struct Descriptor {
    int value = -1;
    ~Descriptor() {
      if (value >= 0) ::close(value);
    }
  } fd;
  NpyLayout layout;
  explicit OpenNpy(const std::string& path);
  void read_at(const std::string& path, void* into, std::size_t count, std::uint64_t at) const;
};

void OpenNpy::read_at(const std::string& path, void* into, std::size_t count, std::uint64_t at) const {
  auto* p = static_cast<char*>(into);
  while (count > 0) {
    const ssize_t got = ::pread(fd.value, p, count, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail(path, "expected " + std::to_string(count) + " more bytes at byte " + std::to_string(at) + ", got " +
                     (got < 0 ? std::string(std::strerror(errno)) : std::string("end of file")));
    p += got, at += static_cast<std::uint64_t>(got), count -= static_cast<std::size_t>(got);
  }
}

OpenNpy::OpenNpy(const std::string& path) {
  fd.value = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.value < 0) fail(path, std::string("expected a readable .npy file, got ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.value, &st) != 0 || !S_ISREG(st.st_mode)) fail(path, "expected a regular .npy file");
  const std::uint64_t file_size = static_cast<std::uint64_t>(st.st_size);
  // The preamble (12 bytes at most), then exactly the header it announces.
  std::vector<unsigned char> prefix(static_cast<std::size_t>(std::min<std::uint64_t>(file_size, 12)));
  read_at(path, prefix.data(), prefix.size(), 0);
  if (prefix.size() >= 10 && std::memcmp(prefix.data(), kMagic.data(), kMagic.size()) == 0 &&
      (prefix[6] == 1 || prefix.size() == 12)) {
    const std::size_t length_bytes = prefix[6] == 1 ? 2 : 4;
    const std::uint64_t wanted = kMagic.size() + 2 + length_bytes + read_le(prefix.data() + 8, length_bytes);
    prefix.resize(static_cast<std::size_t>(std::min(file_size, wanted)));
    read_at(path, prefix.data(), prefix.size(), 0);
  }
  layout = parse_layout(prefix.data(), prefix.size(), file_size, path);
}

}  // namespace

NpyLayout read_npy_layout(const std::string& path) { return OpenNpy(path).layout; }

Tensor read_npy_rows(const std::string& path, const std::vector<RowRange>& rows, std::vector<std::int64_t>* shape) {
  const OpenNpy file(path);
  const NpyLayout& layout = file.layout;
  if (layout.shape.size() < 2)
    fail(path, "expected rank >= 2 ((..., seq, dim)) for a row read, got " + shape_text(layout.shape));
  if (layout.fortran_order) fail(path, "expected C order for a row read (np.ascontiguousarray), got Fortran order");
  const std::size_t d = layout.shape.size() - 2;
  const std::int64_t length = layout.shape[d], cols = layout.shape[d + 1];
  std::int64_t matrices = 1, kept = 0;
  for (std::size_t k = 0; k < d; ++k) matrices *= layout.shape[k];
  for (const RowRange& r : rows) {
    if (r.begin < 0 || r.end < r.begin || r.end > length)
      fail(path, "expected rows within [0, " + std::to_string(length) + "), got [" + std::to_string(r.begin) + ", " +
                     std::to_string(r.end) + ")");
    kept += r.end - r.begin;
  }
  std::vector<std::int64_t> out_shape = layout.shape;
  out_shape[d] = kept;
  Tensor tensor(layout.dtype, out_shape);
  auto* out = static_cast<unsigned char*>(tensor.data());
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(cols) * layout.itemsize;
  for (std::int64_t m = 0; m < matrices; ++m)
    for (const RowRange& r : rows) {
      const std::uint64_t first = (static_cast<std::uint64_t>(m * length + r.begin)) * row_bytes;
      const std::uint64_t count = static_cast<std::uint64_t>(r.end - r.begin) * row_bytes;
      file.read_at(path, out, static_cast<std::size_t>(count), layout.data_offset + first);
      check_bools(out, count, layout.dtype, path, first);
      out += count;
    }
  if (layout.swap)
    byte_swap(static_cast<std::byte*>(tensor.data()), static_cast<std::size_t>(tensor.numel()), layout.itemsize);
  if (shape) *shape = layout.shape;
  return tensor;
}

}  // namespace sdpa::io
