// The CLI's ring run. Output files: rank 0 creates a temporary file beside each output
// (io::create_temporary_beside, in the folder of the file io::OutputFiles resolved: a
// symlink's target, as a single-process run writes through it, with the permission bits
// the single-process run gives), writes the .npy header and sizes it; every rank
// writes its rows at their offsets (pwrite); when every rank has succeeded (one
// collective), rank 0 renames the temporaries over the outputs — all or nothing, as
// io::OutputFiles does for a single process (commit). Every step that can fail on one
// rank is followed by an agreement (src/dist/agreement.h), the renames included, so an
// error reaches every rank.
#include "ring_run.h"

#include <mpi.h>

#include <cerrno>
#include <cstdio>  // renameat2 (glibc >= 2.28, _GNU_SOURCE)
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "dist/agreement.h"
#include "io/npy.h"
#include "io/output_files.h"
#include "sdpa/distributed.h"

namespace sdpa::cli {

namespace {

using distributed::detail::agree;

std::vector<io::RowRange> io_rows(const std::vector<distributed::RowRange>& rows) {
  std::vector<io::RowRange> out;
  for (const auto& r : rows) out.push_back({r.begin, r.end});
  return out;
}

// One output written by every rank: rank 0's temporary, the header, then the rows.
// `target` is where io::OutputFiles found the output (symlinks followed: the link stays,
// its target is replaced, as in a single-process run).
struct SharedOutput {
  io::OutputFiles::Target target;
  std::string temporary;
  std::size_t header_bytes = 0;
};

void fail_io(const SharedOutput& out, const std::string& what) {
  throw Error(ErrorKind::value, out.target.argument, out.target.path + ": " + what + ": " + std::strerror(errno));
}

// Rank 0: the temporary beside the target, with the header and the full size.
void create_output(SharedOutput& out, const std::string& header, std::uint64_t data_bytes) {
  std::string name;
  const int fd = io::create_temporary_beside(out.target, name);
  if (fd < 0) fail_io(out, "cannot create a temporary beside it");
  out.temporary = name;
  const bool ok = ::pwrite(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()) &&
                  ::ftruncate(fd, static_cast<off_t>(header.size() + data_bytes)) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(name.c_str());
    fail_io(out, "cannot write its header");
  }
  out.header_bytes = header.size();
}

// This rank's rows of a (matrices, rows, cols) tensor whose file bytes are `encoded` (an
// encode_npy of the shard: header, then little-endian data).
void write_rows(const SharedOutput& out, const std::string& encoded, std::int64_t matrices, std::int64_t length,
                std::int64_t shard_rows, std::int64_t cols, const std::vector<distributed::RowRange>& rows) {
  const std::size_t elements = static_cast<std::size_t>(matrices * shard_rows * cols);
  // The shard's own header: 10 bytes of preamble (version 1.0) and the length they give.
  const std::size_t shard_header = 10 + (static_cast<unsigned char>(encoded[8]) |
                                         (static_cast<std::size_t>(static_cast<unsigned char>(encoded[9])) << 8));
  if (elements == 0) return;
  const std::size_t element = (encoded.size() - shard_header) / elements;
  const int fd = ::open(out.temporary.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail_io(out, "cannot open its temporary");
  bool ok = true;
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * element;
  for (std::int64_t m = 0; m < matrices && ok; ++m) {
    std::int64_t local = 0;
    for (const auto& r : rows) {
      const std::size_t count = static_cast<std::size_t>(r.end - r.begin) * row_bytes;
      const std::size_t from = shard_header + static_cast<std::size_t>(m * shard_rows + local) * row_bytes;
      const std::uint64_t at = out.header_bytes + static_cast<std::uint64_t>(m * length + r.begin) * row_bytes;
      if (count > 0 &&
          ::pwrite(fd, encoded.data() + from, count, static_cast<off_t>(at)) != static_cast<ssize_t>(count))
        ok = false;
      local += r.end - r.begin;
    }
  }
  if (::fsync(fd) != 0) ok = false;
  ::close(fd);
  if (!ok) fail_io(out, "cannot write this rank's rows");
}

// Rank 0: the temporaries renamed over the outputs, all or nothing. Each existing output
// is swapped with its temporary (renameat2's RENAME_EXCHANGE: one atomic step that leaves
// the old file under the temporary's name), so a later rename that fails can swap it
// back; a new output is renamed into place and removed again on failure. On success the
// old files are removed; on failure every output is as it was and no temporary is left.
// (A file system without RENAME_EXCHANGE gets a plain rename: the renames before a
// failing one then stay, io::OutputFiles' one gap.)
void commit(const std::vector<SharedOutput>& files) {
  enum class Done { exchanged, created, replaced };
  std::vector<Done> done;
  for (const SharedOutput& f : files) {
    const char* path = f.target.resolved_path.c_str();
    int status = ::renameat2(AT_FDCWD, f.temporary.c_str(), AT_FDCWD, path, RENAME_EXCHANGE);
    Done how = Done::exchanged;
    if (status != 0 && (errno == ENOENT || errno == EINVAL || errno == ENOSYS)) {
      // No file there yet (ENOENT), or no RENAME_EXCHANGE here: a plain rename.
      const bool existed = ::access(path, F_OK) == 0;
      status = std::rename(f.temporary.c_str(), path);
      how = existed ? Done::replaced : Done::created;
    }
    if (status != 0) {
      const int error = errno;
      for (std::size_t k = done.size(); k-- > 0;) {
        const SharedOutput& back = files[k];
        const char* back_path = back.target.resolved_path.c_str();
        if (done[k] == Done::exchanged)
          ::renameat2(AT_FDCWD, back.temporary.c_str(), AT_FDCWD, back_path, RENAME_EXCHANGE);
        else if (done[k] == Done::created)
          ::unlink(back_path);
      }
      for (const SharedOutput& t : files) ::unlink(t.temporary.c_str());
      errno = error;
      fail_io(f, "cannot replace it (no output was changed)");
    }
    done.push_back(how);
  }
  for (std::size_t k = 0; k < files.size(); ++k)
    if (done[k] == Done::exchanged) ::unlink(files[k].temporary.c_str());  // the old file
}

}  // namespace

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(nullptr, nullptr);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ring_run(const RunArgs& args, const Options& options) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const distributed::Partition partition =
      args.partition == "contiguous" ? distributed::Partition::contiguous : distributed::Partition::zigzag;

