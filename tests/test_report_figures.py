"""The report's pictures (harness.views.svg, harness.views.report_figures) from committed H200 runs."""

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.views import report_figures, svg
from harness.views.report import render_html
from harness.record.records import ComparisonRecord
from harness.views.report_figures import (checkout_series, kl_figure, probe_figure, rule_history,
                                             rule_history_figures, speed_pair_figures)
from harness.triage.run_choice import recorded_series
from harness.record.bench import read_bench
from harness.record.summary import run_dirs_under

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "evidence" / "gpu1-20261202T165838Z"
CUDA = "linux-x86_64-cuda"
SVG = "{http://www.w3.org/2000/svg}"


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


def _lines(step, candidate, series=None):
    return {line: points for line, points in rule_history(ROOT / "results", CUDA, series).items()
            if (line.step, line.candidate) == (step, candidate)}


#: The machine of the default-mode pp rule's moe-48l-quant line these tests draw: the H200 of 2026-12-04, where the
#: planted series ran (an H100's runs of the rule are a line of their own).
H200 = "NVIDIA H200 "


def _h200_quant_points(series):
    """The points of the pp rule's moe-48l-quant line on the H200 (exactly one such line)."""
    [points] = [v for k, v in _lines("speed:cuda-base-vs-fork:pp", "fork", series).items()
                if k.model == "moe-48l-quant" and H200 in k.machine_words]
    return points


def _h200_quant_figure(current, series):
    """The history figure of that line, with ``current`` as this run (exactly one such figure)."""
    [figure] = [f for f in rule_history_figures(ROOT / "results", CUDA, current, series)
                if f.startswith("<figure><figcaption>speed:cuda-base-vs-fork:pp fork: moe-48l-quant")
                and H200 in f[:f.index("</figcaption>")]]
    return figure


def test_a_rule_history_runs_over_the_evidence_oldest_first():
    lines = _lines("speed:cuda-base-vs-fork:pp", "fork")
    points = max(lines.values(), key=len)
    assert len(points) > 10 and len({p.run for p in points}) == len(points)
    assert [p.started for p in points] == sorted(p.started for p in points)


def test_each_line_of_a_rules_history_is_one_model_token_count_instrument_and_machine():
    """The default-mode pp rule ran on moe-large (512 and 2048 prompt tokens, two instruments) and later on
    moe-48l-quant: each is a line of its own, and a line holds exactly the runs that measured its model."""
    lines = _lines("speed:cuda-base-vs-fork:pp", "fork")
    assert {line.model for line in lines} == {"moe-large", "moe-48l-quant"}
    assert {line.n_prompt for line in lines if line.model == "moe-large"} == {512, 2048}
    for line, points in lines.items():
        assert {p.rule["model"] for p in points} == {line.model}
    quant = [p for line, points in lines.items() if line.model == "moe-48l-quant" for p in points]
    measured = [run.name for run in run_dirs_under(ROOT / "results")
                for r in (read_bench(run, CUDA) or {}).get("rules") or []
                if r.get("step") == "speed:cuda-base-vs-fork:pp" and r.get("model") == "moe-48l-quant"]
    assert sorted(p.run for p in quant) == sorted(measured) and len(measured) < 20


def test_runs_of_another_patch_series_are_told_by_their_recorded_series_and_drawn_apart():
    """The planted faults of 2026-12-04 (one extra patch, their fork's configure line naming another series)
    are not the fork's history: hollow points off its line, never its red failures."""
    series = checkout_series()
    assert series and recorded_series(ROOT / "results" / "evidence" / "gpu1-20261204T073536Z", CUDA) == series
    plant = run_dirs_under(ROOT / "results" / "evidence" / "h200-speed-20261204" / "plants")[0]
    recorded = recorded_series(plant, CUDA)
    assert recorded and not series.startswith(recorded)
    points = _h200_quant_points(series)
    apart = {p.run for p in points if p.same_series is False}
    assert apart == {"plant-hold-prompt-20261204T072726Z", "plant-hold-token-20261204T073005Z"}
    figure = _h200_quant_figure("x", series)
    root = ET.fromstring(figure[figure.index("<svg"):figure.index("</svg>") + 6])
    dots = list(root.iter(f"{SVG}circle"))
    hollow = [d for d in dots if d.get("class") == "apart"]
    assert len(hollow) == 2 and all("another patch series" in d.find(f"{SVG}title").text for d in hollow)
    assert not [d for d in dots if d.get("class") == "bad" and "plant" in d.find(f"{SVG}title").text]
    line_points = " ".join(p.get("points") for p in root.iter(f"{SVG}polyline"))
    assert all(f"{d.get('cx')},{d.get('cy')}" not in line_points for d in hollow)


