// `mpirun -np N sdpa run --ring ...`: one attention call on .npy files, split along the
// sequence across the MPI ranks (sdpa::distributed). Built where MPI is found.
#pragma once

#include "commands.h"
#include "sdpa/options.h"

namespace sdpa::cli {

// MPI for the duration of a ring command (mpirun starts the processes; a plain `sdpa run
// --ring` is a single rank, MPI's singleton mode). run_command holds it around the whole
// command, its error report included: Open MPI's MPI_Finalize waits for every rank (the
// standard does not require it to), so every rank has printed its error before any exits — mpirun ends the job when the first rank exits
// non-zero, which would cut off the others' messages.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Each rank reads only its rows of --query, --key and --value (positioned reads of the
// .npy payload), runs the ring forward and writes its rows of --out (and --lse) into one
// .npy file at their offsets. Throws sdpa::Error, on every rank, naming the flag at fault.
// Needs an MpiSession.
void ring_run(const RunArgs& args, const Options& options);

}  // namespace sdpa::cli
