"""Stage 3: configure and build one platform and build variant with CMake and Ninja.

One build directory per platform and variant (``base``: upstream as pinned,
``fork``: base plus the patch series).  Each build is keyed on the base
commit, the series digest (fork only), the CMake options and the targets;
when the key and the outputs are unchanged, neither configure nor build runs.
Every step writes its own log and exit code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ...common import proc
from ...common.jobserver import JobBudget
from ...common.locks import BuildLock

from ...common.errors import EnvironmentProblem
from ...record.layout import BUILD_FILES
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED

#: Bumped when the way builds are configured changes, so old build dirs are not reused.
BUILD_SCHEME = 1


class BuildError(EnvironmentProblem):
    """A build could not even be attempted (e.g. cmake or ninja missing)."""


@dataclass(frozen=True)
class BuildRequest:
    """What to build: ``source_dir`` into ``build_dir`` with ``cmake_options`` and ``targets``.

    ``exe_suffix``: file name suffix of the platform's executables (``.exe``
    for Windows, also when cross-built on Linux).
    """

    platform: str
    variant: str
    source_dir: Path
    build_dir: Path
    cmake_options: Mapping[str, str]
    targets: tuple[str, ...]
    key_parts: Mapping[str, str] = field(default_factory=dict)
    jobs: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    exe_suffix: str = ""

    def key(self) -> str:
        """sha256 over base commit, series digest, CMake options, targets and BUILD_SCHEME (hex, 16 chars)."""
        blob = json.dumps({"scheme": BUILD_SCHEME, "platform": self.platform, "variant": self.variant,
                           "options": dict(sorted(self.cmake_options.items())),
                           "targets": sorted(self.targets), **dict(self.key_parts)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class BuildResult:
    """Outcome of one build: status passed/failed/error, seconds, logs and the bin dir."""

    platform: str
    variant: str
    status: str
    key: str
    build_dir: Path
    seconds: float
    up_to_date: bool
    detail: str = ""
    logs: dict[str, Path] = field(default_factory=dict)

    @property
    def bin_dir(self) -> Path:
        """Directory holding the built executables."""
        return self.build_dir / "bin"


def find_tool(name: str) -> str | None:
    """Path of executable ``name``: beside this Python first, else on PATH.

    A virtual environment's bin/ holds cmake, ninja, ctest and ccache at the versions pinned in
    requirements.txt, whether or not it is activated; a system CMake on PATH may be older than
    the 3.31 the compile step's CUDA unity groups and the relocatable unity sources need (Debian
    12 has 3.25, which configures without them and says nothing), so the pinned one wins.
    """
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def _tool(name: str) -> str:
    found = find_tool(name)
    if not found:
        raise BuildError(f"{name} not found on PATH; install the project's requirements "
                         f"(pip install -r requirements.txt)")
    return found


def compiler_launcher_options(device_language: str | None = None) -> dict[str, str]:
    """CMake options for ccache when it is on PATH, else {}: the launcher of C, C++ and ``device_language``, the
    CMake language of a GPU kind's device code (harness.kinds.shape.GpuKind.device_language: ``CUDA``; None: none).

    Besides the launchers, ``CMAKE_UNITY_BUILD_RELOCATABLE`` (CMake >= 3.31) makes
    the generated unity sources include their members by relative paths, so the
    unity translation units of libllama hash the same in every tree (base, fork,
    bisect steps, other clones) and ccache hits across them.
    """
    ccache = find_tool("ccache")
    if not ccache:
        return {}
    languages = ("C", "CXX", *((device_language,) if device_language else ()))
    return {**{f"CMAKE_{lang}_COMPILER_LAUNCHER": ccache for lang in languages}, "CMAKE_UNITY_BUILD_RELOCATABLE": "ON"}


def ccache_env(base_dir: Path) -> dict[str, str]:
    """Environment for builds whose source trees sit at equal depth under ``base_dir``.

    ccache rewrites absolute paths below ``base_dir`` to relative ones and
    leaves the working directory out of the hash, so the same file compiled in
    two such trees (base and fork, or two bisect steps) is compiled once.
    """
    return {"CCACHE_BASEDIR": str(base_dir), "CCACHE_NOHASHDIR": "1"}


def _run_step(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
              budget: JobBudget | None = None) -> tuple[int, float]:
    """Run ``argv`` (extra ``env`` added) with stdout+stderr into ``log`` and the exit code into ``log``.rc.

    ``budget``: the run's job budget (harness.common.jobserver): the child gets its environment and
    runs holding one of its slots (waiting for one first), and the log's second line says which
    budget governs the step, or why none does.  Returns (exit code, seconds).
    The child runs in its own process group (harness.common.proc): an interrupt
    terminates cmake, ninja and every compiler they started.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    if budget is not None:
        env = {**(env or {}), **budget.env()}
    with open(log, "wb") as fh:
        fh.write(("$ " + proc.command_line(argv, env) + "\n").encode())
        if budget is not None:
            fh.write((budget.describe() + "\n").encode())
        fh.flush()
        with budget.slot() if budget is not None else nullcontext():
            done = proc.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    rc = done.returncode if done.returncode is not None else -1
    log.with_suffix(".rc").write_text(f"{rc}\n")
    return rc, done.seconds


