#include "dist/exchange.h"

#include <algorithm>
#include <cstdint>

namespace sdpa::distributed::detail {

namespace {

// MPI counts are int: a larger buffer goes as several messages of at most 1 GiB, in
// order (MPI keeps the order of messages between two ranks with the same tag).
constexpr std::size_t kMessageBytes = std::size_t{1} << 30;

}  // namespace

Transfer::~Transfer() {
  // Only after an exception between start() and wait(), on the way to MPI_Abort
  // (agreement.h's after_agreement): the buffers are about to be freed, so the transfers
  // must end first. They do: each peer posted the matching send and receive at the start
  // of the same step, before anything that waits on this rank.
  if (!requests_.empty()) wait();
}

void Transfer::start(const void* send, std::size_t send_bytes, int to, void* receive, std::size_t receive_bytes,
                     int from) {
  for (std::size_t at = 0; at < receive_bytes; at += kMessageBytes) {
    requests_.emplace_back();
    MPI_Irecv(static_cast<std::byte*>(receive) + at, static_cast<int>(std::min(kMessageBytes, receive_bytes - at)),
              MPI_BYTE, from, tag_, comm_, &requests_.back());
  }
  for (std::size_t at = 0; at < send_bytes; at += kMessageBytes) {
    requests_.emplace_back();
    MPI_Isend(static_cast<const std::byte*>(send) + at, static_cast<int>(std::min(kMessageBytes, send_bytes - at)),
              MPI_BYTE, to, tag_, comm_, &requests_.back());
  }
  bytes_sent_ += static_cast<double>(send_bytes);
}

void Transfer::broadcast(void* buffer, std::size_t bytes, int root) {
  for (std::size_t at = 0; at < bytes; at += kMessageBytes) {
    requests_.emplace_back();
    MPI_Ibcast(static_cast<std::byte*>(buffer) + at, static_cast<int>(std::min(kMessageBytes, bytes - at)), MPI_BYTE,
               root, comm_, &requests_.back());
  }
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &ranks);
  if (rank == root) bytes_sent_ += static_cast<double>(bytes) * (ranks - 1);
}

void Transfer::poll() {
  if (requests_.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
  if (done) requests_.clear();
}

void Transfer::wait() {
  if (requests_.empty()) return;
  MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  requests_.clear();
}

}  // namespace sdpa::distributed::detail
