"""docs/checks.md's table of the planted faults and the tests that run them cannot go stale.

Every file of tests/plants/ has a row (``| plant | test | what fails | tier |``, under "The test that runs each
plant").  A row's tier says how its plant is proven caught:

- ``fast`` or ``slow``: the row names one or more tests (``tests/test_x.py::test_name``), each a test function of a
  file that names the plant (its file name without ``.patch``: the patch itself or the evidence run recorded with
  it), and each test's tier, as pytest selects it (``-m slow``, markers from fixtures included), is the row's: one
  tier per test, in their order (``slow, fast``);
- ``GPU``: no test on this machine; the plant is run on a GPU machine by ``.ci/gpu-evidence.sh`` (``PLANT=``);
- ``none``: no test runs it, and the row says why.

A plant file nobody lists, a row for a file that is gone, a test that does not exist, that does not name its
plant or that runs in another tier than the row says is one problem each, naming the plant.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "checks.md"
#: The heading of the table's section in PAGE, and the table's header.
HEADING = "The test that runs each plant"
HEADER = ["plant", "test", "what fails", "tier"]
#: Where a row's plant file may live: the planted faults, and the slowdown test_e2e_speed.py keeps with its data.
PLANT_DIRS = (ROOT / "tests" / "plants", ROOT / "tests" / "data")
#: Files of tests/plants/ that are tools, not plants: each must be used by a test file.
TOOLS = {"series_with.py"}
TIERS = {"fast", "slow", "GPU", "none"}
TEST_ID = re.compile(r"^(tests/test_\w+\.py)::(test_\w+)$")


@dataclass(frozen=True)
class Row:
    """One row of the table: the plant's file name, the tests it names (``file::function``), the tiers it gives."""

    plant: str
    tests: tuple[str, ...]
    tiers: tuple[str, ...]
    line: int


def table_rows(text: str) -> list[Row]:
    """The rows of the table under the :data:`HEADING` heading of the Markdown ``text``, in order.

    The plant is the first code span of its cell; the tests are the code spans of theirs that look like
    ``tests/test_x.py::test_name``; the tiers are the comma-separated words of the last cell.  ``line`` is 1-based.
    Raises ValueError when there is no such heading, or no table with :data:`HEADER` below it.
    """
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    starts = [i for i, t in enumerate(tokens) if t.type == "heading_open" and tokens[i + 1].content == HEADING]
    if not starts:
        raise ValueError(f"no heading {HEADING!r}")
    rows: list[list[tuple[str, list[str]]]] = []
    lines: list[int] = []
    header: list[str] = []
    in_head = False
    for tok in tokens[starts[0] + 2:]:
        if tok.type in ("heading_open", "table_close"):
            break
        if tok.type in ("thead_open", "thead_close"):
            in_head = tok.type == "thead_open"
        elif tok.type == "tr_open" and not in_head:
            rows.append([])
            lines.append((tok.map or [0])[0] + 1)
        elif tok.type == "inline" and in_head:
            header.append(tok.content.strip())
        elif tok.type == "inline" and rows:
            spans = [c.content for c in tok.children or () if c.type == "code_inline"]
            rows[-1].append((tok.content.strip(), spans))
    if header != HEADER:
        raise ValueError(f"no table with the header {' | '.join(HEADER)} under {HEADING!r} (found {header})")
    out = []
    for cells, line in zip(rows, lines):
        (_, plant_spans), (_, test_spans), _, (tier_text, _) = cells
        out.append(Row(plant_spans[0] if plant_spans else "", tuple(s for s in test_spans if TEST_ID.match(s)),
                       tuple(t.strip() for t in tier_text.split(",")), line))
    return out


def slow_tests(test_ids: list[str]) -> set[str]:
    """Those of ``test_ids`` (``file::function``) that ``-m slow`` selects, as pytest collects them in one process
    (markers that tests/conftest.py adds for their fixtures included).  Raises CalledProcessError when collection
    fails."""
    if not test_ids:
        return set()
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-n", "0",
                           "-p", "no:cacheprovider", *test_ids], cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    collected = {line.split("[", 1)[0] for line in done.stdout.splitlines() if "::" in line}
    return {t for t in test_ids if t in collected}


