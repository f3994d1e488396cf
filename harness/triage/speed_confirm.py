"""``triage --confirm``: a suspect speed change re-measured with both runs' builds, interleaved, on this machine.

A suspect (harness.triage.speed_diff) is a configuration whose tok/s fell past the factor between
two runs while no within-run ratio can tell a slower build from a slower machine.  As airspeed
velocity's ``asv continuous`` does for two commits, the two builds are then measured side by side:
one resident engine per build (run A's and run B's build of the configuration's variant, the
configuration's own ``args`` and ``env``), timed in interleaved rounds by the speed stage's own
measurement (harness.stages.speed.speed: one untimed warm-up request each, then rounds A B, B A, ...),
and B's samples are judged against A's by the slowdown rule (harness.common.statistics).  A
slowdown by the rule is **confirmed**; anything else clears the suspect.

The builds: a run records each build's key in its ``build`` step (``built in 215 s (key …)``); a
build directory ``<work>/<variant>/build-<platform>`` whose stamp (``harness-build.json``) holds that
key is that run's build.  Run A's build is usually gone (the directory was rebuilt for run B's
series); ``--a-work-dir`` names another work directory that still holds it.  Rebuilding run A's
series from its record is not done: a run records its patches' names and digests, not their text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..common.errors import InputError
from ..matrix.config import Generation, Matrix
from ..matrix.platforms import executable_suffix
from ..common.statuses import STEP_PASSED
from ..record.summary import read_run
from ..stages.building.engine_target import ENGINE_TARGET
from ..stages.outputs.engine import EngineError, EngineSession, engine_argv
from ..stages.speed.speed import Measurement, Unit, interleave, process_medians
from .speed_diff import SpeedChange
from ..common.statistics import MIN_SAMPLES, WITHIN_ROUND, judge

#: A build step's detail names its key so (harness.stages.building.build): ``built in 215 s (key d30508219794aa37)``.
BUILD_KEY = re.compile(r"\(key ([0-9a-f]{16})\)")


class ConfirmError(InputError):
    """A suspect cannot be re-measured: a build that is gone, a platform this machine does not run natively."""


@dataclass(frozen=True)
class Engine:
    """How to start one side's engine: the full command and the environment added to this process's."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


@dataclass
class Confirmation:
    """A suspect re-measured: tok/s medians of run A's build (``a_median``) and run B's (``b_median``), measured
    now and interleaved, ``ratio`` B over A (the median of within-round ratios) against ``threshold``, the rank
    test's ``p_value`` against ``p_max``; ``confirmed``: B's build slower by the rule."""

    platform: str
    config: str
    model: str
    metric: str
    a_median: float
    b_median: float
    ratio: float
    threshold: float
    p_value: float
    p_max: float
    confirmed: bool


def recorded_build_key(run_dir: Path, platform: str, variant: str) -> str | None:
    """The key of ``variant``'s build of ``platform`` that run ``run_dir`` used (its ``build`` step's detail),
    None when the run has no such passed step."""
    step = read_run(run_dir).steps_by_key().get((platform, variant, "build"))
    if step is None or step.status != STEP_PASSED:
        return None
    found = BUILD_KEY.search(step.detail)
    return found.group(1) if found else None


