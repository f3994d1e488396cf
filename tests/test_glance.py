"""The fork at a glance (harness.record.glance): the first panel of report.html and summary.md, per platform each
measure of the fork's purpose with its rule and the verdict recorded for it, then what did not run and why.

Rendered from committed H200 runs (results/evidence/: gpu1-20261204T073536Z passed; gpu1-20261205T030752Z was
interrupted in racecheck) and from runs of the fake project with a planted fault (tests/fake_upstream.py: a crash
of the fork on one prompt; a probe that finds the mapped weights in anonymous memory), in Python and in headless
Chromium, whose DOM is read for the panel, the step that did not finish and the colours of the verdicts.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.views import report
from harness.record.glance import (EXPERTS, FORK_VS_UPSTREAM, MAPPING, MEASURES, PAGE_LOCKED, PINNED_PREFILL,
                                   SANITIZER, UPSTREAM_SUITE, build_glance)
from harness.record.layout import RunLayout
from harness.record.summary import read_run
from harness.record.verdict import FAILS, NOT_RUN, PASSES

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "results" / "evidence"
PASSING_CUDA = "gpu1-20261204T073536Z"
INCOMPLETE_CUDA = "gpu1-20261205T030752Z"
PAGEABLE_PLANT = "plant-cuda-host-buffers-pageable-20261202T144114Z"
CHROMIUM = Path("/usr/bin/chromium")
CUDA = "linux-x86_64-cuda"


def _copy(tmp_path: Path, name: str) -> Path:
    """A copy of a committed run (report rewrites its views; the committed files stay as they are)."""
    return Path(shutil.copytree(EVIDENCE / name, tmp_path / "results" / name))


def _glance(run_dir: Path):
    data = read_run(run_dir)
    return build_glance(RunLayout(run_dir), data.steps, data.skipped_platforms, data.incomplete)


def _rows(run_dir: Path, platform: str = CUDA) -> dict[str, list]:
    g = _glance(run_dir)
    rows = next(p.rows for p in g.platforms if p.platform == platform)
    return {m: [r for r in rows if r.measure == m] for m in MEASURES}


def test_the_passing_h100_run_shows_each_purpose_measure_with_its_rule_and_verdict():
    rows = _rows(EVIDENCE / PASSING_CUDA)
    pinned = {r.subject: r for r in rows[PINNED_PREFILL]}
    top = pinned["pp: cuda-pin-all vs cuda-nopin (moe-large)"]
    assert top.verdict.verdict == PASSES and top.value.startswith("4.") and "fails below 3x" in top.rule
    modes = {r.subject.split(" (")[0] for r in rows[FORK_VS_UPSTREAM]}
    assert {"pp: fork vs base", "tg: fork vs base", "pp: cuda-pin-all vs cuda-base-host-experts",
            "tg: cuda-pin-all vs cuda-base-host-experts"} <= modes
    experts = {r.subject: r for r in rows[EXPERTS]}
    assert experts["cuda-pin-layers-2 (moe-large)"].value == "CUDA_Host: 0-1; CPU: 2-7"
    assert experts["cuda-pin-layers-2 (moe-large)"].rule == "layers 0-1: CUDA_Host; 2-: CPU"
    locked = {r.subject: r for r in rows[PAGE_LOCKED]}["cuda-pin-all (moe-large)"]
    assert locked.value.startswith("driver 4.") and "claimed 4." in locked.value
    assert [r.verdict.text() for r in rows[SANITIZER] + rows[UPSTREAM_SUITE]] == [  # not run, never a blank
        "not run: no step ran under a GPU kind's sanitizer (--sanitize, GPU platforms only)",
        "not run: upstream's suite was not asked for (--upstream-tests)"]
    assert all(r.verdict.verdict == PASSES for m in MEASURES[:5] for r in rows[m])


def test_a_planted_fault_fails_its_rows_first_and_the_measures_not_run_say_why():
    """The plant that leaves the fork's host buffers pageable: the probe finds the experts in CPU buffers and
    nothing page-locked; the panel shows the failures the expectations step recorded, first."""
    g = _glance(EVIDENCE / PAGEABLE_PLANT)
    (cuda,) = g.platforms
    failing = [r for r in cuda.rows if r.verdict.fails]
    assert failing and cuda.rows[:len(failing)] == failing
    assert {(r.measure, r.subject) for r in failing} >= {(EXPERTS, "cuda-pin-all (moe-large)"),
                                                         (PAGE_LOCKED, "cuda-pin-all (moe-large)")}
    assert "expected CUDA_Host" in next(r for r in failing if r.measure == EXPERTS).verdict.why
    speed = [r for r in cuda.rows if r.measure == PINNED_PREFILL]
    assert [r.verdict.verdict for r in speed] == [NOT_RUN] and "--no-bench" in speed[0].verdict.why


def test_an_interrupted_step_is_named_with_its_cause_in_the_headline_and_the_panel(tmp_path):
    run_dir = _copy(tmp_path, INCOMPLETE_CUDA)
    g = _glance(run_dir)
    unfinished = g.unfinished()
    assert unfinished[0].what == "linux-x86_64-cuda cuda-pin-layers-half generate-racecheck"
    assert "interrupted by SIGINT" in unfinished[0].why
    assert g.not_run[:len(unfinished)] == unfinished  # the unfinished first
    sanitizers = {r.subject: r for r in _rows(run_dir)[SANITIZER]}
    assert sanitizers["memcheck"].verdict.verdict == PASSES and "6 step(s): 6 passes" in sanitizers["memcheck"].value
    racecheck = sanitizers["racecheck"]
    assert racecheck.verdict.verdict == NOT_RUN and "cuda-pin-layers-half generate-racecheck" in racecheck.value
    html = report.render_html(run_dir, None)
    headline = html[html.index('id="headline"'):html.index("</p>", html.index('id="headline"'))]
    assert "Did not finish" in headline and "generate-racecheck" in headline and "SIGINT" in headline
    assert "No step or comparison fails." not in html
    assert html.index('id="glance"') < html.index('id="steps"')
    report.write_report(run_dir, baseline=None)
    from harness.record.summary import write_summary_md
    md = write_summary_md(run_dir).read_text(encoding="utf-8")
    assert md.index("## The fork at a glance") < md.index("## Steps")
    assert "**did not finish**: linux-x86_64-cuda cuda-pin-layers-half generate-racecheck" in md


def _fake_run(tmp_path: Path, **env: str) -> Path:
    """A run of the fake project (build, compare-outputs) with ``env``; its directory."""
    project = make_fake_project(tmp_path / "fake")
    proc = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT, env=project.env(**env),
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (project.results / "latest").resolve()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_crash_of_the_fork_on_one_prompt_leaves_the_other_prompts_judged(tmp_path):
    run_dir = _fake_run(tmp_path, FAKE_FORK_CRASH_WORD="four")
    data = read_run(run_dir)
    crashed = [c for c in data.comparisons if c.status == "crashed"]
    assert len(crashed) == 1 and crashed[0].kl is None  # a crash is a crash: no KL, no agreement
    assert {c.status for c in data.comparisons if c is not crashed[0]} == {"identical"}
    fork = next(s for s in data.steps if s.config == "fork" and s.step == "expectations")
    assert fork.status == "passed" and "in 4 load(s)" in fork.detail  # the crashed prompt's load left out
    md = (run_dir / "summary.md").read_text(encoding="utf-8")
    row = next(line for line in md.splitlines() if "| crashed |" in line)
    assert row.endswith("| – | – |")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_mapping_served_from_anonymous_memory_fails_the_panels_mapping_row(tmp_path):
    run_dir = _fake_run(tmp_path, FAKE_PROBE_ANON="1")
    rows = _rows(run_dir, "linux-x86_64-cpu")
    assert [r.verdict.verdict for r in rows[MAPPING]] == [FAILS, FAILS]
    assert all("not backed by the model file" in r.verdict.why for r in rows[MAPPING])
    assert all(r.verdict.verdict == PASSES for r in rows[EXPERTS])


# --------------------------------------------------------------------------- in headless Chromium


class _Panel(HTMLParser):
    """What the DOM holds of the panel: the ids of the sections in order, the headline's text and class, each
    glance row's measure, verdict and its badge's computed colour (written by :data:`_PROBE`), and the items of
    the did-not-run list."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.headline, self.headline_color = "", ""
        self.rows: list[dict] = []
        self.not_run: list[str] = []
        self._in: str = ""
        self._row: dict | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and a.get("id"):
            self.sections.append(a["id"] or "")
        elif tag == "p" and a.get("id") == "headline":
            self._in, self.headline_color = "headline", a.get("data-color") or ""
        elif tag == "tr" and "glance-row" in (a.get("class") or ""):
            self._row = {"measure": a.get("data-measure"), "verdict": a.get("data-verdict"), "color": "", "text": ""}
            self.rows.append(self._row)
        elif tag == "span" and self._row is not None and "row-verdict" in (a.get("class") or ""):
            self._row["color"] = a.get("data-color") or ""
        elif tag == "li" and a.get("class") in ("unfinished", "not-run"):
            self._in = "li"
            self.not_run.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag in ("p", "li"):
            self._in = ""

    def handle_data(self, data: str) -> None:
        if self._in == "headline":
            self.headline += data
        elif self._in == "li":
            self.not_run[-1] += data
        if self._row is not None:
            self._row["text"] += data


