"""Step, comparison, verdict and patch statuses are declared once (harness.common.statuses: STEP, COMPARISON,
VERDICT, PATCH) and named through their constants (STEP_PASSED, STEP_FAILED, ..., IDENTICAL, DIVERGED, CRASHED,
TIMEOUT, UNSUPPORTED_UPSTREAM, GENERATION_FAILURES, VERDICT_IN_PROGRESS, PATCH_CLEAN, ...): no other module of the
harness or of benchmarks/ spells one as a string, nor as a CSS class of report.html (a badge's colour is its
outcome's class, written from the declaration), so a status renamed or added is one line of the declaration.  A word of another vocabulary that a status shares (ctest's outcome of a test, a
finding's, JUnit's element, a run's verdict) is declared once as a constant of the module that owns that
vocabulary, and only that declaration may spell it (each listed below with its reason)."""

import ast
import io
from functools import cache
from pathlib import Path
from typing import Iterable

import re

from harness.views import report
from harness.common import console
from harness.common.statuses import COMPARISON, PATCH, STEP, STEP_ERROR, STEP_FAILED, STEP_INCOMPLETE, \
    STEP_INTERRUPTED, VERDICT, Status

PACKAGE = Path(__file__).resolve().parent.parent / "harness"

#: The benchmark scripts, which read runs' statuses too.
BENCHMARKS = PACKAGE.parent / "benchmarks"

#: The module that declares the statuses.
DECLARATION = Path("common/statuses.py")

#: (module, where) that spell a comparison status's word for another vocabulary, each with its reason; ``where``
#: is the module-level name the word is written under (a function, a class or a declared constant).
OTHER_VOCABULARIES = {
    (Path("triage/signatures.py"), "_classify_test"): "the ``timeout`` signature kind, not a comparison's status",
    (Path("triage/signatures.py"), "generate_signatures"): "the ``timeout`` signature kind",
    (Path("triage/text_rules.py"), "KIND_RANK"): "the ``timeout`` signature kind's rank",
    (Path("triage/text_rules.py"), "classify_text"): "the ``timeout`` signature kind",
    (Path("stages/native_tests/native_tests.py"), "_run_wrapped"): "ctest's word for a test it stopped, in that "
                                                                     "test's message",
    (Path("tools/mutation.py"), "CAUGHT"): "mutmut's status of a mutant that made a test hang (docs/mutation.md)",
}

#: (module, where) that declare a word a step status shares, for another vocabulary, each with its reason.  Every
#: other module names those words through the declared constants.
STEP_WORDS_OF_OTHER_VOCABULARIES = {
    (Path("record/native_tests.py"), "CASE_PASSED"): "ctest's outcomes of one native test (tests.json)",
    (Path("record/expectations.py"), "FINDING_PASSED"): "the outcomes of one rule on one load (a finding)",
    (Path("record/junit.py"), "PASSED"): "JUnit's outcomes of a <testcase> and the elements that carry them",
    (Path("upstream/roll_state.py"), "SKIPPED_BY_HAND"): "a roll's outcome of a patch dropped by git am --skip",
    (Path("triage/triage.py"), "TRIAGE_REGRESSED"): "the verdicts of a triage report",
    (Path("stages/outputs/divergence.py"), "TEXT_DIFFERS"): "a llama-completion text that may be cut (a TextCheck)",
}

#: (module, where) that spell a patch status's word for another vocabulary, each with its reason.
PATCH_WORDS_OF_OTHER_VOCABULARIES = {
    (Path("triage/speed_spread.py"), "__all__"): "the function ``clean`` of the module, exported",
    (Path("triage/triage.py"), "TRIAGE_REGRESSED"): "the verdict of a triage report that found no regression",
    (Path("stages/building/patches.py"), "Git"): "git's ``clean`` command",
}

#: Calls whose first argument is a key or a field's name (``data.get("error")``), or an XML element's tag
#: (``case.find("skipped")``); ``SubElement``'s second argument is a tag too.
KEY_CALLS = frozenset({"get", "pop", "setdefault", "find", "findall", "findtext", "iter"})


def _keys(tree: ast.AST) -> set[int]:
    """ids of the constants of ``tree`` that name a key, a field or an XML element (see :func:`status_literals`)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            found.add(id(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            found.add(id(node.left))
        elif isinstance(node, ast.Call):
            called = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if called in KEY_CALLS and node.args:
                found.add(id(node.args[0]))
            elif called == "SubElement" and len(node.args) > 1:
                found.add(id(node.args[1]))
    return found


def _where(statement: ast.stmt) -> str:
    """The module-level name ``statement`` is written under: a function's or class's name, or the first name an
    assignment binds (``A, B = ...``: ``A``); "" for any other statement."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return statement.name
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, ast.AnnAssign) else []
    for target in targets:
        for node in [target, *getattr(target, "elts", ())]:
            if isinstance(node, ast.Name):
                return node.id
    return ""


