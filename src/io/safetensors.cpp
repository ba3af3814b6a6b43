// The safetensors format (huggingface/safetensors, docs "Format"): an 8-byte
// little-endian unsigned header length N, N bytes of a UTF-8 JSON object
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>"}}
// then the data buffer; offsets are relative to the buffer's start. Every number in a
// hostile file is checked against the bytes actually present before anything is indexed
// or allocated, so the largest allocation is bounded by the size of the input.
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "io/file.h"
#include "io/output_files.h"
#include "sdpa/error.h"

namespace sdpa::io {
namespace {

using Json = nlohmann::json;

// The reference implementation's limit (safetensors/src/tensor.rs MAX_HEADER_SIZE): a
// header bigger than this is an attack, not a model.
constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
// As for .npy: no real tensor has more dimensions, and the limit bounds the work a
// hostile shape causes.
constexpr std::size_t kMaxRank = 32;
constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;

[[noreturn]] void fail(const std::string& name, const std::string& message, ErrorKind kind = ErrorKind::value) {
  throw Error(kind, name, message);
}

// Text taken from the file, quoted for an error message (see io/file.h).
std::string quote(std::string_view text) { return quote_untrusted(text, 60); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

struct DtypeInfo {
  std::size_t itemsize;
  std::optional<DType> dtype;  // empty: a valid safetensors dtype sdpa does not hold
};

// Every dtype of safetensors' Dtype enum with a whole number of bytes per element.
std::optional<DtypeInfo> lookup_dtype(std::string_view name) {
  if (name == "F64") return DtypeInfo{8, DType::float64};
  if (name == "F32") return DtypeInfo{4, DType::float32};
  if (name == "F16") return DtypeInfo{2, DType::float16};
  if (name == "BF16") return DtypeInfo{2, DType::bfloat16};
  if (name == "BOOL") return DtypeInfo{1, DType::boolean};
  if (name == "I8") return DtypeInfo{1, DType::int8};
  if (name == "I64" || name == "U64") return DtypeInfo{8, std::nullopt};
  if (name == "I32" || name == "U32") return DtypeInfo{4, std::nullopt};
  if (name == "I16" || name == "U16") return DtypeInfo{2, std::nullopt};
  if (name == "U8" || name == "F8_E5M2" || name == "F8_E4M3" || name == "F8_E8M0")
    return DtypeInfo{1, std::nullopt};
  return std::nullopt;
}

const char* dtype_code(DType dtype) {
  switch (dtype) {
    case DType::float64:
      return "F64";
    case DType::float32:
      return "F32";
    case DType::float16:
      return "F16";
    case DType::bfloat16:
      return "BF16";
    case DType::boolean:
      return "BOOL";
    case DType::int8:
      return "I8";
  }
  return "?";
}

// One parsed header entry, before its bytes are looked at.
struct Entry {
  std::string name;
  std::string dtype_name;
  DtypeInfo dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

// Parses the header text. nlohmann::json builds the document; the parser callback
// enforces what the DOM would hide: objects nested deeper than the format needs (a
// "[[[[..." bomb would otherwise cost memory and, on destruction, stack) and duplicate
// keys (the DOM silently keeps the last one, which would let two readers of the same
// file disagree on its contents).
Json parse_header_json(std::string_view text, const std::string& name) {
  struct Violation {
    std::string message;
  };
  std::vector<std::set<std::string>> keys_per_object;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // Root object (0), an entry or __metadata__ (1), a shape or offsets array (2).
        if (depth > 2) throw Violation{"expected a header nested at most 3 levels deep, got more"};
        if (event == Json::parse_event_t::object_start) keys_per_object.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_per_object.empty() && !keys_per_object.back().insert(parsed.get<std::string>()).second) {
          throw Violation{"expected each key once in an object, got " + quote(parsed.get<std::string>()) + " twice"};
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Violation& v) {
    fail(name, v.message);
  } catch (const Json::exception& e) {
    // nlohmann's messages name the byte offset and the token; they hold no file bytes
    // beyond a short excerpt, which quote() makes safe.
    fail(name, "expected a valid JSON header, got a parse error: " + quote(e.what()));
  }
}

std::uint64_t get_offset(const Json& value, const std::string& name, const std::string& entry) {
  if (!value.is_number_unsigned()) {
    fail(name,
         "expected 'data_offsets' of " + quote(entry) + " to be non-negative integers, got " + quote(value.dump()));
  }
  return value.get<std::uint64_t>();
}

Entry parse_entry(const std::string& key, const Json& value, const std::string& name) {
  if (!value.is_object()) {
    fail(name, "expected the entry " + quote(key) + " to be an object with dtype, shape and data_offsets, got " +
                   quote(value.dump()));
  }
  Entry entry;
  entry.name = key;
  for (const auto& [field, _] : value.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      fail(name, "expected only 'dtype', 'shape' and 'data_offsets' in " + quote(key) + ", got " + quote(field));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) fail(name, "expected " + quote(field) + " in the entry " + quote(key) + ", got none");
  }

  const Json& dtype = value["dtype"];
  if (!dtype.is_string())
    fail(name, "expected 'dtype' of " + quote(key) + " to be a string, got " + quote(dtype.dump()));
  entry.dtype_name = dtype.get<std::string>();
  const std::optional<DtypeInfo> info = lookup_dtype(entry.dtype_name);
  if (!info) {
    fail(name,
         "expected a safetensors dtype (F64, F32, F16, BF16, BOOL, I64, ..., U8) for " + quote(key) + ", got " +
             quote(entry.dtype_name),
         ErrorKind::type);
  }
  entry.dtype = *info;

  const Json& shape = value["shape"];
  if (!shape.is_array()) fail(name, "expected 'shape' of " + quote(key) + " to be a list, got " + quote(shape.dump()));
  if (shape.size() > kMaxRank) {
    fail(name, "expected at most " + std::to_string(kMaxRank) + " dimensions for " + quote(key) + ", got " +
                   std::to_string(shape.size()));
  }
  for (const Json& dim : shape) {
    // An unsigned JSON integer above 2^63 would turn negative as int64.
    if (!dim.is_number_unsigned() || dim.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(name,
           "expected 'shape' of " + quote(key) + " to hold non-negative 64-bit integers, got " + quote(shape.dump()));
    }
    entry.shape.push_back(static_cast<std::int64_t>(dim.get<std::uint64_t>()));
  }

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(name, "expected 'data_offsets' of " + quote(key) + " to be [begin, end], got " + quote(offsets.dump()));
  }
  entry.begin = get_offset(offsets[0], name, key);
  entry.end = get_offset(offsets[1], name, key);
  if (entry.end < entry.begin) {
    fail(name, "expected 'data_offsets' of " + quote(key) + " with begin <= end, got [" + std::to_string(entry.begin) +
                   ", " + std::to_string(entry.end) + "]");
  }

