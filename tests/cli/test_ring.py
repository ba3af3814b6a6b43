"""`mpirun -np N sdpa run --ring` against the single-process `sdpa run` on the same .npy
files (tests/cli/CMakeLists.txt runs it under pytest when MPI was found).

Each rank reads only its rows and writes them into one output file: the output's .npy
header and size are the single-process file's, and its values agree within 1e-12 in
float64 through the ring exchange (it merges partial results by their log-sum-exp, so the
last bits may differ from a single pass over the keys) and 1e-5 in float32. float64 files
go through the ordered exchange by default: the same bytes (`cmp`). A bad input ends every rank
with exit code 2 and its message, and leaves no file behind."""

import os
import stat
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

SDPA = os.environ.get("SDPA_CLI")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not SDPA or not MPIRUN, reason="needs SDPA_CLI and mpirun")

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def run(args, ranks=None, cwd=None):
    command = ([MPIRUN, "-np", str(ranks), "--oversubscribe", SDPA] if ranks else [SDPA]) + args
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)


def write_inputs(folder: Path, dtype, L, S, Hq=4, Hkv=2):
    rng = np.random.default_rng(7)
    np.save(folder / "q.npy", rng.standard_normal((2, Hq, L, 16)).astype(dtype))
    np.save(folder / "k.npy", rng.standard_normal((2, Hkv, S, 16)).astype(dtype))
    np.save(folder / "v.npy", rng.standard_normal((2, Hkv, S, 8)).astype(dtype))


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype, L, S, flags", [
    (np.float64, 37, 37, ["--causal", "top-left"]),
    (np.float64, 29, 45, ["--causal", "bottom-right", "--partition", "contiguous"]),
    (np.float64, 40, 40, ["--window-left", "5", "--window-right", "2", "--dropout-p", "0.3", "--seed", "9"]),
    (np.float32, 33, 50, []),
    (np.float64, 30, 30, ["--causal", "top-left", "--exchange", "all-gather"]),
    (np.float64, 30, 30, ["--causal", "top-left", "--exchange", "ring"]),
    (np.float32, 45, 45, ["--causal", "top-left", "--exchange", "ordered"]),
])
def test_ring_run_writes_the_single_process_file(tmp_path, ranks, dtype, L, S, flags):
    write_inputs(tmp_path, dtype, L, S)
    common = ["-q", "q.npy", "-k", "k.npy", "-v", "v.npy"] + flags
    single = run(["run"] + common + ["-o", "single.npy", "--lse", "single_lse.npy"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    ring = run(["run", "--ring"] + common + ["-o", "ring.npy", "--lse", "ring_lse.npy"], ranks=ranks, cwd=tmp_path)
    assert ring.returncode == 0, ring.stdout + ring.stderr
    for name in ("", "_lse"):
        a_bytes = (tmp_path / f"single{name}.npy").read_bytes()
        b_bytes = (tmp_path / f"ring{name}.npy").read_bytes()
        assert len(a_bytes) == len(b_bytes)
        header = 10 + a_bytes[8] + 256 * a_bytes[9]
        assert a_bytes[:header] == b_bytes[:header]  # the same .npy header, hence dtype and shape
        a, b = np.load(tmp_path / f"single{name}.npy"), np.load(tmp_path / f"ring{name}.npy")
        tolerance = 1e-12 if dtype == np.float64 else 1e-5
        assert np.abs(a - b).max() <= tolerance * max(1.0, np.abs(a).max())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype, L, S, sinks_shape, flags", [
    (np.float64, 37, 37, (4,), ["--causal", "top-left"]),
    (np.float32, 33, 50, (2, 4), []),
    # Bottom-right with L > S: the first queries see no key (output 0, lse = sink).
    (np.float64, 45, 29, (2, 4), ["--causal", "bottom-right", "--partition", "contiguous"]),
])
def test_ring_run_with_sinks_writes_the_single_process_file(tmp_path, ranks, dtype, L, S, sinks_shape, flags):
    write_inputs(tmp_path, dtype, L, S)
    np.save(tmp_path / "s.npy", np.random.default_rng(3).standard_normal(sinks_shape) * 2)
    common = ["-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "--sinks", "s.npy"] + flags
    single = run(["run"] + common + ["-o", "single.npy", "--lse", "single_lse.npy"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    ring = run(["run", "--ring"] + common + ["-o", "ring.npy", "--lse", "ring_lse.npy"], ranks=ranks, cwd=tmp_path)
    assert ring.returncode == 0, ring.stdout + ring.stderr
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    for name in ("", "_lse"):
        a, b = np.load(tmp_path / f"single{name}.npy"), np.load(tmp_path / f"ring{name}.npy")
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.abs(a - b).max() <= tolerance * max(1.0, np.abs(a).max())


def _append_only(folder: Path) -> bool:
    """Makes `folder` append-only (chattr +a: entries may be added, none renamed or removed),
    where the file system and the user allow it (root on ext4, xfs, btrfs)."""
    chattr = shutil.which("chattr")
    return bool(chattr) and subprocess.run([chattr, "+a", str(folder)], capture_output=True).returncode == 0


@pytest.mark.parametrize("out_exists", [True, False])
def test_a_failing_rename_on_rank_0_fails_every_rank_and_changes_no_output(tmp_path, out_exists):
    # Rank 0 renames the temporaries last. Here --lse lies in an append-only folder: its
    # temporary can be made and written, but not renamed over lse.npy. Every rank must fail
    # (not only rank 0), and --out, renamed just before, must be as it was: the old file
    # back, or no file where there was none.
    write_inputs(tmp_path, np.float64, 16, 16)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "lse.npy").write_bytes(b"old lse")
    if out_exists:
        (tmp_path / "out.npy").write_bytes(b"old out")
    if not _append_only(locked):
        pytest.skip("chattr +a refused here (needs root and a file system with the append-only flag)")
    try:
        ring = run(["run", "--ring", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "out.npy", "--lse",
                    "locked/lse.npy"], ranks=2, cwd=tmp_path)
    finally:
        subprocess.run([shutil.which("chattr"), "-a", str(locked)], check=True)
    assert ring.returncode == 2, ring.stdout + ring.stderr
    assert ring.stderr.count("sdpa: error:") == 2, ring.stderr  # one message per rank (their lines may interleave)
    assert ring.stderr.count("locked/lse.npy: cannot replace it") == 2, ring.stderr
    assert "(on rank 0)" in ring.stderr, ring.stderr  # rank 1's: rank 0's error, broadcast
    assert (locked / "lse.npy").read_bytes() == b"old lse"
    if out_exists:
        assert (tmp_path / "out.npy").read_bytes() == b"old out"
    else:
        assert not (tmp_path / "out.npy").exists()
    # No temporary beside --out; the append-only folder keeps its (it forbids removing one).
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("L, S, flags", [
    (37, 37, ["--causal", "top-left"]),
    (150, 203, ["--causal", "bottom-right", "--partition", "contiguous"]),
    (130, 130, ["--window-left", "40", "--window-right", "9", "--dropout-p", "0.3", "--seed", "9"]),
    (70, 70, ["--causal", "top-left", "--sinks", "sinks.npy"]),
])
def test_float64_ring_run_writes_the_single_process_bytes(tmp_path, ranks, L, S, flags):
    # float64 through --ring's default exchange (ordered): the files compare equal with cmp.
    write_inputs(tmp_path, np.float64, L, S)
    np.save(tmp_path / "sinks.npy", np.array([-1.0, 0.5, 2.0, 0.0]))
    common = ["-q", "q.npy", "-k", "k.npy", "-v", "v.npy"] + flags
    single = run(["run"] + common + ["-o", "single.npy", "--lse", "single_lse.npy"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    ring = run(["run", "--ring"] + common + ["-o", "ring.npy", "--lse", "ring_lse.npy"], ranks=ranks, cwd=tmp_path)
    assert ring.returncode == 0, ring.stdout + ring.stderr
    for name in ("", "_lse"):
        same = subprocess.run(["cmp", f"single{name}.npy", f"ring{name}.npy"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert same.returncode == 0, same.stdout + same.stderr


def test_a_bad_input_fails_every_rank_and_writes_nothing(tmp_path):
    write_inputs(tmp_path, np.float64, 16, 16)
    np.save(tmp_path / "bad.npy", np.zeros(5))  # rank 1: not (…, seq, dim)
    ring = run(["run", "--ring", "-q", "q.npy", "-k", "bad.npy", "-v", "v.npy", "-o", "out.npy"], ranks=2,
               cwd=tmp_path)
    assert ring.returncode == 2, ring.stderr
    assert ring.stderr.count("sdpa: error:") == 2, ring.stderr  # one message per rank
    assert "bad.npy" in ring.stderr
    assert not (tmp_path / "out.npy").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_flags_that_need_the_whole_sequence_are_refused(tmp_path):
    write_inputs(tmp_path, np.float64, 8, 8)
    ring = run(["run", "--ring", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy", "--weights", "w.npy"],
               ranks=2, cwd=tmp_path)
    assert ring.returncode == 2
    assert "--weights: not accepted with --ring" in ring.stderr
    assert not (tmp_path / "o.npy").exists()


def test_a_value_file_longer_than_the_keys_is_refused_not_cut(tmp_path):
    # V is read with K's rows: without its own length check a longer value file would be
    # cut to fit, where the single-process run refuses it.
    write_inputs(tmp_path, np.float64, 8, 8)
    np.save(tmp_path / "v_long.npy", np.zeros((2, 2, 9, 8)))
    ring = run(["run", "--ring", "-q", "q.npy", "-k", "k.npy", "-v", "v_long.npy", "-o", "out.npy"], ranks=2,
               cwd=tmp_path)
    assert ring.returncode == 2, ring.stdout + ring.stderr
    assert "v_long.npy: expected sequence length S = 8 (the key's), got 9" in ring.stderr
    assert not (tmp_path / "out.npy").exists()


@pytest.mark.parametrize("outputs, flag", [(["-o", "same.npy", "--lse", "same.npy"], "--lse"),
                                           (["-o", "folder"], "--out"),
                                           (["-o", "missing/out.npy"], "--out")])
def test_bad_output_paths_are_refused_before_any_work(tmp_path, outputs, flag):
    # The single-process run's checks: the lse must not silently replace the output.
    write_inputs(tmp_path, np.float64, 8, 8)
    (tmp_path / "folder").mkdir()
    ring = run(["run", "--ring", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy"] + outputs, ranks=2, cwd=tmp_path)
    assert ring.returncode == 2, ring.stdout + ring.stderr
    assert f"{flag}" in ring.stderr
    assert not (tmp_path / "same.npy").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_fifo_output_is_refused_and_left_a_fifo(tmp_path):
    # Every rank writes its rows at their offsets into a file rank 0 renames: a FIFO (as
    # /dev/null, a device) cannot be written that way. Before the fix the rename replaced
    # the FIFO with a plain file (and /dev/null's node with one).
    write_inputs(tmp_path, np.float64, 8, 8)
    os.mkfifo(tmp_path / "fifo")
    ring = run(["run", "--ring", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "fifo"], ranks=2, cwd=tmp_path)
    assert ring.returncode == 2, ring.stdout + ring.stderr
    assert ring.stderr.count("--out: expected a regular file or a new path with --ring") == 2, ring.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_symlinked_output_is_written_through_and_keeps_the_old_files_mode(tmp_path):
    # As a single-process run: the link stays and its target gets the output, with the
    # permission bits the target had; a dangling link's target is created. Before the fix
    # the links were replaced by plain files, and the target left as it was.
    write_inputs(tmp_path, np.float64, 12, 12)
    common = ["-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "--causal", "top-left"]
    single = run(["run"] + common + ["-o", "single.npy", "--lse", "single_lse.npy"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "out.npy").write_bytes(b"old")
    os.chmod(tmp_path / "data" / "out.npy", 0o640)
    os.symlink("data/out.npy", tmp_path / "out.npy")
    os.symlink("data/lse.npy", tmp_path / "lse.npy")  # dangling
    ring = run(["run", "--ring"] + common + ["-o", "out.npy", "--lse", "lse.npy"], ranks=2, cwd=tmp_path)
    assert ring.returncode == 0, ring.stdout + ring.stderr
    for link, target, expected in (("out.npy", "out.npy", "single.npy"), ("lse.npy", "lse.npy", "single_lse.npy")):
        assert os.path.islink(tmp_path / link)
        assert (tmp_path / "data" / target).read_bytes() == (tmp_path / expected).read_bytes()
    assert stat.S_IMODE(os.stat(tmp_path / "data" / "out.npy").st_mode) == 0o640
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.name.startswith(".")) == []
