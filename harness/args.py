"""Command-line pieces shared by the harness's commands (the stages, patches, bisect ...)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from .common.errors import InputError


def add_common(ap: argparse.ArgumentParser) -> None:
    """Add ``--matrix``, ``--patches-dir`` and ``--work-dir`` (defaults: matrix.yaml, patches, .harness)."""
    ap.add_argument("--matrix", type=Path, default=Path("matrix.yaml"), help="matrix file (default: matrix.yaml)")
    ap.add_argument("--patches-dir", type=Path, default=Path("patches"), help="patch series directory")
    ap.add_argument("--work-dir", type=Path, default=Path(".harness"),
                    help="work trees and build directories (default: .harness)")


def positive(text: str) -> int:
    """An argparse type: ``text`` as an integer ≥ 1; raises ArgumentTypeError otherwise."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


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
