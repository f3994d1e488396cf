"""The front door: step lines with times, progress while a step runs, GitHub Actions folding."""

import io
import time

import pytest

from harness.common.console import Console
from harness.record.records import StepRecord
from harness.record.run import Run


def test_a_step_prints_a_start_and_a_timed_end_line_and_the_log_where_it_failed():
    out = io.StringIO()
    con = Console(out, interactive=False, github=False, heartbeat_s=0)
    with con.step("[linux] build fork") as step:
        step.finish("passed", "built in 1 s")
    with con.step("[linux] test") as step:
        step.finish("failed", "1 failed", "results/r/linux/tests/ctest.log")
    lines = out.getvalue().splitlines()
    assert lines[0] == "▶ [linux] build fork"
    assert lines[1].startswith("✔ [linux] build fork: passed — built in 1 s (") and lines[1].endswith(" s)")
    assert lines[3].startswith("✘ [linux] test: failed — 1 failed (")
    assert lines[4] == "  log: results/r/linux/tests/ctest.log"


def test_github_actions_folds_steps_and_annotates_failures():
    out = io.StringIO()
    con = Console(out, interactive=False, github=True, heartbeat_s=0)
    with con.step("[linux] build fork") as step:
        with con.step("inner"):  # groups do not nest on GitHub: only the outermost folds
            pass
        step.finish("failed", "compile error in a.c:1: x\ny", "build.log")
    text = out.getvalue()
    assert text.count("::group::") == 1 and text.count("::endgroup::") == 1
    assert text.startswith("::group::[linux] build fork\n")
    assert "::error title=[linux] build fork%3A failed::compile error in a.c:1: x%0Ay (log: build.log)" in text


def test_an_exception_ends_the_step_as_interrupted():
    out = io.StringIO()
    con = Console(out, interactive=False, github=False, heartbeat_s=0)
    with pytest.raises(KeyboardInterrupt):
        with con.step("[linux] compare base-vs-fork"):
            raise KeyboardInterrupt
    assert "■ [linux] compare base-vs-fork: interrupted" in out.getvalue()


def test_ninja_progress_is_read_from_the_log_and_shown_every_few_seconds_off_a_terminal(tmp_path):
    log = tmp_path / "build.log"
    log.write_bytes(b"[151/151] Linking old\n")  # an earlier build's lines do not count
    out = io.StringIO()
    con = Console(out, interactive=False, github=False, heartbeat_s=0.3)
    with con.step("[linux] build fork", watch=log) as step:
        with log.open("ab") as fh:
            fh.write(b"[1/151] Building C object ggml.c.o\n[57/151] Building CXX object llama.cpp.o\n")
        time.sleep(1.5)
        assert (step.done, step.total) == (57, 151)
        step.finish("passed")
    beats = [ln for ln in out.getvalue().splitlines() if ln.startswith("  … ")]
    assert beats and any("[57/151]" in b for b in beats)


def test_generations_count_k_of_n_and_draw_a_bar_on_a_terminal():
    out = io.StringIO()
    con = Console(out, interactive=True, github=False)
    with con.step("[linux] compare g", total=4) as step:
        for k in range(4):
            con.advance(step, 1, f"fork story.r{k + 1}")
        assert step.progress_text() == "[4/4] fork story.r4"
        step.finish("passed", "2 identical")
    assert "✔ [linux] compare g: passed" in out.getvalue()


def test_the_headline_counts_skipped_platforms(tmp_path):
    run = Run.open(tmp_path, "r1")
    run.record_step(StepRecord("linux-x86_64-cpu", "fork", "build", "passed"))
    run.skipped_platforms.update({"linux-x86_64-cuda": "no GPU", "windows-x86_64-cuda": "not windows"})
    run.write_summary()
    assert run.headline() == "passed (2 platforms skipped)"
    assert run.layout.summary_md.read_text().startswith("# Run r1: ✅ passed (2 platforms skipped)")