  // Each rank's rows of the three files (the global lengths from the headers alone).
  Tensor query, key, value;
  std::int64_t L = 0, S = 0;
  io::OutputFiles output_files;
  agree(
      comm,
      [&] {
        const auto length = [](const std::string& path) {
          const io::NpyLayout layout = io::read_npy_layout(path);
          if (layout.shape.size() < 2)
            throw Error(
                ErrorKind::value, path,
                "expected rank >= 2 ((..., seq, dim)), got a rank " + std::to_string(layout.shape.size()) + " array");
          return layout.shape[layout.shape.size() - 2];
        };
        // The single-process run's checks of the output paths (not a directory, an existing
        // folder, no file named twice), agreed on by every rank before any work. A device,
        // FIFO or descriptor is refused: its bytes come in order through one writer, and
        // here every rank writes its rows at their offsets into a file rank 0 renames (a
        // rename over /dev/null would replace the device node).
        output_files.add("--out", args.out);
        if (args.lse) output_files.add("--lse", *args.lse);
        for (const io::OutputFiles::Target& t : output_files.targets())
          if (t.direct)
            throw Error(ErrorKind::value, t.argument,
                        "expected a regular file or a new path with --ring (every rank writes its rows into it), "
                        "got a device, FIFO, socket or file descriptor: " +
                            t.path);
        L = length(args.query);
        S = length(args.key);
        // V is read with K's rows: a longer or shorter value file must not be cut to fit.
        if (const std::int64_t value_length = length(args.value); value_length != S)
          throw Error(ErrorKind::value, args.value,
                      "expected sequence length S = " + std::to_string(S) + " (the key's), got " +
                          std::to_string(value_length));
        query = io::read_npy_rows(args.query, io_rows(distributed::shard_rows(L, ranks, rank, partition)), nullptr);
        key = io::read_npy_rows(args.key, io_rows(distributed::shard_rows(S, ranks, rank, partition)), nullptr);
        value = io::read_npy_rows(args.value, io_rows(distributed::shard_rows(S, ranks, rank, partition)), nullptr);
        return std::string();
      },
      "--query");

