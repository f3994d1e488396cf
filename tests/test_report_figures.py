"""The report's pictures (harness.analysis.svg, harness.analysis.report_figures) from committed H200 runs."""

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.analysis import report_figures, svg
from harness.analysis.report import render_html
from harness.record.results import ComparisonRecord
from harness.analysis.report_figures import kl_figure, probe_figure, rule_history, speed_pair_figures
from harness.record.bench import read_bench

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "evidence" / "gpu1-20261202T165838Z"
CUDA = "linux-x86_64-cuda"


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg class=\"fig\".*?</svg>", html, re.S)]


def test_nice_ticks_cover_the_range_in_round_steps():
    assert svg.nice_ticks(23765, 37201) == [20000, 25000, 30000, 35000, 40000]
    assert svg.nice_ticks(0.0, 0.0)[0] < 0 < svg.nice_ticks(0.0, 0.0)[-1]
    assert svg.tick_text(35000) == "35k" and svg.tick_text(0.002) == "0.002"


def test_a_strip_plot_puts_each_round_on_the_shared_axis():
    out = svg.strip_plot([("base", [10.0, 20.0]), ("fork", [30.0])], x_label="pp tok/s", title="t")
    root = ET.fromstring(out)
    dots = [c for c in root.iter("{http://www.w3.org/2000/svg}circle")]
    xs = sorted(float(c.get("cx")) for c in dots)
    assert len(dots) == 3 and xs[0] < xs[1] < xs[2]
    assert "pp tok/s" in out
    with pytest.raises(ValueError):
        svg.strip_plot([("a", [])], x_label="x", title="empty")


def test_the_h200_runs_two_clusters_of_base_pp_rounds_are_drawn_one_dot_per_round():
    bench = read_bench(RUN, CUDA)
    [first, *_] = speed_pair_figures(bench)
    base = next(m for m in bench["measurements"] if m["config"] == "base")
    assert "pp512: base vs fork, 5 rounds" in first
    for k, v in enumerate(base["pp_tok_s"]):
        assert f"base: round {k + 1}: {v:.1f} tok/s" in first


def test_the_probe_strip_says_which_layers_are_pinned():
    path = RUN / CUDA / "cuda-pin-layers-2" / "gen" / "moe-large" / "engine.probe.json"
    out = probe_figure(path, "t")
    titles = re.findall(r'class="(c-[a-z]+)"><title>(layer \d+) in ([A-Za-z_0-9]+)', out)
    pinned = sorted(layer for cls, layer, buft in titles if cls == "c-pinned")
    assert pinned == ["layer 0", "layer 1"]  # GGML_CUDA_MOE_PIN_LAYERS=2
    assert {buft for cls, _, buft in titles if cls == "c-pageable"} == {"CPU"}


def _started(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["started"]


def test_a_rule_history_runs_over_the_evidence_oldest_first():
    """Each point is one run, in the order the runs started (run.json ``started``, not the directory names'
    order): the history plot reads left to right as time."""
    history = rule_history(ROOT / "results", CUDA)
    points = history["speed:cuda-base-vs-fork:pp fork"]
    assert len(points) > 10 and len({run for run, _ in points}) == len(points)
    runs = {d.name: d for d in (ROOT / "results").rglob("*") if (d / "run.json").is_file()}
    starts = [_started(runs[run]) for run, _ in points]
    assert starts == sorted(starts) and starts[0] < starts[-1]


def test_a_rule_history_keeps_the_newest_runs_when_it_caps_them(tmp_path, monkeypatch):
    """Past HISTORY_RUNS runs the oldest are dropped: the cap keeps the newest, still oldest first.  The runs'
    directory names sort the other way round from their starts, so only the start decides."""
    for k, name in enumerate(["r-c", "r-b", "r-a"]):  # r-c started first
        run = tmp_path / name
        (run / CUDA / "speed").mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"run_id": name, "started": f"2026-12-0{k + 1}T00:00:00+00:00"}))
        (run / "summary.json").write_text(json.dumps({"run_id": name, "overall": "passed", "configurations": []}))
        rules = [{"step": "speed:g:pp", "candidate": "fork", "reference": "base", "ratio": 1.0 - k / 10}]
        (run / CUDA / "speed" / "bench.json").write_text(json.dumps({"rules": rules}))
    monkeypatch.setattr(report_figures, "HISTORY_RUNS", 2)
    assert [run for run, _ in rule_history(tmp_path, CUDA)["speed:g:pp fork"]] == ["r-b", "r-a"]


def test_kl_per_position_is_drawn_where_the_comparison_records_it():
    cmp = ComparisonRecord("p1", "g", "m", "p", "base", "fork", "diverged", first_divergence={"index": 2},
                           kl={"per_position": [0.0, 0.001, 0.5, 0.2]})
    out = kl_figure(cmp)
    assert "first divergent token at 2" in out and "position 2: 0.5 nats" in out and "KL (nats)" in out
    assert kl_figure(ComparisonRecord("p1", "g", "m", "p", "base", "fork", "diverged", kl={"mean": 0.1})) == ""


def test_the_report_of_a_committed_gpu_run_shows_its_pictures(tmp_path):
    html = render_html(RUN)
    figures = _svgs(html)
    assert len(figures) >= 16 + 18  # a strip per pair and metric, a probe strip per configuration and model
    assert 'id="probe"' in html and "Rounds per pair" in html and "History of the rules" in html
    assert 'id="changes"' in html  # against the previous comparable run by default (none beside it here)
