"""JUnit XML of comparisons at a stable path, one test case per comparison."""

import xml.etree.ElementTree as ET

from harness.record.junit import write_comparisons_junit
from harness.record.records import ComparisonRecord
from harness.record.run import Run

CPU = "linux-x86_64-cpu"


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
    paths = write_comparisons_junit(run)
    junit = tmp_path / "results" / "junit"
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
    assert not any(p.parent.name == "r1" for p in paths)  # outside the run id: a path CI can name


def test_a_numerics_control_fails_on_identity_and_passes_its_divergence(tmp_path):
    """JUnit renders the row verdict: under ``expect: diverged`` an identity is the failure, a divergence passes."""
    run = Run.open(tmp_path / "results", "r1")
    run.record_comparisons([
        ComparisonRecord(CPU, "numerics-control", "m", "story", "fork", "fork-ub-1", "diverged",
                         {"index": 3, "reference": {"id": 1, "piece": " a"}, "candidate": {"id": 2, "piece": " b"}},
                         expected="diverged"),
        ComparisonRecord(CPU, "numerics-control", "m", "code", "fork", "fork-ub-1", "identical", expected="diverged"),
    ])
    root = ET.parse(write_comparisons_junit(run)[0]).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert root.get("failures") == "1"
    assert cases["code: fork-ub-1 vs fork"].find("failure").get("message") == "identical; the group expects diverged"
    passed = cases["story: fork-ub-1 vs fork"]
    assert passed.find("failure") is None and passed.find("skipped") is None
    assert passed.find("system-out").text.startswith("diverged, as the group expects: #3")
