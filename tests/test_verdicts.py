"""One verdict per row (harness.record.verdict), rendered everywhere: a failing step or comparison is marked
failed and named in the headline of summary.md and report.html, an expected divergence is not red, and the
console and ``--json`` say a verdict only where it is known.

Failing runs of each kind are built as the stages record them (a regression, a failed expectation, a failed
speed rule, an identity where the group expects a divergence, a crash) beside passing rows; the committed run
results/evidence/kl-gpu1-20261204T072134Z (one identity where its numerics control expects a divergence,
seven expected divergences) is rendered again with ``report``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import cli
from harness.views.run_views import annotate_failures, verdict_json, verdict_line
from harness.common.console import Console
from harness.matrix.config import load_matrix
from harness.record.records import ComparisonRecord, Failure, StepRecord
from harness.record.run import Run
from harness.common.statuses import CRASHED, DIVERGED, IDENTICAL, UNSUPPORTED_UPSTREAM
from harness.record.verdict import (FAILS, NOT_RUN, PASSES, comparison_verdict, failing_names, judge,
                                    step_verdict)

ROOT = Path(__file__).resolve().parent.parent
KL_RUN = ROOT / "results" / "evidence" / "kl-gpu1-20261204T072134Z"
CHROMIUM = Path("/usr/bin/chromium")
CPU, CUDA = "linux-x86_64-cpu", "linux-x86_64-cuda"
DIV = {"index": 4, "near_tie": False, "reference": {"id": 1, "piece": " fisherman"},
       "candidate": {"id": 2, "piece": " woman"}}
NEAR_TIE = {**DIV, "near_tie": True}
KL = {"positions": 32, "mean": 2e-5, "max": 1e-3, "max_at": 4, "top1_agreement": 0.97}


def _cmp(group: str, prompt: str, candidate: str, status: str, expected: str = IDENTICAL, **kw) -> ComparisonRecord:
    return ComparisonRecord(CUDA, group, "moe-large", prompt, "fork", candidate, status,
                            DIV if status == DIVERGED else None, kw.pop("detail", status), expected=expected, **kw)


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("status, expected, extra, verdict, why", [
    (IDENTICAL, IDENTICAL, {}, PASSES, ""),
    (DIVERGED, IDENTICAL, {}, FAILS, "diverged; the group expects identical"),
    (CRASHED, IDENTICAL, {}, FAILS, "crashed; the group expects identical"),
    (DIVERGED, DIVERGED, {}, PASSES, "diverged, as the group expects"),
    (IDENTICAL, DIVERGED, {}, FAILS, "identical; the group expects diverged"),
    (DIVERGED, "near-tie", {"first_divergence": NEAR_TIE, "kl": KL, "kl_mean_max": 1e-4}, PASSES,
     "diverged at a near tie, as the group allows"),
    (DIVERGED, "near-tie", {"kl": KL, "kl_mean_max": 1e-4}, FAILS,
     "diverged (a hard divergence); the group accepts only a near tie"),
    (DIVERGED, "near-tie", {"first_divergence": NEAR_TIE, "kl": KL, "kl_mean_max": 1e-6}, FAILS,
     "diverged (KL mean 2e-05 > 1e-06 nats); the group accepts only a near tie"),
    (DIVERGED, "informational", {}, PASSES, "diverged; the group records divergences without judging them"),
    (CRASHED, "informational", {}, FAILS, "crashed; the group records divergences, and fails on a crashed"),
    (UNSUPPORTED_UPSTREAM, IDENTICAL, {}, NOT_RUN, None),
])
def test_a_comparison_is_judged_against_its_groups_expect(status, expected, extra, verdict, why):
    c = _cmp("g", "story", "fork-x", status, expected, **{k: v for k, v in extra.items() if k != "first_divergence"})
    if "first_divergence" in extra:
        c.first_divergence = extra["first_divergence"]
    v = comparison_verdict(c)
    assert v.verdict == verdict and (why is None or v.why == why)
    assert c.failed() == (verdict == FAILS)  # the run's verdict asks the same rule


@pytest.mark.parametrize("status, verdict", [("passed", PASSES), ("failed", FAILS), ("error", FAILS),
                                             ("skipped", NOT_RUN), ("interrupted", NOT_RUN),
                                             ("incomplete", NOT_RUN)])
def test_a_step_is_judged_by_its_statuss_declared_outcome(status, verdict):
    assert step_verdict(StepRecord(CPU, "fork", "build", status)).verdict == verdict


def test_a_headline_names_the_first_three_failures_then_counts_the_rest():
    steps = [StepRecord(CPU, f"c{i}", "generate", "failed") for i in range(5)]
    text = failing_names(judge(steps, []))
    assert text == (f"{CPU} c0 generate: failed; {CPU} c1 generate: failed; {CPU} c2 generate: failed "
                    "and 2 more")
    assert failing_names(judge([StepRecord(CPU, "fork", "build", "passed")], [])) == ""


# --------------------------------------------------------------------------- failing runs of each kind


@dataclass(frozen=True)
class Kind:
    """A failing run of one kind: what its headline must name, in that order (``failing``), and the why of each
    failing row, in the order of the tables (steps, then comparisons)."""

    name: str
    failing: tuple[str, ...]
    whys: tuple[str, ...]


def _passing_rows(run: Run) -> None:
    """What every run holds beside its failure: passed builds and generations, an identical comparison and a
    numerics control's expected divergence (must not be red)."""
    run.record_step(StepRecord(CPU, "base", "build", "passed", 10.0, "built in 10 s"))
    run.record_step(StepRecord(CUDA, "fork", "build", "passed", 12.0, "built in 12 s"))
    run.record_step(StepRecord(CUDA, "fork", "generate", "passed", 3.0, "all generations ran"))
    run.record_comparisons([_cmp("cuda-base-vs-fork", "code", "fork-pin", IDENTICAL),
                            _cmp("cuda-numerics-control", "story", "fork-ub-1", DIVERGED, DIVERGED)])