@cache
def _tree(source: str) -> ast.Module:
    """The syntax tree of a module's ``source``, parsed once per text for every rule that reads it; not to be
    changed."""
    return ast.parse(source)


def status_literals(source: str, names: Iterable[str], *, fields: bool = True) -> list[tuple[int, str, str]]:
    """(line, word, where) of every string constant in ``source`` that is one of ``names``, ``where`` the
    module-level name it is written under (:func:`_where`); docstrings and other longer texts do not count (a
    whole constant must be the name).  With ``fields`` False a word that names a key or a field of a record
    (a dict display's key, a subscript, the first argument of get/pop/setdefault, the left of ``in``) or an
    XML element (find, findall, iter, SubElement) does not count either: ``data["error"]`` is a field's name
    and ``<skipped/>`` JUnit's element, not a status."""
    names = set(names)
    tree = _tree(source)
    keys = set() if fields else _keys(tree)
    return [(node.lineno, node.value, _where(statement)) for statement in tree.body for node in ast.walk(statement)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
            and id(node) not in keys]


def _modules() -> list[tuple[Path, Path]]:
    """(path, relative path) of every module of the package (relative to it) and of benchmarks/ (relative to
    the checkout: ``benchmarks/x.py``)."""
    return [(path, path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))] + \
        [(path, path.relative_to(BENCHMARKS.parent)) for path in sorted(BENCHMARKS.rglob("*.py"))]


def _spelled(names: Iterable[str], allowed: dict[tuple[Path, str], str], *, fields: bool) -> list[str]:
    """``module:line: 'word'`` for each status word of ``names`` spelled in the package or benchmarks/ outside
    its declaration and the places ``allowed``."""
    return [f"{rel}:{line}: {word!r}" for path, rel in _modules() if rel != DECLARATION
            for line, word, where in status_literals(path.read_text(encoding="utf-8"), names, fields=fields)
            if (rel, where) not in allowed]


def test_no_module_but_the_declaration_spells_a_comparison_status():
    found = _spelled(COMPARISON.names, OTHER_VOCABULARIES, fields=True)
    assert found == [], "use the constants of harness.common.statuses instead:\n" + "\n".join(found)


def test_no_module_but_the_declaration_spells_a_step_status():
    found = _spelled(STEP.names, STEP_WORDS_OF_OTHER_VOCABULARIES, fields=False)
    assert found == [], ("use the constants of harness.common.statuses (STEP_PASSED, ...) for a step's status, or "
                         "those of the module that owns the other vocabulary:\n" + "\n".join(found))


def test_no_module_but_the_declaration_spells_a_verdict():
    found = _spelled(VERDICT.names, STEP_WORDS_OF_OTHER_VOCABULARIES, fields=False)
    assert found == [], "use the constants of harness.common.statuses (VERDICT_IN_PROGRESS, ...):\n" + "\n".join(found)


def test_no_module_but_the_declaration_spells_a_patch_status():
    found = _spelled(PATCH.names, PATCH_WORDS_OF_OTHER_VOCABULARIES, fields=True)
    assert found == [], "use the constants of harness.common.statuses (PATCH_CONFLICT, ...):\n" + "\n".join(found)


#: A CSS class named for a word: ``st-diverged``, in a string or an f-string's text.
_CSS_CLASS = re.compile(r"\bst-([a-z0-9][a-z0-9-]*)")


