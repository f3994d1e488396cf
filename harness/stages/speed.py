"""The speed stage: prompt-processing (pp) and generation (tg) tok/s per configuration, judged by rules.

It runs after the comparisons of ``compare-outputs`` (``--no-bench`` leaves it out), on every
platform that ran them, for every selected group with a ``speed`` section in ``matrix.yaml``.
Per platform and model, one engine process (``llama-harness-engine``, harness.stages.engine) per
configuration that a rule needs is started with the configuration's own ``args`` and ``env``, so
the measurement is of the configuration as the comparisons ran it, and stays resident: after one
untimed warm-up request each, the timed ``bench <n_prompt> <n_gen>`` requests alternate between
the configurations (reference, candidate, reference, candidate, ...) for ``repeats`` rounds, so
the machine's load drifts over both sides alike and no model load is paid per repeat.

Each rule (``groups.<name>.speed.rules``: a candidate, a metric, ``min_ratio``) is judged by
harness.analysis.statistics.judge on the two configurations' samples and recorded as a step
``speed:<group>:<metric>`` of the candidate configuration: ``passed``, ``failed`` (a slowdown by
the rule) or ``error`` (a build, the model or the engine did not let it be measured), with a log
``<platform>/speed/<group>.<candidate>.<metric>.log``.  Every sample, its spread, each verdict and
the machine's fingerprint go to ``<platform>/speed/bench.json``, which triage compares across runs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.statistics import judge, spread
from ..matrix.config import Generation, GroupSpeed, Platform, SpeedRule
from ..matrix.platforms import cannot_run
from ..record import environment
from ..record.bench import METRICS, step_name
from ..record.results import Failure, StepRecord, write_json
from .engine import EngineError, EngineSession
from .greedy import Side

#: The pipeline the stage runs in (harness.pipeline.Pipeline: matrix, run, opts, console, build_variant,
#: model_path, doing, _hooks); typed loosely here, since the pipeline imports this module.
Pipeline = Any

@dataclass(frozen=True)
class Unit:
    """What one interleaved measurement times: ``model``, tokens per request and rounds."""

    model: str
    n_prompt: int
    n_gen: int
    repeats: int


@dataclass
class Measurement:
    """One configuration's samples of one unit, tok/s per timed request (in the order taken).

    ``position``: its place in each round (0 runs first).  ``errors``: why requests failed.
    """

    config: str
    unit: Unit
    position: int
    pp: list[float] = field(default_factory=list)
    tg: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The record bench.json keeps: settings, samples and their spread (harness.analysis.statistics.Spread)."""
        out: dict[str, Any] = {"config": self.config, **asdict(self.unit), "position": self.position,
                               "pp_tok_s": self.pp, "tg_tok_s": self.tg, "errors": self.errors}
        for metric in METRICS:
            samples = getattr(self, metric)
            out[metric] = asdict(spread(samples)) if samples else None
        return out


@dataclass(frozen=True)
class Rule:
    """A speed rule as one platform runs it: the group, its reference, the rule and its unit."""

    group: str
    reference: str
    rule: SpeedRule
    unit: Unit


def rules_for(pipe: Pipeline, p: Platform) -> list[Rule]:
    """The speed rules platform ``p`` runs: of its groups selected by ``--group`` that have a ``speed``
    section, need no more GPUs than are visible, and whose speed model ``--model`` leaves in."""
    opts, matrix = pipe.opts, pipe.matrix
    visible = environment.visible_gpu_count() if p.gpu == "nvidia" else 0
    out = []
    for gname in p.groups:
        group = matrix.groups[gname]
        speed: GroupSpeed | None = group.speed
        if speed is None or (opts.groups and gname not in opts.groups) or (opts.models and speed.model not in opts.models):
            continue
        if p.gpu == "nvidia" and group.min_gpus > visible:
            continue  # the comparisons recorded the skip
        unit = Unit(speed.model, speed.n_prompt, speed.n_gen, opts.bench_repeats or speed.repeats)
        out += [Rule(gname, group.reference, r, unit) for r in speed.rules]
    return out