def test_a_history_names_dates_and_keeps_its_threshold_label_off_the_data():
    series = checkout_series()
    figure = next(f for f in rule_history_figures(ROOT / "results", CUDA, "x", series) if "moe-48l-quant" in f)
    root = ET.fromstring(figure[figure.index("<svg"):figure.index("</svg>") + 6])
    texts = {t.text: t for t in root.iter(f"{SVG}text")}
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", next(t for t in texts if t and t[0].isdigit() and "-" in t))
    frame_top = float(next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "frame").get("y"))
    label = next(t for k, t in texts.items() if k and k.startswith("fails below"))
    assert float(label.get("y")) < frame_top  # above the plot, where no point is drawn


def test_the_probe_strip_of_a_platform_without_a_device_draws_no_device_memory(tmp_path):
    """CPU_REPACK is not host-addressable (ggml_backend_buffer_is_host false) but is host memory on a CPU-only
    platform: its cells are host memory, not device memory; on a platform with a device the same record
    would say device."""
    record = {"weights": [{"name": "blk.0.ffn_up_exps.weight", "layer": 0, "type": "q4_0", "bytes": 1024,
                           "buffer": 0, "page_locked": None}],
              "buffers": [{"name": "CPU_REPACK", "buffer_type": "CPU_REPACK", "bytes": 1024, "host": False,
                           "page_locked": None}], "driver": None, "probe_ms": 1.0}
    path = tmp_path / "engine.probe.json"
    path.write_text(__import__("json").dumps(record))
    assert 'class="c-host"' in probe_figure(path, "t", device=False)
    assert 'class="c-device"' not in probe_figure(path, "t", device=False)
    assert 'class="c-device"' in probe_figure(path, "t", device=True)


def test_layer_ticks_stay_apart_at_48_layers():
    assert svg.tick_stride(48, 5.2) == 5 and svg.tick_stride(8, 22) == 1 and svg.tick_stride(48, 22) == 1
    cells = [svg.Cell("c-pinned", "") for _ in range(48)]
    out = svg.cell_strip([("CPU", cells)], column_label="layer", title="t", legend=[], notes=["x"])
    xs = sorted(float(t.get("x")) for t in ET.fromstring(out).iter(f"{SVG}text") if (t.text or "").isdigit())
    assert min(b - a for a, b in zip(xs, xs[1:])) >= 2 * svg.DIGIT_W + svg.TICK_GAP  # two-digit labels apart


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
    [points] = rule_history(tmp_path, CUDA).values()
    assert [p.run for p in points] == ["r-b", "r-a"]


def test_kl_per_position_is_drawn_where_the_comparison_records_it():
    cmp = ComparisonRecord("p1", "g", "m", "p", "base", "fork", "diverged", first_divergence={"index": 2},
                           kl={"per_position": [0.0, 0.001, 0.5, 0.2]})
    out = kl_figure(cmp)
    assert "first divergent token at 2" in out and "position 2: 0.5 nats" in out and "KL (nats)" in out
    root = ET.fromstring(out[out.index("<svg"):out.index("</svg>") + 6])
    [mark] = [m for m in root.iter(f"{SVG}line") if m.get("class") == "mark"]
    dot = next(c for c in root.iter(f"{SVG}circle") if c.find(f"{SVG}title").text.startswith("position 2:"))
    assert mark.get("x1") == dot.get("cx")  # the dotted line stands on position 2
    assert kl_figure(ComparisonRecord("p1", "g", "m", "p", "base", "fork", "diverged", kl={"mean": 0.1})) == ""


def test_the_report_of_a_committed_gpu_run_shows_its_pictures(tmp_path):
    html = render_html(RUN)
    figures = _svgs(html)
    assert len(figures) >= 16 + 18  # a strip per pair and metric, a probe strip per configuration and model
    assert 'id="probe"' in html and "Rounds per pair" in html and "History of the rules" in html
    assert 'id="changes"' in html  # against the previous comparable run by default (none beside it here)


def test_no_planted_run_is_drawn_as_the_forks_in_any_rules_history():
    """Over results/evidence/, every rule's history: each point of a planted fault's run (each recorded
    another series than the checkout's) is hollow and off the line, in every figure."""
    figures = rule_history_figures(ROOT / "results", CUDA, "x", checkout_series())
    planted = 0
    for figure in figures:
        root = ET.fromstring(figure[figure.index("<svg"):figure.index("</svg>") + 6])
        for dot in root.iter(f"{SVG}circle"):
            if dot.find(f"{SVG}title").text.startswith("plant"):
                planted += 1
                assert dot.get("class") == "apart", dot.find(f"{SVG}title").text
    assert planted >= 10


def _probe_svg(run: Path, config: str) -> tuple[ET.Element, str]:
    from harness.views.report_figures import probe_figures
    figure = next(f for f in probe_figures(run) if f"· {config} ·" in f)
    return ET.fromstring(figure[figure.index("<svg"):figure.index("</svg>") + 6]), figure


