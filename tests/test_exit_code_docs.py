"""The exit codes are told in three places (harness/common/errors.py, noxfile.py, README.md): they agree.

errors.py's table is the reference; each code the others name must mean there what it means in it
(compared on the words before the first colon, e.g. "bad input or environment").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness.common import errors

ROOT = Path(__file__).resolve().parents[1]


def reference_table() -> dict[int, str]:
    """errors.py's docstring table: code -> its meaning up to the first colon."""
    rows = re.findall(r"^(\d+)\s{2,}([^:\n]+):", errors.__doc__ or "", re.M)
    return {int(code): meaning.strip() for code, meaning in rows}


def test_the_reference_table_agrees_with_the_constants():
    table = reference_table()
    assert table[errors.EXIT_PASSED] == "passed"
    assert table[errors.EXIT_FAILED] == "failed"
    assert table[errors.EXIT_BAD_INPUT] == table[errors.EXIT_ENVIRONMENT] == "bad input or environment"
    assert table[errors.EXIT_INCOMPLETE] == "incomplete"


def test_the_noxfile_docstring_names_the_codes_as_errors_py_does():
    doc = ast.get_docstring(ast.parse((ROOT / "noxfile.py").read_text()))
    listed = re.search(r"\(harness/common/errors\.py: ([^)]*)\)", " ".join(doc.split()))
    assert listed, "noxfile.py's docstring no longer lists the exit codes after harness/common/errors.py"
    pairs = [re.match(r"(\d+) (.+)", item.strip()).groups() for item in listed.group(1).split(",")]
    table = reference_table()
    assert pairs and {int(code): meaning for code, meaning in pairs} == {int(c): table.get(int(c)) for c, _ in pairs}


def exit_code_tables() -> list[tuple[Path, dict[int, str]]]:
    """Every "| code | meaning |" table of README.md and docs/: (file, code -> meaning up to the first colon)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        for table in re.findall(r"^\| code \| meaning \|\n\|[-:| ]+\|\n((?:\|.*\n)+)", path.read_text(), re.M):
            rows = re.findall(r"^\| (\d+) \| ([^:|]+):", table, re.M)
            found.append((path, {int(code): meaning.strip() for code, meaning in rows}))
    return found


def test_the_readme_table_names_the_codes_as_errors_py_does():
    tables = exit_code_tables()
    assert tables, "no exit-code table (| code | meaning |) in README.md or docs/"
    reference = reference_table()
    for path, table in tables:
        assert table == {code: reference.get(code) for code in table}, path
