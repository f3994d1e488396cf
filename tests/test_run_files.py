"""Every file of a run is named and read through ``harness/record/`` (docs/layout.md, "Where each run file is named
and read"): outside it, no module spells a run file's name, and no module parses JSON but those listed below, each
with what it reads.  A new reader of a run file gets a typed reader in record/ instead."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from harness.record.compare import find_compare_entry, read_compare_entries, record_compare_entries
from harness.record.forecast import read_forecast
from harness.record.reloads import read_reload_check
from harness.record.layout import BUILD_FILES, COMPILE_FILES, LOAD_FILES, TESTS_FILES
from harness.record.records import RecordError

PACKAGE = Path(__file__).resolve().parent.parent / "harness"

#: The names of the files RunLayout declares (harness.record.layout), and the suffixes of a load's JSON records.
RUN_FILE_NAMES = frozenset({
    "run.json", "summary.json", "summary.md", "signatures.json", "report.html", "forecast.json", "forecast.md",
    "environment.json", "config.json", "compare.json", "compare-timing.json", "placement.json", "expectations.json",
    "expectations.log", "reloads.json", "reloads.log", "bench.json", *TESTS_FILES.values(), *COMPILE_FILES.values(),
    *BUILD_FILES.values(), *(s for s in LOAD_FILES.values() if s.endswith(".json"))})

#: (module, name) pairs that spell a run file's name for something that is not a run's file.
NOT_RUN_FILES = {
    ("stages/building/cuda_compile.py", "toolkit.json"): "the assembled toolkit's stamp in the harness cache, not a run",
}

#: Modules outside record/ that parse JSON, with how many calls and what they read.  Those marked "run file" read a
#: file of a run without a typed reader of record/ yet: the count must only go down.
JSON_READERS = {
    "triage/speed_confirm.py": (1, "a build directory's harness-build.json stamp, not a run"),
    "upstream/roll_state.py": (1, "the roll in progress's state.json in the work directory, not a run"),
    "matrix/config.py": (1, "the matrix's JSON schema"),
    "matrix/pin.py": (1, "a mirror archive's manifest, its first member"),
    "matrix/models.py": (2, "a model file's sidecars in the model cache"),
    "stages/building/build.py": (1, "a build directory's harness-build.json stamp"),
    "stages/building/quantize_tool.py": (1, "a build directory's harness-build.json stamp"),
    "stages/building/cuda_compile.py": (2, "the toolkit cache's stamp; CMake's compile_commands.json"),
    "stages/building/source.py": (3, "a source mirror's manifest and the base cache's record"),
    "stages/outputs/engine.py": (1, "the engine's replies on its pipe"),
    "stages/outputs/generation_cache.py": (1, "a cached generation's stored bytes"),
    "stages/native_tests/test_cache.py": (1, "ctest --show-only=json-v1 output"),
    "tools/bench.py": (2, "the benchmark commands' JSON output"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def run_file_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string of ``source`` (docstrings left out) that is a run file's name or a path ending
    in one (``"summary.json"``, ``"speed/bench.json"``; parts of f-strings count)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and n.value.replace("\\", "/").rsplit("/", 1)[-1].lstrip("'\" ") in RUN_FILE_NAMES]


def json_parses(source: str) -> list[int]:
    """Lines of ``source`` that call ``json.load`` or ``json.loads``."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("load", "loads")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"]


def _outside_record() -> list[tuple[str, str]]:
    return [(path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8"))
            for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "record"]


def test_no_module_outside_record_spells_a_run_files_name():
    found = [f"{module}:{line}: {text!r}" for module, source in _outside_record()
             for line, text in run_file_names(source) if (module, text) not in NOT_RUN_FILES]
    assert found == []


def test_only_the_listed_modules_parse_json_and_no_more_often_than_listed():
    found = {module: len(lines) for module, source in _outside_record() if (lines := json_parses(source))}
    assert found == {module: n for module, (n, _) in JSON_READERS.items()}


def test_the_rules_find_what_a_stage_would_write():
    source = ('"""Writes summary.json."""\n'
              'import json\n'
              'data = json.loads((run_dir / "compare.json").read_text())\n'
              'log = out / f"{x}/reloads.log"\n'
              'other = json.load(fh)\n'
              'fine = "compile_commands.json"\n')
    assert sorted(run_file_names(source)) == [(3, "compare.json"), (4, "/reloads.log")]
    assert json_parses(source) == [3, 5]


def test_the_compare_reader_finds_the_last_entry_and_names_a_broken_file(tmp_path):
    path = tmp_path / "compare.json"
    with pytest.raises(FileNotFoundError, match="compare.json"):
        read_compare_entries(path)
    entry = {"group": "g", "model": "m", "prompt_id": "p", "reference": "base", "candidate": "fork",
             "status": "diverged", "reference_text": "a b", "candidate_text": "a c"}
    record_compare_entries(path, "g", "m", "p", [entry])
    record_compare_entries(path, "g", "m", "q", [dict(entry, prompt_id="q")])
    record_compare_entries(path, "g", "m", "p", [dict(entry, candidate_text="a d")])  # replaces, keeps q
    assert [e.prompt_id for e in read_compare_entries(path)] == ["q", "p"]
    assert find_compare_entry(path, "g", "m", "p", "base").candidate_text == "a d"
    assert find_compare_entry(path, "other", "m", "p", "base") is None
    path.write_text(json.dumps([{"prompt_id": "p"}]))
    with pytest.raises(RecordError, match=r"compare.json: entry 0"):
        read_compare_entries(path)


def test_the_reload_check_and_forecast_readers_name_the_file(tmp_path):
    reloads = tmp_path / "reloads.json"
    reloads.write_text(json.dumps({"platform": "p", "config": "c", "status": "failed", "models": {"m": [
        {"rule": "freed", "status": "failed", "message": "4 MiB left", "key": "left page-locked"},
        {"rule": "memory", "status": "passed", "message": "ok", "key": "ok"}]}}))
    assert read_reload_check(reloads).failed_keys() == {("m", "freed", "4 MiB left"): "left page-locked"}
    reloads.write_text(json.dumps({"models": {"m": [{"status": "failed"}]}}))
    with pytest.raises(RecordError, match="reloads.json: not a reloads record"):
        read_reload_check(reloads)
    with pytest.raises(FileNotFoundError, match="forecast.json"):
        read_forecast(tmp_path / "forecast.json")
    (tmp_path / "forecast.json").write_text(json.dumps({"onto": {"commit": "a"}}))
    with pytest.raises(RecordError, match="forecast.json: not a forecast record"):
        read_forecast(tmp_path / "forecast.json")
