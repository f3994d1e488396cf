"""Bisect of a run's failing rows (harness.bisect): the search, rows judged by the run's own verdict, and
whole bisections of the fake project (tests/fake_upstream.py) whose series ends in planted faults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import _git, make_fake_project
from test_readme_bisect import readme_bisect_command
from harness import cli
from harness.bisect.record import FOUND, BisectRecord, PointVerdict, RowBisect, markdown
from harness.bisect.rows import failing_targets, judge_at, pick
from harness.bisect.search import BAD, GOOD, UNDECIDED, search
from harness.record.records import ComparisonRecord, Failure, StepRecord
from harness.record.summary import RunSummary
from harness.stages.building.patches import export_series

ROOT = Path(__file__).resolve().parents[1]
CPU = "linux-x86_64-cpu"


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_search_finds_every_first_bad_position_judging_each_point_once(n):
    for first_bad in range(1, n + 1):
        outcomes = [GOOD] * first_bad + [BAD] * (n + 1 - first_bad)
        asked: list[int] = []
        found = search(lambda k: asked.append(k) or outcomes[k], 0, n)
        assert (found.last_good, found.first_bad, found.exact) == (first_bad - 1, first_bad, True)
        assert sorted(set(asked)) == sorted(asked) and {0, n}.isdisjoint(asked)  # the ends are the caller's
        assert len(asked) <= (n - 1).bit_length() + 1


def test_search_steps_around_undecided_points_and_ends_as_a_range_when_none_between_decides():
    outcome = {1: GOOD, 2: UNDECIDED, 3: UNDECIDED, 4: BAD, 5: BAD}
    found = search(outcome.__getitem__, 0, 6)
    assert (found.last_good, found.first_bad, found.exact) == (1, 4, False)
    outcome[3] = GOOD
    found = search(outcome.__getitem__, 0, 6)
    assert (found.last_good, found.first_bad, found.exact) == (3, 4, True)
    with pytest.raises(ValueError):
        search(lambda k: "maybe", 0, 3)
    with pytest.raises(ValueError):
        search(lambda k: GOOD, 2, 2)


@pytest.mark.parametrize("outcomes, expected", [
    # the series brings what the row checks (patch 3), patch 6 breaks it: searched from the point below the run
    ([BAD, BAD, BAD, GOOD, GOOD, GOOD, BAD], 6),
    ([BAD, BAD, GOOD, GOOD, BAD, BAD, BAD], 4),
    ([UNDECIDED, GOOD, GOOD, GOOD, GOOD, BAD, BAD], 5),
    # failing everywhere the probe looks: no point to search from
    ([BAD, BAD, BAD, BAD, BAD, BAD, BAD], None),
])
def test_a_row_that_fails_at_the_base_is_bisected_from_the_nearest_point_where_the_series_made_it_pass(
        outcomes, expected):
    from harness.bisect import last_good_in_series
    asked: list[int] = []

    def at(k: int) -> str:
        asked.append(k)
        return outcomes[k]

    n = len(outcomes) - 1
    good = last_good_in_series(at, n)
    if expected is None:
        assert good is None and asked == [5, 4, 2]  # n-1, n-2, n-4
        return
    assert good is not None and outcomes[good] == GOOD and asked[0] == n - 1
    assert search(lambda k: outcomes[k], good, n).first_bad == expected


# --------------------------------------------------------------------------- rows, judged as the run judged them


def _summary(steps=(), comparisons=()) -> RunSummary:
    return RunSummary("r", "failed", list(steps), list(comparisons))


def _control(status: str) -> ComparisonRecord:
    return ComparisonRecord(CPU, "numerics-control", "m", "p", "fork", "fork-ub-1", status, expected="diverged")


def test_numerics_control_is_judged_by_its_expect_so_diverged_is_never_bad():
    assert failing_targets(_summary(comparisons=[_control("diverged")])) == []
    [target] = failing_targets(_summary(comparisons=[_control("identical")]))
    assert target.id == f"{CPU} numerics-control m/p: fork-ub-1 vs fork"
    assert judge_at(target, _summary(comparisons=[_control("diverged")])).outcome == GOOD
    bad = judge_at(target, _summary(comparisons=[_control("identical")]))
    assert (bad.outcome, bad.text) == (BAD, "fails: identical; the group expects diverged")
    # at every point of a bisection (of the series or of upstream commits alike) where it diverges, it is good
    from harness.bisect.points import Point
    from harness.bisect.rows import Seen
    points = {k: Point(k, Path(f"/points/k{k}"), _summary(comparisons=[_control("diverged")]), 0, 0, 0.0)
              for k in range(5)}
    seen = Seen(target, points.__getitem__, lambda line: None)
    assert [seen.outcome(k) for k in range(5)] == [GOOD] * 5
    assert search(seen.outcome, 0, 5).last_good == 4  # a search never stops on it before the end


def test_each_expectation_of_a_failing_step_is_a_row_of_its_own():
    mapped = Failure("expectation", model="moe-small", status="mapped", message="223 MiB of private page copies")
    warn = Failure("expectation", model="moe-small", status="warnings", message="a warning")
    step = StepRecord(CPU, "fork", "expectations", "failed", detail="2 findings", failures=[mapped, warn])
    targets = failing_targets(_summary([step]))
    assert [t.id for t in targets] == [f"{CPU} fork expectations: mapped moe-small",
                                       f"{CPU} fork expectations: warnings moe-small"]
    assert pick(targets, f"{CPU} fork expectations") == targets
    with pytest.raises(LookupError, match="names no failing row"):
        pick(targets, "nothing")
    only_warn = StepRecord(CPU, "fork", "expectations", "failed", failures=[warn])
    assert judge_at(targets[0], _summary([only_warn])).outcome == GOOD
    here = judge_at(targets[0], _summary([step]))
    assert (here.outcome, here.text) == (BAD, "fails: fork expectations: mapped: 223 MiB of private page copies (and 1 "
                                              "more)")  # the run's own verdict, which names this expectation
    alone = judge_at(targets[1], _summary([step]))  # the verdict names the other one: the finding's own words
    assert (alone.outcome, alone.text) == (BAD, "fails: warnings: moe-small: a warning")
    passed = judge_at(targets[0], _summary([StepRecord(CPU, "fork", "expectations", "passed")]))
    assert passed.outcome == GOOD


def test_a_bisection_of_tests_of_upstream_s_suite_narrows_its_points_to_them_and_of_the_whole_step_does_not():
    from argparse import Namespace
    from harness.bisect.points import RunCommandLine, narrowed, narrowing
    from harness.bisect.rows import suite_tests
    tests = [Failure("upstream-test", message=f"{n}: Failed (passes on base)") for n in ("test-a", "test-b")]
    suite = StepRecord(CPU, "fork", "upstream-tests", "failed", failures=tests)
    gen = StepRecord(CPU, "fork", "generate", "failed", failures=[Failure("generation", model="m", prompt="p")])
    both = failing_targets(_summary([suite, gen]))
    assert suite_tests(both) == ["test-a", "test-b"]  # the generation's row is no test of the suite
    assert suite_tests(pick(both, f"{CPU} fork upstream-tests: test-b")) == ["test-b"]
    assert suite_tests(failing_targets(_summary([gen]))) == []
    blocked = StepRecord(CPU, "fork", "upstream-tests", "error", failures=[Failure("blocked", build="fork")])
    assert suite_tests(failing_targets(_summary([blocked]))) == []  # the step as a whole: the whole suite
    run = RunCommandLine(("build", "test"), Namespace(upstream_tests=True, upstream_test=[]))
    cut = narrowed(run, ["test-b"])
    assert cut.args.upstream_test == ["test-b"] and run.args.upstream_test == []  # the run's own left as it was
    assert narrowing(cut) == " (upstream's suite: only test-b, the tests bisected)" and narrowing(run) == ""
    without = RunCommandLine(("build", "test"), Namespace(upstream_tests=False, upstream_test=[]))
    assert narrowed(without, ["test-b"]) is without and narrowed(run, []) is run


def test_a_speed_rule_the_stage_could_not_measure_is_undecided_and_a_row_not_recorded_too():
    failed = StepRecord(CPU, "fork", "speed:base-vs-fork:tg", "failed", detail="tg: slowdown: 0.53x, p 0.004")
    [target] = failing_targets(_summary([failed]))
    error = StepRecord(CPU, "fork", "speed:base-vs-fork:tg", "error", detail="tg not measured: too few samples")
    assert judge_at(target, _summary([error])).outcome == UNDECIDED
    assert judge_at(target, _summary([])).outcome == UNDECIDED
    # the run's own verdict: its check and its measure
    assert judge_at(target, _summary([failed])).text == "fails: fork speed:base-vs-fork:tg: tg: slowdown: 0.53x, p 0.004"
    blocked = StepRecord(CPU, "fork", "expectations", "error", failures=[Failure("blocked", build="fork")])
    expectation = StepRecord(CPU, "fork", "expectations", "failed", detail="x")
    [row] = failing_targets(_summary([expectation]))
    assert judge_at(row, _summary([blocked])).outcome == UNDECIDED


def test_bisect_md_names_the_first_bad_patch_the_last_good_point_and_the_cost():
    from harness.bisect.record import PatchInfo
    row = RowBisect("cpu fork expectations: mapped m", FOUND, PatchInfo(3, "c.patch", "Map it", ("src/a.cpp",)), 2,
                    "fails: mapped: m: 223 MiB", "passes", [PointVerdict(2, GOOD, "passes", "/w/k2"),
                                                            PointVerdict(3, BAD, "fails: mapped: m: 223 MiB")],
                    1, 1, 12.5)
    text = markdown(BisectRecord("r1", ["a.patch", "b.patch", "c.patch"], [row]))
    assert "first bad patch 3 c.patch (Map it)" in text and "`src/a.cpp`" in text
    assert "last good: patches 1..2; verdict there: passes" in text
    assert "1 build(s) made, 1 reused, 12.5 s" in text


def _recorded(root: Path, status: str, argv: list[str]) -> Path:
    from harness.record.run import Run
    run = Run.open(root, None, argv=argv)
    run.record_step(StepRecord(CPU, "fork", "expectations", status, detail="x"))
    run.write_summary()
    run.close()
    return run.dir


def test_bisect_without_a_run_or_a_failing_row_or_a_stage_command_line_is_bad_input(tmp_path, capsys):
    assert cli.main(["bisect", "--results-dir", str(tmp_path)]) == 2
    assert "holds no runs" in capsys.readouterr().err
    passed = _recorded(tmp_path / "a", "passed", ["harness", "compare-outputs"])
    assert cli.main(["bisect", str(passed), "--results-dir", str(tmp_path / "a")]) == 2
    assert "has no failing row: nothing to bisect" in capsys.readouterr().err
    failed = _recorded(tmp_path / "b", "failed", ["harness", "report"])
    assert cli.main(["bisect", "--results-dir", str(tmp_path / "b"), "--check", "nothing"]) == 2
    assert f"names no failing row of the run (its failing rows: {CPU} fork expectations)" in capsys.readouterr().err
    assert cli.main(["bisect", str(failed), "--results-dir", str(tmp_path / "b")]) == 2
    assert "no stage command (build, test, compare-outputs) recorded" in capsys.readouterr().err


def test_a_point_runs_the_stages_and_options_the_run_was_started_with(tmp_path):
    from harness.bisect.points import command_line
    from harness.record.run import Run
    run = _recorded(tmp_path, "failed", ["/x/harness/__main__.py", "build", "--group", "base-vs-fork", "--no-bench"])
    again = Run.open(tmp_path, run.name, argv=["/x/harness/__main__.py", "compare-outputs", "--group", "base-vs-fork",
                                               "--no-bench", "--n-predict", "8"])
    again.close()
    line = command_line(run)
    assert line.stages == ("build", "compare-outputs")
    assert (line.args.group, line.args.n_predict, line.args.bench) == (["base-vs-fork"], 8, False)


# --------------------------------------------------------------------------- whole bisections of the fake project

#: Patches after the fake project's own one: a harmless one, then a generation that aborts on the prompt
#: "seven eight" (in the engine and llama-completion alike), then a fork whose vocabulary test of upstream's suite
#: fails.  Each is one commit of the fork's tree, exported as a real patch is.
PLANTS = [
    ("Add the fork's changelog", "Users asked what changed.", {"CHANGES.md": "the fork's changes\n"}),
    ("Abort a generation on the word seven", "A planted fault: llama-completion aborts on one prompt.", "abort"),
    ("Split the fork's vocabulary test", "A planted fault: the vocabulary test of upstream's suite fails.", "vocab"),
]


def _plant(repo: Path, how) -> None:
    if isinstance(how, dict):
        for name, text in how.items():
            (repo / name).write_text(text)
        return
    if how == "abort":
        for name in ("fake_completion.py", "fake_harness-engine.py"):
            text = (repo / name).read_text()
            text = text.replace("def generation_hooks(prompt, model):\n",
                                "def generation_hooks(prompt, model):\n    if 'seven' in prompt:\n"
                                "        os.abort()\n", 1)
            (repo / name).write_text(text)
        return
    text = (repo / "fake_test.py").read_text()
    (repo / "fake_test.py").write_text(text.replace('os.environ.get("FAKE_BREAK_FORK_VOCAB")', "True"))


def _series(project, upto: int, out: Path) -> Path:
    """The fake project's patch plus the first ``upto`` of :data:`PLANTS`, exported into ``out``."""
    repo = project.repo
    base = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    _git(repo, "checkout", "-q", "fork")
    _git(repo, "checkout", "-q", "-B", f"plants-{upto}")
    for subject, body, how in PLANTS[:upto]:
        _plant(repo, how)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"{subject}\n\n{body}")
    export_series(repo, base, out)
    _git(repo, "checkout", "-q", "main")
    return out


