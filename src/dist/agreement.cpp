#include "dist/agreement.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>

#include "sdpa/error.h"

namespace sdpa::distributed::detail {

namespace {

// FNV-1a: equal texts give equal hashes; unequal ones differ but with probability 2^-64.
std::uint64_t hash_text(const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

void agree(MPI_Comm comm, const std::function<std::string()>& check, const char* argument) {
  if (comm == MPI_COMM_NULL) throw Error(ErrorKind::value, "comm", "expected a communicator, got MPI_COMM_NULL");
  int rank = 0;
  MPI_Comm_rank(comm, &rank);

  std::optional<Error> error;
  std::string signature;
  try {
    signature = check();
  } catch (const Error& e) {
    error = e;
  } catch (const std::exception& e) {  // out of memory reading a shard, say: still every rank's error
    error = Error(ErrorKind::value, argument, e.what());
  }
  // One reduction answers both questions: the lowest failing rank (or none) and whether
  // every signature hash is the same (min(h) == max(h), max taken as min of ~h).
  const std::uint64_t h = hash_text(signature);
  std::uint64_t local[3] = {error ? static_cast<std::uint64_t>(rank) : std::numeric_limits<std::uint64_t>::max(), h,
                            ~h};
  std::uint64_t global[3];
  MPI_Allreduce(local, global, 3, MPI_UINT64_T, MPI_MIN, comm);

  if (global[0] != std::numeric_limits<std::uint64_t>::max()) {
    // The failing rank's error, sent to every rank (a second collective, only on failure).
    const int root = static_cast<int>(global[0]);
    std::string text = error ? std::string(error->argument()) + '\n' + error->message() : std::string();
    int kind = error && error->kind() == ErrorKind::type ? 1 : 0;
    long long size = static_cast<long long>(text.size());
    MPI_Bcast(&size, 1, MPI_LONG_LONG, root, comm);
    MPI_Bcast(&kind, 1, MPI_INT, root, comm);
    text.resize(static_cast<std::size_t>(size));
    MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, root, comm);
    if (rank == root) throw *error;
    const std::size_t newline = text.find('\n');
    throw Error(kind == 1 ? ErrorKind::type : ErrorKind::value, text.substr(0, newline),
                text.substr(newline + 1) + " (on rank " + std::to_string(root) + ")");
  }
  if (global[1] != h || ~global[2] != h)
    throw Error(ErrorKind::value, argument,
                "expected the same call on every rank (dtype, dims other than the sequence, global lengths, "
                "partition, options), got a different one on some rank; this rank's: " +
                    signature);
}

void after_agreement(MPI_Comm comm, const char* call, const std::function<void()>& work) {
  std::string what;
  try {
    work();
    return;
  } catch (const std::exception& e) {  // sdpa::Error among them
    what = e.what();
  } catch (...) {
    what = "an unknown exception";
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::fprintf(stderr,
               "%s: rank %d failed after every rank had agreed on the call: %s; aborting the job (MPI_Abort), "
               "since the other ranks wait on this one's messages\n",
               call, rank, what.c_str());
  std::fflush(stderr);
  MPI_Abort(comm, 1);
  std::abort();  // MPI_Abort does not return; should an implementation's, this rank still ends
}

}  // namespace sdpa::distributed::detail