  const std::vector<std::int64_t>& q_shape = query.shape();
  std::vector<std::int64_t> out_shape(q_shape.begin(), q_shape.end() - 1), lse_shape = out_shape;
  out_shape.push_back(value.shape().back());
  Tensor output(query.dtype(), out_shape);
  Tensor lse(query.dtype() == DType::float64 ? DType::float64 : DType::float32, lse_shape);
  ForwardOutputs outputs{output.view(), std::nullopt, std::nullopt};
  if (args.lse) outputs.lse = lse.view();
  // auto: float64 files on the CPU backend through the ordered exchange, whose output file
  // has the single-process run's bytes; the ring (which overlaps more) for the other dtypes
  // and for the reference backend (which makes no bitwise claim through the ordered one).
  const bool bitwise = query.dtype() == DType::float64 && options.backend != Backend::reference;
  const distributed::Exchange exchange = args.exchange == "all-gather" ? distributed::Exchange::all_gather
                                         : args.exchange == "ordered" || (args.exchange == "auto" && bitwise)
                                             ? distributed::Exchange::ordered
                                             : distributed::Exchange::ring;
  distributed::forward(comm, query.view(), key.view(), value.view(), outputs, {L, S, partition, exchange}, options);

  // The global shapes: this rank's with the sequence dim at L.
  std::vector<std::int64_t> global_out = out_shape, global_lse = lse_shape;
  global_out[global_out.size() - 2] = L;
  global_lse.back() = L;
  std::vector<SharedOutput> files;
  for (const io::OutputFiles::Target& t : output_files.targets()) files.push_back({t, "", 0});
  // Rank 0 creates the temporaries; every rank learns their names and header length.
  agree(
      comm,
      [&] {
        if (rank != 0) return std::string();
        for (SharedOutput& f : files) {
          const bool is_out = f.target.argument == "--out";
          const Tensor& t = is_out ? output : lse;
          const std::vector<std::int64_t>& shape = is_out ? global_out : global_lse;
          std::uint64_t count = 1;
          for (std::int64_t d : shape) count *= static_cast<std::uint64_t>(d);
          const std::size_t element = t.dtype() == DType::bfloat16 ? 4 : dtype_size(t.dtype());
          create_output(f, io::npy_header(t.dtype(), shape, f.target.argument), count * element);
        }
        return std::string();
      },
      "--out");
  for (SharedOutput& f : files) {
    long long header = static_cast<long long>(f.header_bytes);
    MPI_Bcast(&header, 1, MPI_LONG_LONG, 0, comm);
    f.header_bytes = static_cast<std::size_t>(header);
    int size = static_cast<int>(f.temporary.size());
    MPI_Bcast(&size, 1, MPI_INT, 0, comm);
    f.temporary.resize(static_cast<std::size_t>(size));
    MPI_Bcast(f.temporary.data(), size, MPI_CHAR, 0, comm);
  }
  const std::vector<distributed::RowRange> my_rows = distributed::shard_rows(L, ranks, rank, partition);
  const std::int64_t matrices =
      output.numel() / std::max<std::int64_t>(1, q_shape[q_shape.size() - 2] * out_shape.back());
  try {
    agree(
        comm,
        [&] {
          const std::int64_t shard = q_shape[q_shape.size() - 2];
          std::int64_t lse_matrices = 1;
          for (std::size_t d = 0; d + 1 < lse_shape.size(); ++d) lse_matrices *= lse_shape[d];
          for (const SharedOutput& f : files) {
            if (f.target.argument == "--out")
              write_rows(f, io::encode_npy(output, "--out"), shard == 0 ? 0 : matrices, L, shard, out_shape.back(),
                         my_rows);
            else
              write_rows(f, io::encode_npy(lse, "--lse"), lse_matrices, L, shard, 1, my_rows);
          }
          return std::string();
        },
        "--out");
  } catch (const Error&) {
    if (rank == 0)
      for (const SharedOutput& f : files) ::unlink(f.temporary.c_str());
    throw;
  }
  // Rank 0 commits; the outcome is agreed, so a rename failing there fails every rank.
  agree(
      comm,
      [&] {
        if (rank == 0) commit(files);
        return std::string();
      },
      "--out");
}

}  // namespace sdpa::cli
