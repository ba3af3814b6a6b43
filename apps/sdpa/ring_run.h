// `mpirun -np N sdpa run --ring ...`: one attention call on .npy files, split along the
// sequence across the MPI ranks (sdpa::distributed). Built where MPI is found.
#pragma once

#include "commands.h"
#include "sdpa/options.h"

namespace sdpa::cli {

// Each rank reads only its rows of --query, --key and --value (positioned reads of the
// .npy payload), runs the ring forward and writes its rows of --out (and --lse) into one
// .npy file at their offsets. Throws sdpa::Error, on every rank, naming the flag at fault.
void ring_run(const RunArgs& args, const Options& options);

}  // namespace sdpa::cli
