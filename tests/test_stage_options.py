"""harness.stages.options.STAGE_OPTIONS: one declaration per stage option, read by the parser, the stages'
Options, the noxfile and docs/layout.md, each held to it here."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from harness import cli
from harness.args import build_options, run_options, stage_options
from harness.common.errors import InputError
from harness.stages.options import STAGE_OPTIONS, Options, declared, markdown_table, undeclared_fields

ROOT = Path(__file__).resolve().parent.parent


def test_every_options_field_is_declared_once_and_every_declaration_names_a_field():
    assert undeclared_fields() == []
    assert len({o.field for o in STAGE_OPTIONS}) == len(STAGE_OPTIONS)
    assert len({f for o in STAGE_OPTIONS for f in o.flags}) == sum(len(o.flags) for o in STAGE_OPTIONS)


def test_a_field_without_a_declaration_is_found(monkeypatch):
    from harness.stages import options
    planted = tuple(o for o in STAGE_OPTIONS if o.field != "lanes")
    monkeypatch.setattr(options, "STAGE_OPTIONS", planted)
    assert options.undeclared_fields() == ["lanes"]


def test_the_parsers_defaults_become_the_options_defaults():
    """Parsed with no option at all, every field is the dataclass's own default (the paths aside: those are
    in the checkout)."""
    args = cli.parse(["build"])
    got, default = stage_options(args), Options()
    for f in fields(Options):
        if f.name not in ("work_dir", "patches_dir"):
            assert getattr(got, f.name) == getattr(default, f.name), f.name
    assert got.work_dir.resolve() == ROOT / ".harness" and got.patches_dir.resolve() == ROOT / "patches"


def test_every_declared_option_reaches_its_field():
    argv = ["build", "--platform", "a,b", "--platform", "c", "--cuda-arch", "90", "-j", "3", "-D", "A=1",
            "--sanitize", "racecheck", "--upstream-tests", "--upstream-test", "t1,t2", "--model", "m", "--group", "g", "--n-predict", "4",
            "--repeats", "2", "--lanes", "1", "--no-bench", "--bench-repeats", "7", "--bench-warmup", "0",
            "--no-cache", "--work-dir", "w", "--patches-dir", "p"]
    assert stage_options(cli.parse(argv)) == Options(
        platforms=["a", "b", "c"], cuda_arch="90", jobs=3, cmake_defines={"A": "1"}, sanitize="racecheck",
        upstream_tests=True, upstream_only=["t1", "t2"], models=["m"], groups=["g"], n_predict=4, repeats=2, lanes=1, bench=False,
        bench_repeats=7, bench_warmup=0, no_cache=True, work_dir=Path("w"), patches_dir=Path("p"))


def test_the_parent_parsers_declare_exactly_the_declared_options():
    for parser, group in ((build_options(), "build"), (run_options(), "run")):
        strings = [s for a in parser._actions for s in a.option_strings]
        assert strings == [f for o in declared(group) for f in o.flags]
        assert all(a.help for a in parser._actions)


def test_a_bad_value_is_refused_as_its_declaration_says():
    for argv in (["-j", "0"], ["--bench-repeats", "4"], ["--bench-warmup", "21"], ["--sanitize", "nope"]):
        with pytest.raises(SystemExit):
            cli.parse(["build", *argv])


def test_upstream_test_without_the_suite_is_refused_naming_both_options():
    with pytest.raises(InputError, match="--upstream-test .* needs --upstream-tests"):
        stage_options(cli.parse(["test", "--upstream-test", "test-chat"]))


def test_docs_layout_holds_the_table_the_declarations_write():
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- STAGE_OPTIONS begin[^\n]*-->\n(.*?)<!-- STAGE_OPTIONS end -->", text, re.S)
    assert found, "docs/layout.md has no STAGE_OPTIONS table"
    assert found.group(1) == markdown_table(), "regenerate it from harness.stages.options.markdown_table()"


def test_the_stage_sessions_of_nox_name_every_declared_option():
    """nox -s build -- --help lists them too; the session's own help (its docstring) names them from the
    declarations."""
    code = ("import runpy, sys; sys.argv = ['nox']; import nox.registry as r; "
            "runpy.run_path('noxfile.py'); print(r.get()['build'].__doc__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for option in STAGE_OPTIONS:
        assert option.name in done.stdout, option.name


def test_help_is_the_declarations_help():
    ap = argparse.ArgumentParser(parents=[run_options()])
    helps = {a.option_strings[0]: a.help for a in ap._actions if a.option_strings}
    for o in declared("run"):
        assert helps[o.flags[0]] == o.help
