"""Comparison statuses are declared once (harness.record.statuses.COMPARISON, re-exported by
harness.record.statuses) and named through its constants (IDENTICAL, DIVERGED, CRASHED, TIMEOUT, UNSUPPORTED_UPSTREAM, GENERATION_FAILURES): no other module of the
harness spells one as a string, so a status renamed or added is one line of the declaration."""

import ast
from pathlib import Path

from harness.record.statuses import COMPARISON

PACKAGE = Path(__file__).resolve().parent.parent / "harness"

#: The module that declares the statuses.
DECLARATION = Path("record/statuses.py")

#: (module, word) pairs that spell a comparison status's word for another vocabulary, each with its reason.
OTHER_VOCABULARIES = {
    (Path("analysis/signatures.py"), "timeout"): "a failure signature's kind (KIND_ORDER), not a comparison's status",
    (Path("analysis/text_rules.py"), "timeout"): "a failure signature's kind (KIND_RANK), not a comparison's status",
    (Path("stages/native_tests/native_tests.py"), "timeout"): "ctest's word for a test it stopped, in that test's message",
    (Path("tools/mutation.py"), "timeout"): "mutmut's status of a mutant that made a test hang (docs/mutation.md)",
}


def status_literals(source: str) -> list[tuple[int, str]]:
    """(line, word) of every string constant in ``source`` that is a comparison status's name; docstrings and
    other longer texts do not count (a whole constant must be the name)."""
    names = set(COMPARISON.names)
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_module_but_the_declaration_spells_a_comparison_status():
    found = [f"{rel}:{line}: {word!r}" for path in sorted(PACKAGE.rglob("*.py"))
             if (rel := path.relative_to(PACKAGE)) != DECLARATION
             for line, word in status_literals(path.read_text(encoding="utf-8"))
             if (rel, word) not in OTHER_VOCABULARIES]
    assert found == [], "use the constants of harness.record.statuses instead:\n" + "\n".join(found)


def test_every_allowed_spelling_is_still_there():
    """An entry of OTHER_VOCABULARIES whose module no longer spells its word is stale: remove it."""
    for (rel, word) in OTHER_VOCABULARIES:
        assert word in {w for _, w in status_literals((PACKAGE / rel).read_text(encoding="utf-8"))}, (rel, word)


def test_the_rule_finds_the_literals_a_module_would_write():
    source = ('"""A docstring naming "diverged" is prose."""\n'
              'if c.status == "diverged": pass\n'
              'bad = status in ("crashed", "timeout")\n'
              'expect: str = "identical"\n'
              'ok = c.status == DIVERGED\n'
              'text = "identical (both generations end at once)"\n')
    assert sorted(status_literals(source)) == [(2, "diverged"), (3, "crashed"), (3, "timeout"), (4, "identical")]
