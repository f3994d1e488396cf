"""JUnit XML of a run, in the run's own folder and copied to a stable path for CI: one test case per comparison,
check, speed rule and upstream test."""

import xml.etree.ElementTree as ET

from harness.views import report
from harness.record.json_files import write_json
from harness.record.junit import publish_latest, write_run_junit
from harness.record.layout import RunLayout
from harness.record.records import ComparisonRecord, StepRecord
from harness.record.run import Run

CPU = "linux-x86_64-cpu"


def _write(run: Run) -> list:
    return write_run_junit(run.dir, run.steps, run.comparisons, ("expectations",))


def test_one_case_per_comparison_and_the_first_divergence_as_the_failure_message(tmp_path):
    run = Run.open(tmp_path / "results", "r1")
    run.record_comparisons([
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "story", "base", "fork", "diverged",
                         {"index": 17, "reference": {"id": 278, "piece": " the"},
                          "candidate": {"id": 263, "piece": " a"}}, "diverged at token 17"),
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "code", "base", "fork", "identical", None, "identical"),
        ComparisonRecord(CPU, "mmap-vs-load-mode-none", "moe-small", "story", "fork", "fork-load-none", "crashed",
                         None, "candidate crashed: SIGSEGV"),
        ComparisonRecord("other-platform", "g", "m", "p", "a", "b", "identical"),
    ])
    paths = _write(run)
    junit = run.dir / "junit"
    assert paths == [junit / f"comparisons-{CPU}.xml", junit / "comparisons-other-platform.xml"]
    root = ET.parse(paths[0]).getroot()
    assert (root.get("tests"), root.get("failures")) == ("3", "2")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"story: fork vs base", "code: fork vs base", "story: fork-load-none vs fork"}
    failure = cases["story: fork vs base"].find("failure")
    assert failure.get("message") == ("diverged; the group expects identical: first divergent token #17: ' the' "
                                      "(id 278) vs ' a' (id 263)")
    assert cases["code: fork vs base"].find("failure") is None
    assert cases["story: fork-load-none vs fork"].find("failure").get("message") == \
        "crashed; the group expects identical: candidate crashed: SIGSEGV"
    copies = publish_latest(run.dir, run.root)  # and at a path CI can name, outside the run id
    assert copies == [tmp_path / "results" / "junit" / p.name for p in paths]
    assert [c.read_bytes() for c in copies] == [p.read_bytes() for p in paths]


def test_a_numerics_control_fails_on_identity_and_passes_its_divergence(tmp_path):
    """JUnit renders the row verdict: under ``expect: diverged`` an identity is the failure, a divergence passes."""
    run = Run.open(tmp_path / "results", "r1")
    run.record_comparisons([
        ComparisonRecord(CPU, "numerics-control", "m", "story", "fork", "fork-ub-1", "diverged",
                         {"index": 3, "reference": {"id": 1, "piece": " a"}, "candidate": {"id": 2, "piece": " b"}},
                         expected="diverged"),
        ComparisonRecord(CPU, "numerics-control", "m", "code", "fork", "fork-ub-1", "identical", expected="diverged"),
    ])
    root = ET.parse(_write(run)[0]).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert root.get("failures") == "1"
    assert cases["code: fork-ub-1 vs fork"].find("failure").get("message") == "identical; the group expects diverged"
    passed = cases["story: fork-ub-1 vs fork"]
    assert passed.find("failure") is None and passed.find("skipped") is None
    assert passed.find("system-out").text.startswith("diverged, as the group expects: #3")


def _suite_run(tmp_path, regressed: bool) -> Run:
    """A run whose upstream suite step passed with two tests failing on both sides (one passing on both), or
    failed with one more that passes on base and fails on the fork, as harness.stages.native_tests.upstream_suite
    records them."""
    run = Run.open(tmp_path / "results", "r1")
    pairs = [{"name": "test-tokenizer-0", "base": "passed", "fork": "passed", "outcome": "passed-both"},
             {"name": "test-thread-safety", "base": "failed", "fork": "failed", "outcome": "failed-both",
              "fork_message": "no model file"},
             {"name": "test-arg-parser", "base": "failed", "fork": "failed", "outcome": "failed-both"}]
    if regressed:
        pairs.append({"name": "test-backend-ops", "base": "passed", "fork": "failed", "outcome": "regressed",
                      "fork_message": "Subprocess aborted"})
    write_json(run.layout.upstream_file(CPU, "pairs"), {"label": "main", "pairs": pairs})
    run.record_step(StepRecord(CPU, "fork", RunLayout.UPSTREAM_STEP, "failed" if regressed else "passed", 1.0, "…"))
    run.write_summary()
    return run


def test_a_passing_upstream_suite_marks_fail_on_both_tests_skipped_with_the_reason(tmp_path):
    run = _suite_run(tmp_path, regressed=False)
    (path,) = _write(run)
    assert path == run.dir / "junit" / f"upstream-{CPU}.xml"
    root = ET.parse(path).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "0", "2")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    skipped = cases["test-thread-safety"].find("skipped")
    assert skipped.get("message").startswith("fail on both (upstream's or the environment's, never the fork's")
    assert "no model file" in skipped.get("message")
    assert cases["test-tokenizer-0"].find("skipped") is None and cases["test-tokenizer-0"].find("failure") is None


def test_a_regression_of_the_upstream_suite_is_its_only_failure(tmp_path):
    run = _suite_run(tmp_path / "b", regressed=True)
    root = ET.parse(_write(run)[0]).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "1", "2")
    failure = next(c for c in root.iter("testcase") if c.get("name") == "test-backend-ops").find("failure")
    assert "pass on base and fail on the fork" in failure.get("message") and "Subprocess aborted" in failure.get("message")


def test_report_run_writes_the_runs_junit_again(tmp_path, capsys):
    run = _suite_run(tmp_path, regressed=True)
    run.record_step(StepRecord(CPU, "fork", "expectations", "failed", 0.0, "pinned: fraction below 1"))
    run.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "identical")])
    run.write_summary()
    junit = run.dir / "junit"
    assert not junit.exists()  # nothing has written it yet: the run's stages did not end through the pipeline
    assert report.main([str(run.dir), "--against", "none"]) == 0
    assert sorted(p.name for p in junit.iterdir()) == [f"checks-{CPU}.xml", f"comparisons-{CPU}.xml",
                                                      f"upstream-{CPU}.xml"]
    checks = ET.parse(junit / f"checks-{CPU}.xml").getroot()
    assert checks.get("failures") == "1"
    assert not (run.root / "junit").exists()  # report of an old run leaves CI's latest copy alone
