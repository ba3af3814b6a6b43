// The safetensors reader: round trips of every dtype sdpa holds, the byte layout the
// reference implementation writes, and a table of hostile files that must each end in
// sdpa::Error naming the file — never a crash, an out-of-bounds read or an allocation
// sized by an unchecked header field.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "sdpa/error.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;
using sdpa::io::parse_safetensors;
using sdpa::io::SafetensorsFile;

// A file from a header text and data bytes, the length prefix computed.
std::string file_of(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

SafetensorsFile parse(const std::string& bytes) {
  return parse_safetensors(bytes.data(), bytes.size(), "model.safetensors");
}

Tensor filled(DType dtype, std::vector<std::int64_t> shape, double start) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dtype == DType::boolean ? (i % 3 == 0) : start + 0.25 * i);
  return t;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeShapeAndTheMetadata) {
  const Tensor f64 = filled(DType::float64, {2, 3}, -1), f32 = filled(DType::float32, {4}, 2),
               f16 = filled(DType::float16, {1, 2, 2}, 0.5), bf16 = filled(DType::bfloat16, {3}, -3),
               b = filled(DType::boolean, {5}, 0), scalar = filled(DType::float32, {}, 7),
               empty = filled(DType::float64, {0, 4}, 0);
  const std::string bytes = sdpa::io::serialize_safetensors(
      {{"w.f64", &f64}, {"f32", &f32}, {"f16", &f16}, {"bf16", &bf16}, {"mask", &b}, {"s", &scalar}, {"e", &empty}},
      {{"format", "pt"}});
  // Header padded to 8 bytes so the data starts aligned.
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const SafetensorsFile file = parse(bytes);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_TRUE(file.skipped.empty());
  for (const auto& [name, t] : std::vector<std::pair<std::string, const Tensor*>>{{"w.f64", &f64},
                                                                                  {"f32", &f32},
                                                                                  {"f16", &f16},
                                                                                  {"bf16", &bf16},
                                                                                  {"mask", &b},
                                                                                  {"s", &scalar},
                                                                                  {"e", &empty}}) {
    const Tensor& got = file.tensors.at(name);
    EXPECT_EQ(got.dtype(), t->dtype()) << name;
    EXPECT_EQ(got.shape(), t->shape()) << name;
    ASSERT_EQ(got.nbytes(), t->nbytes()) << name;
    if (t->nbytes()) {
      EXPECT_EQ(std::memcmp(got.data(), t->data(), t->nbytes()), 0) << name;
    }
  }
}

// The reference implementation's layout, byte for byte: {"a":{"dtype":"F32","shape":
// [2],"data_offsets":[0,8]}} then two little-endian floats (safetensors docs, "Format").
TEST(SafetensorsTest, ReadsTheReferenceLayout) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}}  )";
  std::string data(16, '\0');
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), values, 8);
  data[8] = 7;
  const SafetensorsFile file = parse(file_of(header, data));
  EXPECT_EQ(file.tensors.at("a").get(0), 1.5);
  EXPECT_EQ(file.tensors.at("a").get(1), -2.0);
  // An integer tensor is checked and listed, not loaded.
  EXPECT_EQ(file.tensors.count("b"), 0u);
  EXPECT_EQ(file.skipped.at("b"), "I64");
}

TEST(SafetensorsTest, WritesAndReadsFiles) {
  const std::string path = (std::filesystem::temp_directory_path() / "sdpa_safetensors_test.safetensors").string();
  const Tensor t = filled(DType::float32, {3, 2}, 1);
  sdpa::io::write_safetensors(path, {{"t", &t}});
  const SafetensorsFile file = sdpa::io::read_safetensors(path);
  EXPECT_EQ(std::memcmp(file.tensors.at("t").data(), t.data(), t.nbytes()), 0);
  std::filesystem::remove(path);
  try {
    sdpa::io::read_safetensors(path);
    FAIL() << "read a missing file";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), path);
  }
  EXPECT_THROW(sdpa::io::write_safetensors("/nonexistent-dir/x.safetensors", {{"t", &t}}), sdpa::Error);
  EXPECT_THROW(sdpa::io::serialize_safetensors({{"t", &t}, {"t", &t}}), sdpa::Error);
  EXPECT_THROW(sdpa::io::serialize_safetensors({{"__metadata__", &t}}), sdpa::Error);
}

