"""Command-line pieces shared by the harness's commands: the checkout the defaults point into, argparse types,
and the parent parsers that declare each option once (harness.cli builds every command from them).

Standard library only, at import and while parsing: ``--help`` of every command works before any of the
project's requirements is installed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Sequence

from .common.errors import InputError
from .stages.options import RUN_CHOICE, SANITIZERS, STAGE_OPTIONS, Group, Options, StageOption, declared

#: What marks the root of a harness checkout (with the ``harness/`` package beside it).
MARKER = "matrix.yaml"

__all__ = ["SANITIZERS", "bench_repeats", "bench_warmup", "build_options", "find_checkout", "in_checkout",
           "matrix_options", "parse_defines", "patches_options", "positive", "results_options", "run_options",
           "split_names", "stage_options", "strip_dashdash", "work_options"]


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


#: The argparse ``type`` of each StageOption.kind.
_KINDS = {"positive": positive, "bench_repeats": bench_repeats, "bench_warmup": bench_warmup, "path": Path}


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
        done, _comma, part = prefix.rpartition(",")
        head = f"{done}," if done else ""
        taken = set(done.split(",")) if done else set()
        return [head + n for n in names if n.startswith(part) and n not in taken]


def completes(action: argparse.Action, kind: str) -> argparse.Action:
    """``action`` with a :class:`MatrixNames` completer of ``kind``; returns it."""
    action.completer = MatrixNames(kind)  # type: ignore[attr-defined]  # read by argcomplete
    return action



def _add_option(ap: argparse.ArgumentParser, option: StageOption) -> None:
    """Declare ``option`` (harness.stages.options.STAGE_OPTIONS) on ``ap`` as its StageOption says: flags, type,
    default (a path's in the checkout, :func:`in_checkout`), help."""
    kwargs: dict[str, object] = {"dest": option.attribute, "help": option.help}
    if option.action:
        kwargs["action"] = option.action
    if option.kind:
        kwargs["type"] = _KINDS[option.kind]
    if option.choices:
        kwargs["choices"] = option.choices
    if option.metavar:
        kwargs["metavar"] = option.metavar
    if option.action not in ("store_true", "store_false"):
        kwargs["default"] = list(option.default) if isinstance(option.default, list) else option.default
    if option.checkout is not None:
        kwargs["default"] = in_checkout(option.checkout)
    action = ap.add_argument(*option.flags, **kwargs)  # type: ignore[arg-type]  # argparse's keywords differ per action
    if option.completes:
        completes(action, option.completes)


def _options(group: Group, flag: str | None = None) -> argparse.ArgumentParser:
    """A parent parser with the options of ``group`` (only ``flag`` of it when given)."""
    ap = argparse.ArgumentParser(add_help=False)
    for option in declared(group):
        if flag is None or option.name == flag:
            _add_option(ap, option)
    return ap


def matrix_options() -> argparse.ArgumentParser:
    """A parent parser with ``--matrix`` (default: the checkout's matrix.yaml)."""
    return _options("paths", "--matrix")


def patches_options() -> argparse.ArgumentParser:
    """A parent parser with ``--patches-dir`` (default: the checkout's patches/)."""
    return _options("paths", "--patches-dir")


def work_options() -> argparse.ArgumentParser:
    """A parent parser with ``--work-dir`` (default: the checkout's .harness/)."""
    return _options("paths", "--work-dir")


def results_options() -> argparse.ArgumentParser:
    """A parent parser with ``--results-dir`` (default: the checkout's results/)."""
    return _options("paths", "--results-dir")


def build_options() -> argparse.ArgumentParser:
    """A parent parser with what a build takes: ``--platform``, ``--gpu-arch``, ``-j`` and ``-D``
    (the stages, forecast, bisect)."""
    return _options("build")


def run_options() -> argparse.ArgumentParser:
    """A parent parser with what selects and shapes a run's tests, comparisons and speed pairs (the stages,
    forecast)."""
    return _options("run")


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


def stage_options(args: argparse.Namespace, **overrides: object) -> Options:
    """The options of harness.args.build_options and run_options in ``args`` as the stages' Options, with
    ``--work-dir`` and ``--patches-dir``: each StageOption's field, converted as it says (split_names,
    parse_defines); ``overrides`` replace fields (forecast: its own work directory, series and groups).
    Raises InputError for a malformed ``-D`` or an empty name.  Here, beside the parsers that declare those
    options, so that the commands and the forecast (harness.upstream.forecast) share it."""
    fields: dict[str, object] = {}
    for option in STAGE_OPTIONS:
        if option.field in RUN_CHOICE:
            continue
        value = getattr(args, option.attribute)
        if option.convert == "names":
            value = split_names(value, option.name)
        elif option.convert == "defines":
            value = parse_defines(value)
        fields[option.field] = value
    fields.update(overrides)
    if fields.get("upstream_only") and not fields.get("upstream_tests"):
        raise InputError("--upstream-test picks tests of upstream's suite: it needs --upstream-tests")
    return Options(**fields)  # type: ignore[arg-type]  # each field's type is its StageOption's (test_stage_options)