_PROBE = """<script>
for (const s of document.querySelectorAll('#glance span.row-verdict, #headline'))
  s.dataset.color = getComputedStyle(s).color;
</script>"""

#: The page's colours as Chromium computes them: --bad, --ok, --skip, --warn.
RED, GREEN, GREY, AMBER = "rgb(207, 34, 46)", "rgb(26, 127, 55)", "rgb(110, 119, 129)", "rgb(154, 103, 0)"
COLOR = {FAILS: RED, PASSES: GREEN, NOT_RUN: GREY}


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", *args, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)


def _dom(tmp_path: Path, run_dir: Path) -> _Panel:
    """report.html of ``run_dir``, written again by ``report``, as headless Chromium renders it."""
    assert report.main([str(run_dir), "--against", "none"]) == 0
    page = tmp_path / "probe.html"
    page.write_text((run_dir / "report.html").read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                    encoding="utf-8")
    proc = _chromium(tmp_path, page, "--dump-dom")
    assert 'id="glance"' in proc.stdout, proc.stderr[-2000:]
    parsed = _Panel()
    parsed.feed(proc.stdout)
    return parsed


def _run(tmp_path: Path, which: str) -> Path:
    if which == "incomplete":
        return _copy(tmp_path, INCOMPLETE_CUDA)
    if which == "passing":
        return _copy(tmp_path, PASSING_CUDA)
    if which == "crash":
        return _fake_run(tmp_path, FAKE_FORK_CRASH_WORD="four")
    return _fake_run(tmp_path, FAKE_PROBE_ANON="1")


