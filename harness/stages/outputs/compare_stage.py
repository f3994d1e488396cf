"""The ``generate`` steps and the greedy comparisons of every selected platform (harness.stages.outputs.greedy).

Per platform: the comparison groups it runs (a group needing more GPUs than are visible is skipped
with the reason), every (group, model) job through one GreedyRunner (one engine load per configuration
and model), each model's comparisons recorded as soon as they are decided, then one ``generate`` step
per configuration.  Before any generation, what cannot run is refused (harness.stages.outputs.refusals).
"""

from __future__ import annotations

import errno

import json
from dataclasses import asdict
from typing import Sequence

from ...matrix.config import Platform
from ...common.jobserver import available_cores
from ...kinds.registry import gpu_of, group_fits
from ...record.progress import describe_abort
from ...record.json_files import write_json
from ...record.records import Failure, StepRecord
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_INTERRUPTED, STEP_PASSED, STEP_SKIPPED
from ...record.verdict import count_text, failing_names, judge
from ..shape import Context, Stage, StepSpec
from .greedy import GreedyRunner, Side, lanes_for
from .jobs import jobs_of, record_job
from .refusals import refuse_what_cannot_run


def run_compare(ctx: Context) -> None:
    """Run every comparison group of each selected platform and record per-prompt outcomes.

    Groups needing more GPUs than are visible are skipped with the reason.
    Jobs (group x model) whose model, builds or emulator are missing are
    recorded as failures of their configurations' ``generate`` steps; the
    rest run through ``GreedyRunner`` (one engine load per configuration and
    model), each model's comparisons recorded as soon as they are decided.
    The configurations that generated on each platform are left in ``ctx.generated`` for the
    checks after this stage (harness.stages.checks).
    Where the time went is written to ``<platform>/compare-timing.json``.
    """
    chosen = ctx.platforms("compare-outputs")
    refuse_what_cannot_run(ctx, chosen)
    for p in chosen:
        groups = ctx.selection.group_names(p.name)
        gen_steps: dict[str, list[Failure]] = {}
        visible = gpu_of(p).visible()
        runnable = []
        for gname in groups:
            why = group_fits(p, ctx.matrix.groups[gname], visible)
            if why:
                ctx.run.record_step(StepRecord(p.name, gname, "compare-outputs", STEP_SKIPPED, detail=why))
                if ctx.selection.names_group(gname):
                    ctx.run.mark_incomplete(f"{p.name}: group {gname} skipped: {why}")
                ctx.say(f"[{p.name}] {gname}: skipped: {why}")
                continue
            runnable.append(gname)
        runner = run_groups(ctx, p, runnable, gen_steps)
        if not any(c.platform == p.name for c in ctx.run.comparisons) and not gen_steps:
            ctx.run.mark_incomplete(f"{p.name}: compare-outputs selected no comparison "
                                    f"(groups {', '.join(p.groups) or 'none'}; filters: "
                                    f"{ctx.selection.filters()})")
        record_generate_steps(ctx, p, runner, gen_steps)
        for config, per_model in ctx.sessions.placements.get(p.name, {}).items():
            write_json(ctx.run.layout.placement_json(p.name, config), per_model)
        ctx.generated[p.name] = list(gen_steps)
        t = runner.timing
        if t.sessions or t.completion_runs:
            write_json(ctx.run.layout.compare_timing_json(p.name),
                       {**asdict(t), "pure_generation": t.pure_generation,
                        "wall_over_pure_generation": t.wall / t.pure_generation if t.pure_generation else None})
            ctx.say(f"[{p.name}] compare-outputs: {t.wall:.1f} s wall, {t.pure_generation:.1f} s generating, "
                    f"{t.loads:.1f} s in {t.sessions} engine load(s) ({t.probes:.1f} s probing them), "
                    f"{t.engine_scoring:.1f} s scoring, "
                    f"{t.completion_runs} llama-completion runs")
        ctx.builds.write_environment(p)


def run_groups(ctx: Context, p: Platform, groups: Sequence[str], gen_steps: dict[str, list[Failure]]) -> GreedyRunner:
    """Run comparison groups ``groups`` on ``p`` through one GreedyRunner and record their comparisons.

    Failure facts of ``p``'s configurations land in ``gen_steps``; returns the
    runner (its timing, per-side seconds and runs feed the generate steps).  On
    an interrupt or exception the generate steps cut short are recorded first.
    """
    lanes, threads = lanes_for(gpu_of(p), ctx.opts.lanes, available_cores())
    runner = GreedyRunner(ctx.hooks(p), {k: v.text for k, v in ctx.matrix.prompts.items()},
                          ctx.opts.work_dir.resolve() / "tmp", ctx.opts.n_predict, ctx.opts.repeats, ctx.say,
                          text_check=p.text_check, cache=ctx.sessions.session_cache(), lanes=lanes, threads=threads)
    try:
        jobs = [job for gname in groups for job in jobs_of(ctx, p, gname, gen_steps)]
        runs = {(side, j.model, prompt): max(2, ctx.opts.repeats or j.generation.repeats)
                for j in jobs for side in (j.reference, *j.candidates, *j.upstream.values()) for prompt in j.prompts}
        total = sum(runs.values())  # each side runs once per model and prompt, whichever groups share it
        with ctx.console.step(f"[{p.name}] compare {', '.join(groups) or 'nothing'}", total=total) as shown:
            ctx.sessions.shown = shown
            try:
                runner.run(jobs, lambda res: record_job(ctx, p, res, runner.origins))
            finally:
                ctx.sessions.shown = None
            mine = [c for c in ctx.run.comparisons if c.platform == p.name and c.group in groups]
            counts: dict[str, int] = {}
            for c in mine:
                counts[c.status] = counts.get(c.status, 0) + 1
            # generation failures that upstream's build shares (unsupported upstream) are not the fork's
            fork_problems = any(not (f.kind == "generation" and (side, f.model, f.prompt) in runner.unsupported)
                                for side, facts in runner.problems.items() for f in facts)
            unmade = list(dict.fromkeys(f.text() for facts in gen_steps.values() for f in facts
                                        if f.kind in ("blocked", "model")))
            if not mine and unmade:  # nothing ran for want of a build or a model: not a pass
                shown.finish(STEP_ERROR, "did not run: " + "; ".join(unmade))
            elif not mine and not fork_problems:  # the selection left nothing to compare: not a pass either
                shown.finish(STEP_SKIPPED, "no comparison selected")
            else:
                rows = judge((), mine)
                names = failing_names(rows)
                outcomes = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                shown.finish(STEP_FAILED if names or fork_problems else STEP_PASSED,
                             (f"{count_text(rows, 'comparison')} ({outcomes})" if mine else "no comparison ran")
                             + (f"; fails: {names}" if names else ""))
    except BaseException as exc:
        _merge_runner_failures(p, runner, gen_steps)
        _record_cut_generations(ctx, p, exc, runner, gen_steps)
        raise
    _merge_runner_failures(p, runner, gen_steps)
    return runner


