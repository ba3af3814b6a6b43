// The .npy format (numpy/lib/format.py, NEP 1): "\x93NUMPY", a major and minor version
// byte, a little-endian header length (2 bytes in 1.0, 4 bytes in 2.0 and 3.0), an ASCII
// Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}, then the raw
// data. Every length in a hostile file is checked against the bytes actually present
// before anything is indexed or allocated, so the largest allocation is bounded by the
// size of the input.
#include "io/npy.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "common/half.h"
#include "io/file.h"
#include "io/npy_format.h"
#include "io/output_files.h"
#include "sdpa/error.h"

namespace sdpa::io {

using npy_format::kMagic;

namespace {

// No real tensor has more dimensions; the limit bounds the work a hostile shape causes
// and matches what the rest of sdpa can index (NumPy's own limit is 64).
constexpr std::size_t kMaxRank = 32;
constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;

[[noreturn]] void fail(const std::string& name, const std::string& message, ErrorKind kind = ErrorKind::value) {
  throw Error(kind, name, message);
}

// A character as an error message should show it: printable ASCII quoted, anything else
// (NUL, control bytes, Latin-1 / UTF-8 garbage) in hex, so messages stay readable.
std::string describe_char(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

// A value read from the file, quoted for an error message (see io/file.h).
std::string quote(std::string_view text) { return quote_untrusted(text, 40); }

struct Dtype {
  DType dtype;
  std::size_t itemsize;
  bool swap;  // stored in the other byte order than the host's
};

// Accepts the descr strings NumPy writes for the dtypes sdpa has: '<f2', '<f4', '<f8',
// their big-endian '>' and native '=' forms, and bool ('|b1', or '?', which np.dtype
// also accepts), and int8 ('|i1'). Byte order is optional, as in np.dtype ('f4' is native).
std::optional<Dtype> parse_descr(std::string_view descr) {
  if (descr == "?" || descr == "|b1" || descr == "|?" || descr == "b1" || descr == "<b1" || descr == ">b1" ||
      descr == "=b1") {
    return Dtype{DType::boolean, 1, false};
  }
  // int8 (quantized K/V): one byte, no byte order ('|i1', or 'i1').
  if (descr == "|i1" || descr == "i1" || descr == "<i1" || descr == ">i1" || descr == "=i1")
    return Dtype{DType::int8, 1, false};
  bool big = !kLittleEndianHost;
  if (!descr.empty() && (descr[0] == '<' || descr[0] == '>' || descr[0] == '=')) {
    if (descr[0] == '<') big = false;
    if (descr[0] == '>') big = true;
    descr.remove_prefix(1);
  }
  const bool swap = big == kLittleEndianHost;
  if (descr == "f2") return Dtype{DType::float16, 2, swap};
  if (descr == "f4") return Dtype{DType::float32, 4, swap};
  if (descr == "f8") return Dtype{DType::float64, 8, swap};
  return std::nullopt;
}

// A recursive-descent parser for the header dict. It accepts exactly the Python literal
// subset NumPy writes (and ast.literal_eval would accept for these keys), so a file that
// parses here means the same thing it means to NumPy.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  struct Header {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::int64_t> shape;
  };

