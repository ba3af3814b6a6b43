// The .npy reader is the CLI's door for user files, so beyond round trips it must turn
// every malformed or hostile file into sdpa::Error naming the file — never a crash, an
// out-of-bounds read, or an allocation sized by an unchecked header field.
#include "io/npy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;
using sdpa::io::parse_npy;
using sdpa::io::read_npy;
using sdpa::io::write_npy;

// A .npy file built by hand: preamble for `version` (1, 2 or 3), the header text as
// given (no padding added unless `pad`), then `data`.
std::string npy_file(const std::string& header, const std::string& data, int version = 1, bool pad = true) {
  std::string text = header;
  const std::size_t preamble = version == 1 ? 10 : 12;
  if (pad) {
    const std::size_t total = (preamble + text.size() + 1 + 63) / 64 * 64;
    text.append(total - preamble - text.size() - 1, ' ');
    text += '\n';
  }
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  out += static_cast<char>(text.size() & 0xff);
  out += static_cast<char>((text.size() >> 8) & 0xff);
  if (version != 1) {
    out += static_cast<char>((text.size() >> 16) & 0xff);
    out += static_cast<char>((text.size() >> 24) & 0xff);
  }
  return out + text + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

Tensor parse(const std::string& bytes, const std::string& name = "test.npy") {
  return parse_npy(bytes.data(), bytes.size(), name);
}

class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sdpa_npy_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& file) const { return (dir_ / file).string(); }

  std::filesystem::path dir_;
};

Tensor make_tensor(DType dtype, std::vector<std::int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    // Values exact in every dtype (small integers and halves), with both signs.
    t.set(i, dtype == DType::boolean ? static_cast<double>(i % 3 == 0) : 0.5 * static_cast<double>(i % 17) - 3.0);
  }
  return t;
}

TEST_F(NpyFileTest, RoundTripsEveryDtypeAndShape) {
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {5}, {2, 3}, {2, 0, 4}, {3, 1, 4, 5}};
  for (DType dtype : {DType::float16, DType::float32, DType::float64, DType::boolean}) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(std::string(sdpa::dtype_name(dtype)) + " rank " + std::to_string(shape.size()));
      const Tensor original = make_tensor(dtype, shape);
      write_npy(path("t.npy"), original);
      const Tensor back = read_npy(path("t.npy"));
      EXPECT_EQ(back.dtype(), dtype);
      EXPECT_EQ(back.shape(), shape);
      ASSERT_EQ(back.nbytes(), original.nbytes());
      if (original.nbytes() != 0) {
        EXPECT_EQ(std::memcmp(back.data(), original.data(), original.nbytes()), 0);
      }
    }
  }
}

// A rank of ring attention reads only its rows (positioned reads of the payload): the rows
// asked for, in the order asked, equal those of the whole file read at once; the layout
// comes from the header alone; rows outside the file and Fortran order are refused.
TEST_F(NpyFileTest, ReadsOnlyTheRowsAskedFor) {
  for (DType dtype : {DType::float16, DType::float32, DType::float64, DType::boolean}) {
    SCOPED_TRACE(sdpa::dtype_name(dtype));
    const Tensor whole = make_tensor(dtype, {2, 3, 7, 5});
    write_npy(path("w.npy"), whole);
    EXPECT_EQ(sdpa::io::read_npy_layout(path("w.npy")).shape, whole.shape());
    std::vector<std::int64_t> shape;
    const Tensor rows = sdpa::io::read_npy_rows(path("w.npy"), {{1, 2}, {4, 7}}, &shape);
    EXPECT_EQ(shape, whole.shape());
    ASSERT_EQ(rows.shape(), (std::vector<std::int64_t>{2, 3, 4, 5}));
    for (std::int64_t m = 0; m < 6; ++m)
      for (std::int64_t r = 0; r < 4; ++r)
        for (std::int64_t c = 0; c < 5; ++c) {
          const std::int64_t i = r == 0 ? 1 : r + 3;
          ASSERT_EQ(rows.get((m * 4 + r) * 5 + c), whole.get((m * 7 + i) * 5 + c)) << m << ' ' << r << ' ' << c;
        }
  }
  try {
    sdpa::io::read_npy_rows(path("w.npy"), {{5, 8}}, nullptr);
    ADD_FAILURE() << "rows past the end were read";
  } catch (const sdpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected rows within [0, 7)"), std::string::npos) << e.what();
  }
}

