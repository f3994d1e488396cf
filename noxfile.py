"""nox sessions: thin wrappers around ``python -m harness``.

Every session passes ``session.posargs`` through, e.g.
``nox -s build test compare-outputs -- --platform linux-x86_64-cpu -DGGML_AVX2=OFF``.
Sessions run in the current Python environment (install requirements.txt first), or
in the project's ``.venv`` when nox itself runs elsewhere (pipx); the stages of one nox
invocation share one results run.

The first session that fails stops the chain, and nox exits with the harness's own exit
code (harness/common/errors.py: 1 failed, 2 bad input or environment, 3 incomplete): the
session raises SystemExit with it, which nox lets through, so nox prints no "Session ...
failed" line and writes no --report for that invocation.  SIGINT and SIGTERM that nox gets
are passed on to the harness, and nox waits for it to stop its children and record the run.
"""

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
# standard library only (tests/test_cli.py): nox may run in a Python that lacks the requirements
from harness.common.interpreter import harness_python  # noqa: E402
from harness.common.proc import command_line, run_passing_signals  # noqa: E402
from harness.record.run_id import chain_environment  # noqa: E402
from harness.stages.command_names import STAGE_COMMANDS  # noqa: E402
from harness.stages.options import STAGE_OPTIONS  # noqa: E402

nox.options.default_venv_backend = "none"
nox.options.sessions = list(STAGE_COMMANDS)
nox.options.stop_on_first_error = True

# one results run for all sessions of this nox invocation, held by this process from the first session to the last
# (harness/record/run_id.py: a second invocation with the same run id is refused while this one lives)
CHAIN = chain_environment()


def _run(session: nox.Session, *args: str) -> None:
    argv = [harness_python(ROOT), *args]
    env = dict(CHAIN)
    session.log(command_line(argv, env))
    # SIGINT and SIGTERM are passed on and waited for: the harness stops its children and records the run
    rc = run_passing_signals(argv, env=env)
    if rc:
        session.log(f"Session {session.name} failed with exit code {rc}")
        raise SystemExit(rc)  # nox would turn every failure into 1


def _harness(session: nox.Session, command: str) -> None:
    _run(session, "-m", "harness", command, *session.posargs)


def _stage_session(command: str, summary: str) -> None:
    """Declare the session of stage command ``command`` (harness.stages.command_names), ``summary`` its line."""
    def session_of_stage(session: nox.Session) -> None:
        _harness(session, command)
    flags = ", ".join(o.name for o in STAGE_OPTIONS)
    session_of_stage.__doc__ = (summary[0].upper() + summary[1:] + ".\n\n"
                                f"Options after ``--`` (harness.stages.options.STAGE_OPTIONS): {flags}, --json.")
    nox.session(name=command)(session_of_stage)


for _command, _summary in STAGE_COMMANDS.items():
    _stage_session(_command, _summary)


@nox.session
def patches(session: nox.Session) -> None:
    """Patch series: ``nox -s patches -- apply|export|check``."""
    _harness(session, "patches")


@nox.session(name="llama-bench-rows")
def llama_bench_rows(session: nox.Session) -> None:
    """Runs' speed measurements as llama-bench JSONL rows: ``nox -s llama-bench-rows -- RUN...``."""
    _harness(session, "llama-bench-rows")


@nox.session
def source(session: nox.Session) -> None:
    """Base source: ``nox -s source -- fetch|export-mirror [--out PATH]``."""
    _harness(session, "source")


@nox.session
def models(session: nox.Session) -> None:
    """Assemble, generate or derive the matrix's models: ``nox -s models [-- NAME ...]``; a derived (quantized)
    model needs llama-quantize from a finished base build of the host's CPU platform (``nox -s build`` first),
    and its line says so when there is none."""
    _harness(session, "models")


@nox.session(name="ci-matrix")
def ci_matrix(session: nox.Session) -> None:
    """The GitHub Actions matrix (JSON) derived from matrix.yaml: ``nox -s ci-matrix [-- --github-output]``."""
    _harness(session, "ci-matrix")


@nox.session(name="check-windows")
def check_windows(session: nox.Session) -> None:
    """Compile the patches' Windows-only host code with MinGW-w64 (and g++) against the CUDA headers."""
    _harness(session, "check-windows")


@nox.session
def triage(session: nox.Session) -> None:
    """What changed between two runs: ``nox -s triage -- [A B] [--json] [--strict]``; exit 1 on a regression."""
    _harness(session, "triage")


@nox.session
def bisect(session: nox.Session) -> None:
    """The first patch of the series that makes each failing row of a run fail: ``nox -s bisect -- [RUN] [--check ID]``
    (RUN: the newest run by default); ``-- [RUN] --upstream GOOD..BAD [--check ID]``: the first upstream commit,
    each with the whole series on top."""
    _harness(session, "bisect")


@nox.session
def forecast(session: nox.Session) -> None:
    """What the series would hit on another upstream commit: ``nox -s forecast -- --onto SOURCE``."""
    _harness(session, "forecast")


@nox.session
def roll(session: nox.Session) -> None:
    """Move the pin and the series to another upstream commit on branch roll/<commit12>, verified:
    ``nox -s roll -- --onto SOURCE``, then ``--continue`` or ``--abort`` after a conflict (docs/roll.md)."""
    _harness(session, "roll")


@nox.session
def report(session: nox.Session) -> None:
    """Self-contained ``results/<run-id>/report.html``: ``nox -s report -- [RUN] [--markdown]``."""
    _harness(session, "report")


@nox.session
def bench(session: nox.Session) -> None:
    """Pin-ladder benchmark on a CUDA machine: ``nox -s bench -- --build-dir DIR [--model GGUF]``."""
    _harness(session, "bench")


@nox.session(name="bench-compile")
def bench_compile(session: nox.Session) -> None:
    """Time the compile step of the CUDA platform, fork and base: ``nox -s bench-compile [-- --cold] [-j N]``."""
    _harness(session, "bench-compile")


@nox.session(name="bench-loop")
def bench_loop(session: nox.Session) -> None:
    """Time edit -> verdict on a fresh clone with warm caches (docs/cache.md): ``nox -s bench-loop [-- --keep]``."""
    _harness(session, "bench-loop")


@nox.session(name="bench-cold")
def bench_cold(session: nox.Session) -> None:
    """Time the README's first command on a fresh clone with empty caches: ``nox -s bench-cold [-- --keep]``."""
    _harness(session, "bench-cold")


@nox.session(name="bench-noise")
def bench_noise(session: nox.Session) -> None:
    """The speed stage's noise: N runs of the same builds, each rule's false alarms and spread (docs/speed.md)."""
    _run(session, "benchmarks/speed_stage.py", "noise", *session.posargs)


@nox.session
def pytest(session: nox.Session) -> None:
    """The project's own test suite (including the end-to-end build of the real llama.cpp)."""
    _run(session, "-m", "pytest", *session.posargs)


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing of the modules that decide a verdict (harness/tools/mutation.py, docs/mutation.md):
    ``nox -s mutation`` for all of them, ``nox -s mutation -- --changed origin/main`` before a pull request."""
    _run(session, "-m", "harness.tools.mutation", *session.posargs)