@pytest.mark.parametrize("config", ["cuda-nopin", "cuda-sim-sticky", "cuda-pin-layers-2"])
def test_memory_the_configuration_expects_is_neutral_in_the_probe_figure(config):
    """Expected pageable layers (all of cuda-nopin and cuda-sim-sticky, layers 2-7 of cuda-pin-layers-2) are
    grey, not the red of a failure, and the figure says the expectations check passed them."""
    root, _ = _probe_svg(ROOT / "results" / "evidence" / "gpu1-20261205T030752Z", config)
    classes = [r.get("class") for r in root.iter(f"{SVG}rect")]
    assert "c-pageable" in classes and "verdict-frame" not in classes
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert any("placement and pinned passed: as the configuration expects" in t for t in texts)
    assert not [t for t in root.iter(f"{SVG}text") if t.get("class") == "verdict-bad"]
    red = [rule.split("{")[0] for rule in re.split(r"}\s*", svg.CSS) if "#cf222e" in rule]
    assert red and not [sel for sel in red if ".c-" in sel], red  # no memory class is painted in the failure colour


def test_a_probe_figure_of_a_failed_load_is_framed_red_and_names_the_failure():
    """The planted fault that leaves the host buffers pageable: the expectations check failed cuda-pin-all's
    placement and pinned findings; the figure says so in red, from the record."""
    root, _ = _probe_svg(ROOT / "results" / "evidence" / "plant-cuda-host-buffers-pageable-20261202T144114Z",
                         "cuda-pin-all")
    assert "verdict-frame" in [r.get("class") for r in root.iter(f"{SVG}rect")]
    failed = ["".join(t.itertext()) for t in root.iter(f"{SVG}text") if t.get("class") == "verdict-bad"]
    assert any(t.startswith("expectations: pinned failed") for t in failed), failed
    assert any(t.startswith("expectations: placement failed") for t in failed), failed


def _history(current: str) -> ET.Element:
    figure = _h200_quant_figure(current, checkout_series())
    return ET.fromstring(figure[figure.index("<svg"):figure.index("</svg>") + 6])


def _box(t: ET.Element) -> tuple[float, float, float, float]:
    """(left, right, top, bottom) of a text of 11 px, svg.DIGIT_W a character, by its anchor."""
    x, y, w = float(t.get("x")), float(t.get("y")), svg.DIGIT_W * len(t.text or "")
    left = {"end": x - w, "middle": x - w / 2}.get(t.get("text-anchor") or "start", x)
    return left, left + w, y - 11, y


def test_this_run_is_marked_as_the_first_last_or_a_middle_point_apart_from_the_dates():
    series = checkout_series()
    points = _h200_quant_points(series)
    for current in (points[0].run, points[len(points) // 2].run, points[-1].run):
        root = _history(current)
        texts = list(root.iter(f"{SVG}text"))
        [mark] = [t for t in texts if t.text == "this run"]
        [ring] = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "mark"]
        assert ring.find(f"{SVG}title").text == "this run"
        left, right, top, bottom = _box(mark)
        assert 0 <= left and right <= svg.WIDTH
        for other in texts:
            if other is not mark and other.text:
                o_left, o_right, o_top, o_bottom = _box(other)
                assert right <= o_left or o_right <= left or bottom <= o_top or o_bottom <= top, other.text


def test_a_history_s_threshold_line_says_the_whole_rule():
    texts = [t.text for t in _history("x").iter(f"{SVG}text")]
    assert "fails below 0.909x with Mann-Whitney p ≤ 0.01" in texts


def test_small_pin_ladder_allocations_stay_visible_on_the_run_s_shared_axis():
    """The fork's cudaMallocHost allocations of 125 KiB and a few MiB beside 4.6 GiB ladders on one axis: each
    bar is drawn at least MIN_BAR wide and its size printed beside it."""
    from harness.views.pin_chart import MIN_BAR, ladder_scale, pin_chart_svg, pin_ladders
    ladders = pin_ladders(ROOT / "results" / "evidence" / "gpu1-20261205T030752Z")
    scale = ladder_scale([g["records"] for g in ladders])
    assert scale >= 4 * 2**30
    fork = next(g for g in ladders if g["config"] == "fork" and g["model"] == "moe-large")
    root = ET.fromstring(pin_chart_svg(fork["records"], "t", scale).replace("<svg ", f'<svg xmlns="{SVG[1:-1]}" ', 1))
    rows = [g for g in root.iter(f"{SVG}g")]
    assert len(rows) == len(fork["records"]) >= 2
    for g in rows:
        req, got = [r for r in g.iter(f"{SVG}rect")]
        assert float(req.get("width")) >= MIN_BAR and float(got.get("width")) >= MIN_BAR
        [beside] = [t for t in g.iter(f"{SVG}text") if "too small for this axis" in (t.text or "")]
        assert float(beside.get("x")) < float(req.get("x")) + 20
    assert "125.00 KiB of 125.00 KiB, too small for this axis" in ET.tostring(root, encoding="unicode")
