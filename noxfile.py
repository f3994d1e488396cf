"""nox sessions: thin wrappers around ``python -m harness``.

Every session passes ``session.posargs`` through, e.g.
``nox -s build test compare-outputs -- --platform linux-x86_64-cpu -DGGML_AVX2=OFF``.
Sessions run in the current Python environment (install requirements.txt first);
the stages of one nox invocation share one results run.
"""

import os

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["build", "test", "compare-outputs"]

# one results run for all sessions of this nox invocation
os.environ.setdefault("HARNESS_RUN_ID", __import__("harness.results", fromlist=["new_run_id"]).new_run_id())


def _harness(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "harness", *args, *session.posargs, env={"HARNESS_RUN_ID": os.environ["HARNESS_RUN_ID"]})


@nox.session
def build(session: nox.Session) -> None:
    """Configure and build every selected platform (base and fork variants)."""
    _harness(session, "build")


@nox.session
def test(session: nox.Session) -> None:
    """Run the fork's native tests through ctest by label; writes JUnit XML."""
    _harness(session, "test")


@nox.session(name="compare-outputs")
def compare_outputs(session: nox.Session) -> None:
    """Run every greedy comparison group (temperature 0, fixed seed) and report divergences."""
    _harness(session, "compare-outputs")


@nox.session
def patches(session: nox.Session) -> None:
    """Patch series: ``nox -s patches -- apply|export|check``."""
    session.run("python", "-m", "harness", "patches", *session.posargs)


@nox.session
def source(session: nox.Session) -> None:
    """Base source: ``nox -s source -- fetch|export-mirror [--out PATH]``."""
    session.run("python", "-m", "harness", "source", *session.posargs)


@nox.session
def models(session: nox.Session) -> None:
    """Assemble or generate the matrix's models: ``nox -s models [-- NAME ...]``."""
    session.run("python", "-m", "harness", "models", *session.posargs)


@nox.session(name="ci-matrix")
def ci_matrix(session: nox.Session) -> None:
    """The CI job matrix from matrix.yaml as JSON: ``nox -s ci-matrix [-- --platform P --github-output]``."""
    session.run("python", "-m", "harness", "ci-matrix", *session.posargs)


@nox.session(name="check-windows")
def check_windows(session: nox.Session) -> None:
    """The Windows checks of ``python -m harness check-windows``: ``nox -s check-windows [-- ...]``."""
    session.run("python", "-m", "harness", "check-windows", *session.posargs)


@nox.session
def pytest(session: nox.Session) -> None:
    """The project's own pytest suite (including the end-to-end build on the real llama.cpp)."""
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def triage(session: nox.Session) -> None:
    """What changed between two runs: ``nox -s triage -- [A B] [--json]``; exit 1 on a regression."""
    session.run("python", "-m", "harness", "triage", *session.posargs)


@nox.session
def bisect(session: nox.Session) -> None:
    """First patch of the series that turns a check from pass to fail: ``nox -s bisect -- --platform P --check ...``."""
    session.run("python", "-m", "harness", "bisect", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Self-contained ``results/<run-id>/report.html``: ``nox -s report -- [RUN] [--markdown]``."""
    session.run("python", "-m", "harness", "report", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Pin-ladder benchmark on a CUDA machine: ``nox -s bench -- --build-dir DIR [--model GGUF]``."""
    session.run("python", "-m", "harness", "bench", *session.posargs)
