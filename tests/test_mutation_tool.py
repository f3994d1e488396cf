"""The mutation-testing session's own rules (harness/tools/mutation.py, docs/mutation.md): the modules and tests
it names exist, ``--changed`` picks the verdict modules a change touches, and the score and the equivalent
mutants are read as the page says."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

from harness.tools import mutation
from harness.tools.mutation import (DEFAULT_MODULES, MUTATED_FUNCTIONS, VERDICT_MODULES, Mutant, changed_modules,
                                    listed_equivalent, mutant_patterns, score, setup_cfg)

ROOT = Path(__file__).resolve().parents[1]


def test_every_verdict_module_and_every_test_it_is_run_against_exists():
    """A renamed test or module would leave a module mutated against fewer tests, or none, without a word."""
    assert set(DEFAULT_MODULES) <= set(VERDICT_MODULES)
    for module, tests in VERDICT_MODULES.items():
        assert (ROOT / module).is_file(), module
        assert tests, module
        for node in tests:
            path, _, name = node.partition("::")
            text = (ROOT / path).read_text(encoding="utf-8")
            assert not name or re.search(rf"^def {re.escape(name)}\(", text, re.M), node


def _mutmut_function_names(module: Path) -> set[str]:
    """mutmut's names of ``module``'s functions (``x_<function>``) and methods (``xǁ<Class>ǁ<method>``)."""
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            names |= {f"xǁ{node.name}ǁ{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def test_every_function_a_module_is_mutated_in_part_by_is_a_function_of_it():
    """A renamed function would drop out of the mutated part of its module without a word."""
    for module, functions in MUTATED_FUNCTIONS.items():
        assert module in VERDICT_MODULES
        missing = set(functions) - _mutmut_function_names(ROOT / module)
        assert functions and not missing, (module, missing)


def test_a_module_mutated_in_part_asks_mutmut_for_the_mutants_of_its_named_functions_only():
    patterns = mutant_patterns(["harness/common/statuses.py", "harness/triage/triage.py"])

    def asked(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    assert asked("harness.common.statuses.xǁStatusSetǁcheck__mutmut_2")  # mutated whole
    assert asked("harness.triage.triage.x__category__mutmut_1")
    assert asked("harness.triage.triage.xǁTriageReportǁto_json__mutmut_3")
    assert not asked("harness.triage.triage.x_format_report__mutmut_1")  # the text, left out
    assert not asked("harness.triage.triage.x__category_of__mutmut_1")  # a name that only starts alike
    assert not asked("harness.common.statistics.x_judge__mutmut_1")  # a module not asked for


def test_the_configuration_mutates_the_modules_asked_against_their_tests_in_the_fast_tier():
    cfg = setup_cfg(["harness/common/statistics.py"])
    assert "only_mutate =\n    harness/common/statistics.py\n" in cfg
    # relative to the copy mutmut runs pytest in: a node id keeps its file (tests/test_speed.py::...), which
    # mutmut hands back to pytest to run a mutant's tests; an absolute path of the checkout lost it
    tests = re.findall(r"^    (tests/\S+)$", cfg, re.M)
    assert tests == list(VERDICT_MODULES["harness/common/statistics.py"])
    assert "    -m\n    not slow\n" in cfg
    assert "    -n\n    0\n" in cfg  # in mutmut's process: pytest-xdist's workers would run the tests outside its hooks
    assert "divergence" not in cfg


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def test_changed_picks_the_verdict_modules_a_change_touches_committed_or_not(tmp_path):
    for module in ("harness/common/statistics.py", "harness/record/loads.py", "harness/cli.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    assert changed_modules("HEAD", tmp_path) == []
    (tmp_path / "harness/record/loads.py").write_text("x = 2\n")  # not committed
    (tmp_path / "harness/cli.py").write_text("x = 2\n")  # no verdict module
    assert changed_modules("HEAD", tmp_path) == ["harness/record/loads.py"]
    _git(tmp_path, "commit", "-qam", "change")
    (tmp_path / "harness/common/statistics.py").write_text("x = 3\n")
    assert changed_modules("HEAD~1", tmp_path) == ["harness/common/statistics.py", "harness/record/loads.py"]
    with pytest.raises(ValueError, match="--changed no-such-ref"):
        changed_modules("no-such-ref", tmp_path)


def test_an_unknown_module_is_bad_input(capsys):
    assert mutation.main(["--module", "harness/cli.py"]) == 2
    assert "--module harness/cli.py: not a verdict module" in capsys.readouterr().err


def test_the_score_counts_killed_and_timed_out_mutants_of_those_a_test_reached():
    mutants = [Mutant("m.x_f__mutmut_1", "killed"), Mutant("m.x_f__mutmut_2", "timeout"),
               Mutant("m.x_f__mutmut_3", "survived"), Mutant("m.x_f__mutmut_4", "no tests")]
    assert score(mutants) == (2, 3)


def test_the_equivalent_mutants_are_the_names_the_page_lists(tmp_path):
    doc = tmp_path / "mutation.md"
    doc.write_text("## Why\nnamed like `harness.common.statistics.x_judge__mutmut_1`\n"
                   "## Equivalent mutants\n| `harness.common.statistics.x_judge__mutmut_7` | the same value |\n"
                   "`harness.record.native_tests.xǁTestRunǁcounts__mutmut_12`, not `x_judge`\n"
                   "## After\n`harness.common.statistics.x_judge__mutmut_2`\n")
    assert listed_equivalent(doc) == {"harness.common.statistics.x_judge__mutmut_7",
                                      "harness.record.native_tests.xǁTestRunǁcounts__mutmut_12"}
    listed = listed_equivalent(ROOT / "docs" / "mutation.md")  # each a mutant of a module of the table
    assert listed and all(any(n.startswith(m[:-len(".py")].replace("/", ".") + ".") for m in VERDICT_MODULES)
                          for n in listed)
    assert listed_equivalent(tmp_path / "none.md") == set()


def test_the_statuses_are_read_from_mutmut_s_results_lines():
    text = ("    harness.common.statistics.x_judge__mutmut_1: killed\n"
            "    harness.record.native_tests.xǁTestRunǁcounts__mutmut_3: no tests\n"
            "    done in 12ms\n")
    assert mutation.parse_results(text) == [("harness.common.statistics.x_judge__mutmut_1", "killed"),
                                            ("harness.record.native_tests.xǁTestRunǁcounts__mutmut_3", "no tests")]