def status_classes(source: str, names: Iterable[str]) -> list[tuple[int, str]]:
    """(line, class) of every ``st-<status>`` class written literally in ``source`` (a string constant or the
    text of an f-string), ``<status>`` one of ``names``: a status badge takes its class from the status and its
    colour from the status's outcome (``st-failure``), never from a status word written by hand."""
    names = set(names)
    return [(node.lineno, f"st-{word}") for node in ast.walk(_tree(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for word in _CSS_CLASS.findall(node.value) if word in names]


def test_no_module_writes_a_status_as_a_css_class():
    words = {*STEP.names, *COMPARISON.names, *VERDICT.names, *PATCH.names}
    found = [f"{rel}:{line}: {cls}" for path, rel in _modules()
             for line, cls in status_classes(path.read_text(encoding="utf-8"), words)]
    assert found == [], ("colour by the outcome's class (st-success, st-failure, st-neutral), as "
                         "harness.views.report._status does:\n" + "\n".join(found))


def test_the_rule_finds_a_status_written_as_a_css_class():
    source = ('flag = f\' <span class="st-diverged">&gt; {x:g}</span>\'\n'
              'ok = f\'<span class="st st-{outcome} st-{escape(status)}">\'\n'
              'css = ".st-success { color: green; }"\n')
    assert status_classes(source, COMPARISON.names) == [(1, "st-diverged")]


def test_every_outcome_a_status_declares_has_its_colour_in_the_report():
    """report.html colours a badge by the class of its status's outcome; each outcome of every vocabulary has
    its rule in the page's style sheet."""
    outcomes = {s.outcome for kind in (STEP, COMPARISON, VERDICT, PATCH) for s in kind.by_name.values()}
    rules = set(re.findall(r"\.st-([a-z]+)\s*\{", report._CSS))
    assert outcomes <= rules, outcomes - rules


def test_every_allowed_spelling_is_still_there():
    """An entry of the allowed places whose module no longer spells a status's word there is stale: remove it."""
    for allowed, names, fields in ((OTHER_VOCABULARIES, COMPARISON.names, True),
                                   (STEP_WORDS_OF_OTHER_VOCABULARIES, STEP.names, False),
                                   (PATCH_WORDS_OF_OTHER_VOCABULARIES, PATCH.names, True)):
        for (rel, where) in allowed:
            spelled = {w for _, _, w in status_literals((PACKAGE / rel).read_text(encoding="utf-8"), names,
                                                        fields=fields)}
            assert where in spelled, (rel, where)


def test_a_new_step_status_reaches_the_console_from_its_declaration_alone(monkeypatch):
    """A step status added to STEP, and nothing else, is marked on its end line and, being a failure, has its
    log named and an error annotation written, as the declared failures have."""
    monkeypatch.setitem(STEP.by_name, "vanished",
                        Status("vanished", "failure", "👻", "the step's output went missing", mark="?"))
    out = io.StringIO()
    con = console.Console(out, interactive=False, github=True, heartbeat_s=0)
    with con.step("[linux] new stage") as step:
        step.finish("vanished", "no output", "new.log")
    text = out.getvalue()
    assert "? [linux] new stage: vanished — no output" in text
    assert "  log: new.log" in text
    assert "::error title=[linux] new stage%3A vanished::no output (log: new.log)" in text


def test_the_console_marks_and_alarms_by_the_declaration():
    """Every declared step status's mark is the console's; the failures and the statuses that leave a run
    unproven name their log, the others do not."""
    assert STEP.alarming == {STEP_FAILED, STEP_ERROR, STEP_INTERRUPTED, STEP_INCOMPLETE}
    for status in STEP.by_name.values():
        assert status.mark and console.end_mark(status.name) == status.mark
        out = io.StringIO()
        with console.Console(out, interactive=False, github=False, heartbeat_s=0).step("s") as step:
            step.finish(status.name, "", "s.log")
        assert ("  log: s.log" in out.getvalue()) == (status.name in STEP.alarming), status.name
    assert console.end_mark(console.REUSED) == "♻" and console.end_mark("undeclared") == "•"


def test_the_rule_finds_the_literals_a_module_would_write():
    source = ('"""A docstring naming "diverged" is prose."""\n'
              'if c.status == "diverged": pass\n'
              'bad = status in ("crashed", "timeout")\n'
              'expect: str = "identical"\n'
              'ok = c.status == DIVERGED\n'
              'text = "identical (both generations end at once)"\n')
    assert sorted(status_literals(source, COMPARISON.names)) == \
        [(2, "diverged", ""), (3, "crashed", "bad"), (3, "timeout", "bad"), (4, "identical", "expect")]


def test_the_rule_finds_a_step_status_spelled_and_leaves_fields_and_elements():
    source = ('def judge(step):\n'
              '    if step.status == "failed":\n'
              '        return StepRecord(p, c, "build", "error", detail=data["error"])\n'
              '    ok = step.status in (STEP_PASSED, "skipped")\n'
              '    if "incomplete" in record or tc.find("skipped") is not None:\n'
              '        return {"interrupted": data.get("interrupted"), "x": "passed"}\n'
              'A, B = "passed", "failed"\n')
    assert status_literals(source, STEP.names, fields=False) == \
        [(2, "failed", "judge"), (3, "error", "judge"), (4, "skipped", "judge"), (6, "passed", "judge"),
         (7, "passed", "A"), (7, "failed", "A")]