@pytest.mark.slow  # one fake project and one headless Chromium each: about 20 s on the 2-core development machine
@pytest.mark.debian
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
@pytest.mark.parametrize("which", ["incomplete", "crash", "mapped", "passing"])
def test_the_panel_in_chromium_comes_first_names_what_did_not_finish_and_colours_each_verdict(tmp_path, which):
    run_dir = _run(tmp_path, which)
    dom = _dom(tmp_path, run_dir)
    assert dom.sections[0] == "glance"  # first, before the changes, the steps and the comparisons
    assert dom.rows and {r["measure"] for r in dom.rows} == set(MEASURES)
    for r in dom.rows:  # each verdict in its colour: red only where the row fails
        assert r["color"] == COLOR[r["verdict"]], r
    failing = [r for r in dom.rows if r["verdict"] == FAILS]
    assert dom.rows[:len(failing)] == failing
    headline = " ".join(dom.headline.split())
    if which == "incomplete":
        assert headline.startswith("Did not finish: linux-x86_64-cuda cuda-pin-layers-half generate-racecheck")
        assert "interrupted by SIGINT" in headline and dom.headline_color == AMBER
        assert dom.not_run[0].startswith("linux-x86_64-cuda cuda-pin-layers-half generate-racecheck did not finish")
        assert not failing
    elif which == "crash":
        assert "crashed; the group expects identical" in headline and not failing  # the fork's loads all pass
        assert any(r["measure"] == EXPERTS and r["verdict"] == PASSES and "fork" in r["text"] for r in dom.rows)
    elif which == "mapped":
        assert {r["measure"] for r in failing} == {MAPPING} and len(failing) == 2
        assert "expectations: mapped: " in headline  # the check and its measure (issue 59)
    else:
        assert headline == "No step or comparison fails." and not failing
        assert any(r["measure"] == PINNED_PREFILL and r["verdict"] == PASSES for r in dom.rows)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_prompt_that_crashes_upstream_too_leaves_the_other_prompts_judged(tmp_path):
    """Both builds crash on one prompt (unsupported-upstream: the generate steps are skipped, naming it): the
    expectations of the model's other prompts are still checked, not skipped as "nothing to check"."""
    project = make_fake_project(tmp_path / "fake")
    proc = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT, env=project.env(FAKE_CRASH_WORD="four"),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = read_run((project.results / "latest").resolve())
    assert {s.config: s.status for s in data.steps if s.step == "generate"} == {"base": "skipped", "fork": "skipped"}
    checked = {s.config: (s.status, s.detail) for s in data.steps if s.step == "expectations"}
    assert {c: status for c, (status, _) in checked.items()} == {"base": "passed", "fork": "passed"}
    assert all("in 4 load(s)" in detail for _, detail in checked.values())


def test_a_speed_rule_that_failed_without_a_measurement_fails_its_measures_never_reads_as_not_asked(tmp_path):
    """A rule step whose engine could not be measured (status ``error``, no rule in bench.json): the speed
    measures show that step and its verdict, not "not run: --no-bench"."""
    from harness.record.records import StepRecord
    from harness.record.run import Run
    run = Run.open(tmp_path / "results", "r1")
    run.record_step(StepRecord(CUDA, "cuda-pin-all", "generate", "passed", 1.0, "all generations ran"))
    run.record_step(StepRecord(CUDA, "cuda-pin-all", "speed:cuda-pin-routes:pp", "error", 1.0,
                               "the engine ended before its first round (SIGSEGV)"))
    run.write_summary()
    rows = _rows(run.dir)
    for m in (PINNED_PREFILL, FORK_VS_UPSTREAM):
        assert [(r.verdict.verdict, r.subject) for r in rows[m]] == \
            [(FAILS, "linux-x86_64-cuda cuda-pin-all speed:cuda-pin-routes:pp")]
