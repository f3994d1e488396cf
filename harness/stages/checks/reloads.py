"""Reloads: a model loaded, probed and freed again in one process gives back what it took, and gets it again.

A server loads a model, frees it and loads it again in one process; a load that keeps a
registration past its free leaves page-locked memory behind, and the next load may get less.
For the pin configurations (harness.matrix.loading.reload_count) the comparisons ask an engine process of
their own to load, probe and free the model ``count`` times (harness.record.reloads).  Each
configuration so asked gets a step ``reloads``; per model and per load, after its free:

``freed``
    the driver reports no page-locked byte left in the freed host weight buffers (the same
    ranges asked again with ``cudaPointerGetAttributes``);
``baseline``
    the process's locked and pinned memory (VmLck, VmPin) are back where they were before the
    first load;
``grant``
    the load's host weight buffers were granted the page-locked bytes the first load's were
    (within one probe sample, 1 MiB, per buffer);
``memory``
    the process's resident memory is at most ``rss_slack_mib`` (matrix.yaml
    ``defaults.reloads``) above where it was before the first load.

``freed`` and ``grant`` need the driver's counts (CUDA builds); without them they are not
checked, and the step says so.  A missing record is ``incomplete``; an engine that failed the
request or died in it fails the step.  Each step writes ``<config>/reloads.json`` (the findings
with stable keys) and ``reloads.log``; a failed one gets a signature of kind ``reload``
(harness.triage.signatures).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Iterable

from ...matrix.config import Matrix, Platform, RunConfig
from ...record.probe import PROBE_STEP_BYTES
from ...record.reloads import RELOADS_FILE, RELOADS_LOG, ReloadError, Reloads, read_reloads
from ...record.json_files import write_json
from ...record.layout import RunLayout
from ...record.records import Failure, StepRecord
from .checks import CheckContext, check_stage
from .expectation_probe import mib
from .expectation_rules import Finding
from ...matrix.loading import reload_count
from ...common.statuses import STEP_FAILED, STEP_INCOMPLETE, STEP_PASSED, STEP_SKIPPED
from ...record.expectations import FINDING_FAILED, FINDING_INCOMPLETE, FINDING_PASSED

#: The step every configuration asked to reload gets.
STEP_NAME = "reloads"
#: The rules, in the order they are reported.
RULES = ("freed", "baseline", "grant", "memory")


def judge(record: Reloads, rss_slack_bytes: int) -> list[Finding]:
    """The findings of one reload record (see the module): per rule the first load that breaks it (failed), else
    one passed or not-checked finding.  ``rss_slack_bytes``: the ``memory`` rule's bound."""
    base = record.baseline
    out: list[Finding] = []
    cycles = list(enumerate(record.cycles, 1))
    if not cycles:
        return [Finding("freed", FINDING_INCOMPLETE, "no load in the record", "the reload record holds no load")]
    first = record.cycles[0]
    if record.driver is None:
        out.append(Finding("freed", FINDING_PASSED, "not checked",
                           "not checked: no driver counts (a build without its GPU kind's probe)"))
        out.append(Finding("grant", FINDING_PASSED, "not checked",
                           "not checked: no driver counts (a build without its GPU kind's probe)"))
    else:
        left = next(((k, c) for k, c in cycles if c.left), None)
        if left:
            k, c = left
            types = sorted({b.buffer_type for b in c.buffers if b.host and b.page_locked_after_free})
            out.append(Finding("freed", FINDING_FAILED, "page-locked bytes left in freed host buffers",
                                f"after the free of load {k} of {len(cycles)} the driver reports {mib(c.left)} page-locked "
                                f"in the freed {', '.join(types)} buffer(s) (granted {mib(c.granted)} while loaded)"))
        else:
            out.append(Finding("freed", FINDING_PASSED, "as expected",
                                f"no page-locked byte left in the freed host buffers after {len(cycles)} load(s) "
                                f"(granted {mib(first.granted)} each time it was asked)"))
        n_host = max(1, sum(1 for b in first.buffers if b.host))
        other = next(((k, c) for k, c in cycles if abs(c.granted - first.granted) > n_host * PROBE_STEP_BYTES), None)
        if other:
            k, c = other
            rel = "less" if c.granted < first.granted else "more"
            out.append(Finding("grant", FINDING_FAILED, f"a later load was granted {rel} than the first",
                                f"load {k} of {len(cycles)} was granted {mib(c.granted)} page-locked, the first "
                                f"{mib(first.granted)} (the driver)"))
        else:
            out.append(Finding("grant", FINDING_PASSED, "as expected",
                                f"every load granted {mib(first.granted)} page-locked (the driver)"))
    for field, name in (("locked", "VmLck"), ("pinned", "VmPin")):
        if getattr(base, field) is None:
            continue
        moved = next(((k, c) for k, c in cycles if getattr(c.freed, field) != getattr(base, field)), None)
        if moved:
            k, c = moved
            out.append(Finding("baseline", FINDING_FAILED, f"{name} not back at its baseline after a free",
                                f"after the free of load {k} {name} is {mib(getattr(c.freed, field) or 0)}, "
                                f"{mib(getattr(base, field))} before the first load"))
    if not any(f.rule == "baseline" for f in out):
        said = [n for f, n in (("locked", "VmLck"), ("pinned", "VmPin")) if getattr(base, f) is not None]
        out.append(Finding("baseline", FINDING_PASSED, "as expected" if said else "not checked",
                            f"{' and '.join(said)} back at the baseline after every free" if said
                            else "not checked: the OS reports no locked or pinned memory (Windows)"))
    if base.rss is None:
        out.append(Finding("memory", FINDING_PASSED, "not checked", "not checked: no resident memory reading"))
    else:
        grown = next(((k, c) for k, c in cycles if c.freed.rss is not None and c.freed.rss - base.rss > rss_slack_bytes),
                     None)
        worst = max((c.freed.rss or 0) - base.rss for c in record.cycles)
        if grown:
            k, c = grown
            out.append(Finding("memory", FINDING_FAILED, "resident memory not given back after a free",
                                f"after the free of load {k} the process holds {mib((c.freed.rss or 0) - base.rss)} more "
                                f"resident memory than before the first load, above the bound of {mib(rss_slack_bytes)} "
                                f"(while loaded: {mib((c.loaded.rss or 0) - base.rss)} more)"))
        else:
            out.append(Finding("memory", FINDING_PASSED, "as expected",
                                f"resident memory after each free at most {mib(max(worst, 0))} above the baseline "
                                f"(bound {mib(rss_slack_bytes)})"))
    return sorted(out, key=lambda f: RULES.index(f.rule))


