"""Upstream's own ctest suite on base and fork (harness.stages.native_tests.upstream_suite) and test-backend-ops
(harness.stages.native_tests.backend_ops): the classes of a pair, the declared needs, the targets asked of ctest, the
record, the signature of a regression, and test-backend-ops' SQL read through SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.triage.signatures import classify_step
from harness.kinds.registry import gpu_of
from harness.matrix.config import UpstreamNeed, UpstreamTests, load_matrix
from harness.record import native_tests
from harness.record.records import RecordError, StepRecord
from harness.record.layout import RunLayout, TESTS_FILES
from harness.record.json_files import write_json
from harness.record.upstream_tests import (DECLARED, FAILED_BOTH, FIXED, FORK_ONLY, MISSING_DATA, PASSED_BOTH,
                                           REGRESSED, SKIPPED_BOTH, SuiteRecord, classify, read_suite, write_suite)
from harness.stages.native_tests.backend_ops import judge_test_mode, read_cases
from harness.stages.building.build import find_tool
from harness.stages.native_tests.upstream_suite import (describe, emulated_tests, lacked_needs, missing_data, outcomes,
                                                pair_up, suite_targets, ctest_commands)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("base,fork,expected", [
    ("passed", "passed", PASSED_BOTH), ("failed", "failed", FAILED_BOTH), ("passed", "failed", REGRESSED),
    ("failed", "passed", FIXED), ("passed", "skipped", REGRESSED), ("passed", "absent", REGRESSED),
    ("absent", "failed", REGRESSED), ("skipped", "skipped", SKIPPED_BOTH), ("absent", "passed", FORK_ONLY),
    ("failed", "absent", FAILED_BOTH), ("declared", "declared", DECLARED), ("missing", "missing", MISSING_DATA),
    ("passed", "missing", REGRESSED), ("missing", "passed", MISSING_DATA), ("failed", "missing", MISSING_DATA),
])
def test_each_pair_of_outcomes_has_one_class(base, fork, expected):
    assert classify(base, fork) == expected


def test_only_a_test_that_fails_on_the_fork_and_not_on_base_is_a_regression_and_the_detail_names_it_first():
    names = ["test-a", "test-b", "test-c", "test-net"]
    base = native_tests.TestRun("failed", [native_tests.TestCase("test-a", "passed", 1.0), native_tests.TestCase("test-b", "passed", 1.0),
                              native_tests.TestCase("test-c", "failed", 2.0, "exit 1")])
    fork = native_tests.TestRun("failed", [native_tests.TestCase("test-a", "passed", 1.0), native_tests.TestCase("test-b", "failed", 1.5, "exit 3"),
                              native_tests.TestCase("test-c", "failed", 2.0, "exit 1")])
    pairs = pair_up(names, outcomes(base, names), outcomes(fork, names), {"test-net": "needs the network: x"})
    record = SuiteRecord("main", pairs)
    assert [p.outcome for p in pairs] == [PASSED_BOTH, REGRESSED, FAILED_BOTH, DECLARED]
    assert pairs[3].base == pairs[3].fork == "declared"  # never run, never counted as passed
    detail = describe(record)
    assert detail.startswith("1 regressed (pass on base, fail on the fork): test-b: exit 3")
    assert "1 pass on both" in detail and "1 fail on both (upstream's or the environment's" in detail
    assert "test-c" in detail and "1 skipped by declaration (needs the network): test-net" in detail


def test_the_record_reads_back_and_a_bad_one_is_refused_naming_the_file(tmp_path):
    names = ["test-a"]
    run = native_tests.TestRun("passed", [native_tests.TestCase("test-a", "passed", 0.5)])
    record = SuiteRecord("main", pair_up(names, outcomes(run, names), outcomes(run, names), {}), {"fork": 3.0})
    path = tmp_path / "pairs.json"
    write_json(path, record)
    back = read_suite(path)
    assert back.pairs == record.pairs and back.seconds == {"fork": 3.0}
    path.write_text(json.dumps({"label": "main", "pairs": [{"name": "x", "base": "passed", "fork": "passed",
                                                              "outcome": "fine"}]}))
    with pytest.raises(RecordError, match="pairs.json.*unknown outcome 'fine'"):
        read_suite(path)


def test_the_network_tests_are_declared_in_the_matrix_and_lacked_on_every_platform():
    matrix = load_matrix(ROOT / "matrix.yaml")
    suite = matrix.upstream_tests
    assert suite.label == "main"
    network = {"test-download-model", "test-arg-parser", "test-thread-safety", "test-tokenizers-ggml-vocabs"}
    assert {n for n, need in suite.needs.items() if need.needs == "network"} == network
    for p in matrix.platforms.values():
        assert set(lacked_needs(suite, p)) == network  # a data need is asked of the tree, not of the machine
    assert matrix.platforms["linux-x86_64-cpu"].upstream_tests and matrix.platforms["windows-x86_64-cpu"].upstream_tests
    assert matrix.platforms["linux-x86_64-cuda"].backend_ops.test == ("MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "CPY",
                                                                       "SET_ROWS")


def test_a_test_that_needs_a_gpu_is_skipped_only_where_the_platform_has_none():
    matrix = load_matrix(ROOT / "matrix.yaml")
    suite = UpstreamTests("main", {"test-gpu": UpstreamNeed("gpu", "runs on CUDA0")})
    cpu, cuda = matrix.platforms["linux-x86_64-cpu"], matrix.platforms["linux-x86_64-cuda"]
    assert not gpu_of(cpu).has_device and gpu_of(cuda).has_device
    assert lacked_needs(suite, cpu) == {"test-gpu": "needs the gpu: runs on CUDA0"}
    assert lacked_needs(suite, cuda) == {}


def test_the_schema_refuses_an_undeclared_need(tmp_path):
    from harness.matrix.config import MatrixError
    text = (ROOT / "matrix.yaml").read_text().replace("needs: network\n      reason: \"downloads",
                                                      "needs: moon\n      reason: \"downloads", 1)
    bad = tmp_path / "matrix.yaml"
    bad.write_text(text)
    with pytest.raises(MatrixError, match="needs"):
        load_matrix(bad)


def _ctest_tree(build: Path) -> None:
    """A build directory's CTestTestfile.cmake tree as CMake writes it: one test at the top, a subdirectory with a
    test named after its vocabulary, one running cmake -P, and an argument holding a semicolon."""
    (build / "bin").mkdir(parents=True)
    (build / "tests").mkdir()
    (build / "CTestTestfile.cmake").write_text('subdirs("tests")\n')
    (build / "tests" / "CTestTestfile.cmake").write_text(
        f'add_test("test-tokenizer-0-falcon" "{build}/bin/test-tokenizer-0.exe" "/src/falcon.gguf")\n'
        'set_tests_properties("test-tokenizer-0-falcon" PROPERTIES LABELS "main" WORKING_DIRECTORY ".")\n'
        f'add_test("test-log" "{build}/bin/test-log.exe" "a;b")\n'
        'set_tests_properties("test-log" PROPERTIES LABELS "main;fork")\n'
        'add_test("test-download-model" "/usr/bin/cmake" "-P" "/src/download.cmake")\n'
        'set_tests_properties("test-download-model" PROPERTIES LABELS "main")\n')


def test_the_targets_are_the_executables_of_the_build_that_the_tests_start_read_by_cmake(tmp_path):
    build = tmp_path / "build"
    _ctest_tree(build)
    commands = ctest_commands(build)
    assert commands["test-tokenizer-0-falcon"] == [f"{build}/bin/test-tokenizer-0.exe", "/src/falcon.gguf"]
    assert commands["test-log"] == [f"{build}/bin/test-log.exe", "a;b"]  # one argument, as ctest passes it
    assert suite_targets(list(commands.values()), build, ".exe") == ["test-tokenizer-0", "test-log"]
    assert suite_targets([["/usr/bin/wine", f"{build}/bin/test-log.exe"]], build, ".exe") == ["test-log"]


def test_a_cross_builds_tests_are_declared_again_started_through_the_emulator(tmp_path):
    build = tmp_path / "build"
    _ctest_tree(build)
    out = emulated_tests(build, [sys.executable, "-X", "dev"], tmp_path / "emulated")
    shown = json.loads(subprocess.run([find_tool("ctest") or "ctest", "--test-dir", str(out), "--show-only=json-v1",
                                       "-L", "^main$"], capture_output=True, check=True).stdout)
    tests = {t["name"]: t for t in shown["tests"]}
    assert set(tests) == {"test-tokenizer-0-falcon", "test-log", "test-download-model"}
    props = {p["name"]: p["value"] for p in tests["test-tokenizer-0-falcon"]["properties"]}
    assert props["LABELS"] == ["main"] and props["WORKING_DIRECTORY"] == f"{build}/tests/."
    assert tests["test-tokenizer-0-falcon"]["command"] == [sys.executable, "-X", "dev", f"{build}/bin/test-tokenizer-0.exe",
                                                           "/src/falcon.gguf"]
    assert tests["test-log"]["command"][-1] == "a;b"


#: test-backend-ops' ``--output sql`` as upstream's SqlPrinter writes it: its CREATE TABLE of 16 fields, taken from
#: a recorded run (tests/data), after a line a backend prints; the cases follow (:func:`_insert`).
SQL_HEAD = "ggml_backend_cuda_init: found 1 CUDA devices\n" + \
    (ROOT / "tests" / "data" / "test-backend-ops-perf-cpu-base.sql").read_text().split("\nINSERT", 1)[0] + "\n"
_COLS = ("test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, "
         "time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name")


def _insert(op: str, params: str, mode: str, supported: int, passed: int | str, us: float = 0.0,
            flops: float = 0.0, gb_s: float = 0.0) -> str:
    return (f"INSERT INTO test_backend_ops ({_COLS}) VALUES ('t', '0c1e570', 'CUDA0', '{op}', '{params}', '{mode}', "
            f"'{supported}', '{passed}', '', '{us:f}', '{flops:f}', '{gb_s:f}', '0', '10', 'NVIDIA H100', 'CUDA');\n")


SQL = SQL_HEAD + _insert("MUL_MAT", "type_a=q4_K,m=16", "test", 1, "{ok}") + \
    _insert("GET_ROWS", "type=f16", "test", 1, 1) + _insert("CPY", "type_src=bf16", "test", 0, 0)


def test_test_backend_ops_sql_is_read_through_sqlite_and_a_case_the_fork_fails_is_a_regression():
    base = read_cases(SQL.format(ok=1))
    fork = read_cases(SQL.format(ok=0))
    assert [(c.op, c.supported, c.passed) for c in base] == [("MUL_MAT", True, True), ("GET_ROWS", True, True),
                                                             ("CPY", False, False)]
    status, detail, regressed = judge_test_mode(base, fork)
    assert status == "failed" and regressed == ["MUL_MAT(type_a=q4_K,m=16) on CUDA0"]
    assert detail.startswith("1 regressed") and "1 pass on both" in detail
    assert "1 unsupported by the backend on both" in detail and "skipped on both by ctest" not in detail
    assert judge_test_mode(base, base)[0] == "passed"
    fork_drops = read_cases(SQL.format(ok=1).replace("'GET_ROWS', 'type=f16', 'test', '1'", "'GET_ROWS', 'type=f16', 'test', '0'"))
    status, _, regressed = judge_test_mode(base, fork_drops)  # base passes a case the fork's backend no longer supports
    assert status == "failed" and regressed == ["GET_ROWS(type=f16) on CUDA0"]


@pytest.fixture(scope="module")
def compare_llama_bench() -> Path:
    """upstream's scripts/compare-llama-bench.py in the base tree, obtained as every run obtains it (the harness's
    download cache, filled from the matrix's sources where it is empty): never skipped for a cache another test
    happened not to fill yet."""
    from harness.stages.building.source import obtain_base
    script = obtain_base(load_matrix(ROOT / "matrix.yaml")).path / "scripts" / "compare-llama-bench.py"
    assert script.is_file(), f"{script}: upstream's script is missing from the base tree"
    return script


@pytest.mark.network
def test_the_perf_pairs_are_written_so_that_upstreams_compare_script_prints_fork_against_base(tmp_path,
                                                                                              compare_llama_bench):
    from harness.stages.native_tests.backend_ops import perf_pairs, sql_statements, write_perf_database
    base_sql = SQL_HEAD + _insert("MUL_MAT_ID", "type_a=q4_K,n_mats=8", "perf", 1, 1, 100.0, 2e12, 0) \
        + _insert("MUL_MAT", "type_a=f16,m=4096", "perf", 1, 1, 50.0, 4e12, 0) + _insert("MUL_MAT", "x", "perf", 0, 0)
    fork_sql = base_sql.replace("'100.000000', '2000000000000.000000'", "'125.000000', '1600000000000.000000'")
    base, fork = read_cases(base_sql), read_cases(fork_sql)
    rows = perf_pairs(base, fork)
    assert [(r["op"], r["ratio"]) for r in rows] == [("MUL_MAT_ID", 1.25), ("MUL_MAT", 1.0)]  # unsupported left out
    assert rows[0]["fork_flops"] == 1.6e12 and rows[0]["base_flops"] == 2e12
    database = tmp_path / "backend-ops-perf.sqlite"
    write_perf_database(database, {"base": sql_statements(base_sql), "fork": sql_statements(fork_sql)})
    import sqlite3
    with sqlite3.connect(database) as db:
        assert sorted(db.execute("SELECT build_commit, COUNT(*) FROM test_backend_ops GROUP BY 1")) == \
            [("base", 3), ("fork", 3)]
    done = subprocess.run([sys.executable, str(compare_llama_bench), "-t", "test-backend-ops", "-i", str(database), "-b", "base",
                           "-c", "fork"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if "MUL_MAT" in line]
    assert len(table) == 2 and any("MUL_MAT_ID" in line and "0.80" in line for line in table), done.stdout


def _upstream_run(tmp_path: Path, fork_message: str) -> tuple[Path, StepRecord]:
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    names = ["test-tokenizer-0-falcon", "test-c"]
    base = native_tests.TestRun("failed", [native_tests.TestCase(names[0], "passed"), native_tests.TestCase("test-c", "failed", 1.0, "exit 2")])
    fork = native_tests.TestRun("failed", [native_tests.TestCase(names[0], "failed", 1.0, fork_message), native_tests.TestCase("test-c", "failed", 1.0,
                                                                                       "exit 2")])
    write_json(layout.upstream_file("p", "pairs"), SuiteRecord("main", pair_up(names, outcomes(base, names),
                                                                               outcomes(fork, names), {})))
    write_json(layout.upstream_file("p", "run", "fork"), fork)
    log = layout.upstream_file("p", "log", "fork")
    log.write_text("2/2 Test  #1: test-tokenizer-0-falcon ...***Failed    1.00 sec\n"
                   "main : failed test:    '3333333'\n"
                   "main : detokenized to: '3333333' instead of '3333333'\n"
                   "main : expected tokens:   1012, 1012, 21\n"
                   "1/2 Test  #2: test-c ...........................***Failed    1.00 sec\n"
                   "Segmentation fault\n")
    assert TESTS_FILES["log"] == log.name
    return run_dir, StepRecord("p", "fork", RunLayout.UPSTREAM_STEP, "failed", 2.0, "1 regressed")


def test_the_signature_of_a_regression_comes_from_the_regressed_test_never_from_one_that_fails_on_both(tmp_path):
    run_dir, step = _upstream_run(tmp_path, "exit 1")
    sig = classify_step(run_dir, step)
    assert sig is not None and "test-tokenizer-0-falcon" in sig.summary and "test-c" not in sig.summary
    assert "more failing" not in sig.summary  # test-c fails on base too


def test_triage_lists_a_test_whose_pair_changed_class_a_new_regression_as_one(tmp_path):
    from harness.triage.triage import Transition
    from harness.triage.upstream_diff import upstream_test_transitions
    names = ["test-a", "test-b", "test-c"]
    ok = native_tests.TestRun("passed", [native_tests.TestCase(n, "passed") for n in names])
    a_fork = native_tests.TestRun("passed", [native_tests.TestCase("test-a", "passed"),
                                             native_tests.TestCase("test-b", "passed"),
                                             native_tests.TestCase("test-c", "passed")])
    b_base = native_tests.TestRun("failed", [native_tests.TestCase("test-a", "passed"),
                                             native_tests.TestCase("test-b", "passed"),
                                             native_tests.TestCase("test-c", "failed", 1.0, "exit 1")])
    b_fork = native_tests.TestRun("failed", [native_tests.TestCase("test-a", "failed", 1.0, "exit 3"),
                                             native_tests.TestCase("test-b", "passed"),
                                             native_tests.TestCase("test-c", "failed", 1.0, "exit 1")])
    for run, base, fork in (("a", ok, a_fork), ("b", b_base, b_fork)):
        write_json(RunLayout(tmp_path / run).upstream_file("p", "pairs"),
                   SuiteRecord("main", pair_up(names, outcomes(base, names), outcomes(fork, names), {})))
    found = upstream_test_transitions(tmp_path / "a", tmp_path / "b", ["p", "q"], Transition)
    got = {(t.what, t.category, t.before, t.after) for t in found}
    assert got == {("upstream test test-a", "regression", PASSED_BOTH, REGRESSED),
                   ("upstream test test-c", "other", PASSED_BOTH, FAILED_BOTH)}  # failing on both: never the fork's


#: Commands as the CTestTestfile.cmake of a CPU build at main @ 1bc1a53 declares them (.harness/fork), the tree at
#: SRC and the build at BUILD: a vocabulary argument, a test without arguments, a build output and a cmake script.
RECORDED = {
    "test-tokenizer-0-falcon": ["BUILD/bin/test-tokenizer-0", "SRC/models/ggml-vocab-falcon.gguf"],
    "test-tokenizer-0-llama-spm": ["BUILD/bin/test-tokenizer-0", "SRC/models/ggml-vocab-llama-spm.gguf"],
    "test-tokenizer-1-llama-spm": ["BUILD/bin/test-tokenizer-1-spm", "SRC/models/ggml-vocab-llama-spm.gguf"],
    "test-chat": ["BUILD/bin/test-chat"],
    "test-sampling": ["BUILD/bin/test-sampling"],
    "test-recurrent-state-rollback": ["BUILD/bin/test-recurrent-state-rollback", "--models", "BUILD/tests/test-models/"],
    "test-download-model": ["/usr/bin/cmake", "-DDEST=BUILD/tinyllamas/stories15M-q4_0.gguf", "-P",
                            "SRC/cmake/download-models.cmake"],
}


def test_a_test_whose_arguments_name_a_missing_file_of_the_source_tree_needs_that_data(tmp_path):
    src, build = tmp_path / "llama.cpp", tmp_path / "build"
    (src / "models").mkdir(parents=True)
    (src / "cmake").mkdir()
    (src / "cmake" / "download-models.cmake").write_text("")
    (src / "models" / "ggml-vocab-llama-spm.gguf").write_bytes(b"v")
    commands = {n: [a.replace("SRC", str(src)).replace("BUILD", str(build)) for a in argv] for n, argv in RECORDED.items()}
    templates = UpstreamNeed("data", "reads models/templates/", "models/templates")
    suite = UpstreamTests("main", {"test-chat": templates})
    assert missing_data(commands, src, suite) == {"test-tokenizer-0-falcon": "models/ggml-vocab-falcon.gguf",
                                                  "test-chat": "models/templates"}
    (src / "models" / "ggml-vocab-falcon.gguf").write_bytes(b"v")
    (src / "models" / "templates").mkdir()
    assert missing_data(commands, src, suite) == {}  # the build's own outputs (test-models/) are never data


def test_a_test_skipped_for_missing_data_is_named_with_its_file_never_counted_and_the_headline_carries_it(tmp_path):
    names = ["test-a", "test-vocab", "test-both"]
    run = native_tests.TestRun("failed", [native_tests.TestCase("test-a", "passed", 1.0),
                                          native_tests.TestCase("test-both", "failed", 1.0, "exit 1")])
    gone = {"test-vocab": "models/ggml-vocab-falcon.gguf"}
    record = SuiteRecord("main", pair_up(names, outcomes(run, names, gone), outcomes(run, names, gone), {}))
    assert [p.outcome for p in record.pairs] == [PASSED_BOTH, MISSING_DATA, FAILED_BOTH]
    assert record.pairs[1].need == "missing data: models/ggml-vocab-falcon.gguf"
    assert describe(record).endswith("1 skipped for missing data (not run): test-vocab (models/ggml-vocab-falcon.gguf)")
    assert record.unproven() == ("1 pass on both; 1 fail on both (not proven); "
                                 "1 skipped for missing data (not run): test-vocab")
    path = tmp_path / "pairs.json"
    write_suite(path, record)
    glance = json.loads(path.read_text())["glance"]
    assert glance == {"passed_both": 1, "failed_both": 1, "failed_both_names": ["test-both"], "regressed": 0,
                      "missing_data": gone, "declared": 0}
    assert read_suite(path).pairs == record.pairs
    clean = SuiteRecord("main", pair_up(["test-a"], outcomes(run, ["test-a"]), outcomes(run, ["test-a"]), {}))
    assert clean.unproven() == ""


def test_a_step_s_unproven_words_are_in_the_run_s_headline(tmp_path):
    from harness.record.run import Run
    run = Run.open(tmp_path / "results", "r1")
    run.begin("test", [], "t")
    run.record_step(StepRecord("p", "fork", "upstream-tests", "passed", 1.0, "d",
                               unproven="upstream suite on p: 30 pass on both; 17 fail on both (not proven)"))
    run.end()
    assert run.headline() == "passed (upstream suite on p: 30 pass on both; 17 fail on both (not proven))"


FAKE_TEST_BACKEND_OPS = r"""#!/bin/sh
# a stand-in for test-backend-ops: MODE -o OP -b BACKEND --output sql; FAKE_SLOW_OP sleeps on that op
mode=$1 op=$3
echo "$*" >> "$(dirname "$0")/argv.log"
[ "$mode" = perf ] && [ "$op" = "$FAKE_SLOW_OP" ] && sleep 30
cat "$(dirname "$0")/head.sql"
echo "INSERT INTO test_backend_ops (@COLS@) VALUES ('t', 'c', 'CUDA0', '$op', 'm=16', '$mode', '1', '1', '', '10.0', '1e12', '0', '0', '5', 'd', 'CUDA');"
"""


def _fake_backend_ops_ctx(tmp_path: Path, budget: dict, out, perf_params: str = ""):
    """A stage context whose two builds hold the fake test-backend-ops, for :func:`run_backend_ops`."""
    from contextlib import nullcontext
    from types import SimpleNamespace
    from harness.common.console import Console
    from harness.matrix.config import BackendOps, Platform
    from harness.record.run import Run
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "head.sql").write_text(SQL_HEAD.split("\n", 1)[1])
    exe = bin_dir / "test-backend-ops"
    exe.write_text(FAKE_TEST_BACKEND_OPS.replace("@COLS@", _COLS))
    exe.chmod(0o755)
    run = Run.open(tmp_path / "results", "r1")
    built = SimpleNamespace(status="passed", bin_dir=bin_dir, detail="")
    ctx = SimpleNamespace(run=run, console=Console(out, interactive=False, heartbeat_s=0.5),
                          doing=lambda *a: nullcontext(), build_variant=lambda p, v: built,
                          builds=SimpleNamespace(build_more=lambda *a: (0, 0.0)))
    p = load_matrix(ROOT / "matrix.yaml").platforms["linux-x86_64-cuda"]
    return ctx, Platform(**{**p.__dict__, "backend_ops": BackendOps(("MUL_MAT",), ("MUL_MAT_ID", "MUL_MAT"), "CUDA0",
                                                                    budget, perf_params)})


def test_the_perf_mode_is_a_step_with_progress_that_stops_at_its_budget_keeping_what_it_measured(tmp_path, monkeypatch):
    import io
    from harness.stages.native_tests.backend_ops import run_backend_ops
    out = io.StringIO()
    ctx, p = _fake_backend_ops_ctx(tmp_path, {"test": 20, "perf": 3}, out)
    monkeypatch.setenv("FAKE_SLOW_OP", "MUL_MAT")
    run_backend_ops(ctx, p)
    steps = {s.step: s for s in ctx.run.steps}
    assert steps["backend-ops-test"].status == "passed"
    perf = steps["backend-ops-perf"]
    assert perf.status == "incomplete", perf
    assert perf.detail.startswith("ran past its budget of 3 s (base MUL_MAT stopped after")
    assert "1 cases of MUL_MAT_ID, MUL_MAT measured on both" in perf.detail
    shown = out.getvalue()
    assert "▶ [linux-x86_64-cuda] backend-ops-perf" in shown
    assert "… [linux-x86_64-cuda] backend-ops-perf: [2/4] fork MUL_MAT_ID" in shown  # progress while the op runs
    data = json.loads(ctx.run.layout.upstream_file(p.name, "perf").read_text())
    assert [c["op"] for c in data["cases"]] == ["MUL_MAT_ID"] and data["stopped"].startswith("base MUL_MAT")

    out = io.StringIO()
    ctx, p = _fake_backend_ops_ctx(tmp_path / "fast", {"perf": 20}, out)
    monkeypatch.delenv("FAKE_SLOW_OP")
    run_backend_ops(ctx, p)
    perf = {s.step: s for s in ctx.run.steps}["backend-ops-perf"]
    assert perf.status == "passed" and perf.detail.startswith("2 cases of MUL_MAT_ID, MUL_MAT measured on both")
    assert "-b base -c fork" in perf.detail
    assert (ctx.run.layout.upstream_file(p.name, "perf").with_suffix(".sqlite")).exists()


def test_the_perf_mode_takes_the_cases_matrix_yaml_names_by_their_parameters_and_the_test_mode_every_case(tmp_path):
    import io
    from harness.stages.native_tests.backend_ops import run_backend_ops
    cuda = load_matrix(ROOT / "matrix.yaml").platforms["linux-x86_64-cuda"].backend_ops
    assert cuda is not None and cuda.perf_params  # an H100 ran past the perf budget on every MUL_MAT_ID case
    ctx, p = _fake_backend_ops_ctx(tmp_path, {"test": 20, "perf": 20}, io.StringIO(), cuda.perf_params)
    run_backend_ops(ctx, p)
    calls = (tmp_path / "bin" / "argv.log").read_text().splitlines()
    perf = [c for c in calls if c.startswith("perf ")]
    assert len(perf) == 4 and all(c.endswith(f"-p {cuda.perf_params} --output sql") for c in perf)
    assert [c for c in calls if c.startswith("test ")] == ["test -o MUL_MAT -b CUDA0 --output sql"] * 2


@pytest.mark.network
def test_recorded_perf_output_of_upstreams_test_backend_ops_is_read_and_compared(tmp_path, compare_llama_bench):
    """tests/data/test-backend-ops-perf-cpu-{base,fork}.sql: two runs of test-backend-ops at the pinned commit,
    built for the CPU on the 2-core development machine (2026-12-06), ``perf -o MUL_MAT -b CPU -p
    type_a=f16,type_b=f32,m=4096,n=1,k=14336 --output sql``."""
    from harness.stages.native_tests.backend_ops import perf_pairs, sql_statements, write_perf_database
    data = ROOT / "tests" / "data"
    base_sql, fork_sql = ((data / f"test-backend-ops-perf-cpu-{v}.sql").read_text() for v in ("base", "fork"))
    rows = perf_pairs(read_cases(base_sql), read_cases(fork_sql))
    assert [(r["backend"], r["op"], r["ratio"]) for r in rows] == [("CPU", "MUL_MAT", 1.0332)]
    assert rows[0]["base_us"] == 19454.15942 and round(rows[0]["base_flops"] / 1e9, 2) == 6.04
    database = tmp_path / "backend-ops-perf.sqlite"
    write_perf_database(database, {"base": sql_statements(base_sql), "fork": sql_statements(fork_sql)})
    done = subprocess.run([sys.executable, str(compare_llama_bench), "-t", "test-backend-ops", "-i", str(database), "-b", "base",
                           "-c", "fork"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| CPU       | MUL_MAT   |          6.04 |          5.84 |      0.97 |" in done.stdout, done.stdout
