"""Expectations: what each configuration must do beyond its tokens, checked in every run from its records.

The fork exists so that expert tensors in host memory are page-locked; a silent fallback
to pageable ``CPU`` buffers leaves every greedy token unchanged.  So every load of a
configuration's model (the engine's and each llama-completion run's stderr, which
harness.record.gpu parses into ``*.placement.json`` and ``*.pin-ladder.json``) is checked
against four rules:

``placement``
    which buffer type holds the expert tensors, per layer range.  llama logs one line per
    model buffer (``load_tensors:    CUDA_Host model buffer size =  4733.00 MiB``) named
    after the buffer actually allocated, so a host buffer that fell back to plain memory
    shows as ``CPU``.  The experts' bytes per layer come from the model file
    (``<platform>/models/<model>.json``, harness.matrix.models.model_summary): the buffer
    types expected for a layer range must hold at least those bytes, and no buffer type
    may hold more expert bytes than it is expected to plus every non-expert byte of the
    model.
``weights``
    every model buffer's type is one of a list (on the CPU platform ``CPU_Mapped`` when
    the model is memory-mapped: a silent loss of mmap makes it ``CPU``).
``pinned``
    the fraction of the experts' bytes that is page-locked, measured against the experts'
    size, not against what was requested: a model buffer with no pin-ladder record never
    asked to be pinned and counts as pageable.  Of a buffer of S bytes, X of them experts,
    whose allocation was granted G page-locked bytes, at least ``max(0, G - (S - X))``
    expert bytes are page-locked (the rest of the buffer can take up at most S - X of
    them); the fraction is the sum over the model buffers divided by the experts' bytes.
``warnings``
    warnings that must appear and warnings that must not (:data:`WARNINGS`).

A configuration declares rules in matrix.yaml (``configs.<name>.expectations``, schema
``#/$defs/expectations``); every rule it leaves out gets the default of
:func:`default_expectations`, derived from its build, ``env``, ``args`` and the platform
(docs/checks.md states the rule).  Each configuration that generated gets a step
``expectations`` with its own status, detail, log (``<config>/expectations.log``) and
record (``<config>/expectations.json``); harness.triage.signatures gives a failed one
its signature, e.g. ``placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 in
CPU (4733 MiB), expected CUDA_Host``.  A record that is missing or cannot be read makes
the step ``incomplete``, never ``passed``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from ...matrix.config import Platform, RunConfig
from ...record.expectations import EXPECTATIONS_STEP, FINDING_FAILED, FINDING_INCOMPLETE, FINDING_PASSED
from ...record.probe import PROBE_FILE, Probe, ProbeError, read_probe
from ...record.inputs import read_model_record
from ...record.loads import PinLadder, read_pin_ladder, read_placement
from ...record.json_files import write_json
from ...record.layout import RunLayout
from ...record.records import Failure, RecordError, StepRecord
from .expectation_load import LOGGED_MIB_TOLERANCE_BYTES, Finding, check_load
from .expectation_rules import (RULES, WARNINGS, Expectations, default_expectations, expectations_for, pin_layers,
                                rule_on, uses_mmap)
from .checks import CheckContext, check_stage
from ...common.statuses import STEP_FAILED, STEP_INCOMPLETE, STEP_PASSED, STEP_SKIPPED

__all__ = ["STEP_NAME", "STAGE", "RULES", "WARNINGS", "LOGGED_MIB_TOLERANCE_BYTES", "Expectations", "check",
           "check_config", "check_load", "default_expectations", "expectations_for", "pin_layers", "uses_mmap"]

#: The step every configuration that generated gets.
STEP_NAME = EXPECTATIONS_STEP

T = TypeVar("T")


# --------------------------------------------------------------------------- the step


def _read(reader: Callable[[Path], T], path: Path) -> tuple[T | None, str]:
    """(the record ``reader`` reads at ``path``, "") or (None, why it cannot be read, naming the file by its
    name: the expectations record holds no absolute path)."""
    try:
        return reader(path), ""
    except FileNotFoundError:
        return None, f"{path.name} missing"
    except RecordError as exc:
        return None, f"{path.name} {exc.reason}"


#: A prompt of :func:`_failed_generations` that stands for every generation of its model (a model that failed
#: to load or to be obtained names no prompt).
EVERY_PROMPT = ""


def _failed_generations(step: StepRecord | None) -> dict[str, set[str]]:
    """Model -> the prompts whose generations the configuration's generate step records as failed (a crash, a
    time limit; :data:`EVERY_PROMPT` where the failure names no prompt).  The records of those loads say
    nothing about placement: the generate step holds that failure; the model's other prompts are checked."""
    if step is None:
        return {}
    out: dict[str, set[str]] = {}
    for f in step.failures:
        if f.model:
            out.setdefault(f.model, set()).add(f.prompt or EVERY_PROMPT)
    return out


