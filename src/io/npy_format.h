// The pieces of the .npy format (npy.cpp) that a reader of part of a file needs too
// (npy_rows.cpp: a ring rank's rows by positioned reads): the magic, the preamble's
// little-endian lengths, the header's checks, and the data's byte order and bool bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/npy.h"

namespace sdpa::io::npy_format {

inline constexpr std::array<unsigned char, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};

// "(2, 3)", "(4,)": a shape as NumPy prints it, for messages.
std::string shape_text(const std::vector<std::int64_t>& shape);

// The little-endian unsigned integer of the `n` bytes at `p` (n <= 4).
std::uint32_t read_le(const unsigned char* p, std::size_t n);

// Reverses the bytes of each of `count` items of `itemsize` bytes (big-endian data).
void byte_swap(std::byte* data, std::size_t count, std::size_t itemsize);

// Refuses bool data bytes other than 0 and 1 (nothing for other dtypes). `first` is the
// index of data[0] among the file's data bytes, for the message naming `name`.
void check_bools(const unsigned char* data, std::uint64_t count, DType dtype, const std::string& name,
                 std::uint64_t first);

// The preamble and header of a .npy file whose first `size` bytes are `p` (at least the
// preamble and header) and whose whole length is `file_size`: everything checked but the
// data bytes themselves. Throws sdpa::Error naming `name`.
NpyLayout parse_layout(const unsigned char* p, std::size_t size, std::uint64_t file_size, const std::string& name);

}  // namespace sdpa::io::npy_format
