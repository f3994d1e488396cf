"""The typed reader of a run's summary.json (harness.record.summary.read_run): what a run recorded comes back as
records, and a summary it cannot read is refused naming the file."""

import json

import pytest

from harness.record.layout import RunLayout
from harness.record.records import RECORD_VERSION, ComparisonRecord, Failure, RecordError, StepRecord
from harness.record.run import Run
from harness.common.statuses import CRASHED, DIVERGED, IDENTICAL
from harness.record.summary import read_run, run_dirs_under


def _run(tmp_path):
    run = Run(tmp_path / "results", "r1")
    run.record_step(StepRecord("p1", "fork", "build", "passed", 12.5, "built (key 0123456789abcdef)"))
    run.record_step(StepRecord("p1", "fork", "generate", "failed", 3.0, "m/a: crashed SIGSEGV",
                               failures=[Failure("generation", model="m", prompt="a", status=CRASHED, signal="SIGSEGV")]))
    run.record_step(StepRecord("p2", "fork", "build", "skipped", 0.0, "no GPU"))
    run.record_comparisons([ComparisonRecord("p1", "g", "m", "a", "base", "fork", IDENTICAL),
                            ComparisonRecord("p1", "g", "m", "b", "base", "fork", DIVERGED,
                                             first_divergence={"index": 3})])
    run.mark_incomplete("p3: not run")
    run.close()
    return run


def test_what_a_run_recorded_reads_back_as_records(tmp_path):
    run = _run(tmp_path)
    s = read_run(run.dir)
    assert s.run_id == "r1" and s.overall == "failed" and s.incomplete == ["p3: not run"] and not s.killed
    assert [(x.platform, x.step, x.status) for x in s.steps] == [("p1", "build", "passed"),
                                                                 ("p1", "generate", "failed"),
                                                                 ("p2", "build", "skipped")]
    assert s.steps[1].failures == [Failure("generation", model="m", prompt="a", status=CRASHED, signal="SIGSEGV")]
    assert s.step_status("p1", "fork", "generate") == "failed" and s.step_status("p1", "base", "build") is None
    assert s.covered_platforms() == {"p1"}
    assert s.comparisons_by_key()[("p1", "g", "m", "b", "base", "fork")].first_divergence == {"index": 3}
    assert s.updated  # written with the summary
    assert run_dirs_under(tmp_path) == [run.dir]


@pytest.mark.parametrize("text, says", [
    ("{not json", "not valid JSON"),
    (json.dumps({"record_version": RECORD_VERSION + 1}), "newer than this harness reads"),
    (json.dumps({"configurations": [{"platform": "p", "config": "c", "step": "build", "status": "fine"}]}),
     "step status 'fine'"),
    (json.dumps({"skipped_platforms": ["p"]}), "not of a summary's shape"),
])
def test_a_summary_it_cannot_read_is_refused_naming_the_file(tmp_path, text, says):
    path = RunLayout(tmp_path).summary_json
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError, match=says) as caught:
        read_run(tmp_path)
    assert str(path) in str(caught.value)


def test_a_directory_without_a_summary_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        read_run(tmp_path)
