""".ci/gpu-evidence.sh: bad phases stop it before anything runs; compare-2gpu runs only the two-GPU groups.

The script runs in a scratch directory with a ``python3`` first on PATH that records each
``python3 -m harness ...`` call instead of running it (no GPU here) and runs the script's own
``python3 -c`` group listing with the real Python, against the real matrix.yaml or a
stand-in listing.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix.config import load_matrix

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu-evidence.sh"


@pytest.fixture
def scratch(tmp_path):
    """(working directory with matrix.yaml, environment, file the harness calls are recorded in)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "matrix.yaml").symlink_to(ROOT / "matrix.yaml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        "# -c: the script's group listing, by the stand-in where one is given, else by the real Python\n"
        'if [ "$1" = -c ]; then\n'
        '    if [ -n "${FAKE_LISTING+x}" ]; then printf "%s" "$FAKE_LISTING"; exit "${FAKE_LISTING_RC:-0}"; fi\n'
        f'    exec {sys.executable} "$@"\n'
        "fi\n"
        'echo "$*" >> "$CALLS"\n'
        "# FAKE_SLEEP_S: a phase that runs that long, and says when SIGINT stopped it; it ends its child as the\n"
        "# harness does, else the sleep would hold the phase's pipe to tee open until it ended (30 s a phase)\n"
        'if [ -n "${FAKE_SLEEP_S:-}" ]; then '
        'trap \'kill "$child"; echo "interrupted by SIGINT" >> "$CALLS"; exit 130\' INT; '
        'sleep "$FAKE_SLEEP_S" & child=$!; wait; fi\n', encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "CALLS": str(calls)}
    return work, env, calls


def run(work: Path, env: dict, *phases: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(work / "out"), *phases], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_unknown_phase_exits_2_before_anything_runs(scratch):
    work, env, calls = scratch
    proc = run(work, env, "build-test", "compare-3gpu")
    assert proc.returncode == 2
    assert "unknown phase: compare-3gpu (known: build-test compare-1gpu compare-seed compare-2gpu bench upstream-tests)" in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == ["matrix.yaml"]  # no OUTDIR, no .harness, no run ids
    assert not calls.exists()  # build-test did not start either


def test_compare_2gpu_runs_exactly_the_two_gpu_groups(scratch):
    work, env, calls = scratch
    proc = run(work, env, "compare-2gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = load_matrix(ROOT / "matrix.yaml")
    two_gpu = [g for g in m.platforms["linux-x86_64-cuda"].groups if m.groups[g].min_gpus >= 2]
    assert len(two_gpu) >= 2
    [call] = calls.read_text().splitlines()
    assert call == " ".join(["-m harness compare-outputs --platform linux-x86_64-cuda",
                             *(f"--group {g}" for g in two_gpu)])


def test_compare_1gpu_runs_every_one_gpu_group_but_the_seed_table_which_compare_seed_runs(scratch):
    work, env, calls = scratch
    proc = run(work, env, "compare-1gpu", "compare-seed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = load_matrix(ROOT / "matrix.yaml")
    one_gpu = [g for g in m.platforms["linux-x86_64-cuda"].groups if m.groups[g].min_gpus < 2]
    assert "cuda-seed-table" in one_gpu and "cuda-pin-routes" in one_gpu
    first, seed = calls.read_text().splitlines()
    assert first == " ".join(["-m harness compare-outputs --platform linux-x86_64-cuda",
                              *(f"--group {g}" for g in one_gpu if g != "cuda-seed-table")])
    assert seed == "-m harness compare-outputs --platform linux-x86_64-cuda --group cuda-seed-table"


def test_upstream_tests_runs_the_suite_and_test_backend_ops_on_one_gpu_in_the_one_gpu_run(scratch):
    work, env, calls = scratch
    proc = run(work, env, "build-test", "upstream-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build, suite = calls.read_text().splitlines()
    jobs = str(len(os.sched_getaffinity(0)))  # what nproc counts
    assert build.startswith("-m harness build test --platform linux-x86_64-cuda --sanitize memcheck")
    assert suite == f"-m harness test --platform linux-x86_64-cuda --upstream-tests -j {jobs}"
    ids = (work / ".harness" / "gpu-evidence.env").read_text()
    assert "RUN_1GPU=gpu1-" in ids  # both phases of this call recorded into the one-GPU run


def test_compare_2gpu_with_no_two_gpu_group_runs_nothing(scratch):
    work, env, calls = scratch
    proc = run(work, {**env, "FAKE_LISTING": ""}, "compare-2gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compare-2gpu: linux-x86_64-cuda has no group with min_gpus >= 2 in matrix.yaml; nothing to run" \
        in (work / "out" / "compare-2gpu.log").read_text()
    assert not calls.exists()  # without a --group, compare-outputs would have run every group


def test_compare_2gpu_whose_listing_fails_runs_nothing_and_fails(scratch):
    work, env, calls = scratch
    proc = run(work, {**env, "FAKE_LISTING": "", "FAKE_LISTING_RC": "1"}, "compare-2gpu", "bench")
    assert proc.returncode == 1
    assert "could not list the two-GPU groups" in (work / "out" / "compare-2gpu.log").read_text()
    # the phase after it still runs; compare-outputs never did
    assert [c.split()[2] for c in calls.read_text().splitlines()] == ["models", "bench"]


def test_a_phase_past_its_limit_gets_sigint_and_the_next_phase_still_runs(scratch):
    work, env, calls = scratch
    proc = run(work, {**env, "PHASE_LIMIT_S": "1", "FAKE_SLEEP_S": "30"}, "build-test", "upstream-tests")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a phase stopped is not a pass
    lines = calls.read_text().splitlines()
    assert [line.split()[2] if line.startswith("-m harness") else line for line in lines] == \
        ["build", "interrupted by SIGINT", "test", "interrupted by SIGINT"]
    assert "no data archive in mirror/" in (work / "out" / "upstream-tests.log").read_text()


def test_a_phase_limit_that_is_not_a_number_exits_2(scratch):
    work, env, calls = scratch
    proc = run(work, {**env, "PHASE_LIMIT_S": "5m"}, "build-test")
    assert proc.returncode == 2 and "PHASE_LIMIT_S must be a whole number of seconds, not '5m'" in proc.stderr
    assert not calls.exists()