// NumPy has no bfloat16: it goes out as float32, which holds every bfloat16 exactly.
TEST_F(NpyFileTest, WritesBfloat16AsFloat32) {
  const Tensor original = make_tensor(DType::bfloat16, {4, 3});
  write_npy(path("b.npy"), original);
  const Tensor back = read_npy(path("b.npy"));
  EXPECT_EQ(back.dtype(), DType::float32);
  EXPECT_EQ(back.shape(), original.shape());
  for (std::int64_t i = 0; i < original.numel(); ++i) EXPECT_EQ(back.get(i), original.get(i));
}

// NumPy's layout rule, which numpy.load does not check but memory-mapping readers rely on:
// the data starts at a multiple of 64 bytes and the header ends in '\n'.
TEST_F(NpyFileTest, WrittenHeaderIsPaddedTo64BytesLikeNumPy) {
  write_npy(path("h.npy"), make_tensor(DType::float32, {2, 3}));
  std::ifstream in(path("h.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_length =
      static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  EXPECT_EQ((10 + header_length) % 64, 0u);
  EXPECT_EQ(bytes[10 + header_length - 1], '\n');
  EXPECT_EQ(bytes.substr(10, 59), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(bytes.size(), 10 + header_length + 6 * 4);
}

TEST_F(NpyFileTest, MissingFileErrorNamesThePath) {
  const std::string missing = path("does_not_exist.npy");
  try {
    read_npy(missing);
    FAIL() << "expected sdpa::Error";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), missing);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos);
  }
}

TEST_F(NpyFileTest, UnwritablePathErrorNamesThePath) {
  const std::string bad = path("no_such_dir/out.npy");
  try {
    write_npy(bad, make_tensor(DType::float32, {2}));
    FAIL() << "expected sdpa::Error";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), bad);
  }
}

// A (2, 3) array saved with fortran_order=True stores column by column:
// a[0,0], a[1,0], a[0,1], a[1,1], a[0,2], a[1,2]. The reader must hand back row-major.
TEST(NpyParse, FortranOrderBecomesRowMajor) {
  const std::vector<float> column_major = {0, 10, 1, 11, 2, 12};  // a[i][j] = 10 i + j
  const Tensor t =
      parse(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", raw_bytes(column_major)));
  ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{2, 3}));
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(t.at({i, j}), 10.0 * i + j) << i << "," << j;
}

TEST(NpyParse, FortranOrderRank3) {
  // a[i][j][k] = 100 i + 10 j + k, shape (2, 3, 4), stored with i fastest.
  std::vector<double> column_major;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) column_major.push_back(100.0 * i + 10.0 * j + k);
  const Tensor t =
      parse(npy_file("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3, 4), }", raw_bytes(column_major)));
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) EXPECT_EQ(t.at({i, j, k}), 100.0 * i + 10.0 * j + k);
}

TEST(NpyParse, BigEndianIsByteSwapped) {
  // 1.5f = 0x3fc00000, 1.5 = 0x3ff8000000000000, 1.5 (half) = 0x3e00; stored big-endian.
  const Tensor f4 =
      parse(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string("\x3f\xc0\x00\x00", 4)));
  EXPECT_EQ(f4.dtype(), DType::float32);
  EXPECT_EQ(f4.get(0), 1.5);
  const Tensor f8 = parse(npy_file("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }",
                                   std::string("\x3f\xf8\x00\x00\x00\x00\x00\x00", 8)));
  EXPECT_EQ(f8.get(0), 1.5);
  const Tensor f2 =
      parse(npy_file("{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }", std::string("\x3e\x00", 2)));
  EXPECT_EQ(f2.dtype(), DType::float16);
  EXPECT_EQ(f2.get(0), 1.5);
}