  Header parse() {
    // NumPy 1.0/2.0 headers are Latin-1 and 3.0 headers UTF-8, but every header sdpa
    // can use is pure ASCII; rejecting other bytes up front keeps the rest simple.
    for (std::size_t i = 0; i < text_.size(); ++i) {
      const auto c = static_cast<unsigned char>(text_[i]);
      if (c >= 0x80 || c == 0) {
        fail(name_,
             "expected an ASCII header, got byte " + describe_char(c) + " at header offset " + std::to_string(i));
      }
    }
    Header header;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    expect('{', "a header dict starting with '{'");
    skip_space();
    while (!at('}')) {
      const std::string key = parse_string("a quoted key");
      skip_space();
      expect(':', "':' after key " + quote(key));
      skip_space();
      if (key == "descr") {
        if (have_descr) fail(name_, "expected each header key once, got 'descr' twice");
        if (!at('\'') && !at('"')) {
          fail(name_,
               "expected 'descr' to be a dtype string such as '<f4', got " + found() +
                   " (structured dtypes are not supported)",
               ErrorKind::type);
        }
        header.descr = parse_string("a dtype string");
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) fail(name_, "expected each header key once, got 'fortran_order' twice");
        header.fortran_order = parse_bool();
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) fail(name_, "expected each header key once, got 'shape' twice");
        header.shape = parse_shape();
        have_shape = true;
      } else {
        fail(name_, "expected header keys 'descr', 'fortran_order' and 'shape', got " + quote(key));
      }
      skip_space();
      if (at(',')) {
        ++pos_;
        skip_space();
      } else if (!at('}')) {
        fail(name_, "expected ',' or '}' after the value of " + quote(key) + ", got " + found());
      }
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) fail(name_, "expected only padding after the header dict, got " + found());
    if (!have_descr) fail(name_, "expected a 'descr' key in the header, got none");
    if (!have_fortran) fail(name_, "expected a 'fortran_order' key in the header, got none");
    if (!have_shape) fail(name_, "expected a 'shape' key in the header, got none");
    return header;
  }

 private:
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  // What the parser is looking at, for "got ..." in messages.
  std::string found() const {
    if (pos_ >= text_.size()) return "the end of the header";
    return describe_char(static_cast<unsigned char>(text_[pos_])) + " at header offset " + std::to_string(pos_);
  }

  // Python's whitespace inside brackets (NumPy pads with spaces and ends with '\n').
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\f')) {
      ++pos_;
    }
  }

  void expect(char c, const std::string& what) {
    if (!at(c)) fail(name_, "expected " + what + ", got " + found());
    ++pos_;
  }

  // A single- or double-quoted string without escapes: neither NumPy's keys nor any
  // dtype sdpa accepts contains a backslash, so one is reported instead of interpreted.
  std::string parse_string(const std::string& what) {
    if (!at('\'') && !at('"')) fail(name_, "expected " + what + ", got " + found());
    const char quote_char = text_[pos_++];
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote_char) {
      if (text_[pos_] == '\\') fail(name_, "expected a string without escapes in the header, got '\\'");
      if (text_[pos_] == '\n') break;  // Python strings cannot span lines
      ++pos_;
    }
    if (!at(quote_char)) {
      fail(name_, std::string("expected a closing quote (") + quote_char + ")" + " for the string at header offset " +
                      std::to_string(start - 1) + ", got " + found());
    }
    std::string value(text_.substr(start, pos_ - start));
    ++pos_;
    return value;
  }

  bool parse_bool() {
    const std::string_view rest = text_.substr(pos_);
    auto word_ends = [&](std::size_t n) {
      return rest.size() == n || !(std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_');
    };
    if (rest.starts_with("True") && word_ends(4)) {
      pos_ += 4;
      return true;
    }
    if (rest.starts_with("False") && word_ends(5)) {
      pos_ += 5;
      return false;
    }
    fail(name_, "expected 'fortran_order' to be True or False, got " + found());
  }

  // A Python int literal as NumPy writes one: decimal digits, no sign, no leading zeros.
  std::int64_t parse_dim() {
    if (at('-')) fail(name_, "expected non-negative dimensions in 'shape', got " + found());
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
      fail(name_, "expected an integer dimension in 'shape', got " + found());
    }
    const std::size_t start = pos_;
    std::int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, text_[pos_] - '0', &value)) {
        fail(name_, "expected dimensions that fit in 64 bits, got one starting " +
                        quote(text_.substr(start, pos_ + 1 - start)));
      }
      ++pos_;
    }
    if (pos_ - start > 1 && text_[start] == '0') {
      fail(name_, "expected a decimal integer dimension, got " + quote(text_.substr(start, pos_ - start)));
    }
    // "3.0", "3L", "3e2", "3j" are not ints (or not Python 3 ints).
    if (pos_ < text_.size() &&
        (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.' || text_[pos_] == '_')) {
      fail(name_, "expected an integer dimension in 'shape', got " + found());
    }
    return value;
  }

  // A tuple: "()", "(3,)", "(3, 4)", "(3, 4,)". "(3)" is an int in Python, not a tuple.
  std::vector<std::int64_t> parse_shape() {
    expect('(', "'shape' to be a tuple starting with '('");
    std::vector<std::int64_t> shape;
    bool trailing_comma = false;
    skip_space();
    while (!at(')')) {
      if (shape.size() == kMaxRank)
        fail(name_, "expected at most " + std::to_string(kMaxRank) + " dimensions, got " +
                        std::to_string(kMaxRank + 1) + " or more");
      shape.push_back(parse_dim());
      skip_space();
      trailing_comma = at(',');
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (!at(')')) {
        fail(name_, "expected ',' or ')' in 'shape', got " + found());
      }
    }
    ++pos_;  // ')'
    if (shape.size() == 1 && !trailing_comma) fail(name_, "expected 'shape' to be a tuple, got a parenthesised int");
    return shape;
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

}  // namespace

namespace npy_format {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

std::uint32_t read_le(const unsigned char* p, std::size_t n) {
  std::uint32_t value = 0;
  for (std::size_t i = n; i-- > 0;) value = (value << 8) | p[i];
  return value;
}

void byte_swap(std::byte* data, std::size_t count, std::size_t itemsize) {
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* item = data + i * itemsize;
    for (std::size_t a = 0, b = itemsize - 1; a < b; ++a, --b) std::swap(item[a], item[b]);
  }
}

