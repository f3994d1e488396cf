"""Results layout, summary contents, JUnit parsing and log parsers."""

import json

import pytest

from harness.record import gpu
from harness.stages.native_tests.native_tests import parse_junit
from harness.record.records import ComparisonRecord, StepRecord
from harness.record.run import Run
from harness.record.run_id import new_run_id


def test_runs_never_overwrite_and_latest_points_at_the_newest(tmp_path):
    a = Run.open(tmp_path, new_run_id())
    a.record_step(StepRecord("linux-x86_64-cpu", "fork", "build", "passed", 1.0, "built"))
    b = Run.open(tmp_path, new_run_id())
    assert a.dir != b.dir and a.dir.exists() and b.dir.exists()
    assert (tmp_path / "latest").resolve() == b.dir.resolve()
    assert json.loads((a.dir / "summary.json").read_text())["configurations"][0]["step"] == "build"


def test_run_id_collision_is_refused(tmp_path):
    (tmp_path / "20260101T000000Z-abcd").mkdir()
    run = Run(tmp_path, "20260101T000000Z-abcd")  # an existing run is continued, never recreated
    run.record_step(StepRecord("p", "c", "build", "passed"))
    assert (tmp_path / "20260101T000000Z-abcd" / "summary.json").exists()


def test_summary_has_the_documented_shape(tmp_path):
    run = Run.open(tmp_path, "r1")
    run.record_step(StepRecord("linux-x86_64-cpu", "fork", "test", "failed", 2.0, "failed: test-x"))
    run.record_comparisons([ComparisonRecord(
        "linux-x86_64-cpu", "base-vs-fork", "gemma3-270m", "story", "base", "fork", "diverged",
        {"index": 17, "reference": {"id": 278, "piece": " the"}, "candidate": {"id": 263, "piece": " a"}},
        "diverged at token 17")])
    data = json.loads((run.dir / "summary.json").read_text())
    assert data["overall"] == "failed"
    assert set(data["configurations"][0]) >= {"platform", "config", "step", "status"}
    cmp = data["comparisons"][0]
    assert set(cmp) >= {"platform", "group", "model", "prompt", "reference", "candidate", "status",
                        "first_divergence"}
    assert cmp["first_divergence"]["index"] == 17
    md = (run.dir / "summary.md").read_text()
    assert "#17: ' the' (id 278) vs ' a' (id 263)" in md and "failed: test-x" in md


def test_summary_is_kept_across_stages_of_one_run(tmp_path):
    run = Run.open(tmp_path, "r2")
    run.record_step(StepRecord("p", "fork", "build", "passed"))
    run.close()  # the stage's process ends
    again = Run.open(tmp_path, "r2")  # a later stage (another process) continues the run
    again.record_step(StepRecord("p", "fork", "test", "passed"))
    steps = json.loads((run.dir / "summary.json").read_text())["configurations"]
    assert [s["step"] for s in steps] == ["build", "test"]
    assert again.overall() == "passed"


def test_bad_statuses_are_refused():
    with pytest.raises(ValueError):
        StepRecord("p", "c", "build", "ok")
    with pytest.raises(ValueError):
        ComparisonRecord("p", "g", "m", "x", "r", "c", "same")


