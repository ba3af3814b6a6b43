// The exchanges' transport: this rank's buffer to the next rank while the previous rank's
// arrives, with MPI_Isend / MPI_Irecv (the ring), or a buffer from its owner to every rank
// with MPI_Ibcast (the ordered exchange), so that the transfer runs while the shard in
// hand is computed (double buffering). The caller polls between pieces of its compute:
// Open MPI moves a large (rendezvous) message only inside MPI calls, so without a test
// now and then the transfer would wait for the final MPI_Waitall.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace sdpa::distributed::detail {

class Transfer {
 public:
  explicit Transfer(MPI_Comm comm, int tag) : comm_(comm), tag_(tag) {}
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();

  // Starts sending `send_bytes` to rank `to` and receiving `receive_bytes` from `from`.
  void start(const void* send, std::size_t send_bytes, int to, void* receive, std::size_t receive_bytes, int from);
  // Starts broadcasting `bytes` from rank `root`'s `buffer` into every other rank's
  // (MPI_Ibcast: collective, so every rank starts the same broadcasts in the same order).
  void broadcast(void* buffer, std::size_t bytes, int root);
  // Lets MPI move data (MPI_Testall); returns at once.
  void poll();
  // Blocks until both transfers are done.
  void wait();
  // Bytes this rank has sent through it (a broadcast counts its root's bytes once per
  // other rank, whatever tree MPI sends them along).
  double bytes_sent() const { return bytes_sent_; }

 private:
  MPI_Comm comm_;
  int tag_;
  std::vector<MPI_Request> requests_;
  double bytes_sent_ = 0;
};

}  // namespace sdpa::distributed::detail