// Fortran order is column-major: the first index varies fastest. Walk the source
// sequentially with an odometer over the multi-index and scatter each element to its
// row-major position.
static void fortran_to_row_major(const unsigned char* src, std::byte* dst, const std::vector<std::int64_t>& shape,
                          std::size_t itemsize) {
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> row_major_stride(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) row_major_stride[d] = row_major_stride[d + 1] * shape[d + 1];
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t count = 1;
  for (std::int64_t size : shape) count *= size;
  std::int64_t dst_offset = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + dst_offset * static_cast<std::int64_t>(itemsize), src + i * static_cast<std::int64_t>(itemsize),
                itemsize);
    for (std::size_t d = 0; d < rank; ++d) {
      if (++index[d] < shape[d]) {
        dst_offset += row_major_stride[d];
        break;
      }
      dst_offset -= (shape[d] - 1) * row_major_stride[d];
      index[d] = 0;
    }
  }
}

// NumPy's bool is one byte, 0 or 1; any other value has no defined meaning here, and
// code that treats bool as 0/1 arithmetic would silently misbehave. `first` is the
// index of data[0] among the file's data bytes, for the message.
void check_bools(const unsigned char* data, std::uint64_t count, DType dtype, const std::string& name,
                 std::uint64_t first) {
  if (dtype != DType::boolean) return;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (data[i] > 1) {
      fail(name, "expected bool bytes 0 or 1, got " + std::to_string(data[i]) + " at data byte " +
                     std::to_string(first + i));
    }
  }
}

// The preamble and header of a .npy file whose first `size` bytes are `p` (at least the
// preamble and header) and whose whole length is `file_size`: everything checked but the
// data bytes themselves.
NpyLayout parse_layout(const unsigned char* p, std::size_t size, std::uint64_t file_size, const std::string& name) {
  if (size < kMagic.size() + 2) {
    fail(name, "expected at least the 8-byte .npy preamble (\\x93NUMPY and a version), got a " + std::to_string(size) +
                   "-byte file");
  }
  if (std::memcmp(p, kMagic.data(), kMagic.size()) != 0) {
    fail(name, "expected the .npy magic string \\x93NUMPY, got " +
                   quote(std::string_view(reinterpret_cast<const char*>(p), kMagic.size())));
  }
  const unsigned major = p[6], minor = p[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(name,
         "expected .npy format version 1.0, 2.0 or 3.0, got " + std::to_string(major) + "." + std::to_string(minor));
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble = kMagic.size() + 2 + length_bytes;
  if (size < preamble) {
    fail(name, "expected a " + std::to_string(preamble) + "-byte preamble for version " + std::to_string(major) +
                   ".0, got a " + std::to_string(size) + "-byte file");
  }
  const std::size_t header_length = read_le(p + 8, length_bytes);
  if (header_length > size - preamble) {
    fail(name, "expected a header length within the file's " + std::to_string(size) + " bytes, got " +
                   std::to_string(header_length));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(p + preamble), header_length);
  const HeaderParser::Header header = HeaderParser(header_text, name).parse();

  const std::optional<Dtype> dtype = parse_descr(header.descr);
  if (!dtype) {
    fail(name,
         "expected dtype '<f2', '<f4', '<f8' (or big-endian '>') or bool '|b1', got " + quote(header.descr) +
             " (convert with arr.astype(np.float32))",
         ErrorKind::type);
  }

  // Checked before the Tensor exists: its constructor allocates. Dims of size 0 count as
  // 1 so that (0, 2**62, 2**62) is rejected as well: its row-major strides overflow even
  // though it holds no element.
  std::int64_t extent = static_cast<std::int64_t>(dtype->itemsize);
  for (std::int64_t dim : header.shape) {
    if (__builtin_mul_overflow(extent, dim > 0 ? dim : 1, &extent)) {
      fail(name, "expected a shape whose element and byte counts fit in 64 bits, got " + shape_text(header.shape) +
                     " of " + std::to_string(dtype->itemsize) + "-byte elements");
    }
  }
  std::int64_t numel = 1;
  for (std::int64_t dim : header.shape) numel *= dim;  // cannot overflow: bounded by extent
  const std::uint64_t data_bytes = static_cast<std::uint64_t>(numel) * dtype->itemsize;
  const std::size_t data_offset = preamble + header_length;
  const std::uint64_t available = file_size - data_offset;
  if (available < data_bytes) {
    fail(name, "expected " + std::to_string(data_bytes) + " data bytes for the header's shape, got " +
                   std::to_string(available) + " (truncated file)");
  }
  if (available > data_bytes) {
    fail(name, "expected " + std::to_string(data_bytes) + " data bytes for the header's shape, got " +
                   std::to_string(available) + " (trailing bytes)");
  }

  NpyLayout layout;
  layout.dtype = dtype->dtype;
  layout.shape = header.shape;
  layout.fortran_order = header.fortran_order;
  layout.swap = dtype->swap;
  layout.itemsize = dtype->itemsize;
  layout.data_offset = data_offset;
  layout.numel = numel;
  return layout;
}

}  // namespace npy_format