def test_parse_junit_reads_ctest_statuses(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="x" tests="3" failures="1" skipped="1">
  <testcase name="test-moe-pin-layers" classname="test-moe-pin-layers" time="0.05" status="run"/>
  <testcase name="test-gguf" classname="test-gguf" time="1.5" status="fail">
    <failure message="Failed"/>
  </testcase>
  <testcase name="test-cuda-pin-ladder" classname="x" time="0" status="notrun">
    <skipped message="Skipped"/>
  </testcase>
</testsuite>""")
    cases = {c.name: c for c in parse_junit(xml)}
    assert cases["test-moe-pin-layers"].status == "passed"
    assert cases["test-gguf"].status == "failed" and cases["test-gguf"].seconds == 1.5
    assert cases["test-cuda-pin-ladder"].status == "skipped"


def test_ladder_lines_parse_into_numbers():
    log = "\n".join([
        "load_tensors: something else",
        "ggml_cuda_host_malloc: pin ladder: requested=6442450944 granted=2147483648 segments=4 seconds=0.731",
        "ggml_cuda_host_malloc: pin ladder: partial pin: requested=6442450944 granted=2147483648 segments=4 "
        "error=cudaErrorMemoryAllocation",
        "ggml_cuda_host_malloc: pin ladder: no pin: requested=100 granted=0 segments=0 error=cudaErrorInvalidValue",
    ])
    recs = gpu.parse_ladder_lines(log)
    assert [r["kind"] for r in recs] == ["ladder", "partial", "none"]
    assert recs[0]["requested"] == 6442450944 and recs[0]["granted"] == 2147483648
    assert recs[0]["segments"] == 4 and recs[0]["seconds"] == pytest.approx(0.731)
    assert recs[1]["error"] == "cudaErrorMemoryAllocation"
    totals = gpu.ladder_totals(recs)
    assert totals == {"allocations": 1, "requested": 6442450944, "granted": 2147483648, "segments": 4,
                      "calls": 0, "seconds": 0.731, "warnings": 2}


def test_sanitizer_summary(tmp_path):
    log = tmp_path / "ctest.log"
    log.write_text("========= COMPUTE-SANITIZER\nok\n========= ERROR SUMMARY: 0 errors\n"
                   "========= ERROR SUMMARY: 2 errors\n")
    assert gpu.sanitizer_summary(log) == "compute-sanitizer: 2 run(s), 2 error(s)"
    assert gpu.sanitizer_summary(tmp_path / "missing.log") == ""


def test_a_run_that_ran_nothing_or_skipped_what_was_asked_is_not_passed(tmp_path):
    nothing = Run.open(tmp_path, "nothing")
    nothing.record_step(StepRecord("linux-x86_64-cuda", "-", "test", "skipped", detail="needs an NVIDIA GPU"))
    assert nothing.overall() == "skipped"
    asked = Run.open(tmp_path, "asked")
    asked.record_step(StepRecord("linux-x86_64-cuda", "fork", "build", "passed"))
    asked.mark_incomplete("linux-x86_64-cuda: test skipped: needs an NVIDIA GPU")
    assert asked.overall() == "incomplete"
    data = json.loads((asked.dir / "summary.json").read_text())
    assert data["overall"] == "incomplete" and data["incomplete"]
    assert "needs an NVIDIA GPU" in (asked.dir / "summary.md").read_text()
    asked.record_step(StepRecord("linux-x86_64-cuda", "fork", "test", "failed"))
    assert asked.overall() == "failed"


def test_long_details_are_cut_in_the_markdown_but_kept_in_json(tmp_path):
    run = Run.open(tmp_path, "long")
    detail = "PatchApplyError: patch 2 of 3 does not apply\n" + "@@ -1,3 +1,4 @@ | context\n" * 200
    run.record_step(StepRecord("p", "fork", "build", "error", detail=detail))
    md = (run.dir / "summary.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| p | fork | build"))
    assert len(row) < 500 and row.rstrip(" |").endswith("(195 more lines in summary.json)") and "\\|" in row
    assert json.loads((run.dir / "summary.json").read_text())["configurations"][0]["detail"] == detail


def test_an_error_line_is_shown_whole_however_long(tmp_path):
    """A failed git fetch's line ends with what went wrong: a cell that cut it at a few hundred characters
    showed "fatal: unable to acce"."""
    run = Run.open(tmp_path, "fetch")
    line = ("git fetch --quiet --depth 1 https://github.com/ggml-org/llama.cpp " + "0123456789abcdef" * 5
            + " failed in /home/runner/.cache/llama-fork-harness/base/0123456789ab.tmp: fatal: unable to access "
            "'https://github.com/ggml-org/llama.cpp/': Could not resolve host: github.com")
    run.record_step(StepRecord("p", "base", "build", "error",
                               detail=f"SourceError: no source produced the pinned commit:\n  git: {line}"))
    md = (run.dir / "summary.md").read_text()
    assert len(line) > 300 and line in md and "Could not resolve host: github.com |" in md


def _near_tie_group_record(status="diverged", near_tie=True, kl_mean=5e-9, nondeterministic=()):
    fd = None if status == "identical" else {"index": 79, "near_tie": near_tie, "near_tie_margin": 0.1,
                                             "reference": {"id": 18509, "piece": " a", "margin": 0.0007},
                                             "candidate": {"id": 30954, "piece": " b", "margin": 0.00002}}
    return ComparisonRecord("windows-x86_64-cpu", "cross-os", "moe-small", "long-prefill",
                            "fork@linux-x86_64-cpu", "fork", status, first_divergence=fd,
                            kl={"positions": 120, "mean": kl_mean, "max": kl_mean * 10, "max_at": 3,
                                "top1_agreement": 1.0},
                            kl_mean_max=1e-4, expected="near-tie", nondeterministic=list(nondeterministic))


def test_a_near_tie_group_accepts_only_near_tie_divergences_with_small_kl(tmp_path):
    from harness.record.junit import comparisons_xml
    assert not _near_tie_group_record("identical").failed()
    accepted = _near_tie_group_record()
    assert not accepted.failed() and accepted.tolerated_near_tie()
    assert _near_tie_group_record(near_tie=False).failed()            # a hard divergence
    assert _near_tie_group_record(kl_mean=3e-4).failed()              # KL above kl_mean_max
    assert _near_tie_group_record(nondeterministic=["fork"]).failed()  # a side disagrees with itself
    assert _near_tie_group_record("crashed").failed()
    run = Run(tmp_path, new_run_id())
    run.record_comparisons([accepted])
    assert run.overall() == "passed"
    xml = comparisons_xml("windows-x86_64-cpu", [accepted, _near_tie_group_record(near_tie=False)]).getroot()
    assert (xml.get("tests"), xml.get("failures"), xml.get("skipped")) == ("2", "1", "0")
    run.record_comparisons([_near_tie_group_record(near_tie=False)])
    assert run.overall() == "failed"


def test_an_informational_group_records_divergences_and_fails_only_on_crashes(tmp_path):
    hard = _near_tie_group_record(near_tie=False, kl_mean=3e-3)
    hard.expected = "informational"
    assert not hard.failed()
    crashed = _near_tie_group_record("crashed")
    crashed.expected = "informational"
    assert crashed.failed()
    run = Run(tmp_path, new_run_id())
    run.record_comparisons([hard])
    assert run.overall() == "passed"
    run.record_comparisons([crashed])
    assert run.overall() == "failed"