def _left_to_generate(failed: dict[str, set[str]], model: str, stem: str) -> bool:
    """Whether the load ``stem`` of ``model`` (``engine`` or ``<prompt>.r<k>``) belongs to a failed generation:
    every load of a model whose failure names no prompt, a llama-completion load of a failed prompt."""
    prompts = failed.get(model, set())
    return EVERY_PROMPT in prompts or (stem != "engine" and stem.rsplit(".r", 1)[0] in prompts)


def check_config(layout: RunLayout, platform: Platform, config: RunConfig,
                 generate: StepRecord | None) -> StepRecord:
    """The ``expectations`` step of ``config`` on ``platform``: every load under ``<config>/gen/<model>/``
    (one per ``.stderr`` file) checked with :func:`check_load`; writes ``<config>/expectations.json``
    (rules, their origin, per load the facts and findings) and ``<config>/expectations.log``.

    Status: ``failed`` when a rule failed on a load; else ``incomplete`` when a record a rule needs is
    missing or unreadable (a load whose stderr has no placement record, a model summary missing) on a
    load that is not a failed generation's; else ``passed`` when something was checked; ``skipped`` when
    every load belongs to a failed generation or nothing is checked.  A failed generation (a crashed prompt)
    leaves out only its own loads: the model's other prompts, and the engine's load where it was recorded,
    are checked.  ``failures`` hold one
    ``expectation`` fact per failed rule and model.
    """
    failed = _failed_generations(generate)
    loads: list[dict[str, Any]] = []
    rules: dict[str, dict[str, Any]] = {}
    probes: dict[str, tuple[Probe | None, str]] = {}
    for model, stem, stderr in layout.load_logs(platform.name, config.name):
        entry: dict[str, Any] = {"model": model, "load": stem, "log": layout.relative(stderr), "findings": []}
        loads.append(entry)
        if _left_to_generate(failed, model, stem):
            entry["skipped"] = "a generation of this model failed (see the generate step)"
            continue
        model_record, why = _read(read_model_record, layout.model_json(platform.name, model))
        if model_record is None and model in failed:
            entry["skipped"] = f"a generation of this model failed before its summary was recorded: {why}"
            continue
        if model_record is None:
            entry["findings"].append(asdict(Finding("records", FINDING_INCOMPLETE, "model summary missing",
                                                    f"model summary: {why}")))
            continue
        try:
            summary = model_record.summary
            exp = expectations_for(platform, config, summary)
        except ValueError as exc:
            entry["findings"].append(asdict(Finding("records", FINDING_INCOMPLETE, "expectations unreadable", str(exc))))
            continue
        rules.setdefault(model, _describe_rules(exp))
        if not any(rule_on(exp, r) for r in RULES):
            entry["skipped"] = "no rule holds for this configuration"
            continue
        placement, why = _read(read_placement, layout.load_file(platform.name, config.name, model, stem, "placement"))
        if placement is None and model in failed:  # the engine ended in a failed prompt before it logged its load
            entry["skipped"] = f"a generation of this model failed before this load was recorded: {why}"
            continue
        if placement is None:
            entry["findings"].append(asdict(Finding("records", FINDING_INCOMPLETE, "no placement record",
                                                    f"no placement record for {layout.relative(stderr)}: {why} "
                                                    "(its stderr has no buffer lines)")))
            continue
        ladder_path = layout.load_file(platform.name, config.name, model, stem, "pin_ladder")
        ladder = PinLadder()
        if ladder_path.exists():  # no file: the load logged no pin-ladder line
            logged_ladder, why = _read(read_pin_ladder, ladder_path)
            if logged_ladder is None:
                entry["findings"].append(asdict(Finding("records", FINDING_INCOMPLETE, "pin-ladder record unreadable",
                                                        f"{layout.relative(ladder_path)}: {why}")))
                continue
            ladder = logged_ladder
        probe, probe_problem = probes.get(model) or _probe(layout, stderr.with_name(PROBE_FILE), probes, model)
        source = "the engine" if stem == "engine" else f"llama-completion ({stem})"
        findings, facts = check_load(exp, placement.as_record(), [dict(r) for r in ladder.lines], summary, probe,
                                     probe_problem, source)
        entry["facts"] = facts
        entry["findings"] = [asdict(f) for f in findings]
    return _step(layout, platform, config, loads, rules)


