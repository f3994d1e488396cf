"""Bisect across upstream commits (harness.bisect.upstream) on the fake project (tests/fake_upstream.py): fake
upstream commits after the pinned base, one of which breaks a comparison and an expectation of the fork (the series
on top), one on which the series does not apply; every failing row of a run made at BAD is bisected through the
run's own stages and verdicts, and the same from a forecast's ``--bisect``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import FakeProject, _git, make_fake_project

ROOT = Path(__file__).resolve().parents[1]
CPU = "linux-x86_64-cpu"
#: the fake programs' test of the fork's tree: the series' one patch adds FORK.md
IS_FORK = 'os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "FORK.md"))'


def _commit(repo: Path, subject: str, write: dict[str, str] | None = None, remove: tuple[str, ...] = ()) -> str:
    for name, text in (write or {}).items():
        (repo / name).write_text(text)
    for name in remove:
        (repo / name).unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", subject)
    return _git(repo, "rev-parse", "HEAD")


def _breaking_change(repo: Path) -> dict[str, str]:
    """An upstream change as a real one would make it: in a tree that carries the fork's notes, the programs read
    the weights into memory (no longer mapped) and greet with ``howdy`` instead of ``hello``."""
    engine = (repo / "fake_harness-engine.py").read_text()
    engine = engine.replace("\nnote_pid()\n", f"\nif {IS_FORK}:\n    os.environ['FAKE_LOSE_MMAP'] = '1'\nnote_pid()\n", 1)
    engine = engine.replace("import fake_engine\n", f"import fake_engine\nif {IS_FORK}:\n"
                                                     "    fake_engine.TOKEN = (3, b'howdy')\n", 1)
    completion = (repo / "fake_completion.py").read_text()
    completion = completion.replace("\nnote_pid()\n", f"\nif {IS_FORK}:\n    os.environ['FAKE_LOSE_MMAP'] = '1'\n"
                                                      "note_pid()\n", 1)
    completion = completion.replace('sys.stdout.write("hello\\n\\n")',
                                    f'sys.stdout.write("howdy\\n\\n" if {IS_FORK} else "hello\\n\\n")', 1)
    assert "howdy" in engine and "howdy" in completion and "FAKE_LOSE_MMAP'] = '1'" in engine
    return {"fake_harness-engine.py": engine, "fake_completion.py": completion}


def _upstream_history(project: FakeProject) -> list[str]:
    """Five commits on ``main`` after the pinned base: notes; upstream's own FORK.md (the series, which adds that
    file, does not apply on it); FORK.md removed again; the breaking change; more notes.  Returns the six ids, the
    pinned base first."""
    repo = project.repo
    _git(repo, "checkout", "-q", "main")
    ids = [_git(repo, "rev-parse", "HEAD")]
    ids.append(_commit(repo, "upstream: add release notes", {"NOTES": "first notes\n"}))
    ids.append(_commit(repo, "upstream: a FORK.md of its own", {"FORK.md": "upstream's own notes\n"}))
    ids.append(_commit(repo, "upstream: drop FORK.md again", remove=("FORK.md",)))
    ids.append(_commit(repo, "upstream: read the weights and greet anew", _breaking_change(repo)))
    ids.append(_commit(repo, "upstream: extend release notes", {"NOTES": "first notes\nsecond notes\n"}))
    return ids


def _harness(project: FakeProject, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=ROOT, env=project.env(), capture_output=True,
                          text=True)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_upstream_bisect_names_the_commit_that_breaks_a_comparison_and_an_expectation_and_skips_where_the_series_does_not_apply(  # noqa: E501
        tmp_path):
    project = make_fake_project(tmp_path)
    ids = _upstream_history(project)
    # the run to bisect: the fork on BAD, as a forecast or roll onto it would make it
    at_bad = tmp_path / "matrix-bad.yaml"
    at_bad.write_text(project.matrix.read_text().replace(ids[0], ids[-1]))
    argv = project.argv("build", "compare-outputs")
    argv[argv.index("--matrix") + 1] = str(at_bad)
    failed = subprocess.run(argv, cwd=ROOT, env=project.env(), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    run_dir = (project.results / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {c["status"] for c in summary["comparisons"]} == {"diverged"}

    done = _harness(project, "bisect", "--upstream", f"{ids[0][:10]}..main", "--results-dir", str(project.results))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rec = json.loads((run_dir / "bisect.json").read_text())
    rows = {r["id"]: r for r in rec["rows"]}
    comparisons = [i for i in rows if i.startswith(f"{CPU} base-vs-fork tiny/")]
    expectations = [i for i in rows if i.startswith(f"{CPU} fork expectations: ")]
    assert len(comparisons) == 4 and expectations, list(rows)  # a comparison per prompt, the lost mapping
    for r in rows.values():
        assert r["outcome"] == "found", r
        assert (r["first_bad"]["sha"], r["first_bad"]["subject"]) == (ids[4], "upstream: read the weights and greet anew")
        assert r["first_bad"]["files"] == ["fake_completion.py", "fake_harness-engine.py"]
        assert r["last_good"] == 3 and r["at_last_good"].startswith("passes")
        # the verdict of the point's own run, in the run's words
        assert r["at_first_bad"].startswith("fails: ")
    assert rows[comparisons[0]]["at_first_bad"].startswith("fails: diverged")
    assert "fork expectations: weights: model weights in CPU" in rows[expectations[0]]["at_first_bad"]
    # the commit with upstream's own FORK.md: the series does not apply, nothing ran, neither good nor bad
    assert rec["upstream"]["not_applied"] == {ids[2]: "add-the-fork-s-notes.patch"}
    skipped = next(p for p in rows[comparisons[0]]["points"] if p["k"] == 2)
    assert (skipped["outcome"], skipped["run"]) == ("undecided", "")
    assert "the patch series does not apply at upstream" in skipped["text"]
    assert [p["k"] for p in rec["points"]] == [0, 1, 3, 4, 5]  # every point run once for all the rows
    points = [Path(p["run"]) for p in rec["points"]]
    assert all(json.loads((p / "run.json").read_text())["kind"] == "bisect" for p in points)
    assert not any(p.is_relative_to(project.results) for p in points)
    point_steps = json.loads((points[0] / "summary.json").read_text())["configurations"]
    assert {s["step"] for s in point_steps} >= {"build", "generate", "expectations"}  # the run's own stages
    assert f"first bad upstream commit {ids[4]}" in done.stdout
    assert f"the patch series does not apply at {ids[2][:12]} (add-the-fork-s-notes.patch)" in done.stdout
    md = (run_dir / "bisect.md").read_text()
    assert "git bisect skip" in md and f"`{ids[4]}`" in md

    # the one row --check names, again: every commit's builds are found up to date
    one = _harness(project, "bisect", "--upstream", f"{ids[0]}..{ids[-1]}", "--check", expectations[0], "--json",
                   "--results-dir", str(project.results))
    assert one.returncode == 0, one.stderr[-3000:]
    again = json.loads(one.stdout)
    assert [r["first_bad"]["sha"] for r in again["rows"]] == [ids[4]]
    assert again["builds_made"] == 0 and again["builds_reused"] >= 2 * len(again["points"])

    # a range whose GOOD is already bad: the row says so, and BAD is not run for it
    late = _harness(project, "bisect", "--upstream", f"{ids[4]}..{ids[-1]}", "--check", expectations[0], "--json",
                    "--results-dir", str(project.results))
    assert late.returncode == 1, late.stderr[-3000:]
    [row] = json.loads(late.stdout)["rows"]
    assert row["outcome"] == "not good at GOOD" and [p["k"] for p in row["points"]] == [0]
    assert row["at_last_good"].startswith("fails: ")