  // Element count times item size, overflow-checked. Zero-size dims count as 1 here too
  // (as in the .npy reader), so (0, 2^62, 2^62) is refused: its strides overflow.
  std::uint64_t extent = info->itemsize;
  for (std::int64_t dim : entry.shape) {
    if (__builtin_mul_overflow(extent, static_cast<std::uint64_t>(dim > 0 ? dim : 1), &extent) ||
        extent > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(name,
           "expected a shape whose byte count fits in 64 bits for " + quote(key) + ", got " + shape_text(entry.shape));
    }
  }
  std::uint64_t bytes = info->itemsize;
  for (std::int64_t dim : entry.shape) bytes *= static_cast<std::uint64_t>(dim);  // bounded by extent
  if (entry.end - entry.begin != bytes) {
    fail(name, "expected " + std::to_string(bytes) + " bytes for " + quote(key) + " (" + entry.dtype_name + " " +
                   shape_text(entry.shape) + "), got data_offsets [" + std::to_string(entry.begin) + ", " +
                   std::to_string(entry.end) + "]");
  }
  return entry;
}

[[maybe_unused]] void byte_swap(std::byte* data, std::size_t count, std::size_t itemsize) {
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* item = data + i * itemsize;
    for (std::size_t a = 0, b = itemsize - 1; a < b; ++a, --b) std::swap(item[a], item[b]);
  }
}

}  // namespace

