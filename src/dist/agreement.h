// How the ranks of a collective call agree that it is valid before any ring traffic:
// each rank checks its own arguments, then one collective tells every rank whether any
// failed (and which error), and whether all of them describe the same global call. A
// rank with a bad shard therefore raises on every rank, instead of leaving the others
// waiting in a receive that never completes. What fails after the agreement ends the job
// (after_agreement).
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace sdpa::distributed::detail {

// Runs `check` (which throws sdpa::Error, or returns this rank's signature: a text of
// everything that must be equal on every rank — dtypes, the dims other than the
// sequence, global lengths, partition, options). Collective: every rank of `comm` calls
// it. Throws on every rank when `check` threw on any (the lowest such rank's error, with
// its rank), or when the signatures differ (naming `argument`).
void agree(MPI_Comm comm, const std::function<std::string()>& check, const char* argument);

// Runs `work`, the part of a collective call after the agreement. Whatever it throws
// (memory running out in a kernel's scratch, say) ends the whole job: this rank prints
// the error with its rank and `call` to stderr and calls MPI_Abort on `comm`. Why not an
// error on every rank, as agree() gives: the other ranks are by then inside the ring,
// blocked in a receive or a collective that waits on this rank, and MPI has no way to
// reach them there (ULFM's fault tolerance came with Open MPI 5; Debian 12 has 4.1);
// MPI_Abort is the one call that ends them within seconds instead of never.
// Everything whose size the call knows is allocated before the agreement, so an error
// reaching this point is rare.
void after_agreement(MPI_Comm comm, const char* call, const std::function<void()>& work);

}  // namespace sdpa::distributed::detail
