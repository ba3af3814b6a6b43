"""Issue #12: nothing the `sdpa` CLI writes is ever damaged, and every numeric flag is
checked.

Each case was reproduced on the code before the issue (the comment says what happened
then). Everything happens in pytest's temporary directory; a device node is simulated by
a FIFO (written directly, as /dev/null would be) and "a file elsewhere" by a second
temporary folder, so that no test touches /dev or anything outside its own directory.

Run: SDPA_CLI=PATH/TO/sdpa python -m pytest tests/cli/test_output_files.py
"""

import io
import os
import stat
import subprocess
import threading

import numpy as np
import pytest

from test_cli import attention  # the NumPy float64 oracle of the CLI's conformance checks

SDPA = os.path.abspath(os.environ.get("SDPA_CLI", os.path.join(os.path.dirname(__file__),
                                                                "../../build/release/sdpa")))


def sdpa(*args, **kwargs):
    return subprocess.run([SDPA, *map(str, args)], capture_output=True, timeout=120, **kwargs)


def assert_attention(out_bytes_or_path, q, k, v):
    """The .npy (a path or its bytes) holds attention(q, k, v) within float32 rounding."""
    if isinstance(out_bytes_or_path, bytes):
        out_bytes_or_path = io.BytesIO(out_bytes_or_path)
    got = np.load(out_bytes_or_path)
    want, _, _ = attention(q, k, v)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.fixture
def inputs(tmp_path):
    """q, k, v .npy files in the test's folder: (B, H, L, E) = (1, 2, 5, 8), S = 7."""
    rng = np.random.default_rng(12)
    arrays = {n: rng.standard_normal((1, 2, 5 if n == "q" else 7, 8)).astype(np.float32) for n in "qkv"}
    paths = {}
    for name, array in arrays.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], array)
    return arrays, paths


def run_args(paths):
    return ["run", "-q", paths["q"], "-k", paths["k"], "-v", paths["v"]]


def snapshot(folder):
    """Every entry of `folder`: its kind, and the bytes of regular files."""
    entries = {}
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        mode = os.lstat(full).st_mode
        if stat.S_ISLNK(mode):
            entries[name] = ("link", os.readlink(full))
        elif stat.S_ISREG(mode):
            entries[name] = ("file", open(full, "rb").read())
        else:
            entries[name] = ("other", stat.S_IFMT(mode))
    return entries