def _regression(run: Run) -> None:
    run.record_comparisons([_cmp("cuda-base-vs-fork", "story", "fork-pin", DIVERGED)])


def _expectation(run: Run) -> None:
    run.record_step(StepRecord(CUDA, "fork-pin", "expectations", "failed", 0.0,
                               "placement: moe-large: expert tensors in CPU, expected CUDA_Host",
                               failures=[Failure("expectation", model="moe-large", status="placement",
                                                 message="expert tensors in CPU, expected CUDA_Host")]))


def _speed_rule(run: Run) -> None:
    run.record_step(StepRecord(CUDA, "fork-pin", "speed:cuda-base-vs-fork:pp", "failed", 40.0,
                               "pp 812.0 vs 1020.5 tok/s (medians of 5 and 5): 0.80x, fails below 0.909x",
                               failures=[Failure("speed", model="moe-large", message="0.80x, p 0.004")]))


def _identity(run: Run) -> None:
    run.record_comparisons([_cmp("cuda-numerics-control", "long-prefill", "fork-fa-off", IDENTICAL, DIVERGED)])


def _crash(run: Run) -> None:
    run.record_step(StepRecord(CUDA, "fork-pin", "generate", "failed", 2.0, "moe-large/story: crashed SIGSEGV",
                               failures=[Failure("generation", model="moe-large", prompt="story", status=CRASHED,
                                                 signal="SIGSEGV", program="llama-completion")]))
    run.record_comparisons([_cmp("cuda-pin-limits", "story", "fork-pin", CRASHED,
                                 detail="candidate crashed: SIGSEGV")])


KINDS = {
    "regression": (_regression, Kind("regression", (f"{CUDA} cuda-base-vs-fork moe-large/story: fork-pin vs fork "
                                                    "(diverged; the group expects identical)",),
                                     ("diverged; the group expects identical",))),
    "expectation": (_expectation, Kind("expectation", (
        f"{CUDA} fork-pin expectations: placement: expert tensors in CPU, expected CUDA_Host",),
        ("fork-pin expectations: placement: expert tensors in CPU, expected CUDA_Host",))),
    "speed rule": (_speed_rule, Kind("speed rule", (f"{CUDA} fork-pin speed:cuda-base-vs-fork:pp: 0.80x, p 0.004",),
                                     ("fork-pin speed:cuda-base-vs-fork:pp: 0.80x, p 0.004",))),
    "identity": (_identity, Kind("identity", (f"{CUDA} cuda-numerics-control moe-large/long-prefill: fork-fa-off vs "
                                              "fork (identical; the group expects diverged)",),
                                 ("identical; the group expects diverged",))),
    "crash": (_crash, Kind("crash", (f"{CUDA} cuda-pin-limits moe-large/story: fork-pin vs fork "
                                     "(crashed; the group expects identical)",
                                     f"{CUDA} fork-pin generate: llama-completion SIGSEGV on story"),
                           ("fork-pin generate: llama-completion SIGSEGV on story",
                            "crashed; the group expects identical"))),
}


