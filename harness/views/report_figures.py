"""The report's pictures (inline SVG by harness.views.svg), each from a run's own records:

* :func:`speed_pair_figures`: per measured pair and metric, both sides' rounds as a strip plot (bench.json);
* :func:`rule_history_figures`: per speed rule, its ratio over the runs beside this one (every run under
  ``results/``, ``results/evidence/`` included), the rule's threshold dashed;
* :func:`probe_figures`: per configuration with a runtime probe, its expert tensors' layers × buffer types,
  coloured by the bytes the driver reports page-locked (``engine.probe.json``, harness.record.probe);
* :func:`kl_figure`: a divergent comparison's KL per position, where its record holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..record.bench import bench_measurements, bench_platforms, read_bench, rule_ratio
from ..record.expectations import FINDING_FAILED, FINDING_PASSED, Load, read_expectations
from ..record.layout import RunLayout
from ..record.probe import ProbeError, read_probe
from ..record.records import ComparisonRecord
from ..record.summary import run_dirs_under
from ..triage.run_choice import started_at, run_kind
from .svg import Cell, cell_strip, line_plot, strip_plot
from ..common.statuses import RUN_FORK, RUN_SERIES, STEP_FAILED

#: Most runs a rule's history shows (the newest).
HISTORY_RUNS = 60

#: The kinds of run a rule's history shows (harness.common.statuses.RUN_KINDS): the fork's own runs on its line,
#: runs of another series (planted faults) apart; forecasts, rolls and bisect points are left out.
HISTORY_KINDS = (RUN_FORK, RUN_SERIES)


def _figure(caption: str, svg: str) -> str:
    return f'<figure><figcaption>{escape(caption)}</figcaption>{svg}</figure>'


def speed_pair_figures(bench: dict[str, Any]) -> list[str]:
    """Per pair of a bench.json and per metric, a strip plot of both sides' tok/s per round (the reference
    first, as the pair ran), each dot titled with its round.  Returns HTML ``<figure>`` strings."""
    out = []
    measurements = bench_measurements(bench)
    for pair in bench.get("pairs") or []:
        configs = list(pair.get("configs") or [])
        sides = [next((m for m in measurements if m.config == c and list(m.pair) == configs
                       and m.model == pair.get("model")), None) for c in configs]
        if any(s is None for s in sides):
            continue
        for metric in ("pp", "tg"):
            rows = [(s.config, list(getattr(s, metric))) for s in sides if s is not None]
            if not all(vs for _, vs in rows):
                continue
            tokens = pair["n_prompt"] if metric == "pp" else pair["n_gen"]
            titles = [[f"{c}: round {k + 1}: {v:.1f} tok/s" for k, v in enumerate(vs)] for c, vs in rows]
            title = f"{pair.get('model')} {metric}{tokens}: {' vs '.join(configs)}, {len(rows[0][1])} rounds"
            out.append(_figure(title, strip_plot(rows, x_label=f"{metric} tok/s ({tokens} tokens per request)",
                                                 title=title, point_titles=titles)))
    return out


def _when(run_dir: Path) -> str:
    """The run's start (run.json ``started``), else its directory name: the history's order."""
    return str(started_at(run_dir) or run_dir.name)


def _date(when: str) -> str:
    """``12-04 07:35`` for an ISO 8601 start (UTC), the text itself where it is not one."""
    try:
        return datetime.fromisoformat(when.replace("Z", "+00:00")).astimezone(timezone.utc).strftime("%m-%d %H:%M")
    except ValueError:
        return when[-16:]


def machine_text(machine: Mapping[str, Any]) -> str:
    """A bench.json machine fingerprint in words: ``Intel(R) Xeon(R) Processor, 16 CPUs; 1 of NVIDIA H200
    (driver 580.159.04) visible; CUDA 13.0`` (harness.kinds.machine.machine_fingerprint)."""
    gpus = [g for g in machine.get("gpus") or [] if isinstance(g, (list, tuple)) and g]
    names = ", ".join(f"{g[0]} (driver {g[1]})" if len(g) > 1 and g[1] else str(g[0]) for g in gpus)
    text = f"{machine.get('cpu') or 'unknown CPU'}, {machine.get('cpu_count') or '?'} CPUs"
    if gpus:
        shown = machine.get("visible_gpus")
        text += f"; {'' if shown is None else f'{shown} of '}{names} visible"
        if machine.get("cuda_driver"):
            text += f"; CUDA {machine['cuda_driver']}"
    else:
        text += "; no GPU"
    return text


@dataclass(frozen=True)
class HistoryLine:
    """What one line of a rule's history holds fixed: the rule (its step and candidate), the model, the tokens
    per request (``n_prompt`` prompt, ``n_gen`` generated; None where the record does not say), the instrument
    (bench.json's ``instrument``: how the rounds were taken) and the machine's fingerprint (as JSON text, and in
    words: :func:`machine_text`).  Points of two lines measured different things and are never joined."""

    step: str
    candidate: str
    model: str
    n_prompt: int | None
    n_gen: int | None
    instrument: str
    machine: str
    machine_words: str

    def describe(self) -> str:
        """The line in words, for its figure's caption."""
        tokens = "" if self.n_prompt is None else f", {self.n_prompt} prompt / {self.n_gen} generated tokens"
        return (f"{self.step} {self.candidate}: {self.model}{tokens}, instrument {self.instrument}, "
                f"{self.machine_words}")


@dataclass(frozen=True)
class HistoryPoint:
    """One run's record of a rule: the run's id and start (ISO 8601), the rule record of its bench.json, and
    whether the run is one of the fork's own (harness.triage.run_choice.run_kind ``fork``; False: another
    patch series, e.g. a planted fault)."""

    run: str
    started: str
    rule: Mapping[str, Any]
    same_series: bool | None


def checkout_series() -> str | None:
    """The digest of the checkout's patch series (``patches/`` of harness.args.find_checkout), None where it
    cannot be read."""
    from ..args import find_checkout
    from ..stages.building.patches import PatchError, read_series, series_digest
    root = find_checkout()
    if root is None:
        return None
    try:
        return series_digest(read_series(root / "patches"))
    except (OSError, PatchError):
        return None


def _tokens(bench: Mapping[str, Any], rule: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The prompt and generated tokens per request of ``rule``'s pair in ``bench``, (None, None) unknown."""
    pair = list(rule.get("pair") or [])
    for p in bench.get("pairs") or []:
        if isinstance(p, dict) and list(p.get("configs") or []) == pair and p.get("model") == rule.get("model"):
            return p.get("n_prompt"), p.get("n_gen")
    return None, None


def rule_history(results_dir: Path, platform: str, series: str | None = None
                 ) -> dict[HistoryLine, list[HistoryPoint]]:
    """Per line of a speed rule of ``platform`` (:class:`HistoryLine`: rule, model, tokens, instrument,
    machine), the runs under ``results_dir`` (at any depth) that recorded it, oldest first, at most
    :data:`HISTORY_RUNS` of them, of the kinds :data:`HISTORY_KINDS` (harness.triage.run_choice.run_kind): a
    ``series`` run is kept with ``same_series`` False, for the figure to draw apart.  ``series``: the digest of
    the fork's patch series (e.g. :func:`checkout_series`), which tells a run recorded before runs had kinds
    that built another series; None: every such run is the fork's."""
    runs = sorted(run_dirs_under(results_dir), key=lambda d: (_when(d), d.name))
    out: dict[HistoryLine, list[HistoryPoint]] = {}
    for run in runs:
        bench = read_bench(run, platform) or {}
        if not bench.get("rules"):
            continue
        machine = json.dumps(bench.get("machine") or {}, sort_keys=True)
        words = machine_text(bench.get("machine") or {})
        kind = run_kind(run, None if series is None else {platform: series})
        if kind not in HISTORY_KINDS:
            continue
        same = kind == RUN_FORK
        for rule in bench.get("rules") or []:
            if isinstance(rule, dict) and rule.get("step") and rule.get("candidate"):
                n_prompt, n_gen = _tokens(bench, rule)
                line = HistoryLine(str(rule["step"]), str(rule["candidate"]), str(rule.get("model")), n_prompt, n_gen,
                                   str(bench.get("instrument", "1")), machine, words)
                out.setdefault(line, []).append(HistoryPoint(run.name, _when(run), rule, same))
    return {k: v[-HISTORY_RUNS:] for k, v in out.items()}


def rule_history_figures(results_dir: Path, platform: str, current: str, series: str | None = None) -> list[str]:
    """Per line of :func:`rule_history` (a rule on one model, tokens, instrument and machine), a line plot of its
    candidate/reference ratio over the runs (harness.record.bench.rule_ratio, named in the caption), oldest
    first, the first and last start dates (UTC) on the x axis, the rule's threshold dashed and labelled with its
    whole rule (the ratio below it **and** the rank test's p at most p_max: harness.common.statistics), and
    failed verdicts in red.  Runs of another patch series than ``series`` (planted faults, forecasts) are hollow
    grey dots off the line.  ``current``: this run's id; its point, first, last or between, is marked "this
    run" above the plot, apart from the dates below it.  Lines with fewer than two runs of the series are left
    out."""
    out = []
    lines = rule_history(results_dir, platform, series)
    for line in sorted(lines, key=lambda k: (k.step, k.candidate, k.model, k.n_prompt or 0, k.n_gen or 0,
                                             k.instrument, k.machine)):
        points = lines[line]
        ratios = [rule_ratio(p.rule) for p in points]
        ys = [r.value if r else None for r in ratios]
        ours = [p for p, y in zip(points, ys) if p.same_series is not False and y is not None]
        if len(ours) < 2:
            continue
        apart = [p.same_series is False for p in points]
        last = ours[-1].rule
        threshold = last.get("threshold")
        n = len(points)
        ticks = [(0, _date(points[0].started)), (n - 1, _date(points[-1].started))]
        marks = [(i, "this run") for i, p in enumerate(points) if p.run == current]
        names = sorted({r.name for r in ratios if r})
        others = sum(apart)
        elsewhere = f"; {others} run(s) of another patch series hollow, off the line" if others else ""
        title = (f"{line.describe()}; {last.get('candidate')} / {last.get('reference')}, "
                 f"{' or '.join(names)}, over {len(ours)} runs{elsewhere}")
        out.append(_figure(title, line_plot(
            ys, x_label="runs, oldest to newest (start, UTC)", y_label=f"{last.get('metric')} ratio", title=title,
            x_ticks=ticks, apart=apart, marks=marks,
            limit=float(threshold) if isinstance(threshold, (int, float)) else None,
            limit_label=_rule_text(last) if isinstance(threshold, (int, float)) else "",
            bad=[p.rule.get("status") == STEP_FAILED and p.same_series is not False for p in points],
            point_titles=[_point_title(p) for p in points])))
    return out


def _rule_text(rule: Mapping[str, Any]) -> str:
    """The whole rule a history's dashed line stands for, from the rule's record: ``fails below 0.909x with
    Mann-Whitney p ≤ 0.01`` (harness.common.statistics: a slowdown needs both)."""
    text = f"fails below {float(rule['threshold']):.3g}x"
    return text + (f" with Mann-Whitney p ≤ {float(rule['p_max']):g}" if rule.get("p_max") is not None else "")


def _point_title(p: HistoryPoint) -> str:
    ratio = rule_ratio(p.rule)
    what = ratio.text(3) if ratio else "no ratio"
    if p.rule.get("p_value") is not None and p.rule.get("p_max") is not None:
        p_value, p_max = float(p.rule["p_value"]), float(p.rule["p_max"])
        what += f", Mann-Whitney p {p_value:.3g} {'≤' if p_value <= p_max else '>'} {p_max:g}"
    series = "; another patch series" if p.same_series is False else ""
    return f"{p.run} ({_date(p.started)} UTC): {p.rule.get('status')}, {what}{series}"


def _probe_cell(weights: list[Any], device: bool) -> Cell:
    total = sum(w.bytes for w in weights)
    locked = [w.page_locked for w in weights]
    if not weights:
        return Cell("c-empty", "")
    buffer = weights[0].buffer
    what = f"layer {weights[0].layer} in {buffer.buffer_type}: {total / 2**20:.0f} MiB of expert tensors"
    if not device:
        return Cell("c-host", f"{what} in host memory (a platform without a device)")
    if not buffer.host:
        return Cell("c-device", f"{what} in device memory")
    if any(x is None for x in locked):
        return Cell("c-unknown", f"{what}, page-locked bytes not asked")
    pinned = sum(x or 0 for x in locked)
    cls = "c-pinned" if pinned >= total else "c-partial" if pinned else "c-pageable"
    return Cell(cls, f"{what}, {pinned / 2**20:.0f} MiB page-locked by the driver")


#: The findings of the expectations check that judge what a probe figure shows: where the expert tensors
#: sit and how much of them the driver reports page-locked (harness.stages.checks.expectation_probe).
PROBE_RULES = ("placement", "pinned")


def probe_verdicts(load: Load | None) -> list[tuple[str, bool]]:
    """(text, failed) lines of what the expectations check decided of a probed load (``load``: its record's
    ``engine`` load of the model, harness.record.expectations; None: no record): each failed or incomplete
    :data:`PROBE_RULES` finding with its message, else one line naming those that passed; "not judged" where
    the check has no record of the load or skipped it.  Read from the record, never decided here."""
    if load is None:
        return [("not judged: the expectations check recorded no load of this model", False)]
    if load.skipped is not None:
        return [(f"not judged by the expectations check: {load.skipped}", False)]
    findings = [f for f in load.findings if f.rule in PROBE_RULES]
    out = [(f"expectations: {f.rule} {f.status}: {f.message}", f.status == FINDING_FAILED)
           for f in findings if f.status != FINDING_PASSED]
    not_passed = {f.rule for f in findings if f.status != FINDING_PASSED}
    passed = [r for r in PROBE_RULES if r not in not_passed and any(f.rule == r for f in findings)]
    if passed:
        out.append((f"expectations: {' and '.join(passed)} passed: as the configuration expects", False))
    return out or [("not judged: the expectations check recorded no placement or pinned finding", False)]


def probe_figure(path: Path, title: str, device: bool = True, judged: Load | None = None) -> str:
    """The layer × buffer-type strip of one probe record: a row per buffer type holding expert tensors, a
    column per layer, each cell coloured by the share the driver reports page-locked, in blues and greys that
    mean a memory class, never a verdict; below, what the expectations check decided of the load (``judged``,
    :func:`probe_verdicts`), a failure in red with the grid framed red.  ``device``: whether
    the platform's kind has a device (harness.kinds: GpuKind.has_device); without one every buffer is host
    memory, whatever ggml says of its addressing (CPU_REPACK is not host-addressable, and not device memory
    either), and nothing is page-locked for a device.  Raises ProbeError for a record that cannot be read,
    ValueError for one without expert tensors."""
    probe = read_probe(path)
    experts = probe.experts
    if not experts:
        raise ValueError(f"{path}: no expert tensors")
    layers = max(w.layer for w in experts) + 1
    rows, notes = [], []
    for buffer_type in sorted({w.buffer.buffer_type for w in experts}):
        these = [w for w in experts if w.buffer.buffer_type == buffer_type]
        cells = [_probe_cell([w for w in these if w.layer == layer], device) for layer in range(layers)]
        total = sum(w.bytes for w in these)
        locked = [w.page_locked for w in these]
        pinned = "page-locked not asked" if any(x is None for x in locked) else \
            f"{sum(x or 0 for x in locked) / 2**20:.0f} MiB page-locked"
        rows.append((buffer_type, cells))
        if not device:
            notes.append(f"{total / 2**20:.0f} MiB, host memory")
        else:
            notes.append(f"{total / 2**20:.0f} MiB, {pinned}" if these[0].buffer.host else
                         f"{total / 2**20:.0f} MiB, device memory")
    legend = [("c-pinned", "page-locked"), ("c-partial", "partly page-locked"), ("c-pageable", "pageable"),
              ("c-device", "device memory"), ("c-unknown", "not asked")] if device else \
        [("c-host", "host memory (no device on this platform kind)")]
    return cell_strip(rows, column_label="layer (expert tensors)", title=title, legend=legend, notes=notes,
                      verdicts=probe_verdicts(judged))


def platform_has_device(platform: str, probe_driver: str | None = None) -> bool:
    """Whether ``platform``'s kind has a device (its ``hardware.gpu`` in the checkout's matrix.yaml,
    harness.kinds.registry.gpu_of); for a platform that matrix does not name, whether the probing engine
    was built with a device runtime (the probe's ``driver``)."""
    from ..args import find_checkout
    from ..kinds.registry import UnknownKind, gpu_of
    from ..matrix.config import load_matrix
    root = find_checkout()
    try:
        matrix = load_matrix(root / "matrix.yaml") if root else None
    except Exception:  # noqa: BLE001 - an unreadable matrix leaves the probe's own word
        matrix = None
    if matrix is not None and platform in matrix.platforms:
        try:
            return gpu_of(matrix.platforms[platform]).has_device
        except UnknownKind:
            pass
    return probe_driver is not None


def probe_figures(run_dir: Path) -> list[str]:
    """One :func:`probe_figure` per (platform, configuration, model) of a run that recorded a probe
    (the engine's load: ``gen/<model>/engine.probe.json``), in name order, memory classes by the platform's
    kind (:func:`platform_has_device`), judged by the configuration's expectations record (its ``engine`` load
    of the model); unreadable probe records are left out."""
    out = []
    devices: dict[str, bool] = {}
    for path in sorted(run_dir.glob("*/*/gen/*/engine.probe.json")):
        platform, config, model = path.parents[3].name, path.parents[2].name, path.parent.name
        title = f"{platform} · {config} · {model}: expert tensors per layer and buffer type"
        try:
            if platform not in devices:
                devices[platform] = platform_has_device(platform, read_probe(path).driver)
            record = read_expectations(RunLayout(run_dir).expectations_json(platform, config))
            load = next((x for x in record.loads if x.model == model and x.load == "engine"), None) if record else None
            out.append(_figure(title, probe_figure(path, title, devices[platform], load)))
        except (ProbeError, ValueError):
            continue
    return out


def kl_figure(comparison: ComparisonRecord) -> str:
    """A divergent comparison's KL(reference || candidate) per generated position as a line plot (its
    ``kl.per_position``, nats), the first divergent token's position in the title and marked on the plot by a
    dotted vertical line; "" where the record holds no per-position values (runs before they were recorded)."""
    kl = comparison.kl or {}
    values = kl.get("per_position") or []
    if not values:
        return ""
    first = (comparison.first_divergence or {}).get("index")
    where = f", first divergent token at {first}" if first is not None else ""
    title = (f"{comparison.model}/{comparison.prompt}: {comparison.candidate} vs "
             f"{comparison.reference}, KL per position{where}")
    marks = [(int(first), f"first divergent token ({first})")] if isinstance(first, int) and 0 <= first < len(values) \
        else []
    return _figure(title, line_plot([float(v) for v in values], x_label="generated position (teacher-forced on "
                                    "the reference's tokens)", y_label="KL (nats)", title=title, marks=marks,
                                    point_titles=[f"position {i}: {float(v):.4g} nats" for i, v in enumerate(values)]))


def bench_figures(run_dir: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    """(platform, bench.json) of every platform of a run with one."""
    for platform in bench_platforms(run_dir):
        yield platform, read_bench(run_dir, platform) or {}


__all__ = ["speed_pair_figures", "rule_history", "rule_history_figures", "probe_figure", "probe_figures",
           "kl_figure", "bench_figures", "HISTORY_RUNS"]
