// How the ranks of a collective call agree that it is valid before any ring traffic:
// each rank checks its own arguments, then one collective tells every rank whether any
// failed (and which error), and whether all of them describe the same global call. A
// rank with a bad shard therefore raises on every rank, instead of leaving the others
// waiting in a receive that never completes.
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

}  // namespace sdpa::distributed::detail