def _failing_run(root: Path, kind: str) -> tuple[Path, Kind]:
    """A run of ``kind`` rendered with ``report`` (report.html and summary.md); (its directory, what its headline
    and failing rows must say)."""
    build, expect = KINDS[kind]
    run = Run.open(root, f"r-{kind.replace(' ', '-')}")
    _passing_rows(run)
    build(run)
    run.close()
    assert cli.main(["report", str(run.dir), "--results-dir", str(root), "--against", "none"]) == 0
    return run.dir, expect


def _kl_run(tmp_path: Path) -> tuple[Path, Kind]:
    """The committed kl-gpu1 run, copied and rendered again with ``report``."""
    run_dir = tmp_path / "results" / KL_RUN.name
    shutil.copytree(KL_RUN, run_dir)
    assert cli.main(["report", str(run_dir), "--results-dir", str(tmp_path / "results"), "--against", "none"]) == 0
    return run_dir, Kind("kl-gpu1", (f"{CUDA} cuda-numerics-control moe-large/story: fork-fa-off vs fork "
                                     "(identical; the group expects diverged)",), ("identical; the group expects diverged",))


RUNS = [*KINDS, "kl-gpu1"]


def _render(tmp_path: Path, which: str) -> tuple[Path, Kind]:
    return _kl_run(tmp_path) if which == "kl-gpu1" else _failing_run(tmp_path / "results", which)


def _tables(md: str) -> dict[str, list[str]]:
    """The body rows of summary.md's steps and comparisons tables, by section."""
    tables: dict[str, list[str]] = {}
    section = ""
    for line in md.splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif section in ("Steps", "Greedy comparisons") and line.startswith("| ") and "---" not in line \
                and not line.startswith("| platform |"):
            tables.setdefault(section, []).append(line)
    return tables


@pytest.mark.parametrize("which", RUNS)
def test_summary_md_names_the_failure_in_its_headline_and_marks_only_it_failed(tmp_path, which):
    run_dir, kind = _render(tmp_path, which)
    md = (run_dir / "summary.md").read_text(encoding="utf-8")
    headline = md.splitlines()[0]
    assert headline.startswith(f"# Run {run_dir.name}: ❌ failed: ")
    assert headline.endswith("; ".join(kind.failing))  # in that order: a crashed comparison before its steps
    tables = _tables(md)
    failing_rows = [r for rows in tables.values() for r in rows if "❌ fails" in r]
    assert len(failing_rows) == len(kind.whys)
    for why, row in zip(kind.whys, failing_rows):
        assert why in row
    for rows in tables.values():
        for row in rows:  # no passing row is red
            if "❌ fails" not in row:
                assert "❌" not in row and "💥" not in row, row
        if any(r in rows for r in failing_rows):  # failures first
            assert "❌ fails" in rows[0]


class _Rows(HTMLParser):
    """The rows of report.html's steps and comparisons tables: their class, data-verdict, text and the
    classes of the status badges in them, with the colours the test's script wrote (data-color)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.headline = ""
        self._table = ""
        self._row: dict | None = None
        self._in_headline = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("class") or ""
        elif tag == "tr" and self._table in ("steps", "comparisons") and "data-verdict" in a:
            self._row = {"table": self._table, "class": a.get("class"), "verdict": a.get("data-verdict"),
                         "background": a.get("data-background"), "text": "", "badges": []}
            self.rows.append(self._row)
        elif tag == "span" and self._row is not None and "st" in (a.get("class") or "").split():
            self._row["badges"].append((a.get("class"), a.get("data-color")))
        elif tag == "p" and a.get("id") == "headline":
            self._in_headline = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = ""
        elif tag == "p":
            self._in_headline = False

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            self._row["text"] += data
        if self._in_headline:
            self.headline += data


#: Appended to a copy of the report: writes each row's computed background and each badge's computed colour
#: into the DOM, which Chromium dumps.
_PROBE = """<script>
for (const tr of document.querySelectorAll('tr[data-verdict]')) {
  tr.dataset.background = getComputedStyle(tr.querySelector('td')).backgroundColor;
  for (const s of tr.querySelectorAll('span.st')) s.dataset.color = getComputedStyle(s).color;
}
</script>"""

#: The page's red (--bad, #cf222e) and the failing rows' tint (#fff5f5) as Chromium computes them.
RED, RED_TINT = "rgb(207, 34, 46)", "rgb(255, 245, 245)"


def _dom(tmp_path: Path, report: Path) -> _Rows:
    """report.html as headless Chromium renders it: its DOM after the page's scripts (and the probe) ran."""
    page = tmp_path / "probe.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert "data-background" in proc.stdout, proc.stderr[-2000:]
    parsed = _Rows()
    parsed.feed(proc.stdout)
    return parsed