def _harness(project, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=ROOT, env=project.env(**env),
                          capture_output=True, text=True)


@pytest.mark.slow
def test_bisect_names_the_planted_patch_of_every_failing_row_in_the_run_s_own_words(tmp_path):
    project = make_fake_project(tmp_path)
    clean = _series(project, 1, tmp_path / "clean")
    argv = project.argv("build", "test", "compare-outputs", extra=("--upstream-tests",))
    at = argv.index("--patches-dir") + 1
    passed = subprocess.run([*argv[:at], str(clean), *argv[at + 1:]], cwd=ROOT, env=project.env(),
                            capture_output=True, text=True)
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]  # the series without the plants

    planted = _series(project, 3, tmp_path / "planted")
    failed = subprocess.run([*argv[:at], str(planted), *argv[at + 1:]], cwd=ROOT, env=project.env(),
                            capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    run_dir = (project.results / "latest").resolve()

    # the README's example as written, in the fake project's results directory
    done = _harness(project, "bisect", *readme_bisect_command()[4:], "--results-dir", str(project.results))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rec = json.loads((run_dir / "bisect.json").read_text())
    found = {r["id"]: r for r in rec["rows"]}
    abort = "abort-a-generation-on-the-word-seven.patch"
    vocab = "split-the-fork-s-vocabulary-test.patch"
    firsts = {i: r["first_bad"]["name"] for i, r in found.items()}
    assert firsts[f"{CPU} fork upstream-tests: test-fake-vocab"] == vocab
    crash_rows = [i for i in firsts if i != f"{CPU} fork upstream-tests: test-fake-vocab"]
    assert crash_rows and all(firsts[i] == abort for i in crash_rows), firsts
    assert any("tiny/three" in i for i in crash_rows)  # the generation that aborted, as a row of its own
    vocab_row = found[f"{CPU} fork upstream-tests: test-fake-vocab"]
    assert vocab_row["outcome"] == FOUND and vocab_row["last_good"] == 3
    # the run's own verdict text: the check and what the stage measured
    assert vocab_row["at_first_bad"] == "fails: fork upstream-tests: test-fake-vocab: Failed (passes on base)"
    assert vocab_row["first_bad"]["files"] == ["fake_test.py"]
    # each point built and ran the one test of upstream's suite it bisects, on base and fork, and says so
    assert vocab_row["at_last_good"].startswith("passes — only test-fake-vocab (--upstream-test): 1 pass on both")
    assert "(upstream's suite: only test-fake-vocab, the tests bisected)" in done.stdout
    for p in vocab_row["points"][:-1]:
        pairs = json.loads((Path(p["run"]) / CPU / "upstream-tests" / "pairs.json").read_text())["pairs"]
        assert [t["name"] for t in pairs] == ["test-fake-vocab"], pairs
    # the run's own verdict at its own point is the text of the first bad point when that is the whole series
    assert vocab_row["points"][-1]["run"] == ""
    assert rec["builds_made"] >= 1 and rec["seconds"] > 0 and len(rec["points"]) <= 3
    points = [Path(p["run"]) for p in rec["points"]]
    assert all(json.loads((p / "run.json").read_text())["kind"] == "bisect" for p in points)
    assert not any(p.is_relative_to(project.results) for p in points)  # never a run of the fork's results
    assert f"first bad patch 4 {vocab}" in done.stdout
    md = (run_dir / "bisect.md").read_text()
    assert "## " + f"{CPU} fork upstream-tests: test-fake-vocab" in md
    assert 'href="bisect.md"' in (run_dir / "report.html").read_text()

    one = _harness(project, "bisect", run_dir.name, "--results-dir", str(project.results), "--check",
                   f"{CPU} fork upstream-tests: test-fake-vocab", "--json")
    assert one.returncode == 0, one.stderr[-3000:]
    assert [r["first_bad"]["position"] for r in json.loads(one.stdout)["rows"]] == [4]