def first_error_line(log: Path) -> str:
    """The first line of a build log that reads like a compiler/linker/CMake error ('' if none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        low = line.lower()
        if "error:" in low or "error " in low[:12] or "cmake error" in low or "undefined reference" in low:
            return line.strip()[:300]
    return ""


def outputs_exist(req: BuildRequest) -> bool:
    """True when every requested target's executable is in the build's bin dir."""
    bin_dir = req.build_dir / "bin"
    return all((bin_dir / (t + req.exe_suffix)).exists() for t in req.targets)


def is_up_to_date(req: BuildRequest) -> bool:
    """True when ``req.build_dir`` holds a finished build of ``req``'s key with every target present.

    The stamp (``harness-build.json``) is removed before a build starts and
    written only after it succeeded, so a build that was interrupted or failed
    is never taken as up to date.
    """
    stamp = req.build_dir / "harness-build.json"
    try:
        recorded = json.loads(stamp.read_text()).get("key")
    except (OSError, ValueError):
        return False
    return recorded == req.key() and outputs_exist(req)


def build(req: BuildRequest, logs_dir: Path, say: Callable[[str], None] | None = None,
          budget: JobBudget | None = None) -> BuildResult:
    """Configure (if needed) and build ``req``; logs go to ``logs_dir`` (configure.log, build.log).

    ``budget``: the run's job budget (harness.common.jobserver), shared with the builds running
    beside this one; where it governs, ninja gets no ``-j``.  None: ``-j req.jobs`` where given,
    else ninja's default.

    Holds the build directory's lock for writing (harness.common.locks) throughout: a
    second process building the same directory waits, then finds it up to
    date; a process running the binaries (lock held for reading) is waited
    for.  ``say`` gets a line when the wait begins.

    Returns a BuildResult whose status is ``passed`` (up to date or built),
    ``failed`` (configure or build exited non-zero; ``detail`` holds the first
    error line) or ``error`` (the build could not be started).  Never raises
    for a failing build, so other platforms and variants still run.
    """
    with BuildLock(req.build_dir).write(say):
        return _build_locked(req, logs_dir, budget)


def up_to_date_result(req: BuildRequest, logs_dir: Path) -> BuildResult:
    """The BuildResult of a build directory :func:`is_up_to_date` accepted (a line goes to ``build.log``)."""
    key = req.key()
    logs_dir.mkdir(parents=True, exist_ok=True)
    with open(logs_dir / BUILD_FILES["build"], "a") as fh:  # a later stage of the run keeps the real build's log
        fh.write(f"up to date: key {key}, {req.build_dir}\n")
    return BuildResult(req.platform, req.variant, STEP_PASSED, key, req.build_dir, 0.0, True,
                       detail=f"up to date (key {key})", logs={"build": logs_dir / BUILD_FILES["build"]})


def _build_locked(req: BuildRequest, logs_dir: Path, budget: JobBudget | None) -> BuildResult:
    if is_up_to_date(req):
        return up_to_date_result(req, logs_dir)
    key = req.key()
    stamp = req.build_dir / "harness-build.json"
    logs_dir.mkdir(parents=True, exist_ok=True)
    result = BuildResult(req.platform, req.variant, STEP_PASSED, key, req.build_dir, 0.0, False)
    try:
        cmake, ninja = _tool("cmake"), _tool("ninja")
    except BuildError as exc:
        result.status, result.detail = STEP_ERROR, str(exc)
        return result
    stamp.unlink(missing_ok=True)
    req.build_dir.mkdir(parents=True, exist_ok=True)
    defs = [f"-D{k}={v}" for k, v in sorted(req.cmake_options.items())]
    configure = [cmake, "-S", str(req.source_dir), "-B", str(req.build_dir), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={ninja}", *defs]
    jobs = budget.jobs_option(req.jobs) if budget is not None else ["-j", str(req.jobs)] if req.jobs else []
    steps = [("configure", configure),
             ("build", [cmake, "--build", str(req.build_dir), *jobs, "--target", *req.targets])]
    for name, argv in steps:
        log = logs_dir / BUILD_FILES[name]
        rc, secs = _run_step(argv, log, req.env, budget)
        result.logs[name] = log
        result.seconds += secs
        if rc != 0:
            result.status = STEP_FAILED
            result.detail = f"{name} failed: " + (first_error_line(log) or f"exit {rc}")
            return result
    stamp.write_text(json.dumps({"key": key, "targets": list(req.targets),
                                 "options": dict(req.cmake_options)}, indent=2))
    result.detail = f"built in {result.seconds:.0f} s (key {key})"
    return result