struct Hostile {
  const char* what;
  std::string bytes;
  const char* needle;  // part of the expected message
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

std::vector<Hostile> hostile_files() {
  const std::string ok_entry = entry("a", "F32", "[2]", "[0,8]");
  const std::string eight(8, '\0');
  std::string huge_length(8, '\0');
  huge_length[7] = '\x7f';
  std::string rank33 = "[1";
  for (int d = 1; d < 33; ++d) rank33 += ",1";
  rank33 += "]";
  return {
      {"empty file", "", "8-byte header length"},
      {"short file", std::string(5, '\0'), "8-byte header length"},
      {"header length past the end", huge_length + "{}", "within the file"},
      {"header not an object", file_of("[1,2]"), "start with '{'"},
      {"empty header", file_of(""), "empty header"},
      {"invalid JSON", file_of("{\"a\":"), "valid JSON"},
      {"not JSON at all", file_of("{garbage}"), "valid JSON"},
      {"invalid UTF-8", file_of("{\"\xff\xfe\":1}"), "valid JSON"},
      {"deep nesting", file_of("{\"a\":{\"b\":{\"c\":{\"d\":[[[[1]]]]}}}}"), "nested"},
      {"array bomb", file_of("{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}"), "nested"},
      {"duplicate tensor", file_of("{" + ok_entry + "," + ok_entry + "}", eight), "twice"},
      {"duplicate field", file_of(R"({"a":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", eight),
       "twice"},
      {"entry not an object", file_of("{\"a\":3}"), "to be an object"},
      {"unknown field", file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight), "'x'"},
      {"missing field", file_of(R"({"a":{"dtype":"F32","shape":[2]}})", eight), "data_offsets"},
      {"unknown dtype", file_of("{" + entry("a", "F33", "[2]", "[0,8]") + "}", eight), "F33"},
      {"dtype not a string", file_of(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight), "string"},
      {"negative dim", file_of("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", eight), "non-negative"},
      {"fractional dim", file_of("{" + entry("a", "F32", "[2.5]", "[0,8]") + "}", eight), "non-negative"},
      {"dim above 2^63", file_of("{" + entry("a", "F32", "[9223372036854775808]", "[0,8]") + "}", eight),
       "non-negative"},
      {"byte count overflow", file_of("{" + entry("a", "F32", "[4294967296,4294967296]", "[0,8]") + "}", eight),
       "64 bits"},
      {"strides overflow with a zero dim", file_of("{" + entry("a", "F32", "[0,4611686018427387904,4]", "[0,0]") + "}"),
       "64 bits"},
      {"rank 33", file_of("{" + entry("a", "F32", rank33, "[0,4]") + "}", std::string(4, '\0')), "at most 32"},
      {"shape not a list", file_of("{" + entry("a", "F32", "2", "[0,8]") + "}", eight), "list"},
      {"offsets disagree with the shape", file_of("{" + entry("a", "F32", "[3]", "[0,8]") + "}", eight), "12 bytes"},
      {"end before begin", file_of("{" + entry("a", "F32", "[0]", "[8,0]") + "}", eight), "begin <= end"},
      {"offsets of three numbers", file_of("{" + entry("a", "F32", "[2]", "[0,8,8]") + "}", eight), "[begin, end]"},
      {"negative offset", file_of("{" + entry("a", "F32", "[2]", "[-8,0]") + "}", eight), "non-negative"},
      {"gap between tensors",
       file_of("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}",
               std::string(12, '\0')),
       "gap"},
      {"overlapping tensors",
       file_of("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[4,8]") + "}", eight),
       "overlap"},
      {"truncated data", file_of("{" + ok_entry + "}", std::string(7, '\0')), "truncated"},
      {"trailing bytes", file_of("{" + ok_entry + "}", std::string(9, '\0')), "trailing"},
      {"offset past the data", file_of("{" + entry("a", "F32", "[2]", "[100,108]") + "}", eight), "gap"},
      {"bool byte 2", file_of("{" + entry("m", "BOOL", "[2]", "[0,2]") + "}", std::string("\x01\x02", 2)), "0 or 1"},
      {"metadata not strings", file_of(R"({"__metadata__":{"a":1}})"), "strings"},
      {"metadata not an object", file_of(R"({"__metadata__":"x"})"), "object"},
  };
}

TEST(SafetensorsTest, HostileFilesEndInAnErrorNamingTheFile) {
  for (const Hostile& h : hostile_files()) {
    try {
      parse(h.bytes);
      ADD_FAILURE() << h.what << ": accepted";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(e.argument(), "model.safetensors") << h.what;
      EXPECT_NE(std::string(e.what()).find(h.needle), std::string::npos) << h.what << ": " << e.what();
    }
  }
}

// A header length above the 100 MB limit is refused before the header is looked at,
// even when the file really is that long.
TEST(SafetensorsTest, RefusesHeadersAboveTheReferenceLimit) {
  std::string bytes(8, '\0');
  const std::uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes.resize(8 + n, ' ');
  bytes[8] = '{';
  try {
    parse(bytes);
    FAIL() << "accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 100000000"), std::string::npos) << e.what();
  }
}

}  // namespace
