"""Command-line pieces shared by the harness's commands: the checkout the defaults point into, argparse types,
and the parent parsers that declare each option once (harness.cli builds every command from them).

Standard library only, at import and while parsing: ``--help`` of every command works before any of the
project's requirements is installed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .common.errors import InputError

if TYPE_CHECKING:
    from .stages.options import Options

#: What marks the root of a harness checkout (with the ``harness/`` package beside it).
MARKER = "matrix.yaml"

#: compute-sanitizer tools the native tests can run under (harness.stages.native_tests.native_tests).
SANITIZERS = ("memcheck", "racecheck", "initcheck", "synccheck")


def find_checkout(start: Path | None = None) -> Path | None:
    """The harness checkout holding ``start`` (default: the working directory), found as git finds its
    repository: the nearest of ``start`` and its parents that holds ``matrix.yaml`` and ``harness/``.
    Outside every checkout, the one this package was imported from when it is a checkout (an editable
    install); None when neither is."""
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / MARKER).is_file() and (folder / "harness").is_dir():
            return folder
    own = Path(__file__).resolve().parent.parent
    return own if (own / MARKER).is_file() else None


def in_checkout(name: str) -> Path:
    """The default path of ``name`` (``matrix.yaml``, ``patches/``, ``results/``, ``.harness/`` …) in the checkout
    (:func:`find_checkout`): relative to the working directory when that is in the checkout, else absolute;
    ``name`` itself, relative to the working directory, outside every checkout."""
    root = find_checkout()
    if root is None:
        return Path(name)
    cwd = Path.cwd().absolute()
    if root == cwd or root in cwd.parents:
        return Path(os.path.relpath(root / name))
    return root / name


def positive(text: str) -> int:
    """An argparse type: ``text`` as an integer ≥ 1; raises ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def bench_repeats(text: str) -> int:
    """An argparse type: timed rounds of the speed stage, an integer >= 5 (the matrix schema's minimum:
    fewer samples give the rank test no power; harness/common/statistics.py)."""
    value = positive(text)
    if value < 5:
        raise argparse.ArgumentTypeError(f"{text}: the speed stage needs at least 5 rounds")
    return value