def check_config(layout: RunLayout, matrix: Matrix, platform: Platform, config: RunConfig,
                 generate: StepRecord) -> StepRecord:
    """The ``reloads`` step of ``config`` on ``platform``: every model the generate step reached, judged from its
    reload record; writes ``reloads.json`` and ``reloads.log`` beside the configuration's records."""
    out_dir = layout.config(platform.name, config.name)
    failed_models = {f.model for f in generate.failures if f.kind in ("generation", "model")}
    models = sorted(p.name for p in (out_dir / "gen").iterdir() if p.is_dir()) if (out_dir / "gen").is_dir() else []
    slack = matrix.reloads.rss_slack_mib * 2**20
    record: dict[str, list[dict]] = {}
    failures: list[Failure] = []
    incomplete: list[str] = []
    lines: list[str] = []
    for model in models:
        path = layout.gen_dir(platform.name, config.name, model) / RELOADS_FILE
        try:
            findings = judge(read_reloads(path), slack)
        except ReloadError as exc:
            if not exc.engine_failed and model in failed_models:
                continue  # the generation's failure is in the generate step
            status = FINDING_FAILED if exc.engine_failed else FINDING_INCOMPLETE
            findings = [Finding("freed", status, "the engine failed the reloads" if exc.engine_failed else "no record",
                                 str(exc))]
        record[model] = [asdict(f) for f in findings]
        for f in findings:
            lines.append(f"{model}: {f.rule}: {f.status}: {f.message}")
            if f.status == FINDING_FAILED:
                failures.append(Failure("expectation", model=model, status=f.rule, message=f.message,
                                        log=layout.relative(path.with_name(RELOADS_LOG))))
            elif f.status == FINDING_INCOMPLETE:
                incomplete.append(f"{model}: {f.message}")
    if failures:
        status, detail = STEP_FAILED, "; ".join(f.text() for f in failures)
    elif incomplete:
        status, detail = STEP_INCOMPLETE, "; ".join(incomplete)
    elif record:
        status = STEP_PASSED
        detail = f"{', '.join(RULES)} as expected on {len(record)} model(s)" if not any(
            f["key"] == "not checked" for fs in record.values() for f in fs) else \
            f"passed on {len(record)} model(s); " + "; ".join(dict.fromkeys(
                f"{f['rule']} {f['message']}" for fs in record.values() for f in fs if f["key"] == "not checked"))
    else:
        status, detail = STEP_SKIPPED, "no model of this configuration generated"
    write_json(layout.reloads_json(platform.name, config.name), {"config": config.name, "platform": platform.name,
                                                                 "status": status, "models": record})
    log = layout.reloads_log(platform.name, config.name)
    log.write_text("\n".join(lines + [f"status: {status}: {detail}"]) + "\n", encoding="utf-8")
    return StepRecord(platform.name, config.name, STEP_NAME, status, 0.0, detail, layout.relative(log), failures)


def check(ctx: CheckContext) -> Iterable[StepRecord]:
    """The ``reloads`` step of every configuration of ``ctx.configs`` that generated on ``ctx.platform`` and is
    asked to reload (harness.matrix.loading.reload_count; a check of harness.stages.checks.checks)."""
    for name in ctx.configs:
        config = ctx.matrix.configs.get(name)
        generate = ctx.run.step(ctx.platform.name, name, "generate")
        if config is None or generate is None or not reload_count(ctx.matrix, ctx.platform, config):
            continue
        if generate.status == STEP_SKIPPED:
            yield StepRecord(ctx.platform.name, name, STEP_NAME, STEP_SKIPPED, detail=f"generate step skipped: {generate.detail}")
            continue
        yield check_config(ctx.run.layout, ctx.matrix, ctx.platform, config, generate)


#: The check as a stage of compare-outputs (harness.stages.checks.checks.check_stage).
STAGE = check_stage(STEP_NAME, check, "reloads")