TEST(NpyParse, AcceptsVersions2And3KeysInAnyOrderAndLooseWhitespace) {
  const std::string data = raw_bytes(std::vector<float>{1, 2});
  for (int version : {2, 3}) {
    const Tensor t = parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data, version));
    EXPECT_EQ(t.get(1), 2.0);
  }
  const Tensor t = parse(npy_file("{ \"shape\" :(2 ,),'fortran_order':False,\n 'descr':'=f4'}", data));
  EXPECT_EQ(t.shape(), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(t.get(0), 1.0);
}

TEST(NpyParse, AcceptsBoolSpellings) {
  for (const char* descr : {"|b1", "?"}) {
    const Tensor t = parse(npy_file(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (3,), }",
                                    std::string("\x01\x00\x01", 3)));
    EXPECT_EQ(t.dtype(), DType::boolean);
    EXPECT_EQ(t.get(0), 1.0);
    EXPECT_EQ(t.get(1), 0.0);
  }
}

struct HostileCase {
  const char* label;
  std::string bytes;
  const char* message_part;  // a fragment the message must contain
};

std::vector<HostileCase> hostile_cases() {
  const std::string f4x2 = raw_bytes(std::vector<float>{1, 2});
  auto header = [](const std::string& descr, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  };
  std::string rank33 = "(";
  for (int i = 0; i < 33; ++i) rank33 += "1, ";
  rank33 += ")";
  std::string long_header = npy_file(header("<f4", "(2,)"), f4x2);
  long_header[8] = '\xff';
  long_header[9] = '\xff';  // header length 65535 in a ~90-byte file
  return {
      {"empty file", "", "preamble"},
      {"truncated magic", "\x93NUM", "preamble"},
      {"wrong magic", npy_file(header("<f4", "(2,)"), f4x2).replace(1, 5, "NUMPZ"), "magic"},
      {"version 4.0",
       [&] {
         auto s = npy_file(header("<f4", "(2,)"), f4x2);
         s[6] = 4;
         return s;
       }(),
       "version"},
      {"version 2 preamble cut", std::string("\x93NUMPY\x02\x00\x10", 9), "preamble"},
      {"header length past EOF", long_header, "header length within the file"},
      {"header not a dict", npy_file("['descr', '<f4']", f4x2), "'{'"},
      {"empty header", npy_file("", f4x2, 1, false), "'{'"},
      {"missing shape", npy_file("{'descr': '<f4', 'fortran_order': False}", f4x2), "'shape'"},
      {"missing descr", npy_file("{'fortran_order': False, 'shape': (2,)}", f4x2), "'descr'"},
      {"missing fortran_order", npy_file("{'descr': '<f4', 'shape': (2,)}", f4x2), "'fortran_order'"},
      {"unknown key", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4x2), "'x'"},
      {"duplicate key", npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f4x2),
       "twice"},
      {"int32 dtype", npy_file(header("<i4", "(2,)"), f4x2), "'<i4'"},
      {"complex64 dtype", npy_file(header("<c8", "(1,)"), f4x2), "'<c8'"},
      {"structured dtype", npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", f4x2),
       "structured"},
      {"fortran_order not bool", npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", f4x2),
       "True or False"},
      {"fortran_order Truely", npy_file("{'descr': '<f4', 'fortran_order': Truely, 'shape': (2,)}", f4x2),
       "True or False"},
      {"negative dim", npy_file(header("<f4", "(-2,)"), f4x2), "non-negative"},
      {"float dim", npy_file(header("<f4", "(2.0,)"), f4x2), "integer"},
      {"shape is an int", npy_file(header("<f4", "(2)"), f4x2), "tuple"},
      {"shape is a list", npy_file(header("<f4", "[2]"), f4x2), "tuple"},
      {"dim overflows int64", npy_file(header("<f4", "(99999999999999999999,)"), f4x2), "64 bits"},
      {"element count overflow", npy_file(header("<f4", "(1099511627776, 1099511627776)"), f4x2), "64 bits"},
      {"byte count overflow", npy_file(header("<f8", "(2305843009213693952,)"), f4x2), "64 bits"},
      {"overflow hidden behind a zero dim", npy_file(header("<f4", "(0, 4611686018427387904, 4)"), ""), "64 bits"},
      {"data shorter than claimed", npy_file(header("<f4", "(3,)"), f4x2), "truncated"},
      {"huge claim, tiny file", npy_file(header("<f8", "(1000000000000,)"), f4x2), "truncated"},
      {"trailing data", npy_file(header("<f4", "(1,)"), f4x2), "trailing"},
      {"bool byte 2", npy_file(header("|b1", "(3,)"), std::string("\x01\x02\x00", 3)), "0 or 1"},
      {"rank 33", npy_file(header("<f4", rank33), std::string(4, '\0')), "at most 32"},
      {"unterminated string", npy_file("{'descr': '<f4", f4x2), "closing"},
      {"string across a newline", npy_file("{'descr': '<f4\n', 'fortran_order': False, 'shape': (2,)}", f4x2),
       "closing"},
      {"unterminated dict", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", f4x2), "'}'"},
      {"garbage after dict", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", f4x2), "padding"},
      {"non-ASCII garbage", npy_file("{'descr': '<f4\xc3\xa9', 'fortran_order': False, 'shape': (2,)}", f4x2), "ASCII"},
      {"NUL in header",
       [&] {
         auto h = header("<f4", "(2,)");
         h[15] = '\0';
         return npy_file(h, f4x2);
       }(),
       "ASCII"},
  };
}