def bench_warmup(text: str) -> int:
    """An argparse type: untimed rounds of the speed stage before the timed ones, an integer from 0 to 20
    (the matrix schema's range for ``warmup``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number of rounds") from None
    if not 0 <= value <= 20:
        raise argparse.ArgumentTypeError(f"{text}: the speed stage's warm-up rounds are 0 to 20")
    return value


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


class MatrixNames:
    """An argcomplete completer of the names of one kind of the matrix (``platforms``, ``groups`` or ``models``):
    what the shell offers after ``--platform``, ``--group`` or ``--model`` instead of file names.

    Called by argcomplete (``eval "$(register-python-argcomplete llama-fork-harness)"``) with the word typed so
    far (``prefix``) and what was parsed before it (``parsed_args``: its ``--matrix`` where given, else the
    checkout's matrix.yaml).  Returns the names that start with the word's last comma-separated part, each
    with the parts before it (``--platform a,<TAB>``), in the matrix's order; none where the matrix cannot be
    read (the shell then offers nothing, and the command itself says what is wrong).  The matrix is read by
    harness.matrix.config.load_matrix, imported only when the shell asks.
    """

    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, prefix: str, parsed_args: argparse.Namespace | None = None, **_: object) -> list[str]:
        from .matrix.config import load_matrix
        path = getattr(parsed_args, "matrix", None) or in_checkout(MARKER)
        try:
            names = list(getattr(load_matrix(Path(path)), self.kind))
        except Exception:  # noqa: BLE001 - any unreadable matrix: nothing to offer, the command says why
            return []
        done, _, part = prefix.rpartition(",")
        head = f"{done}," if done else ""
        taken = set(done.split(",")) if done else set()
        return [head + n for n in names if n.startswith(part) and n not in taken]


def completes(action: argparse.Action, kind: str) -> argparse.Action:
    """``action`` with a :class:`MatrixNames` completer of ``kind``; returns it."""
    action.completer = MatrixNames(kind)  # type: ignore[attr-defined]  # read by argcomplete
    return action


def _checkout_path(flag: str, name: str, what: str) -> argparse.ArgumentParser:
    """A parent parser with the one path option ``flag`` (``what`` it names), default ``name`` in the
    checkout (:func:`in_checkout`)."""
    ap = _parent()
    ap.add_argument(flag, type=Path, default=in_checkout(name), help=f"{what} (default: {name} of the checkout)")
    return ap


def matrix_options() -> argparse.ArgumentParser:
    """A parent parser with ``--matrix`` (default: the checkout's matrix.yaml)."""
    return _checkout_path("--matrix", "matrix.yaml", "matrix file")


def patches_options() -> argparse.ArgumentParser:
    """A parent parser with ``--patches-dir`` (default: the checkout's patches/)."""
    return _checkout_path("--patches-dir", "patches/", "patch series directory")


def work_options() -> argparse.ArgumentParser:
    """A parent parser with ``--work-dir`` (default: the checkout's .harness/)."""
    return _checkout_path("--work-dir", ".harness/", "work trees and build directories")


def results_options() -> argparse.ArgumentParser:
    """A parent parser with ``--results-dir`` (default: the checkout's results/)."""
    return _checkout_path("--results-dir", "results/", "where runs are written, one directory each")


def build_options() -> argparse.ArgumentParser:
    """A parent parser with what a build takes: ``--platform``, ``--cuda-arch``, ``-j`` and ``-D``
    (the stages, forecast, bisect)."""
    ap = _parent()
    completes(ap.add_argument("--platform", action="append", default=[],
                              help="platform from matrix.yaml (repeatable or comma separated; default: every "
                                   "platform, those this machine cannot run reported as skipped; forecast: "
                                   "linux-x86_64-cpu and linux-x86_64-cuda; bisect: exactly one)"), "platforms")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES (default: from nvidia-smi)")
    ap.add_argument("-j", "--jobs", type=positive, default=None,
                    help="jobs at once, every build and compile step of the run together "
                         "(default: the cores this process may use; docs/platforms.md)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="VAR=VALUE",
                    help="extra CMake cache option passed through to every configure")
    return ap


def run_options() -> argparse.ArgumentParser:
    """A parent parser with what selects and shapes a run's tests, comparisons and speed pairs (the stages,
    forecast)."""
    ap = _parent()
    ap.add_argument("--run-id", default=None, help="continue this run (default: $HARNESS_RUN_ID or a new run)")
    ap.add_argument("--sanitize", choices=SANITIZERS, default=None,
                    help="also run the native tests under compute-sanitizer with this tool")
    ap.add_argument("--upstream-tests", action="store_true",
                    help="the test command also runs upstream's own ctest suite (matrix.yaml upstream_tests) on "
                         "base and fork side by side, and test-backend-ops on a GPU (docs/upstream-tests.md)")
    completes(ap.add_argument("--model", action="append", default=[], help="only these models (repeatable)"),
              "models")
    completes(ap.add_argument("--group", action="append", default=[],
                              help="only these comparison groups (repeatable)"), "groups")
    ap.add_argument("--n-predict", type=positive, default=None, help="tokens per generation (default: matrix)")
    ap.add_argument("--repeats", type=positive, default=None, help="runs per configuration (default: matrix)")
    ap.add_argument("--lanes", type=positive, default=None,
                    help="generations at once on a CPU platform, each process with cores/lanes threads "
                         "(default: the machine's cores, at most 8; 1: one at a time with llama.cpp's default "
                         "threads; docs/cache.md)")
    ap.add_argument("--no-bench", dest="bench", action="store_false",
                    help="compare-outputs without its speed stage (the groups' speed rules; docs/speed.md)")
    ap.add_argument("--bench-repeats", type=bench_repeats, default=None,
                    help="timed rounds per speed rule (default: matrix; at least 5)")
    ap.add_argument("--bench-warmup", type=bench_warmup, default=None, metavar="N",
                    help="untimed rounds before a speed rule's timed ones (default: matrix; 0-20)")
    ap.add_argument("--no-cache", action="store_true",
                    help="regenerate every generation, rerun every native test and measure every speed pair "
                         "instead of reusing results "
                         "whose inputs are byte-identical (docs/cache.md); fresh results still refresh the cache")
    return ap


def parse_defines(values: Sequence[str]) -> dict[str, str]:
    """``-D VAR=VALUE`` arguments as a mapping of CMake cache options; raises InputError naming a malformed one."""
    defines = {}
    for d in values:
        if "=" not in d:
            raise InputError(f"-D {d}: expected VAR=VALUE")
        key, value = d.split("=", 1)
        defines[key] = value
    return defines


def split_names(values: Sequence[str], option: str = "a name option") -> list[str]:
    """Repeatable, comma-separated names (``--platform a,b --platform c``) as one list.

    Raises InputError naming ``option`` (e.g. ``--group``) for an empty or whitespace-only name (``--group ''``,
    ``a,,b``): left out, the option would select everything instead of nothing the user meant."""
    names = [v for item in values for v in item.split(",")]
    if any(not v.strip() for v in names):
        empty = next(item for item in values if any(not v.strip() for v in item.split(",")))
        raise InputError(f"{option} {empty!r}: an empty name; name what to select, or leave {option} out to "
                         "select everything")
    return names


def strip_dashdash(argv: Sequence[str]) -> list[str]:
    """``argv`` without a leading ``--`` (nox passes its posargs after one)."""
    argv = list(argv)
    return argv[1:] if argv[:1] == ["--"] else argv


def stage_options(args: argparse.Namespace, **overrides) -> Options:
    """The options of harness.args.build_options and run_options in ``args`` as the stages' Options, with
    ``--work-dir`` and ``--patches-dir``; ``overrides`` replace fields (forecast: its own work directory,
    series and groups).  Raises InputError for a malformed ``-D``.  Here, beside the parsers that declare those
    options, so that the commands and the forecast (harness.analysis.forecast) share it."""
    from .stages.options import Options  # when a command runs: the command line imports only the standard library
    fields = dict(platforms=split_names(args.platform, "--platform"), cmake_defines=parse_defines(args.defines),
                  cuda_arch=args.cuda_arch, jobs=args.jobs, sanitize=args.sanitize,
                  models=split_names(args.model, "--model"), groups=split_names(args.group, "--group"),
                  n_predict=args.n_predict, repeats=args.repeats, work_dir=args.work_dir, patches_dir=args.patches_dir, bench=args.bench,
                  bench_repeats=args.bench_repeats, bench_warmup=args.bench_warmup, no_cache=args.no_cache,
                  lanes=args.lanes, upstream_tests=args.upstream_tests)
    fields.update(overrides)
    return Options(**fields)
