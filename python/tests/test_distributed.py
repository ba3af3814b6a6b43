"""sdpa.distributed under `mpirun -np 2` and `mpirun -np 4 --oversubscribe`: runs
ring_cases.py's collective tests in N processes (each a pytest of its own) and fails when
any rank fails. Bounded by a timeout: a rank left waiting is a failure, not a hang."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sdpa._core

pytestmark = pytest.mark.skipif(
    not sdpa._core.has_distributed or shutil.which("mpirun") is None,
    reason="sdpa built without MPI, or no mpirun (scripts/setup.sh installs Open MPI)")


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attention_under_mpirun(ranks, tmp_path):
    pytest.importorskip("mpi4py")
    cases = Path(__file__).with_name("ring_cases.py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    env.pop("SDPA_MIN_EXAMPLES", None)  # the inner runs check no hypothesis examples
    command = ["mpirun", "-np", str(ranks), "--oversubscribe", sys.executable, "-m", "pytest", "-q",
               "-p", "no:cacheprovider", "--rootdir", str(cases.parent), str(cases)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("passed") == ranks, result.stdout[-2000:]  # every rank ran and passed