def _merge_runner_failures(p: Platform, runner: GreedyRunner, gen_steps: dict[str, list[Failure]]) -> None:
    """Move the runner's failure facts of ``p``'s sides into ``gen_steps`` (another platform's reference
    records its own steps when that platform runs)."""
    for side, problems in runner.problems.items():
        if side.platform == p.name:
            gen_steps.setdefault(side.config, []).extend(problems)
    runner.problems.clear()


def record_generate_steps(ctx: Context, p: Platform, runner: GreedyRunner, gen_steps: dict[str, list[Failure]]) -> None:
    """Record one ``generate`` step per configuration of ``gen_steps`` (config -> failure facts).

    Seconds are the runner's wall time for the configuration's sessions and
    llama-completion runs.  The step failed when a fact exists, errored when
    every fact says nothing of the configuration could run (a model or a
    build missing) and no generation of it ran, else passed.  When only part
    of it failed, the detail starts with what did run ("partly failed:
    generations succeeded (model a); failed: ...") and keeps every fact.
    Failures that upstream's build shares in that mode make the step skipped.
    """
    for config, problems in gen_steps.items():
        side = Side(p.name, config)
        seconds = runner.side_seconds.get(side, 0.0)
        ran = runner.side_runs.get(side, 0)
        ok_models = sorted(runner.side_ok.get(side, set()))
        status = STEP_FAILED if problems else STEP_PASSED
        if problems and all(f.kind in ("model", "blocked") for f in problems) and not ran:
            status = STEP_ERROR  # nothing of this configuration could run
        unique = list({json.dumps(asdict(f), sort_keys=True): f for f in problems}.values())
        detail = "; ".join(dict.fromkeys(f.text() for f in unique)) or "all generations ran"
        if problems and ok_models:
            detail = (f"partly failed: generations succeeded (model{'s' if len(ok_models) > 1 else ''} "
                      f"{', '.join(ok_models)}); failed: {detail}")
        unsupported = {(m, pr) for s, m, pr in runner.unsupported if s == side}
        if problems and all(f.kind == "generation" and (f.model, f.prompt) in unsupported for f in problems):
            # every failed generation is a mode that upstream's build fails the same way: not a fork failure
            status, detail = STEP_SKIPPED, f"unsupported upstream: {detail}"
        origins = [r for (s, _), r in runner.origins.items() if s == side]
        if origins and not problems:
            detail = (f"{len(origins)} session(s) from the cache (run {', '.join(dict.fromkeys(origins))}); "
                      + detail)
        ctx.run.record_step(StepRecord(p.name, config, "generate", status, round(seconds, 1),
                                       detail=detail, failures=unique,
                                       cached=", ".join(dict.fromkeys(origins))))


def _record_cut_generations(ctx: Context, p: Platform, exc: BaseException, runner: GreedyRunner,
                            gen_steps: dict) -> None:
    """Record the generate steps of ``p`` that an interrupt or exception cut short, with what they did."""
    why = describe_abort(exc)
    # a full results disk also ends the engines writing their logs there: their crashes are its doing, not a
    # fork failure, and the step says it was cut short, with them named in its detail
    disk_full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    for config, problems in gen_steps.items():
        ran = runner.side_runs.get(Side(p.name, config), 0)
        status = STEP_FAILED if not disk_full and any(f.kind not in ("model", "blocked") for f in problems) \
            else STEP_INTERRUPTED
        texts = list(dict.fromkeys(f.text() for f in problems))
        detail = f"{why} after {ran} generation(s)" + "".join(f"; {t}" for t in texts)
        ctx.run.record_step(StepRecord(p.name, config, "generate", status, detail=detail, failures=problems))
        ctx.run.mark_incomplete(f"{p.name}: generate {config}: {why}; did not finish")
    # recorded here with their facts: record_unfinished must not replace them with a bare "interrupted"
    ctx.progress.forget(lambda d: not (d.platform == p.name and d.step == "generate" and d.config in gen_steps))


STAGE = Stage("compare", command="compare-outputs", role="outputs", reads=("matrix", "builds", "models"),
              writes=("steps", "comparisons", "files"),
              steps=(StepSpec("compare-outputs", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED)), StepSpec("generate", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "generations")), run=run_compare)
