"""Windows compile check on Linux: ``python -m harness check-windows [--tree PATH]``.

The patch series has host code that only a Windows build compiles: the pin
ladder reserves its pageable memory with ``VirtualAlloc`` under ``#ifdef
_WIN32`` and with ``mmap`` otherwise.  A Windows-only symbol outside its guard,
a missing include or a type error in that branch would otherwise show only on
a Windows machine.  This check compiles each file of ``CHECKED_FILES`` for two
targets with ``-fsyntax-only``:

``windows-x86_64``  the MinGW-w64 cross compiler (Debian package
                    ``g++-mingw-w64-x86-64-posix``; the posix thread model,
                    since GCC 12's win32 model has no ``std::mutex``), which
                    defines ``_WIN32`` and brings ``<windows.h>``
``linux-x86_64``    the host ``g++``, for the POSIX branch (CI compiles no
                    CUDA code otherwise)

Each file is compiled as a translation unit holding its prelude and an
``#include`` of it, so a header must bring every include it needs itself.
The compiles use ``-std=c++17 -Wall -Wextra -Werror``: the real build uses
``-Wall -Wextra`` too, and a warning that only the Windows branch raises (an
unused parameter, a signed/unsigned comparison with a ``DWORD``) is the kind
of slip this check is for.  The CUDA headers are searched with ``-isystem``,
so their own warnings (``crt/host_defines.h`` redefines ``__cdecl`` under GCC)
do not count.  ``-Werror=implicit-function-declaration`` is left out: it is a
C option (g++ ignores it with a warning) and in C++ a call to an undeclared
function is an error anyway.  ``__NV_NO_HOST_COMPILER_CHECK=1`` is defined
because ``crt/host_config.h`` refuses host compilers other than MSVC on
Windows when that check is on.

CUDA headers, first found wins (each must hold ``cuda_runtime_api.h`` and
``crt/host_defines.h``): ``--cuda-include``; the PyPI wheels
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` (pinned in requirements.txt)
installed in this Python environment; ``$CUDA_PATH/include``;
``/usr/local/cuda/include``.

Exit status: 0 when every compile passed, 1 when one failed (the summary line
of its target gives the first error line; every compile writes a log), 2 for
a problem with the setup: a compiler or the CUDA headers not found, a checked
file missing from the tree, or the tree could not be made.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..common.proc import command_line
from ..stages.building.cuda_headers import CudaHeaders, SetupError, find_cuda_headers

#: Debian package of the MinGW-w64 C++ cross compiler with the posix thread model.
MINGW_PACKAGE = "g++-mingw-w64-x86-64-posix"
#: Cross compilers tried in order when ``--mingw-cxx`` is not given.
MINGW_CANDIDATES = ("x86_64-w64-mingw32-g++-posix", "x86_64-w64-mingw32-g++")
#: Seconds one compile may take before it counts as failed.
COMPILE_TIMEOUT_S = 300

#: Flags of every compile (see the module docstring for the choice of -Werror).
COMMON_FLAGS = ("-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-D__NV_NO_HOST_COMPILER_CHECK=1")
#: Include directories, relative to the tree: the ones the CUDA backend's build uses.
INCLUDE_DIRS = ("ggml/include", "ggml/src")
#: Export macros of ggml-cuda's own sources (set by ggml's CMake for the shared library build).
GGML_CUDA_DEFINES = ("GGML_BACKEND_BUILD", "GGML_BACKEND_SHARED", "GGML_SHARED")
#: Export macros of a program linking the shared ggml libraries, such as a test.
GGML_CONSUMER_DEFINES = ("GGML_BACKEND_SHARED", "GGML_SHARED")


@dataclass(frozen=True)
class CheckedFile:
    """A file of the patch series with Windows-only host code.

    ``path``: relative to the tree, ``/``-separated.  ``prelude``: lines placed
    before its ``#include`` (the includes its real includer has before it;
    empty for a header that must stand alone).  ``defines``: macros of the
    target it is compiled into, as ``NAME`` or ``NAME=VALUE``.
    """

    path: str
    prelude: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()


#: What the check compiles.  pin-ladder.cuh is the pin ladder's host code (pageable reserve
#: and release, segment records, grant limit simulation); test-cuda-pin-ladder.cpp sets
#: environment variables with _putenv_s on Windows.
CHECKED_FILES: tuple[CheckedFile, ...] = (
    CheckedFile("ggml/src/ggml-cuda/pin-ladder.cuh", defines=GGML_CUDA_DEFINES),
    CheckedFile("tests/test-cuda-pin-ladder.cpp", defines=GGML_CONSUMER_DEFINES),
)


@dataclass(frozen=True)
class Target:
    """One compiler configuration: ``name`` (``windows-x86_64``), ``label`` (compiler and major
    version, for the summary), ``compiler`` (path) and ``defines`` (what ggml's CMake adds on
    that system: ``_XOPEN_SOURCE=600`` everywhere, ``_GNU_SOURCE`` on Linux,
    ``_CRT_SECURE_NO_WARNINGS`` on Windows)."""

    name: str
    label: str
    compiler: str
    defines: tuple[str, ...] = ()


@dataclass
class CompileResult:
    """One compile: the file (relative path), its log, the exit status (None when it timed out)
    and the first error line with tree paths made relative (None when it passed)."""

    file: str
    log: Path
    returncode: int | None
    first_error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the compiler exited 0."""
        return self.returncode == 0