def _probe(layout: RunLayout, path: Path, probes: dict[str, tuple[Probe | None, str]],
           model: str) -> tuple[Probe | None, str]:
    """The probe of the configuration's engine load of ``model`` (``gen/<model>/engine.probe.json``), read once
    per model into ``probes``: (probe, "") or (None, why there is none)."""
    try:
        probes[model] = (read_probe(path), "")
    except ProbeError as exc:
        probes[model] = (None, f"{layout.relative(path.parent)}: {exc}")
    return probes[model]


def _describe_rules(exp: Expectations) -> dict[str, Any]:
    return {"experts": [[r.describe(), r.buffer_type] for r in exp.experts] if exp.experts is not None else None,
            "weights": list(exp.weights) if exp.weights is not None else None,
            "pinned": exp.pinned.describe() if exp.pinned is not None else None,
            "mapped": exp.mapped,
            "warnings": {"present": list(exp.present), "absent": list(exp.absent)},
            "origin": dict(exp.origin)}


def _step(layout: RunLayout, platform: Platform, config: RunConfig, loads: list[dict[str, Any]],
          rules: dict[str, Any]) -> StepRecord:
    record_path = layout.expectations_json(platform.name, config.name)
    log_path = layout.expectations_log(platform.name, config.name)
    failures: list[Failure] = []
    incomplete: list[str] = []
    passed = 0
    lines = []
    for m, r in rules.items():
        lines.append(f"rules for {m}: " + "; ".join(f"{k}: {v}" for k, v in r["origin"].items()))
    for load in loads:
        head = f"{load['model']} {load['load']} ({load['log']})"
        if "skipped" in load:
            lines.append(f"{head}: not checked: {load['skipped']}")
            continue
        for f in load["findings"]:
            lines.append(f"{head}: {f['rule']}: {f['status']}: {f['message']}")
            if f["status"] == FINDING_FAILED:
                fact = Failure("expectation", model=load["model"], status=f["rule"], message=f["message"],
                               log=load["log"])
                if not any((x.model, x.status, x.message) == (fact.model, fact.status, fact.message) for x in failures):
                    failures.append(fact)
            elif f["status"] == FINDING_INCOMPLETE:
                incomplete.append(f"{load['model']} {load['load']}: {f['message']}")
            else:
                passed += 1
    checked = sum(1 for load in loads if "skipped" not in load)
    if failures:
        status = STEP_FAILED
        detail = "; ".join(dict.fromkeys(f.text() for f in failures))
    elif incomplete:
        status, detail = STEP_INCOMPLETE, "; ".join(dict.fromkeys(incomplete))
    elif passed:
        status = STEP_PASSED
        kinds = sorted({f["rule"] for load in loads for f in load["findings"] if f["status"] == FINDING_PASSED},
                       key=RULES.index)
        detail = f"{', '.join(kinds)} as expected in {checked} load(s)"
    else:
        status = STEP_SKIPPED
        detail = "nothing to check: " + ("; ".join(dict.fromkeys(load.get("skipped", "") for load in loads))
                                         or "no generation of this configuration left a record")
    write_json(record_path, {"config": config.name, "platform": platform.name, "status": status, "rules": rules,
                             "loads": loads})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(lines + [f"status: {status}: {detail}"]) + "\n", encoding="utf-8")
    return StepRecord(platform.name, config.name, STEP_NAME, status, 0.0, detail, layout.relative(log_path), failures)


def check(ctx: CheckContext) -> Iterable[StepRecord]:
    """The ``expectations`` step of every configuration of ``ctx.configs`` that has a generate step on
    ``ctx.platform`` (a check of harness.stages.checks.checks); ``skipped`` where that step generated nothing (it
    was skipped and names no failed generation).  A generate step skipped because a prompt failed on upstream's
    build too (``unsupported-upstream``) still checks the loads of the other prompts."""
    for name in ctx.configs:
        generate = ctx.run.step(ctx.platform.name, name, "generate")
        if generate is None or name not in ctx.matrix.configs:
            continue
        if generate.status == STEP_SKIPPED and not generate.failures:  # nothing generated: nothing to check
            yield StepRecord(ctx.platform.name, name, STEP_NAME, STEP_SKIPPED,
                             detail=f"generate step skipped: {generate.detail}")
            continue
        yield check_config(ctx.run.layout, ctx.platform, ctx.matrix.configs[name], generate)


#: The check as a stage of compare-outputs (harness.stages.checks.checks.check_stage).
STAGE = check_stage(STEP_NAME, check, "expectations")