@pytest.mark.slow  # one headless Chromium per run: about 20 s each on the 2-core development machine
@pytest.mark.debian
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
@pytest.mark.parametrize("which", RUNS)
def test_report_html_in_chromium_names_the_failure_and_draws_no_passing_row_red(tmp_path, which):
    run_dir, kind = _render(tmp_path, which)
    dom = _dom(tmp_path, run_dir / "report.html")
    assert "; ".join(kind.failing) in " ".join(dom.headline.split())
    failed = [r for r in dom.rows if r["verdict"] == FAILS]
    assert len(failed) == len(kind.whys)
    for why, row in zip(kind.whys, failed):
        assert row["class"] == "bad" and row["background"] == RED_TINT
        assert any(color == RED for _, color in row["badges"])
        assert why in " ".join(row["text"].split())
        assert next(r for r in dom.rows if r["table"] == row["table"])["verdict"] == FAILS  # failures first
    for r in dom.rows:
        if r["verdict"] != FAILS:  # no passing row is red: neither its background nor a badge in it
            assert r["background"] != RED_TINT and all(color != RED for _, color in r["badges"]), r
    if which in ("identity", "kl-gpu1"):  # the expected divergences drawn as passes, not red
        expected = [r for r in dom.rows if r["table"] == "comparisons" and "as the group expects" in r["text"]]
        assert expected and all(r["verdict"] == PASSES for r in expected)


# --------------------------------------------------------------------------- console and --json


def _run_after(tmp_path: Path, commands: list[str], status: str = "passed") -> Run:
    run = Run.open(tmp_path / "results", "r1")
    for command in commands:
        run.begin(command, [], "t")
        run.record_step(StepRecord(CPU, "fork", command, status))
        run.end()
    return run


def test_after_build_alone_the_console_names_what_was_asked_and_what_was_not(tmp_path):
    run = _run_after(tmp_path, ["build"])
    line = verdict_line(run, run.dir / "report.html", cli.STAGES)
    assert "— passed: build, as asked; not asked: test, compare-outputs (report:" in line
    assert "so far" not in line and "not run yet" not in line
    data = verdict_json(run, run.dir / "report.html", cli.STAGES)
    assert (data["verdict"], data["final"], data["not_run_yet"]) == ("passed", False, ["test", "compare-outputs"])


def test_after_build_test_the_console_reads_as_a_finished_run_of_what_was_asked(tmp_path):
    """``build test`` ended: the line says what ran as asked, not that compare-outputs is pending."""
    run = _run_after(tmp_path, ["build", "test"])
    line = verdict_line(run, run.dir / "report.html", cli.STAGES)
    assert "— passed: build and test, as asked; not asked: compare-outputs (report:" in line
    assert "so far" not in line and "not run yet" not in line
    assert verdict_json(run, run.dir / "report.html", cli.STAGES)["not_run_yet"] == ["compare-outputs"]


def test_compare_outputs_alone_builds_what_it_needs_and_leaves_only_the_tests_not_run(tmp_path):
    run = _run_after(tmp_path, ["compare-outputs"])
    assert verdict_json(run, run.dir / "report.html", cli.STAGES)["not_run_yet"] == ["test"]


def test_github_annotations_name_each_failing_comparison_and_the_run(tmp_path):
    run = Run.open(tmp_path / "results", "r1")
    _passing_rows(run)
    _identity(run)
    out = io.StringIO()
    annotate_failures(run, Console(out, interactive=False, github=True))
    assert out.getvalue().splitlines() == [
        f"::error title={CUDA} cuda-numerics-control moe-large/long-prefill%3A fork-fa-off vs fork::identical; "
        "the group expects diverged",
        f"::error title=run r1%3A failed::failed: {CUDA} cuda-numerics-control moe-large/long-prefill: fork-fa-off "
        "vs fork (identical; the group expects diverged)"]