@dataclass
class TargetResult:
    """The compiles of one target, in ``CHECKED_FILES`` order."""

    target: Target
    compiles: list[CompileResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every compile of the target passed."""
        return all(c.ok for c in self.compiles)

    def summary(self) -> str:
        """``<name> (<label>): ok`` or ``<name> (<label>): FAILED: <first error line>``."""
        head = f"{self.target.name} ({self.target.label})"
        failed = [c for c in self.compiles if not c.ok]
        if not failed:
            return f"{head}: ok"
        return f"{head}: FAILED: {failed[0].first_error}"


_ERROR_RE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+(?::\d+)?): (?:fatal )?error: ")


def first_error_line(output: str, tree: Path) -> str | None:
    """The first ``FILE:LINE[:COL]: error: ...`` line of compiler ``output``, else None.

    Paths under ``tree`` are shortened to the path relative to it, so the line
    names the file as the patch does (``ggml/src/ggml-cuda/pin-ladder.cuh:88:12:
    error: ...``).  Warnings turned into errors by -Werror count as errors.
    """
    prefix = str(tree.resolve()) + os.sep
    for line in output.splitlines():
        if _ERROR_RE.match(line):
            return line.replace(prefix, "")
    return None


def _major_version(compiler: str) -> str:
    """The major version printed by ``compiler -dumpversion`` (``12-posix`` gives ``12``)."""
    proc = subprocess.run([compiler, "-dumpversion"], capture_output=True, text=True, check=False)
    match = re.match(r"\d+", proc.stdout.strip())
    if proc.returncode != 0 or match is None:
        raise SetupError(f"{compiler} -dumpversion failed: {(proc.stderr or proc.stdout).strip()}")
    return match.group(0)


def find_mingw(explicit: str | None = None) -> Target:
    """The windows-x86_64 target: ``explicit`` or the first of MINGW_CANDIDATES on ``$PATH``.

    Raises SetupError naming the Debian package when none is found, or when the
    compiler uses the win32 thread model (its GCC 12 ``<mutex>`` has no
    ``std::mutex``, which MSVC and the posix model have).
    """
    names = (explicit,) if explicit else MINGW_CANDIDATES
    path = next((p for p in (shutil.which(n) for n in names) if p), None)
    if path is None:
        raise SetupError(f"MinGW-w64 cross compiler not found (tried {', '.join(names)}); "
                         f"install the Debian package {MINGW_PACKAGE} (apt-get install {MINGW_PACKAGE})")
    proc = subprocess.run([path, "-v"], capture_output=True, text=True, check=False)
    model = re.search(r"^Thread model: (\S+)", proc.stderr, re.M)
    if model and model.group(1) != "posix":
        raise SetupError(f"{path} uses the {model.group(1)} thread model, which has no std::mutex; "
                         f"install {MINGW_PACKAGE} and use x86_64-w64-mingw32-g++-posix "
                         "(or: update-alternatives --set x86_64-w64-mingw32-g++ /usr/bin/x86_64-w64-mingw32-g++-posix)")
    return Target("windows-x86_64", f"mingw-w64 g++ {_major_version(path)}", path,
                  ("_XOPEN_SOURCE=600", "_CRT_SECURE_NO_WARNINGS"))


def find_host_gxx(explicit: str | None = None) -> Target:
    """The linux-x86_64 target: ``explicit`` or ``g++`` from ``$PATH``; SetupError when missing."""
    name = explicit or "g++"
    path = shutil.which(name)
    if path is None:
        raise SetupError(f"host C++ compiler {name} not found; install the Debian package g++")
    return Target("linux-x86_64", f"g++ {_major_version(path)}", path, ("_XOPEN_SOURCE=600", "_GNU_SOURCE"))



def select_files(only: Sequence[str] = ()) -> list[CheckedFile]:
    """CHECKED_FILES, or those of them whose path is in ``only``; SetupError for an unknown path."""
    if not only:
        return list(CHECKED_FILES)
    known = {f.path: f for f in CHECKED_FILES}
    unknown = [p for p in only if p not in known]
    if unknown:
        raise SetupError(f"not a checked file: {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[p] for p in only]


def check_tree_has(tree: Path, files: Sequence[CheckedFile]) -> None:
    """Raise SetupError unless ``tree`` holds every file of ``files``."""
    missing = [f.path for f in files if not (tree / f.path).is_file()]
    if missing:
        raise SetupError(f"{tree}: missing {', '.join(missing)}; the tree is not the patched fork "
                         "(or the series no longer has the patch these files belong to)")


def compile_command(target: Target, tu: Path, tree: Path, cuda: CudaHeaders, checked: CheckedFile) -> list[str]:
    """The compiler argument list for translation unit ``tu`` of ``checked`` on ``target``."""
    cmd = [target.compiler, *COMMON_FLAGS]
    cmd += [f"-D{d}" for d in (*target.defines, *checked.defines)]
    cmd += [f"-I{tree / d}" for d in INCLUDE_DIRS]
    cmd += ["-isystem", str(cuda.include), str(tu)]
    return cmd


def _slug(path: str) -> str:
    return path.replace("/", "_")


def run_check(tree: Path, log_dir: Path, targets: Sequence[Target], cuda: CudaHeaders,
              files: Sequence[CheckedFile] = CHECKED_FILES) -> list[TargetResult]:
    """Compile every file of ``files`` for every target; return the results per target.

    ``tree``: the patched source tree.  Writes ``log_dir/<file>.cpp`` (the
    translation unit) and ``log_dir/<target>--<file>.log`` (the command, the
    compiler output and the exit status), after removing the files of those
    names that an earlier run left there.  Raises SetupError when a file is
    missing from ``tree``; a compile that fails or times out (COMPILE_TIMEOUT_S)
    is a failed result, not an exception.
    """
    tree = tree.resolve()
    check_tree_has(tree, files)
    log_dir.mkdir(parents=True, exist_ok=True)
    stale = [log_dir / f"{_slug(f.path)}.cpp" for f in CHECKED_FILES]
    stale += [log for t in targets for log in log_dir.glob(f"{t.name}--*.log")]
    for old in stale:
        old.unlink(missing_ok=True)
    units = {}
    for checked in files:
        tu = log_dir / f"{_slug(checked.path)}.cpp"
        tu.write_text("".join(line + "\n" for line in checked.prelude) + f'#include "{tree / checked.path}"\n')
        units[checked.path] = tu
    # plain ASCII messages in every locale, so the error lines read the same everywhere
    added = {"LC_ALL": "C"}
    env = {**os.environ, **added}
    results = []
    for target in targets:
        result = TargetResult(target)
        for checked in files:
            cmd = compile_command(target, units[checked.path], tree, cuda, checked)
            log = log_dir / f"{target.name}--{_slug(checked.path)}.log"
            start = time.monotonic()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env,
                                      timeout=COMPILE_TIMEOUT_S)
                rc: int | None = proc.returncode
                output = proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as exc:
                rc = None
                output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
            seconds = time.monotonic() - start
            status = f"exit status {rc}" if rc is not None else f"timed out after {COMPILE_TIMEOUT_S} s"
            log.write_text(f"$ {command_line(cmd, added)}\n# target: {target.name} ({target.label})\n"
                           f"# CUDA headers: {cuda.include} ({cuda.source})\n\n{output}\n# {status}, "
                           f"{seconds:.1f} s\n")
            first = None
            if rc != 0:
                first = first_error_line(output, tree) or (
                    f"{checked.path}: {status}: " + (output.strip().splitlines() or ["(no output)"])[0])
            result.compiles.append(CompileResult(checked.path, log, rc, first))
        results.append(result)
    return results


def _default_tree(args: argparse.Namespace) -> Path:
    """The fork work tree ``<work-dir>/fork/llama.cpp``, made from the series when missing or stale."""
    from ..matrix.config import MatrixError, load_matrix
    from ..stages.building.patches import PatchError, prepare_series_tree, read_series
    from ..stages.building.source import SourceError, obtain_base
    try:
        matrix = load_matrix(args.matrix)
        patches = read_series(args.patches_dir)
        base = obtain_base(matrix)
        return prepare_series_tree(base, args.work_dir.resolve(), "fork", patches)
    except (MatrixError, PatchError, SourceError, FileNotFoundError) as exc:
        raise SetupError(f"cannot make the fork work tree: {exc}") from exc


def main(argv: Sequence[str]) -> int:
    """``check-windows`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("check-windows", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness check-windows [--tree PATH] [options]``; returns the exit status.

    Prints the tree and CUDA headers used, one summary line per target and the
    log directory.  0: every compile passed; 1: a compile failed; 2: setup
    problem (message on stderr; for a missing cross compiler it names the
    Debian package).
    """
    try:
        files = select_files(args.only)
        if args.tree is not None:
            tree = args.tree
            check_tree_has(tree, files)
        targets = [find_mingw(args.mingw_cxx), find_host_gxx(args.host_cxx)]
        cuda = find_cuda_headers(args.cuda_include)
        if args.tree is None:
            tree = _default_tree(args)
        log_dir = args.log_dir or args.work_dir / "check-windows"
        print(f"tree: {tree}")
        print(f"CUDA headers: {cuda.include} ({cuda.source})")
        sys.stdout.flush()
        results = run_check(tree, log_dir, targets, cuda, files)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for result in results:
        print(result.summary())
        for compile_ in result.compiles:
            if not compile_.ok:
                print(f"  {compile_.file}: see {compile_.log}")
    print(f"logs: {log_dir}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
