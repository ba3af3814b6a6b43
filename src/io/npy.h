// NumPy .npy files (format versions 1.0, 2.0, 3.0): the way a NumPy or PyTorch user
// hands tensors to the CLI. The reader is hardened against hostile files: every
// malformed, truncated or oversized input ends in sdpa::Error, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::io {

// Parses a whole .npy file held in memory. Supported dtypes: float16, float32,
// float64 ('<f2', '<f4', '<f8', big-endian too) and bool ('|b1'); C or Fortran order
// (returned as packed row-major). `name` goes into error messages (a path, usually).
// Throws sdpa::Error(argument = name) on anything else.
Tensor parse_npy(const void* bytes, std::size_t size, const std::string& name);

// Reads a .npy file from disk; throws sdpa::Error naming `path`.
Tensor read_npy(const std::string& path);

// What a .npy file's preamble and header say, checked against the file's length.
struct NpyLayout {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  bool fortran_order = false;
  bool swap = false;  // big-endian data
  std::size_t itemsize = 4;
  std::size_t data_offset = 0;  // where the data starts in the file
  std::int64_t numel = 0;
};

// The layout of a .npy file, from its preamble and header alone (the data is not read).
NpyLayout read_npy_layout(const std::string& path);

// Rows [begin, end) of the second last dim (the sequence of a (..., H, L, E) tensor).
struct RowRange {
  std::int64_t begin = 0, end = 0;
};

// Only the given rows of a .npy file of rank >= 2 in C order, read with positioned reads
// of the payload (never the whole file: a rank of ring attention reads its own shard),
// concatenated along the second last dim in the order given. `shape` receives the
// file's full shape. Throws sdpa::Error naming `path` (a Fortran-order file, rows out of
// range, or anything read_npy refuses).
Tensor read_npy_rows(const std::string& path, const std::vector<RowRange>& rows, std::vector<std::int64_t>* shape);

// The .npy bytes encode_npy gives for a tensor of this dtype and shape, without the
// data: the preamble and header (its length a multiple of 64).
std::string npy_header(DType dtype, const std::vector<std::int64_t>& shape, const std::string& name);

// The bytes of `tensor` as a version 1.0 .npy file, little-endian, C order. bfloat16 has
// no NumPy dtype: it is written as float32. Throws sdpa::Error naming `name` for a tensor
// read_npy could not read back.
std::string encode_npy(const Tensor& tensor, const std::string& name);

// Writes encode_npy(tensor) to `path` as io::write_file does (output_files.h: a regular
// file replaced atomically, a device or FIFO written directly). Throws sdpa::Error
// naming `path` if it cannot be written; a failed write leaves the old file as it was.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace sdpa::io
