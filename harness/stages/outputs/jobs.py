"""The comparisons' jobs: one per (group, model) that can run on a platform, and how a finished job is recorded.

A job names its reference and candidates as sides (a configuration on a platform; a cross-platform
group's reference on another), the upstream configuration that runs a fork candidate's mode, and the
model file.  What keeps a job from running (its model, a build, the emulator) is a failure fact of its
configurations' generate steps instead.
"""

from __future__ import annotations

from typing import Mapping

from ...common.errors import EnvironmentProblem
from ...matrix.config import Platform
from ...matrix.models import model_summary
from ...matrix.platforms import cannot_run
from ...record.compare import record_compare_entries
from ...record.json_files import write_json
from ...record.records import ComparisonRecord, Failure
from ..building.source import raise_storage_problem
from ..shape import Context
from .compare import to_json
from .greedy import Job, JobResult, Side
from ...common.statuses import STEP_PASSED


def _upstream_of(ctx: Context, reference: str, candidate: str) -> str | None:
    """The upstream configuration that runs ``candidate``'s mode: the reference when it is upstream's build
    and the candidate the fork's, else the candidate's ``upstream`` key; None when there is none."""
    ref, cand = ctx.matrix.configs[reference], ctx.matrix.configs[candidate]
    if cand.build != "fork":
        return None
    return reference if ref.build == "base" else cand.upstream


def jobs_of(ctx: Context, p: Platform, gname: str, gen_steps: dict[str, list[Failure]]) -> list[Job]:
    """The runnable (group, model) jobs of group ``gname`` on ``p``; others recorded as failures in ``gen_steps``.

    The reference runs on ``group.reference_platform`` when set (a cross-platform group,
    its reference named ``<config>@<platform>``); that platform must be runnable here.
    """
    group = ctx.matrix.groups[gname]
    ref_p = ctx.matrix.platform(group.reference_platform) if group.reference_platform else p
    ref_label = group.reference if ref_p is p else f"{group.reference}@{ref_p.name}"
    why = cannot_run(ref_p) if ref_p is not p else None
    try:
        ctx.emulator(p)
        ctx.emulator(ref_p)
    except RuntimeError as exc:
        why = str(exc)
    if why:
        fact = Failure("exception", message=f"{gname}: {why}")
        for c in (ref_label, *group.candidates):
            gen_steps.setdefault(c, []).append(fact)
        ctx.say(f"[{p.name}] {gname}: error: {why}")
        return []
    upstream = {c: u for c in group.candidates if ref_p is p and (u := _upstream_of(ctx, group.reference, c))}
    jobs = []
    models = ctx.selection.model_names(gname)
    for model in models:
        try:
            model_path = ctx.model_path(model)
            write_json(ctx.run.layout.model_json(p.name, model),
                       {"path": model_path, **model_summary(model_path)})
        except EnvironmentProblem:
            raise  # the machine's, not the fork's: the run stops, exit 2 (harness.pipeline)
        except Exception as exc:
            raise_storage_problem(exc, ctx.opts.work_dir)
            fact = Failure("model", model=model, message=f"{type(exc).__name__}: {exc}")
            for c in (group.reference, *group.candidates):
                gen_steps.setdefault(c, []).append(fact)
            ctx.say(f"[{p.name}] {gname}: error: {fact.text()}")
            continue
        on = {ref_p.name: ref_p, p.name: p}  # platforms hold dicts: keyed by name, not hashed
        needed = {(ref_p.name, ctx.matrix.configs[group.reference].build)}
        needed |= {(p.name, ctx.matrix.configs[c].build) for c in (*group.candidates, *upstream.values())}
        broken = sorted(v if q == p.name else f"{v}@{q}"
                        for q, v in needed if ctx.build_variant(on[q], v).status != STEP_PASSED)
        if broken:
            for c in (ref_label, *group.candidates):
                gen_steps.setdefault(c, []).extend(Failure("blocked", build=v) for v in broken)
            continue
        for c in (*([group.reference] if ref_p is p else []), *group.candidates, *upstream.values()):
            gen_steps.setdefault(c, [])
        jobs.append(Job(group=gname, model=model, model_path=model_path,
                        reference=Side(ref_p.name, group.reference),
                        candidates=tuple(Side(p.name, c) for c in group.candidates), prompts=group.prompts,
                        generation=group.generation, comparison=group.comparison, label=ref_label,
                        expect=group.expect, upstream={c: Side(p.name, u) for c, u in upstream.items()}))
    return jobs


def record_job(ctx: Context, p: Platform, res: JobResult, origins: Mapping[tuple[Side, str], str]) -> None:
    """Record a job's comparisons in the summary and in each candidate's compare.json; ``origins``: the
    runs that sides restored from the result cache came from."""
    job = res.job
    records = []
    for pc in res.comparisons:
        entry = to_json(pc) | {"group": job.group, "model": job.model}
        cached = {label: origins[(side, job.model)]
                  for label, side in ((job.label, job.reference), (pc.candidate, Side(p.name, pc.candidate)))
                  if (side, job.model) in origins}
        rec = ComparisonRecord(p.name, job.group, job.model, pc.prompt_id, job.label, pc.candidate, pc.status,
                               entry["first_divergence"], pc.detail, list(pc.nondeterministic),
                               kl=entry["kl"], text_check=entry["text_check"],
                               kl_mean_max=job.comparison.kl_mean_max, expected=job.expect, cached=cached)
        records.append(rec)
        ctx.say(f"[{p.name}] {job.group} {job.model} {pc.prompt_id}: {pc.candidate} vs {job.label}: {pc.detail}")
        record_compare_entries(ctx.run.layout.compare_json(p.name, pc.candidate), job.group, job.model, pc.prompt_id,
                               [entry])
    ctx.run.record_comparisons(records)  # recorded per model at once: an interrupt keeps them