SafetensorsFile parse_safetensors(const void* bytes, std::size_t size, const std::string& name) {
  if (bytes == nullptr && size != 0) fail(name, "expected file contents, got a null pointer");
  const auto* p = static_cast<const unsigned char*>(bytes);
  if (size < 8) fail(name, "expected at least the 8-byte header length, got a " + std::to_string(size) + "-byte file");
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | p[i];
  if (header_size > size - 8) {
    fail(name, "expected a header length within the file's " + std::to_string(size) + " bytes, got " +
                   std::to_string(header_size));
  }
  if (header_size > kMaxHeaderSize) {
    fail(name, "expected a header of at most " + std::to_string(kMaxHeaderSize) + " bytes, got " +
                   std::to_string(header_size));
  }
  // The reference implementation requires the header to start with '{' (so a file is
  // recognisable) and allows trailing spaces as padding, which JSON ignores anyway.
  const std::string_view header(reinterpret_cast<const char*>(p + 8), static_cast<std::size_t>(header_size));
  if (header.empty() || header[0] != '{') {
    fail(name, "expected the header to start with '{', got " +
                   (header.empty() ? std::string("an empty header") : quote(header.substr(0, 1))));
  }
  const Json root = parse_header_json(header, name);
  if (!root.is_object()) fail(name, "expected the header to be a JSON object, got " + quote(root.dump()));

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(name, "expected '__metadata__' to be an object, got " + quote(value.dump()));
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          fail(name, "expected '__metadata__' values to be strings, got " + quote(meta_value.dump()) + " for " +
                         quote(meta_key));
        }
        file.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(key, value, name));
  }

  // The byte ranges must tile [0, buffer size) exactly, in some order: the reference
  // implementation rejects gaps, overlaps and trailing bytes (MetadataIncompleteBuffer).
  const std::uint64_t buffer_size = size - 8 - header_size;
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t cursor = 0;
  for (const Entry* e : by_offset) {
    if (e->begin != cursor) {
      fail(name, "expected the tensors' data_offsets to tile the data buffer, got " + quote(e->name) +
                     " starting at byte " + std::to_string(e->begin) + " where byte " + std::to_string(cursor) +
                     (e->begin < cursor ? " is (overlap)" : " is (gap)"));
    }
    cursor = e->end;
  }
  if (cursor != buffer_size) {
    fail(name, "expected a data buffer of " + std::to_string(cursor) + " bytes for the header's tensors, got " +
                   std::to_string(buffer_size) + (buffer_size < cursor ? " (truncated file)" : " (trailing bytes)"));
  }

  const unsigned char* data = p + 8 + header_size;
  for (const Entry& e : entries) {
    if (!e.dtype.dtype) {
      file.skipped[e.name] = e.dtype_name;
      continue;
    }
    const unsigned char* src = data + e.begin;
    const std::uint64_t count = e.end - e.begin;
    if (*e.dtype.dtype == DType::boolean) {
      // One byte, 0 or 1; anything else has no defined meaning (as in the .npy reader).
      for (std::uint64_t i = 0; i < count; ++i) {
        if (src[i] > 1) {
          fail(name, "expected BOOL bytes 0 or 1 in " + quote(e.name) + ", got " + std::to_string(src[i]) +
                         " at element " + std::to_string(i));
        }
      }
    }
    Tensor tensor(*e.dtype.dtype, e.shape);
    if (count != 0) std::memcpy(tensor.data(), src, count);
    if constexpr (!kLittleEndianHost) {
      byte_swap(static_cast<std::byte*>(tensor.data()), count / e.dtype.itemsize, e.dtype.itemsize);
    }
    file.tensors.emplace(e.name, std::move(tensor));
  }
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::vector<char> contents = read_file(path, ".safetensors");
  return parse_safetensors(contents.data(), contents.size(), path);
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in the order given (the data follows that order).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor_name == "__metadata__") fail(tensor_name, "expected a tensor name other than '__metadata__'");
    if (!seen.insert(tensor_name).second) fail(tensor_name, "expected unique tensor names, got this one twice");
    const std::uint64_t bytes = tensor->nbytes();
    header[tensor_name] = {
        {"dtype", dtype_code(tensor->dtype())}, {"shape", tensor->shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception&) {
    // dump() refuses strings that are not valid UTF-8, which JSON requires.
    fail("tensors", "expected tensor names and metadata in valid UTF-8, got invalid bytes");
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  const std::size_t data_start = out.size();
  out.resize(data_start + offset);
  char* cursor = out.data() + data_start;
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor->nbytes() != 0) std::memcpy(cursor, tensor->data(), tensor->nbytes());
    if constexpr (!kLittleEndianHost) {
      byte_swap(reinterpret_cast<std::byte*>(cursor), static_cast<std::size_t>(tensor->numel()),
                dtype_size(tensor->dtype()));
    }
    cursor += tensor->nbytes();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(path, serialize_safetensors(tensors, metadata));
}

}  // namespace sdpa::io