def module_functions(path: Path) -> set[str]:
    """The names of the module-level functions of the Python file ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def table_problems(rows: list[Row], plant_files: list[str], slow: set[str], root: Path = ROOT) -> list[str]:
    """Every way ``rows`` disagree with the files of tests/plants/ (``plant_files``: their names) and the tests, one
    ``docs/checks.md:LINE: plant: what`` each (``tests/plants/NAME: ...`` for a file without a row).

    ``slow``: the named tests that pytest puts in the slow tier (:func:`slow_tests`).
    """
    problems = []
    listed = {r.plant for r in rows}
    for name in sorted(set(plant_files) - TOOLS - listed):
        problems.append(f"tests/plants/{name}: no row in {PAGE.relative_to(ROOT)} under {HEADING!r}")
    for name in sorted(set(plant_files) & TOOLS):
        users = [p.name for p in (root / "tests").glob("test_*.py") if name.removesuffix(".py") in p.read_text()]
        if not users:
            problems.append(f"tests/plants/{name}: a tool no test file uses")
    for row in rows:
        where = f"{PAGE.relative_to(ROOT)}:{row.line}: {row.plant or '(no plant)'}"
        stem = row.plant.removesuffix(".patch")
        if not any((d / row.plant).is_file() for d in PLANT_DIRS) or not row.plant:
            problems.append(f"{where}: no such file in tests/plants/ or tests/data/")
        if not set(row.tiers) <= TIERS:
            problems.append(f"{where}: tier {', '.join(row.tiers)} is not one of {', '.join(sorted(TIERS))}")
            continue
        if row.tiers in (("GPU",), ("none",)):
            if row.tests:
                problems.append(f"{where}: tier {row.tiers[0]} but the row names tests")
            continue
        if not row.tests or len(row.tests) != len(row.tiers):
            problems.append(f"{where}: {len(row.tests)} test(s) for {len(row.tiers)} tier(s)")
            continue
        for test, tier in zip(row.tests, row.tiers):
            file, function = test.split("::")
            path = root / file
            if not path.is_file() or function not in module_functions(path):
                problems.append(f"{where}: {test} does not exist")
            elif stem not in path.read_text(encoding="utf-8"):
                problems.append(f"{where}: {file} does not name the plant")
            elif ("slow" if test in slow else "fast") != tier:
                problems.append(f"{where}: {test} runs in the {'slow' if test in slow else 'fast'} tier, not {tier}")
    return problems


def _plant_files() -> list[str]:
    """The names of the files of tests/plants/ (patches and tools)."""
    return sorted(p.name for p in (ROOT / "tests" / "plants").iterdir() if p.is_file())


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    """The table's rows as docs/checks.md has them."""
    return table_rows(PAGE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def slow(rows) -> set[str]:
    """The tests the table names that pytest puts in the slow tier (one collection, about 1.5 s)."""
    return slow_tests(sorted({t for r in rows for t in r.tests}))


def test_every_plant_has_a_row_naming_the_tests_that_run_it_in_their_tier(rows, slow):
    problems = table_problems(rows, _plant_files(), slow)
    assert not problems, "\n".join(problems)
    assert len({r.plant for r in rows}) == len(rows)  # one row a plant


def test_a_plant_without_a_row_a_test_that_does_not_name_it_and_a_wrong_tier_are_found(rows, slow):
    tested = next(r for r in rows if r.tiers == ("fast",))
    elsewhere = next(r for r in rows if r.tests and tested.plant.removesuffix(".patch")
                     not in (ROOT / r.tests[0].split("::")[0]).read_text(encoding="utf-8"))
    planted = [
        *rows,
        Row("cuda-a-new-plant.patch", (), ("GPU",), 0),  # a row whose file is not there
        Row(tested.plant, elsewhere.tests[:1], ("fast",), 1),  # a test file that does not name the plant
        Row(tested.plant, tested.tests, ("slow",), 2),  # the wrong tier
        Row(tested.plant, ("tests/test_expectations.py::test_no_such_test",), ("fast",), 3),
    ]
    found = table_problems(planted, [*_plant_files(), "llama-a-plant-nobody-lists.patch"], slow)
    assert found == [
        f"tests/plants/llama-a-plant-nobody-lists.patch: no row in docs/checks.md under {HEADING!r}",
        "docs/checks.md:0: cuda-a-new-plant.patch: no such file in tests/plants/ or tests/data/",
        f"docs/checks.md:1: {tested.plant}: {elsewhere.tests[0].split('::')[0]} does not name the plant",
        f"docs/checks.md:2: {tested.plant}: {tested.tests[0]} runs in the fast tier, not slow",
        f"docs/checks.md:3: {tested.plant}: tests/test_expectations.py::test_no_such_test does not exist",
    ]
