"""Triage and the report show results from the result cache exactly like fresh ones, saying where they came from.

Two runs record the same outcomes, one fresh and one whose test step and generations came from the
cache (the records the pipeline writes then: ``cached`` on steps and comparisons, the run's cache counts).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from harness.views.report import markdown_summary, render_html
from harness.triage.triage import diff_runs, format_report
from harness.record.records import ComparisonRecord, StepRecord
from harness.record.run import Run

CPU = "linux-x86_64-cpu"
ORIGIN = "20260101T000000Z-orig"


def _run(root: Path, run_id: str, *, diverged: bool, cached: bool) -> Path:
    run = Run.open(root, run_id)
    origin = ORIGIN if cached else ""
    run.record_step(StepRecord(CPU, "fork", "build", "passed", 90.0, "built in 90 s"))
    run.record_step(StepRecord(CPU, "fork", "test", "passed", 0.2 if cached else 13.0,
                               f"6 reused from run {ORIGIN} (labels main, fork)" if cached else "6 passed, 0 skipped",
                               cached=origin))
    for config in ("base", "fork"):
        run.record_step(StepRecord(CPU, config, "generate", "passed", 0.1 if cached else 20.0,
                                   "all generations ran", cached=origin))
    sides = {"base": ORIGIN, "fork": ORIGIN} if cached else {}
    div = {"index": 7, "near_tie": False, "reference": {"id": 1, "piece": " the", "margin": 2.0},
           "candidate": {"id": 2, "piece": " a", "margin": 1.0}} if diverged else None
    run.record_comparisons([
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "story", "base", "fork",
                         "diverged" if diverged else "identical", div, "diverged at generated token 7" if diverged
                         else "identical", cached=sides),
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "code", "base", "fork", "identical", None, "identical",
                         kl={"positions": 120, "mean": 0.0, "max": 0.0, "max_at": 0, "top1_agreement": 1.0},
                         cached=sides),
    ])
    if cached:
        run.count_cache({"generation": {"hits": 2, "misses": 0, "stored": 0, "corrupt": 0},
                         "tests": {"hits": 2, "misses": 0, "stored": 0, "corrupt": 0}})
    run.write_summary()
    run.close()
    return run.dir


def _plain(transitions):
    return [replace(t, cached="", detail="") for t in transitions]


def test_triage_sees_cached_results_as_the_fresh_ones_and_names_their_run(tmp_path):
    root = tmp_path / "results"
    good = _run(root, "20260102T000000Z-good", diverged=False, cached=False)
    fresh = _run(root, "20260103T000000Z-fres", diverged=True, cached=False)
    cached = _run(root, "20260103T000000Z-cach", diverged=True, cached=True)
    by_fresh, by_cache = diff_runs(good, fresh), diff_runs(good, cached)
    assert _plain(by_cache.transitions) == _plain(by_fresh.transitions)
    assert [t.category for t in by_cache.transitions] == ["regression"]
    assert by_cache.transitions[0].cached == f"cached: {ORIGIN} (base, fork)"
    assert [replace(d, cached="") for d in by_cache.divergences] == by_fresh.divergences
    # a reused test step ran nothing: its 0.2 s is not a time change against 13 s
    assert not by_cache.timing_changes
    text = format_report(by_cache)
    assert f"cached: {ORIGIN} (base, fork)" in text
    assert "result cache in 20260103T000000Z-cach: 2 of 2 generation sessions from the cache, 2 of 2 ctest labels " \
           "reused" in text
    assert "result cache" not in format_report(by_fresh)
    # and from a cached run to a fresh one of the same outcomes: nothing changed
    assert diff_runs(cached, fresh).transitions == [] and diff_runs(fresh, cached).transitions == []


def _badges(html: str) -> list[str]:
    return re.findall(r'class="st st-\w+ st-([\w-]+)"', html)


def test_the_report_shows_cached_comparisons_as_fresh_ones_and_the_test_step_as_reused(tmp_path):
    root = tmp_path / "results"
    fresh = _run(root, "20260103T000000Z-fres", diverged=True, cached=False)
    cached = _run(root, "20260103T000000Z-cach", diverged=True, cached=True)
    html_fresh, html_cached = render_html(fresh), render_html(cached)

    def comparisons(html: str) -> list[str]:
        return _badges(html[html.index('id="comparisons"'):html.index('id="divergences"')])

    assert comparisons(html_cached) == comparisons(html_fresh) == ["diverged", "identical"]
    assert html_cached.count(f"cached: {ORIGIN} (base, fork)") == 2

    def steps(html: str) -> list[str]:
        return _badges(html[html.index('id="steps"'):html.index('id="comparisons"')])

    assert steps(html_fresh) == ["passed", "passed", "passed", "passed"]
    assert steps(html_cached) == ["passed", "reused", "passed", "passed"]  # the test step is never "passed"
    assert f"from run {ORIGIN}" in html_cached and f"cached: {ORIGIN}" in html_cached
    assert "Result cache (docs/cache.md): 2 of 2 generation sessions from the cache" in html_cached
    md = markdown_summary(cached)
    assert "**Result cache:** 2 of 2 generation sessions from the cache, 2 of 2 ctest labels reused" in md
    assert f"cached: {ORIGIN} (base, fork)" in md
    summary_md = (cached / "summary.md").read_text()
    assert f"♻️ reused (run {ORIGIN})" in summary_md and f"cached: {ORIGIN} (base, fork)" in summary_md