class FifoReader:
    """Reads a FIFO in a thread until the writer closes it (the test's `cat`). With
    close_at_once the reader goes away after opening, so a large write gets EPIPE."""

    def __init__(self, path, close_at_once=False):
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(path, close_at_once), daemon=True)
        self.thread.start()

    def _read(self, path, close_at_once):
        with open(path, "rb") as fifo:
            if not close_at_once:
                self.data = fifo.read()

    def join(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the FIFO was never written and closed"
        return self.data


# --- special destinations are written, not replaced ---------------------------------------


def test_fifo_output_is_written_directly_not_replaced(tmp_path, inputs):
    # Before: the FIFO (as a device node such as /dev/null) was replaced by a regular file.
    arrays, paths = inputs
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    proc = sdpa(*run_args(paths), "-o", fifo)
    data = reader.join()
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert_attention(data, arrays["q"], arrays["k"], arrays["v"])


def test_file_descriptor_path_writes_to_the_descriptor(inputs):
    # `-o /dev/stdout` could never work: the writer created "<out>.partial" beside it.
    # /proc/self/fd/1 is the same thing without touching /dev; here stdout is a pipe.
    arrays, paths = inputs
    proc = sdpa(*run_args(paths), "-o", "/proc/self/fd/1")
    assert proc.returncode == 0, proc.stderr
    assert_attention(proc.stdout, arrays["q"], arrays["k"], arrays["v"])


def test_file_descriptor_path_appends_to_a_redirected_file(tmp_path, inputs):
    # `sdpa run ... -o /dev/stdout >> log`: written through the descriptor, so O_APPEND
    # holds and the log keeps what it had (a reopen with O_TRUNC would empty it).
    arrays, paths = inputs
    log = tmp_path / "log.bin"
    log.write_bytes(b"earlier entries\n")
    with open(log, "ab") as stdout:
        proc = subprocess.run([SDPA, *map(str, run_args(paths)), "-o", "/proc/self/fd/1"], stdout=stdout,
                              stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = log.read_bytes()
    assert data.startswith(b"earlier entries\n")
    assert_attention(data[len(b"earlier entries\n"):], arrays["q"], arrays["k"], arrays["v"])


def test_closed_file_descriptor_is_refused_before_any_work(inputs):
    _, paths = inputs
    proc = sdpa(*run_args(paths), "-o", "/proc/self/fd/1000")
    assert proc.returncode == 2 and b"--out" in proc.stderr and b"file descriptor" in proc.stderr


def test_symlink_output_replaces_its_target_and_keeps_the_link(tmp_path, tmp_path_factory, inputs):
    # Before: the link was replaced by a regular file and its target left stale.
    arrays, paths = inputs
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    target = elsewhere / "target.npy"
    target.write_bytes(b"old contents")
    link = tmp_path / "out.npy"
    link.symlink_to(target)
    proc = sdpa(*run_args(paths), "-o", link)
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(link) == str(target)
    assert_attention(str(target), arrays["q"], arrays["k"], arrays["v"])
    assert sorted(os.listdir(elsewhere)) == ["target.npy"], "a temporary was left behind"


def test_dangling_symlink_output_creates_its_target(tmp_path, tmp_path_factory, inputs):
    arrays, paths = inputs
    target = tmp_path_factory.mktemp("elsewhere") / "new.npy"
    link = tmp_path / "out.npy"
    link.symlink_to(target)
    proc = sdpa(*run_args(paths), "-o", link)
    assert proc.returncode == 0, proc.stderr
    assert os.path.islink(link) and os.path.isfile(target)
    assert_attention(str(target), arrays["q"], arrays["k"], arrays["v"])


def test_chain_of_relative_dangling_links_is_followed(tmp_path, inputs):
    # first -> sub/second -> ../final.npy (relative to sub/): final.npy is created.
    arrays, paths = inputs
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "second").symlink_to("../final.npy")
    (tmp_path / "first").symlink_to("sub/second")
    proc = sdpa(*run_args(paths), "-o", "first", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.path.islink(tmp_path / "first") and os.path.islink(tmp_path / "sub" / "second")
    assert_attention(str(tmp_path / "final.npy"), arrays["q"], arrays["k"], arrays["v"])


def test_longest_file_name_can_be_written(tmp_path, inputs):
    # A 255-byte name (NAME_MAX) is valid; its temporary's name must be valid too.
    arrays, paths = inputs
    name = "o" * 251 + ".npy"
    proc = sdpa(*run_args(paths), "-o", name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_attention(str(tmp_path / name), arrays["q"], arrays["k"], arrays["v"])


# --- the temporary is unpredictable and never followed -------------------------------------


def test_planted_partial_symlink_is_not_followed(tmp_path, tmp_path_factory, inputs):
    # Before: with o.npy.partial -> victim.txt, victim.txt was overwritten with the output
    # and o.npy became a symlink to it.
    arrays, paths = inputs
    victim = tmp_path_factory.mktemp("elsewhere") / "victim.txt"
    victim.write_bytes(b"precious")
    (tmp_path / "o.npy.partial").symlink_to(victim)
    proc = sdpa(*run_args(paths), "-o", tmp_path / "o.npy")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_bytes() == b"precious"
    assert os.readlink(tmp_path / "o.npy.partial") == str(victim)
    assert not os.path.islink(tmp_path / "o.npy")
    assert_attention(str(tmp_path / "o.npy"), arrays["q"], arrays["k"], arrays["v"])


def test_users_partial_file_is_left_alone(tmp_path, inputs):
    # Before: a regular o.npy.partial of the user's was clobbered, then renamed away.
    _, paths = inputs
    mine = tmp_path / "o.npy.partial"
    mine.write_bytes(b"my notes")
    proc = sdpa(*run_args(paths), "-o", tmp_path / "o.npy")
    assert proc.returncode == 0, proc.stderr
    assert mine.read_bytes() == b"my notes"


# --- a failure leaves every pre-existing file as it was -----------------------------------


def test_failed_lse_write_keeps_the_input_used_as_output(tmp_path, inputs):
    # Before: exit 2, and the input q.npy (also the output) was deleted.
    _, paths = inputs
    before = snapshot(tmp_path)
    proc = sdpa(*run_args(paths), "-o", paths["q"], "--lse", tmp_path / "missing-folder" / "l.npy")
    assert proc.returncode == 2
    assert b"--lse" in proc.stderr
    assert snapshot(tmp_path) == before


def test_failed_weights_write_keeps_the_previous_output(tmp_path, inputs):
    # Before: a prev.npy that existed before the run was deleted.
    _, paths = inputs
    (tmp_path / "prev.npy").write_bytes(b"yesterday's result")
    before = snapshot(tmp_path)
    proc = sdpa(*run_args(paths), "-o", tmp_path / "prev.npy", "--weights", tmp_path / "missing-folder" / "w.npy")
    assert proc.returncode == 2
    assert b"--weights" in proc.stderr
    assert snapshot(tmp_path) == before


def test_failure_while_writing_is_all_or_nothing(tmp_path, inputs):
    # The weights go to a FIFO whose reader leaves at once: the write fails (EPIPE) after
    # the output's temporary is written. The old output and the folder stay as they were,
    # and the process reports the error instead of dying of SIGPIPE.
    rng = np.random.default_rng(3)
    big = {n: rng.standard_normal((1, 4, 256, 8)).astype(np.float32) for n in "qkv"}  # weights: 1 MiB
    for name, array in big.items():
        np.save(tmp_path / f"big_{name}.npy", array)
    (tmp_path / "out.npy").write_bytes(b"old output")
    fifo = tmp_path / "weights.fifo"
    os.mkfifo(fifo)
    before = snapshot(tmp_path)
    reader = FifoReader(fifo, close_at_once=True)
    proc = sdpa("run", "-q", tmp_path / "big_q.npy", "-k", tmp_path / "big_k.npy", "-v", tmp_path / "big_v.npy",
                "-o", tmp_path / "out.npy", "--weights", fifo)
    reader.join()
    assert proc.returncode == 2, proc.stderr
    assert b"--weights" in proc.stderr
    assert snapshot(tmp_path) == before


def test_several_outputs_all_land(tmp_path, inputs):
    arrays, paths = inputs
    proc = sdpa(*run_args(paths), "-o", tmp_path / "o.npy", "--lse", tmp_path / "l.npy",
                "--weights", tmp_path / "w.npy")
    assert proc.returncode == 0, proc.stderr
    assert_attention(str(tmp_path / "o.npy"), arrays["q"], arrays["k"], arrays["v"])
    _, weights_want, lse = attention(arrays["q"], arrays["k"], arrays["v"])
    np.testing.assert_allclose(np.load(tmp_path / "l.npy"), lse, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), weights_want, atol=1e-5, rtol=0)
    assert sorted(os.listdir(tmp_path)) == ["k.npy", "l.npy", "o.npy", "q.npy", "v.npy", "w.npy"]


def test_replaced_file_keeps_its_permissions_and_new_files_follow_the_umask(tmp_path, inputs):
    # Before: the replacement was a new file with the umask's mode (0640 here), not 0600.
    _, paths = inputs
    existing = tmp_path / "o.npy"
    existing.write_bytes(b"old")
    os.chmod(existing, 0o600)
    proc = sdpa(*run_args(paths), "-o", existing, "--lse", tmp_path / "new.npy",
                preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(existing).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "new.npy").st_mode) == 0o640  # 0666 & ~027


# --- outputs naming one file are refused before any work -----------------------------------


@pytest.mark.parametrize("alias", ["./o2.npy", "sub/../o2.npy", "link.npy", "hard.npy"])
def test_outputs_naming_the_same_file_are_refused(tmp_path, inputs, alias):
    # Before: `-o o2.npy --lse ./o2.npy` was accepted and o2.npy ended up holding the lse.
    _, paths = inputs
    (tmp_path / "sub").mkdir()
    (tmp_path / "o2.npy").write_bytes(b"old")
    (tmp_path / "link.npy").symlink_to(tmp_path / "o2.npy")
    os.link(tmp_path / "o2.npy", tmp_path / "hard.npy")
    before = snapshot(tmp_path)
    proc = sdpa(*run_args(paths), "-o", "o2.npy", "--lse", alias, cwd=tmp_path)
    assert proc.returncode == 2
    assert b"--lse" in proc.stderr and b"same file" in proc.stderr
    assert snapshot(tmp_path) == before


def test_new_outputs_naming_the_same_path_are_refused(tmp_path, inputs):
    _, paths = inputs
    proc = sdpa(*run_args(paths), "-o", "n.npy", "--weights", "./n.npy", cwd=tmp_path)
    assert proc.returncode == 2 and b"--weights" in proc.stderr
    assert not os.path.exists(tmp_path / "n.npy")


def test_directory_output_is_refused(tmp_path, inputs):
    _, paths = inputs
    (tmp_path / "folder").mkdir()
    proc = sdpa(*run_args(paths), "-o", tmp_path / "folder")
    assert proc.returncode == 2 and b"--out" in proc.stderr and b"directory" in proc.stderr
    assert os.listdir(tmp_path / "folder") == []


def test_viz_writes_through_a_symlink(tmp_path, tmp_path_factory, inputs):
    # PNG output goes through the same writer as .npy output.
    weights = np.random.default_rng(0).random((3, 4))
    np.save(tmp_path / "w.npy", weights)
    target = tmp_path_factory.mktemp("elsewhere") / "heat.png"
    target.write_bytes(b"old")
    (tmp_path / "heat.png").symlink_to(target)
    proc = sdpa("viz", "-w", tmp_path / "w.npy", "-o", tmp_path / "heat.png")
    assert proc.returncode == 0, proc.stderr
    assert os.path.islink(tmp_path / "heat.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- numeric flags: empty, non-numeric, out of range ---------------------------------------

RUN_FLAGS = [
    ("--scale", ""), ("--scale", "abc"), ("--scale", "1e400"), ("--scale", "nan"), ("--scale", "1e39"),
    ("--window-left", ""), ("--window-left", "2.5"), ("--window-left", "9223372036854775808"),
    ("--window-right", ""), ("--softcap", ""), ("--softcap", "inf"),
    ("--dropout-p", ""), ("--dropout-p", "0.5x"), ("--dropout-p", "1"),
    ("--num-threads", ""), ("--num-threads", "-1"), ("--num-threads", "100000"),
    ("--seed", ""), ("--seed", "18446744073709551616"), ("--seed", "-5"),
    ("--offset", ""), ("--offset", "-1"),
]


@pytest.mark.parametrize("flag,value", RUN_FLAGS)
def test_run_numeric_flag_is_checked(tmp_path, inputs, flag, value):
    # Before: empty values ran as 0 (exit 0: a script's unset variable gave uniform
    # attention or no dropout), seeds beyond 2^64 - 1 saturated, --scale 1e39 gave NaN.
    _, paths = inputs
    out = tmp_path / "o.npy"
    proc = sdpa(*run_args(paths), "-o", out, flag, value)
    assert proc.returncode == 2, f"{flag} {value!r}: exit {proc.returncode}"
    assert proc.stderr.startswith(b"sdpa: error: ") and flag.encode() in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,flag", [
    (["check", "--seed", "-5"], "--seed"),  # before: wrapped to 2^64 - 5
    (["check", "--seed", ""], "--seed"),
    (["check", "--cases", ""], "--cases"),
    (["bench", "--repeats", "0"], "--repeats"),  # before: a segfault on an empty vector
    (["bench", "--repeats", "-2"], "--repeats"),
    (["bench", "--num-threads", "100000"], "--num-threads"),  # before: a crash in the probes
    (["bench", "--num-threads", ""], "--num-threads"),
    (["viz", "-w", "w.npy", "-o", "w.png", "--vmin", ""], "--vmin"),
    (["viz", "-w", "w.npy", "-o", "w.png", "--index", "-1"], "--index"),
])
def test_other_numeric_flags_are_checked(tmp_path, args, flag):
    proc = sdpa(*args, cwd=tmp_path)
    assert proc.returncode == 2, f"{args}: exit {proc.returncode}"
    assert proc.stderr.startswith(b"sdpa: error: ") and flag.encode() in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


def dropout_output(tmp_path, paths, seed):
    out = tmp_path / "dropout.npy"
    proc = sdpa(*run_args(paths), "-o", out, "--dropout-p", "0.5", "--seed", seed)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def test_largest_seeds_are_distinct(tmp_path, inputs):
    # The two largest valid seeds are accepted and draw different masks (the values
    # beyond them, which saturated to the largest, are refused: RUN_FLAGS above).
    _, paths = inputs
    assert not np.array_equal(dropout_output(tmp_path, paths, "18446744073709551615"),
                              dropout_output(tmp_path, paths, "18446744073709551614"))


def test_integer_flags_are_decimal(tmp_path, inputs):
    # Before: CLI11 read a leading 0 as octal, so --seed 010 drew seed 8's mask.
    _, paths = inputs
    ten = dropout_output(tmp_path, paths, "10")
    assert np.array_equal(dropout_output(tmp_path, paths, "010"), ten)
    assert not np.array_equal(dropout_output(tmp_path, paths, "8"), ten)