using npy_format::byte_swap;
using npy_format::check_bools;
using npy_format::parse_layout;
using npy_format::shape_text;

Tensor parse_npy(const void* bytes, std::size_t size, const std::string& name) {
  if (bytes == nullptr && size != 0) fail(name, "expected file contents, got a null pointer");
  const auto* p = static_cast<const unsigned char*>(bytes);
  const NpyLayout layout = parse_layout(p, size, size, name);
  const std::uint64_t data_bytes = static_cast<std::uint64_t>(layout.numel) * layout.itemsize;
  const unsigned char* data = p + layout.data_offset;
  check_bools(data, data_bytes, layout.dtype, name, 0);

  Tensor tensor(layout.dtype, layout.shape);
  auto* out = static_cast<std::byte*>(tensor.data());
  if (data_bytes != 0) {
    if (layout.fortran_order && layout.shape.size() > 1) {
      npy_format::fortran_to_row_major(data, out, layout.shape, layout.itemsize);
    } else {
      std::memcpy(out, data, data_bytes);
    }
    if (layout.swap) byte_swap(out, static_cast<std::size_t>(layout.numel), layout.itemsize);
  }
  return tensor;
}

Tensor read_npy(const std::string& path) {
  const std::vector<char> contents = read_file(path, ".npy");
  return parse_npy(contents.data(), contents.size(), path);
}

std::string npy_header(DType dtype, const std::vector<std::int64_t>& shape, const std::string& name) {
  // Refuse to write what read_npy would refuse to read back.
  if (shape.size() > kMaxRank) {
    fail(name, "expected at most " + std::to_string(kMaxRank) + " dimensions to write, got " +
                   std::to_string(shape.size()));
  }
  const char* descr = nullptr;
  switch (dtype) {
    case DType::float16:
      descr = "<f2";
      break;
    case DType::bfloat16:  // NumPy has no bfloat16; float32 holds every bfloat16 exactly.
    case DType::float32:
      descr = "<f4";
      break;
    case DType::float64:
      descr = "<f8";
      break;
    case DType::boolean:
      descr = "|b1";
      break;
    case DType::int8:
      descr = "|i1";
      break;
  }

  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  // NumPy's rule: pad with spaces so that magic + version + length + header is a
  // multiple of 64 bytes (the data then starts aligned), the last byte being '\n'.
  constexpr std::size_t kPreamble = 10;
  const std::size_t total = (kPreamble + header.size() + 1 + 63) / 64 * 64;
  header.append(total - kPreamble - header.size() - 1, ' ');
  header += '\n';

  std::string preamble(reinterpret_cast<const char*>(kMagic.data()), kMagic.size());
  preamble += '\x01';
  preamble += '\x00';
  preamble += static_cast<char>(header.size() & 0xff);
  preamble += static_cast<char>((header.size() >> 8) & 0xff);

  return preamble + header;
}

std::string encode_npy(const Tensor& tensor, const std::string& name) {
  const DType dtype = tensor.dtype();
  const std::size_t itemsize = dtype == DType::bfloat16 ? 4 : dtype_size(dtype);
  // The data in little-endian order, converting bfloat16 to float32.
  const std::size_t count = static_cast<std::size_t>(tensor.numel());
  std::string bytes = npy_header(dtype, tensor.shape(), name);
  const std::size_t data_start = bytes.size();
  bytes.resize(data_start + count * itemsize);
  char* data = bytes.data() + data_start;
  if (dtype == DType::bfloat16) {
    const auto* src = static_cast<const std::byte*>(tensor.data());
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      const float value = detail::bf16_to_float(bits);
      std::memcpy(data + 4 * i, &value, 4);
    }
  } else if (count != 0) {
    std::memcpy(data, tensor.data(), count * itemsize);
  }
  if constexpr (!kLittleEndianHost) byte_swap(reinterpret_cast<std::byte*>(data), count, itemsize);
  return bytes;
}

void write_npy(const std::string& path, const Tensor& tensor) { write_file(path, encode_npy(tensor, path)); }

}  // namespace sdpa::io
