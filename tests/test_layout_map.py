"""docs/layout.md's map of the package is the package: every module it names exists where it says, every
module of the package is named there, and every module longer than 400 lines says why in its docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
LAYOUT = ROOT / "docs" / "layout.md"
MODULE = re.compile(r"(?<![\w./-])([A-Za-z_][\w]*\.py)\b")
LONG_LINES = 400
#: No module of the package is longer than this: past it a module holds more than one job (issue 50).
MOST_LINES = 900


def the_map(text: str) -> list[str]:
    """The lines of the first fenced block of ``text`` (docs/layout.md's map)."""
    block = text.split("```", 2)[1]
    return block.splitlines()[1:]


def mapped_modules(lines: list[str]) -> tuple[set[str], set[str]]:
    """(modules, folders) the map names, as paths relative to the checkout: ``harness/stages/building/builds.py``.

    A line whose first word ends in ``/`` is a folder, inside the nearest folder of a smaller indent; the
    ``.py`` words of a line and of the lines continuing its description (indented further than any entry)
    are modules of the folder of the line's entry: that folder for a folder line, the enclosing one for a
    module line.
    """
    stack: list[tuple[int, str]] = []
    modules: set[str] = set()
    folders: set[str] = set()
    where = ""
    entry_indent = -1
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0].rstrip(",")
        if entry_indent >= 0 and indent > entry_indent + 8:  # a continuation of the last entry's description
            words = line
        else:
            entry_indent = indent
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            if first.endswith("/"):
                where = f"{parent}{first}"
                stack.append((indent, where))
                folders.add(where.rstrip("/"))
                words = line[indent + len(first):]
            else:
                where = parent
                words = line
        modules.update(where + m for m in MODULE.findall(words))
    return modules, folders


def test_the_map_names_every_module_where_it_is_and_no_other():
    modules, folders = mapped_modules(the_map(LAYOUT.read_text(encoding="utf-8")))
    tree = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - tree) == [], "named in docs/layout.md but not in the package"
    assert sorted(tree - modules) == [], "in the package but not named in docs/layout.md's map"
    assert sorted(f for f in folders if not (ROOT / f).is_dir()) == []


def test_the_map_reader_places_modules_in_their_folders():
    lines = ["harness/",
             "  cli.py                 the command line",
             "  matrix/                the inputs: config.py (typed), platforms.py (what a",
             "                         platform needs: fit.py's bounds)",
             "    model_sources/       one module per kind: file.py",
             "  stages/",
             "    building/          1 first",
             "      builds.py, cross.py    the builds",
             "                              of every platform (see shape.py)"]
    modules, folders = mapped_modules(lines)
    assert modules == {"harness/cli.py", "harness/matrix/config.py", "harness/matrix/platforms.py",
                       "harness/matrix/fit.py", "harness/matrix/model_sources/file.py",
                       "harness/stages/building/builds.py", "harness/stages/building/cross.py",
                       "harness/stages/building/shape.py"}
    assert folders == {"harness", "harness/matrix", "harness/matrix/model_sources", "harness/stages",
                       "harness/stages/building"}


def test_every_module_longer_than_400_lines_says_why_and_the_map_says_which():
    long = sorted(p for p in PACKAGE.rglob("*.py") if len(p.read_text(encoding="utf-8").splitlines()) > LONG_LINES)
    silent = [p.relative_to(ROOT).as_posix() for p in long
              if "Longer than 400 lines:" not in (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "")]
    assert silent == []
    text = LAYOUT.read_text(encoding="utf-8")
    said = [para for para in text.split("\n\n") if "modules are longer than 400 lines" in para]
    assert len(said) == 1, "docs/layout.md says once which modules are longer than 400 lines"
    named = {n for n in re.findall(r"`([\w/]+\.py)`", said[0]) if not n.startswith("tests/")}
    assert named == {p.relative_to(PACKAGE).as_posix() for p in long}
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
             "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
    count = said[0].split()[0].lower()
    assert (words.index(count) if count in words else int(count)) == len(long)


def modules_longer_than(limit: int, package: Path) -> list[str]:
    """``path: lines`` for every module below ``package`` longer than ``limit`` lines, in path order."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(package).as_posix()}: {lines}")
    return found


def test_no_module_is_longer_than_900_lines():
    assert modules_longer_than(MOST_LINES, PACKAGE) == [], "split the module by role into modules with one job"


def test_the_length_rule_finds_a_long_module(tmp_path: Path):
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "grab_bag.py").write_text("x = 1\n" * (MOST_LINES + 1), encoding="utf-8")
    (tmp_path / "room" / "one_job.py").write_text("x = 1\n" * MOST_LINES, encoding="utf-8")
    assert modules_longer_than(MOST_LINES, tmp_path) == [f"room/grab_bag.py: {MOST_LINES + 1}"]
