"""The README's bisect example, read as the shell reads it: the command line takes it as written, and
tests/test_bisect.py runs it (its arguments after ``--``) on a failing run of the fake project."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.cli import parse

ROOT = Path(__file__).resolve().parents[1]


def readme_bisect_command() -> list[str]:
    """The README's one ``nox -s bisect -- ...`` line, split as the shell splits it (a trailing comment is no
    argument)."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.strip().startswith("nox -s bisect -- ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0], comments=True)


def test_the_readme_bisect_example_bisects_every_failing_row_of_the_newest_run():
    argv = readme_bisect_command()
    assert argv[:4] == ["nox", "-s", "bisect", "--"]
    args = parse(["bisect", *argv[4:]])
    assert (args.run, args.check, args.upstream) == ("latest", None, None)