def build_holding(work_dirs: Sequence[Path], platform: str, variant: str, key: str) -> Path | None:
    """The build directory ``<work>/<variant>/build-<platform>`` of the first of ``work_dirs`` whose stamp holds
    ``key``, None when none does."""
    for work in work_dirs:
        build_dir = work / variant / f"build-{platform}"
        try:
            stamp = json.loads((build_dir / "harness-build.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if stamp.get("key") == key:
            return build_dir
    return None


def engines_from_builds(matrix: Matrix, a: Path, b: Path, a_work: Sequence[Path], b_work: Sequence[Path],
                        model_path: Callable[[str], Path]) -> Callable[[SpeedChange, str], Engine]:
    """A function giving the engine of run ``a``'s (side "A") or run ``b``'s (side "B") build for a suspect.

    Raises ConfirmError (when called) for a configuration the matrix does not know, a platform with an
    emulator or another OS (not measured here), and a run whose build is not in its work directories,
    naming the key it needs and where it looked.
    """
    def engine(change: SpeedChange, side: str) -> Engine:
        config = matrix.configs.get(change.config)
        if config is None:
            raise ConfirmError(f"{change.config}: not a configuration of {matrix.path}")
        p = matrix.platform(change.platform)
        if p.cross is not None:
            raise ConfirmError(f"{change.platform}: runs under an emulator; --confirm measures native platforms only")
        run, works = (a, a_work) if side == "A" else (b, b_work)
        key = recorded_build_key(run, p.name, config.build)
        if key is None:
            raise ConfirmError(f"{run.name}: no passed {config.build} build of {p.name} with a key in its summary")
        build_dir = build_holding(works, p.name, config.build, key)
        if build_dir is None:
            looked = ", ".join(str(w / config.build / f"build-{p.name}") for w in works)
            raise ConfirmError(f"run {run.name}'s {config.build} build of {p.name} (key {key}) is gone: not in "
                               f"{looked}; name a work directory that holds it with --{side.lower()}-work-dir "
                               "(triage does not rebuild a run's series)")
        gen = Generation(n_predict=matrix.generation.n_predict, repeats=1, seed=matrix.generation.seed,
                         ctx_size=max(matrix.generation.ctx_size, (change.n_prompt or 0) + (change.n_gen or 0)),
                         timeout_s=matrix.generation.timeout_s)
        binary = build_dir / "bin" / f"{ENGINE_TARGET}{executable_suffix(p)}"
        return Engine(tuple(engine_argv(binary, model_path(change.model), gen, config.args)), dict(config.env))

    return engine


def remeasure(engines: Mapping[str, Engine], unit: Unit, out_dir: Path, timeout_s: float) -> dict[str, Measurement]:
    """Time both sides of ``engines`` (side label -> Engine) by the speed stage's measurement: ``unit.processes``
    process pairs one after the other, each starting one engine per side, timing ``unit.repeats`` interleaved
    rounds (harness.stages.speed.speed.interleave, the order reversed every other process) and closing them;
    with several processes a side's samples are its processes' medians (harness.stages.speed.speed.process_medians).

    stderr and the command of each go to ``out_dir`` (``<side>.stderr``, ``<side>.cmd``).  ``timeout_s``
    bounds the model load and each request.  Returns side -> Measurement.  Raises EngineError or OSError
    when an engine does not start; a request that fails is in its Measurement's ``errors``.
    """
    sides = list(engines)
    per_process: list[list[Measurement]] = []
    for k in range(max(1, unit.processes)):
        sessions: dict[str, EngineSession] = {}
        try:
            for side, e in engines.items():
                sessions[side] = EngineSession(e.argv, e.env, out_dir / f"{side}.stderr", out_dir / f"{side}.cmd",
                                               load_timeout_s=timeout_s, request_timeout_s=timeout_s)
            order = sides if k % 2 == 0 else sides[::-1]
            per_process.append(interleave(sessions, order, unit, lambda what: None))
        finally:
            for s in sessions.values():
                s.close()
    found = per_process[0] if unit.processes <= 1 else process_medians(tuple(sides), unit, per_process)
    return {m.config: m for m in found}


def confirm(suspects: Sequence[SpeedChange], engine: Callable[[SpeedChange, str], Engine], out_dir: Path,
            repeats: int, factor: float, timeout_s: float = 300.0) -> list[Confirmation]:
    """Re-measure each suspect with both runs' builds (``engine(change, "A"|"B")``) and judge them.

    One interleaved measurement per platform, configuration, model and tokens (both metrics of it at
    once), ``repeats`` rounds; B's samples against A's by the slowdown rule with the factor the suspect
    was found with (a speed rule's own where triage used it: a re-measurement judged tighter than the
    runs were would confirm the noise that rule allows), else ``factor``, and the suspect's ``p_max``.
    Logs go to ``out_dir/<platform>.<config>.<model>/``.  Returns one Confirmation per suspect.  Raises
    ConfirmError as ``engine`` does, and when a side gives fewer than MIN_SAMPLES samples (its errors
    named) or an engine does not start.
    """
    out: list[Confirmation] = []
    measured: dict[tuple, dict[str, Measurement]] = {}
    for c in suspects:
        key = (c.platform, c.config, c.model, c.n_prompt, c.n_gen)
        if key not in measured:
            unit = Unit(c.model, int(c.n_prompt or 0), int(c.n_gen or 0), repeats, processes=c.processes)
            logs = out_dir / f"{c.platform}.{c.config}.{c.model}"
            try:
                measured[key] = remeasure({side: engine(c, side) for side in ("A", "B")}, unit, logs, timeout_s)
            except (EngineError, OSError) as exc:
                raise ConfirmError(f"{c.platform} {c.config} {c.model}: an engine did not start: {exc} "
                                   f"(stderr in {logs})") from None
        sides = measured[key]
        xa, xb = getattr(sides["A"], c.metric), getattr(sides["B"], c.metric)
        if min(len(xa), len(xb)) < MIN_SAMPLES:
            errors = "; ".join(sides["A"].errors + sides["B"].errors) or "too few samples"
            raise ConfirmError(f"{c.platform} {c.config} {c.model} {c.metric}: not re-measured: {errors}")
        v = judge(xa, xb, 1.0, factor if c.factor is None else c.factor, c.p_max, paired=True)
        out.append(Confirmation(c.platform, c.config, c.model, c.metric, v.reference.median, v.candidate.median,
                                v.ratio, v.threshold, v.p_value, v.p_max, v.regressed))
    return out


def describe(c: Confirmation) -> str:
    """One line: the suspect, both builds' medians measured now, the verdict."""
    what = "CONFIRMED: run B's build is slower" if c.confirmed else "cleared: not slower by the rule"
    return (f"  {c.platform}  {c.config} {c.model} {c.metric}: run A's build {c.a_median:.1f}, run B's "
            f"{c.b_median:.1f} tok/s, interleaved here ({WITHIN_ROUND} {c.ratio:.2f}x, fails below {c.threshold:.3g}x; "
            f"Mann-Whitney p {c.p_value:.2g}): {what}")
