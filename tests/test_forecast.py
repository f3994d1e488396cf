"""Tests for harness.upstream.forecast and forecast_patches on a fake upstream with planted drift
(tests/fake_upstream.py, make_drift_project).

The patch-stage tests run git only; the end-to-end ones build the fake project (marked slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fake_upstream import DriftProject, make_drift_project
from harness.upstream.forecast import (ForecastError, forecast_markdown, parse_onto, verdict, with_old_base,
                                      without_left_out_tests)
from harness.upstream.forecast_patches import PatchOutcome, conflict_regions, try_series
from harness.matrix.config import load_matrix
from harness.common.statuses import RUN_FORECAST
from harness.record.forecast import ForecastRecord
from harness.record.inputs import read_run_info
from harness.record.layout import RunLayout
from harness.record.records import ComparisonRecord, StepRecord
from harness.views.report import render_html
from harness.common.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PASSED
from harness.stages.building.patches import apply_series, read_series


@pytest.fixture(scope="module")
def drift(tmp_path_factory: pytest.TempPathFactory) -> DriftProject:
    """One drift project for the module: the tests clone it or give each forecast its own results run."""
    return make_drift_project(tmp_path_factory.mktemp("drift"))


def _trial(d: DriftProject, onto: str, tmp: Path):
    """try_series of the drift series onto ``onto`` in a clone of the fake repository, the old base's
    fork branch beside it (as harness.upstream.forecast.forecast_base leaves it)."""
    repo = tmp / "trial"
    subprocess.run(["git", "clone", "-q", str(d.project.repo), str(repo)], check=True)
    patches = read_series(d.project.patches)
    apply_series(repo, d.old, patches)
    subprocess.run(["git", "branch", "-q", "-f", "old-fork", "HEAD"], cwd=repo, check=True)
    return try_series(repo, onto, patches, log=tmp / "patches.log"), repo


def test_every_patch_is_classified_and_the_series_goes_on_past_a_conflict(drift: DriftProject, tmp_path: Path):
    outcomes, _ = _trial(drift, drift.drift, tmp_path)
    assert [o.status for o in outcomes] == ["3-way", "conflict", "already-upstream", "clean", "clean"]
    moved, rewritten, verbatim, later, api = outcomes
    assert moved.commit and not moved.conflicts
    assert not verbatim.commit  # nothing committed for a patch upstream already holds
    # the later patches applied without the conflicting one, and say so
    assert later.applied_without == [rewritten.name] and api.applied_without == [rewritten.name]
    assert moved.applied_without == []


def test_a_conflict_names_the_file_the_hunk_and_the_upstream_lines_it_met(drift: DriftProject, tmp_path: Path):
    outcomes, repo = _trial(drift, drift.drift, tmp_path)
    rewritten = outcomes[1]
    assert len(rewritten.conflicts) == 1
    c = rewritten.conflicts[0]
    assert c.file == "notes.txt"
    assert c.hunk.startswith("@@ -17,7 +17,7 @@")
    assert c.wanted == ["line 20 (fork)"]
    assert c.upstream == ["line 20 (upstream rewrite)"]
    # the line number is where upstream holds those lines (5 lines were inserted above them)
    notes = subprocess.run(["git", "show", f"{drift.drift}:notes.txt"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert notes[c.upstream_line - 1] == "line 20 (upstream rewrite)"
    assert "notes.txt @@ -17,7 +17,7 @@" in rewritten.detail


def test_an_undrifted_upstream_takes_every_patch_cleanly(drift: DriftProject, tmp_path: Path):
    outcomes, _ = _trial(drift, drift.output, tmp_path)
    assert [o.status for o in outcomes] == ["clean"] * 5
    assert all(o.commit and not o.applied_without for o in outcomes)


def test_conflict_regions_reads_both_sides_and_where_upstream_starts():
    text = "a\n<<<<<<< HEAD\nup 1\nup 2\n=======\nfork\n>>>>>>> patch\nb\n"
    assert conflict_regions(text) == [(2, ["up 1", "up 2"], ["fork"])]
    two = text + "<<<<<<< HEAD\nup 3\n=======\nfork 2\n>>>>>>> patch\n"
    assert conflict_regions(two)[1] == (5, ["up 3"], ["fork 2"])
    assert conflict_regions("no markers\n") == []


def test_parse_onto_reads_every_kind_of_source(tmp_path: Path, drift: DriftProject):
    sdist = parse_onto("pypi-sdist:llama-cpp-python==0.3.30")
    assert (sdist.source.kind, sdist.source.version, sdist.source.subdir, sdist.commit) == \
        ("pypi-sdist", "0.3.30", "vendor/llama.cpp", None)
    remote = parse_onto("https://github.com/ggml-org/llama.cpp.git@" + "a" * 40)
    assert (remote.source.kind, remote.source.url, remote.commit) == \
        ("git", "https://github.com/ggml-org/llama.cpp.git", "a" * 40)
    local = parse_onto(f"{drift.project.repo}@drift")
    assert (local.source.kind, local.commit) == ("local", drift.drift)
    for bad in ("pypi-sdist:llama-cpp-python", "https://example.org/x.git@main", str(tmp_path / "missing"),
                f"{drift.project.repo}@no-such-branch", str(tmp_path / "a.tar.gz")):
        with pytest.raises(ForecastError):
            parse_onto(bad)


def test_parse_onto_reads_an_archive_s_commit_from_its_manifest(tmp_path: Path):
    import io
    import tarfile
    archive = tmp_path / "mirror.tar.gz"
    data = json.dumps({"commit": "b" * 40}).encode()
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("HARNESS-MIRROR.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    onto = parse_onto(f"{archive}#sha256={'c' * 64}")
    assert (onto.source.kind, onto.source.sha256, onto.commit) == ("archive", "c" * 64, "b" * 40)
    (tmp_path / "mirror.tar.gz.sha256").write_text("d" * 64 + "  mirror.tar.gz\n")
    assert parse_onto(str(archive)).source.sha256_file == (tmp_path / "mirror.tar.gz.sha256").resolve()
    with pytest.raises(ForecastError):
        parse_onto(f"{archive}#sha256=short")


def test_verdict_names_conflicts_compile_errors_and_output_changes(drift: DriftProject, tmp_path: Path):
    outcomes, _ = _trial(drift, drift.drift, tmp_path)
    build = StepRecord("p", "fork", "build", "failed", detail="x")
    sig = {"kind": "compile_error", "key": "launcher.c: error: 'FAKE_API_VALUE' undeclared",
           "summary": "compile error in launcher.c:7: 'FAKE_API_VALUE' undeclared"}
    line, work, _ = verdict(outcomes, [build], [], {("p", "fork", "build"): sig}, [])
    assert line.startswith("2 patches need work: ")
    assert [w["patch"] for w in work] == [outcomes[1].name, outcomes[4].name]
    diverged = ComparisonRecord("p", "base-vs-fork", "m", "one", "base", "fork", "diverged", detail="differs")
    elsewhere = dict(sig, key="ggml.c: error: x", summary="compile error in ggml.c:1: x")
    unowned, _, _ = verdict([outcomes[0]], [build], [], {("p", "fork", "build"): elsewhere}, [])
    assert unowned == "0 patches need work; not attributed to a patch: build p/fork (compile error in ggml.c:1: x)"
    clean, _, _ = verdict([outcomes[0]], [], [], {}, [])
    assert clean == "the series moves cleanly"
    changed, _, changes = verdict([outcomes[0]], [], [diverged], {}, [])
    assert changed.startswith("builds but outputs change: ") and changes[0]["group"] == "base-vs-fork"
    upstream_only, _, _ = verdict([outcomes[0]], [], [replace(diverged, group="old-base-vs-new-base")], {},
                                  ["old-base-vs-new-base"])
    assert upstream_only == "the series moves cleanly"


def _forecast(d: DriftProject, onto: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict, Path]:
    p = d.project
    argv = [sys.executable, "-m", "harness", "forecast", "--onto", f"{p.repo}@{onto}", "--matrix", str(p.matrix),
            "--patches-dir", str(p.patches), "--work-dir", str(p.work), "--results-dir", str(p.results), "-j", "1",
            *extra]
    proc = subprocess.run(argv, env=p.env(), capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    run_dir = (p.results / "latest").resolve()
    rec = json.loads((run_dir / "forecast.json").read_text()) if (run_dir / "forecast.json").exists() else {}
    return proc, rec, run_dir


def test_patches_only_forecast_writes_the_report_and_exits_failed_on_a_conflict(drift: DriftProject):
    proc, rec, run_dir = _forecast(drift, "drift", "--patches-only")
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert rec["onto"]["commit"] == drift.drift and rec["old_base"]["commit"] == drift.old
    assert [p["status"] for p in rec["patches"]] == ["3-way", "conflict", "already-upstream", "clean", "clean"]
    assert rec["verdict"].startswith("1 patch needs work: mark-line-20-of-the-notes.patch (conflict: notes.txt @@")
    md = (run_dir / "forecast.md").read_text()
    assert "line 20 (upstream rewrite)" in md and "| 2 | mark-line-20-of-the-notes.patch | ❌ conflict |" in md
    assert 'id="forecast"' in render_html(run_dir)
    assert read_run_info(RunLayout(run_dir).run_json).kind == RUN_FORECAST  # never the fork's history


def test_a_source_that_is_not_there_is_bad_input(drift: DriftProject):
    proc, _, _ = _forecast(drift, "f" * 40, "--patches-only")
    assert proc.returncode == EXIT_BAD_INPUT
    assert "is not a commit" in proc.stderr


@pytest.mark.slow
def test_forecast_onto_drift_finds_the_conflict_and_the_compile_error_of_the_api_rename(drift: DriftProject):
    proc, rec, run_dir = _forecast(drift, "drift")
    assert proc.returncode == EXIT_FAILED, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rec["applied_series"] == ["mark-line-5-of-the-notes.patch", "mark-the-fifteenth-other-line.patch",
                                     "start-the-argument-count-at-the-api-value.patch"]
    first = rec["first_failure"]
    assert (first["config"], first["step"], first["signature"]["kind"]) == ("fork", "build", "compile_error")
    assert first["signature"]["key"].startswith("launcher.c: error:") and "FAKE_API_VALUE" in first["signature"]["key"]
    assert [w["patch"] for w in rec["needs_work"]] == ["mark-line-20-of-the-notes.patch",
                                                      "start-the-argument-count-at-the-api-value.patch"]
    assert rec["verdict"].startswith("2 patches need work: ")
    steps = {(s["config"], s["step"]): s["status"] for s in rec["stages"]}
    assert steps[("base", "build")] == "passed" and steps[("old-base", "build")] == "passed"
    assert steps[("fork", "build")] == "failed"
    # the same records as a normal run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any(s["config"] == "fork" and s["step"] == "build" for s in summary["configurations"])
    assert "FAKE_API_VALUE" in render_html(run_dir)


@pytest.mark.slow
def test_forecast_onto_an_upstream_output_change_blames_upstream_not_the_series(drift: DriftProject):
    proc, rec, run_dir = _forecast(drift, "output")
    assert proc.returncode == EXIT_PASSED, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rec["verdict"] == "the series moves cleanly"
    upstream = rec["upstream_comparisons"]
    assert upstream and all(u["group"] == "old-base-vs-new-base" and u["status"] == "diverged" for u in upstream)
    assert all("howdy" in u["difference"] for u in upstream)
    fork = [c for c in json.loads((run_dir / "summary.json").read_text())["comparisons"]
            if c["group"] == "base-vs-fork"]
    assert fork and all(c["status"] == "identical" for c in fork)
    assert rec["output_changes"] == []
    assert "howdy" in forecast_markdown(ForecastRecord.from_json(rec))


@pytest.mark.slow
def test_forecast_bisects_its_failing_rows_and_a_bad_end_where_the_series_does_not_apply_is_not_bad(
        drift: DriftProject):
    proc, rec, run_dir = _forecast(drift, "drift", "--bisect")
    assert proc.returncode == EXIT_FAILED
    bisect = rec["bisect"]
    assert bisect == json.loads((run_dir / "bisect.json").read_text())
    first = subprocess.run(["git", "rev-parse", "drift~1"], cwd=drift.project.repo, capture_output=True, text=True,
                           check=True).stdout.strip()
    # every failing row of the forecast is bisected with the whole series on each commit: it passes on the pinned
    # base, and on the new one the series does not apply (patch 2 conflicts), which is neither good nor bad
    rows = {r["id"]: r for r in bisect["rows"]}
    assert "linux-x86_64-cpu fork build" in rows
    assert {r["outcome"] for r in rows.values()} == {"not bad at BAD"}
    assert all(r["points"][0]["outcome"] == "good" and r["points"][-1]["outcome"] == "undecided" for r in rows.values())
    assert bisect["upstream"]["not_applied"] == {drift.drift: "mark-line-20-of-the-notes.patch"}
    assert [c for c, _ in bisect["upstream"]["commits"]] == [drift.old, first, drift.drift]
    assert [p["k"] for p in bisect["points"]] == [0]  # GOOD ran; BAD ran nothing


def test_the_old_base_group_judges_the_new_base_against_the_old_by_the_group_s_speed_rules():
    shipped = load_matrix(Path(__file__).resolve().parents[1] / "matrix.yaml")
    matrix, made = with_old_base(shipped, ["linux-x86_64-cpu"])
    group = matrix.groups["old-base-vs-new-base"]
    assert made["old-base-vs-new-base"] == "base-vs-fork"
    assert (group.reference, group.candidates, group.expect) == ("old-base", ("base",), "informational")
    assert matrix.configs["old-base"].build == "old-base"
    # the new base is measured against the old one, never the fork against the old base
    assert group.speed is not None
    assert sorted((r.candidate, r.metric) for r in group.speed.rules) == [("base", "pp"), ("base", "tg")]
    # against the old base: the loader names the group's reference (base) in every rule of base-vs-fork, and a
    # rule left so measured the new base against itself (bench.json's pair [base, base], ratio 1.00x)
    assert {r.reference for r in group.speed.rules} == {"old-base"}
    assert group.speed.platforms == shipped.groups["base-vs-fork"].speed.platforms


def test_a_test_target_whose_definition_comes_with_a_left_out_patch_is_not_built():
    # onto llama-cpp-python 0.3.34's upstream, patches 1-4 conflict: test-cuda-pin-ladder-host is defined
    # by patch 4's lines in tests/CMakeLists.txt (its source comes with patch 2), so ninja has no such target
    root = Path(__file__).resolve().parents[1]
    patches = read_series(root / "patches")
    statuses = ["conflict", "clean", "clean", "conflict", "clean"]
    outcomes = [PatchOutcome(i + 1, p.name, p.name, s, [], "", commit="" if s == "conflict" else f"c{i}")
                for i, (p, s) in enumerate(zip(patches, statuses))]
    matrix, dropped = without_left_out_tests(load_matrix(root / "matrix.yaml"), ["linux-x86_64-cpu"], outcomes, patches)
    targets = matrix.platforms["linux-x86_64-cpu"].test_targets
    assert "test-cuda-pin-ladder-host" not in targets and "test-moe-pin-layers" in targets
    assert dropped == ["linux-x86_64-cpu: test target test-cuda-pin-ladder-host not built: its definition in "
                       f"tests/CMakeLists.txt comes with {patches[3].name}, which was left out"]