def test_after_every_stage_command_the_verdict_is_final(tmp_path):
    run = _run_after(tmp_path, ["build", "test", "compare-outputs"])
    assert re.search(r"— passed \(report: ", verdict_line(run, run.dir / "report.html", cli.STAGES))
    assert verdict_json(run, run.dir / "report.html", cli.STAGES)["final"] is True


def test_a_failure_is_final_and_named_after_build_alone(tmp_path):
    run = _run_after(tmp_path, ["build"], "failed")
    line = verdict_line(run, run.dir / "report.html", cli.STAGES)
    assert "so far" not in line and f"— failed: {CPU} fork build: failed (report:" in line
    data = verdict_json(run, run.dir / "report.html", cli.STAGES)
    assert data["final"] is True and data["exit_code"] == 1 and data["run_dir"] == str(run.dir)
    assert [r["name"] for r in data["failing_steps"]] == [f"{CPU} fork build"]
    assert data["failing_steps"][0]["why"] == "fork build: failed" and data["failing_comparisons"] == []


def test_json_on_a_stage_command_is_the_only_thing_on_stdout(tmp_path, monkeypatch, capfd):
    """``build --json``: the JSON object alone on stdout (the loop's lines on stderr), the verdict and what
    failed in it; the loop itself is replaced by one that records a failed build as the build stage would."""
    from harness import pipeline

    def fake_loop(matrix, run, opts, stages, say=None, **kw):
        run.begin(" ".join(stages), [], "t")
        print("[linux-x86_64-cpu] build fork: failed — a line of the console", flush=True)
        run.record_step(StepRecord(CPU, "fork", "build", "failed", 1.0, "build failed: x.cpp:1: error: y"))
        run.end()
        run.write_summary()
        return 1

    monkeypatch.setattr(pipeline, "run_stages", fake_loop)
    rc = cli.main(["build", "--platform", CPU, "--results-dir", str(tmp_path / "results"),
                   "--work-dir", str(tmp_path / "work"), "--json"])
    out, err = capfd.readouterr()
    assert rc == 1
    data = json.loads(out)
    assert data["verdict"] == "failed" and data["final"] is True
    assert [r["name"] for r in data["failing_steps"]] == [f"{CPU} fork build"]
    assert Path(data["run_dir"]).is_dir() and "a line of the console" in err


def test_the_shell_completes_commands_and_options_through_argcomplete(tmp_path):
    """What bash asks of ``eval "$(register-python-argcomplete llama-fork-harness)"``, asked here directly."""
    out = tmp_path / "completions"

    def complete(line: str) -> set[str]:
        env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line,
               "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
        done = subprocess.run([sys.executable, "-m", "harness"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return set(out.read_text().split())

    assert {"compare-outputs", "compile"} & complete("llama-fork-harness comp") == {"compare-outputs"}
    assert "--json" in complete("llama-fork-harness build --js")
    # --platform, --group and --model complete the matrix's names, not file names (argcomplete's default)
    matrix = load_matrix(ROOT / "matrix.yaml")
    assert complete("llama-fork-harness build --platform ") == set(matrix.platforms)
    assert complete("llama-fork-harness test --platform linux-x86_64-c") == \
        {p for p in matrix.platforms if p.startswith("linux-x86_64-c")}
    assert complete("llama-fork-harness compare-outputs --group cuda-pin-r") == {"cuda-pin-routes"}
    assert complete("llama-fork-harness compare-outputs --model moe-l") == {"moe-large"}
    assert complete("llama-fork-harness build --platform linux-x86_64-cpu,linux-x86_64-cu") == \
        {"linux-x86_64-cpu,linux-x86_64-cuda"}
    other = tmp_path / "other.yaml"
    other.write_text((ROOT / "matrix.yaml").read_text(encoding="utf-8").replace("cuda-pin-routes", "cuda-pin-roads"),
                     encoding="utf-8")
    assert complete(f"llama-fork-harness compare-outputs --matrix {other} --group cuda-pin-r") == {"cuda-pin-roads"}
