"""Hypothesis profiles and the end-of-run report (examples run, worst errors per dtype).

Profiles (SDPA_HYPOTHESIS_PROFILE, default "ci"):
  ci    derandomized: the same examples on every run, no deadline, no example database;
        what `make test` runs.
  quick the same, with a tenth of the examples, for editing.
  deep  random (a new stream each run) with 10x the examples, for hunting.

SDPA_MIN_EXAMPLES=N makes the run fail when fewer than N hypothesis examples were checked
against PyTorch (`make test` sets 2000).
"""

import os

import hypothesis
import pytest

import oracle

_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
)
hypothesis.settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
hypothesis.settings.register_profile("quick", derandomize=True, database=None, **_COMMON)
hypothesis.settings.register_profile("deep", derandomize=False, database=None, **_COMMON)
PROFILE = os.environ.get("SDPA_HYPOTHESIS_PROFILE", "ci")
hypothesis.settings.load_profile(PROFILE)

# Examples per conformance test are written as their "ci" counts; the profile scales them.
EXAMPLE_FACTOR = {"ci": 1.0, "quick": 0.1, "deep": 10.0}[PROFILE]


def examples(ci_count: int) -> int:
    return max(1, int(ci_count * EXAMPLE_FACTOR))


@pytest.fixture(autouse=True)
def _seeded_generators():
    """Tests that draw from the global generators (the seeds' own tests do) see the same
    numbers on every run."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    total = sum(oracle.EXAMPLES.values())
    tr.section("sdpa conformance against PyTorch")
    for test, n in sorted(oracle.EXAMPLES.items()):
        tr.write_line(f"  {n:6d} examples  {test}")
    tr.write_line(f"  {total:6d} hypothesis examples in all (profile {PROFILE})")
    if oracle.STATS:
        tr.write_line("  worst errors (|ours - torch float64|), error / tolerance, error / torch's own error in dtype:")
        for key, s in sorted(oracle.STATS.items()):
            naive = f"  {s.worst_naive_ratio:5.2f}x torch-in-dtype" if s.worst_naive_ratio else ""
            tr.write_line(f"    {key:28s} {s.checks:6d} checks  max err {s.worst_error:9.3g}  "
                          f"{s.worst_ratio:5.3f} of tol{naive}")
    for key, n in sorted(oracle.BOUND_DECIDED.items()):
        tr.write_line(f"  {key}: {n} checks within the rounding bound but above 2 x torch's own error")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    required = int(os.environ.get("SDPA_MIN_EXAMPLES", "0"))
    total = sum(oracle.EXAMPLES.values())
    if required and total < required and session.exitstatus == 0:
        print(f"\nFAILED: {total} hypothesis examples ran against PyTorch, {required} required (SDPA_MIN_EXAMPLES)")
        session.exitstatus = 1