def stage_speed(pipe: Pipeline) -> None:
    """Measure and judge every speed rule of every runnable selected platform (see the module docstring);
    nothing at all with ``--no-bench``."""
    if not pipe.opts.bench:
        return
    for name in pipe.opts.platforms or list(pipe.matrix.platforms):
        p = pipe.matrix.platform(name)
        if cannot_run(p):
            continue  # the comparisons recorded why
        rules = rules_for(pipe, p)
        if rules:
            with pipe.doing(p.name, "-", "speed"):
                _platform(pipe, p, rules)


def _platform(pipe: Pipeline, p: Platform, rules: list[Rule]) -> None:
    layout = pipe.run.layout
    out = layout.speed(p.name)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    measured: dict[tuple[str, Unit], Measurement] = {}
    problems: dict[str, list[Failure]] = {}
    seconds: dict[Unit, float] = {}  # wall time of each unit's interleaved rounds
    by_model: dict[str, dict[Unit, list[str]]] = {}
    for r in rules:
        configs = by_model.setdefault(r.unit.model, {}).setdefault(r.unit, [])
        configs += [c for c in (r.reference, r.rule.candidate) if c not in configs]
    total = sum(len(cs) * u.repeats for units in by_model.values() for u, cs in units.items())
    groups = sorted({r.group for r in rules})
    with pipe.console.step(f"[{p.name}] speed {', '.join(groups)}", total=total) as shown:
        for model, units in by_model.items():
            configs = list(dict.fromkeys(c for cs in units.values() for c in cs))
            sessions = _start(pipe, p, model, configs, units, out, problems)
            try:
                for unit, unit_configs in units.items():
                    live = [c for c in unit_configs if c in sessions]
                    t0 = time.monotonic()
                    measured.update({(m.config, unit): m for m in
                                     _interleave(sessions, live, unit, lambda what: pipe.console.advance(shown, 1, what))})
                    seconds[unit] = time.monotonic() - t0
            finally:
                for session in sessions.values():
                    session.close()
        records = [_judge(pipe, p, r, measured, problems, out, seconds.get(r.unit, 0.0)) for r in rules]
        failed = [s for s in records if s["status"] != "passed"]
        shown.finish("failed" if failed else "passed",
                     f"{len(records) - len(failed)} of {len(records)} speed rule(s) passed")
    write_json(out / "bench.json", {"machine": environment.machine_fingerprint(), "defaults": pipe.matrix.speed,
                                    "wall_s": round(time.monotonic() - start, 2),
                                    "measurements": [m.to_json() for m in measured.values()], "rules": records})


def _start(pipe: Pipeline, p: Platform, model: str, configs: list[str], units: dict[Unit, list[str]], out: Path,
           problems: dict[str, list[Failure]]) -> dict[str, EngineSession]:
    """One resident engine per configuration of ``configs`` on ``model``; a configuration that cannot be
    started (a build that did not pass, the model, the engine) gets its failure in ``problems``."""
    try:
        model_path = pipe.model_path(model)
    except Exception as exc:
        for c in configs:
            problems.setdefault(c, []).append(Failure("model", model=model, message=f"{type(exc).__name__}: {exc}"))
        return {}
    hooks = pipe._hooks(p)
    sessions: dict[str, EngineSession] = {}
    for config in configs:
        variant = pipe.matrix.configs[config].build
        if pipe.build_variant(p, variant).status != "passed":
            problems.setdefault(config, []).append(Failure("blocked", build=variant))
            continue
        group_gen = next(pipe.matrix.groups[g].generation for g in p.groups
                         if pipe.matrix.groups[g].speed and pipe.matrix.groups[g].speed.model == model)
        need = max(u.n_prompt + u.n_gen for u in units)
        gen = Generation(n_predict=group_gen.n_predict, repeats=1, seed=group_gen.seed,
                         ctx_size=max(group_gen.ctx_size, need), timeout_s=group_gen.timeout_s)
        stem = out / f"{config}.{model}.engine"
        try:
            argv, env = hooks.engine(Side(p.name, config), model_path, gen)
            sessions[config] = EngineSession(argv, env, stem.with_suffix(".stderr"), stem.with_suffix(".cmd"),
                                             load_timeout_s=gen.timeout_s, request_timeout_s=gen.timeout_s)
        except (EngineError, OSError, RuntimeError) as exc:
            problems.setdefault(config, []).append(Failure("exception", model=model,
                                                           message=f"engine for {config} on {model}: {exc}"))
    return sessions