TEST(NpyParse, HostileInputsGiveErrorsNamingTheFile) {
  for (const HostileCase& c : hostile_cases()) {
    SCOPED_TRACE(c.label);
    try {
      parse(c.bytes, "hostile.npy");
      ADD_FAILURE() << "expected sdpa::Error";
    } catch (const sdpa::Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.argument(), "hostile.npy");
      EXPECT_EQ(message.rfind("hostile.npy: expected ", 0), 0u) << message;
      EXPECT_NE(message.find(c.message_part), std::string::npos) << message;
    }
  }
}

// The example message the design asks for: expected vs. found, with the file's size.
TEST(NpyParse, HeaderLengthMessageSaysExpectedAndFound) {
  std::string bytes = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  bytes.resize(80);
  bytes[8] = '\xff';
  bytes[9] = '\xff';
  try {
    parse(bytes, "q.npy");
    FAIL() << "expected sdpa::Error";
  } catch (const sdpa::Error& e) {
    EXPECT_STREQ(e.what(), "q.npy: expected a header length within the file's 80 bytes, got 65535");
  }
}

TEST(NpyParse, UnsupportedDtypeIsATypeError) {
  try {
    parse(npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')));
    FAIL() << "expected sdpa::Error";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::type);
  }
}

// Every prefix of a valid file is a truncated file: each must be an error, none a crash
// (run under ASan this checks that no length is trusted before it is checked).
TEST(NpyParse, EveryTruncationIsAnError) {
  const std::string full = npy_file("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }",
                                    raw_bytes(std::vector<double>{1, 2, 3, 4}));
  ASSERT_NO_THROW(parse(full));
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::vector<char> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_npy(prefix.data(), prefix.size(), "cut.npy"), sdpa::Error) << "prefix of " << n << " bytes";
  }
}

}  // namespace