def _interleave(sessions: dict[str, EngineSession], configs: list[str], unit: Unit,
                advance: Any) -> list[Measurement]:
    """Time ``unit.repeats`` rounds of one ``bench`` request per configuration, in ``configs`` order,
    after one untimed warm-up request each.  A configuration whose engine fails stops being timed."""
    found = [Measurement(c, unit, i) for i, c in enumerate(configs)]
    broken: set[str] = set()

    def request(m: Measurement, timed: bool) -> None:
        try:
            res = sessions[m.config].bench(unit.n_prompt, unit.n_gen)
        except EngineError as exc:
            m.errors.append(str(exc))
            broken.add(m.config)
            return
        if timed:
            m.pp.append(res.pp_tok_s)
            m.tg.append(res.tg_tok_s)

    for m in found:
        request(m, timed=False)
    for r in range(unit.repeats):
        for m in found:
            if m.config not in broken:
                request(m, timed=True)
            advance(f"{m.config} {unit.model} r{r + 1}")
    return found


def _judge(pipe: Pipeline, p: Platform, r: Rule, measured: dict[tuple[str, Unit], Measurement],
           problems: dict[str, list[Failure]], out: Path, seconds: float) -> dict[str, Any]:
    """Judge rule ``r``, write its log, record its step (``seconds``: its unit's measuring time); returns
    its bench.json record."""
    rule = r.rule
    ref, cand = measured.get((r.reference, r.unit)), measured.get((rule.candidate, r.unit))
    log = out / f"{r.group}.{rule.candidate}.{rule.metric}.log"
    record: dict[str, Any] = {"group": r.group, "reference": r.reference, "candidate": rule.candidate,
                              "metric": rule.metric, "model": r.unit.model, "min_ratio": rule.min_ratio,
                              "factor": rule.factor, "p_max": rule.p_max}
    lines = [f"speed rule of group {r.group} on {p.name}: {rule.candidate} {rule.metric} tok/s at least "
             f"{rule.min_ratio:g}x {r.reference}'s; a slowdown counts below {rule.min_ratio / (1 + rule.factor):.3g}x "
             f"with one-sided Mann-Whitney U p <= {rule.p_max:g}",
             f"model {r.unit.model}, {r.unit.n_prompt} prompt tokens and {r.unit.n_gen} generated per request, "
             f"{r.unit.repeats} rounds interleaved"]
    failures = [f for c in dict.fromkeys((r.reference, rule.candidate)) for f in problems.get(c, [])]
    for side, m in (("reference", ref), ("candidate", cand)):
        if m is not None:
            lines.append(f"{side} {m.config}: {rule.metric} tok/s {', '.join(f'{x:.2f}' for x in getattr(m, rule.metric))}")
            failures += [Failure("exception", model=r.unit.model, message=f"{m.config}: {e}") for e in m.errors]
    samples = [getattr(m, rule.metric) if m else [] for m in (ref, cand)]
    if failures or min(len(s) for s in samples) < r.unit.repeats:
        status = "error"
        detail = "; ".join(dict.fromkeys(f.text() for f in failures)) or "too few samples"
        detail = f"{rule.metric} not measured ({r.unit.model}): {detail}"
    else:
        verdict = judge(samples[0], samples[1], rule.min_ratio, rule.factor, rule.p_max)
        status = "failed" if verdict.regressed else "passed"
        what = "slowdown" if verdict.regressed else "no slowdown by the rule"
        detail = f"{rule.metric} {r.unit.model}: {what}: {verdict.describe()} vs {r.reference}"
        record.update(ratio=verdict.ratio, threshold=verdict.threshold, p_value=verdict.p_value,
                      reference_spread=asdict(verdict.reference), candidate_spread=asdict(verdict.candidate))
    lines.append(f"{status}: {detail}")
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    record.update(status=status, detail=detail)
    pipe.run.record_step(StepRecord(p.name, rule.candidate, step_name(r.group, rule.metric), status,
                                    round(seconds, 1), detail, pipe.run.layout.relative(log),
                                    failures))
    return record
