"""compute-sanitizer over real generation: a short greedy generation of each pin configuration under the tool.

The native tests under ``--sanitize TOOL`` (step ``test-<tool>``) exercise the pin ladder and the
routing alone; a fault that only a whole model's generation reaches (an illegal access once the
pinned path engages in prefill) needs a real one.  So with ``--sanitize`` the ``test`` command also
runs, on each GPU platform whose fork build passed, one ``llama-completion`` generation per pin
configuration of a one-GPU group (:func:`sanitized_configs`; matrix.yaml's ``sanitize`` of a
configuration turns it on or off): the first model and prompt
of the first comparison group of the platform that has the configuration, :data:`N_PREDICT`
tokens, the configuration's arguments and environment, under ``compute-sanitizer --tool TOOL``.
Each gets a step ``generate-<tool>``: ``passed`` when the tool reported no error and the
generation succeeded, ``failed`` otherwise, its detail naming the first error's kernel and host
frame (harness.record.gpu.first_sanitizer_error) and what the generation cost under the tool.
Files: ``<platform>/<config>/sanitize/<model>/<prompt>.<tool>.*`` (the sanitizer's own log is
``.sanitizer.log``; outside ``gen/``, so no expectation counts it as a load).

:func:`rerun_crashes` (the stage :data:`CRASH_STAGE` of ``compare-outputs``): a generation of a GPU
platform that crashed is run once more, with llama-completion, under memcheck, whether or not
``--sanitize`` was given, with the group's own settings (its full token count: the crash may be
late); ``<prompt>.crash-memcheck.sanitizer.log`` beside the others, a step
``crash-memcheck`` per configuration, and harness.triage.signatures joins the first error to the
crash's signature.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

from ...kinds.registry import gpu_of
from ...kinds.shape import GpuKind
from ...matrix.config import Generation, Platform
from ...matrix.loading import pin_configuration
from ...record import gpu
from ...record.json_files import write_json
from ...record.records import Failure, StepRecord
from ...common.statuses import CRASHED, STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_SKIPPED
from .compare import GenerationResult, GenerationSpec, run_generation
from .greedy import Side
from ..shape import Context, Stage, StepSpec

#: Tokens generated under the sanitizer: enough for the prompt's prefill and a few decodes, the paths a pinned
#: host buffer takes (the H200 run of the issue: 8 tokens of moe-large within seconds under memcheck).
N_PREDICT = 8
#: The tool a crashed generation is run again under, and the label of its files (``<prompt>.crash-memcheck.*``).
CRASH_TOOL = "memcheck"
CRASH_LABEL = "crash-memcheck"


def sanitizer_launcher(tool: str, log_file: Path, kind: GpuKind) -> tuple[str, ...]:
    """The sanitizer prefix of a generation under ``tool`` on GPU kind ``kind`` (its
    :meth:`~harness.kinds.shape.GpuKind.sanitizer_argv`: compute-sanitizer for NVIDIA): its report written to
    ``log_file``, exit code 1 on an error, every report's host backtrace saved."""
    return (*kind.sanitizer_argv(tool, "generation"), "--log-file", str(log_file))


def sanitized_stem(config_dir: Path, model: str, prompt: str, label: str) -> Path:
    """``<config_dir>/sanitize/<model>/<prompt>.<label>``: the path prefix of a generation under a sanitizer (its
    sanitizer log is that plus ``.sanitizer.log``)."""
    return config_dir / "sanitize" / model / f"{prompt}.{label}"


def _first_group(ctx: Context, p: Platform, config: str) -> str | None:
    """The first comparison group of ``p`` the run selects (``--group``, and ``--model`` leaving it a model; matrix
    order) whose reference or candidates hold ``config``; None where no such group runs ``config``."""
    for name in ctx.selection.groups_with_models(p.name):
        g = ctx.matrix.groups[name]
        if config == g.reference or config in g.candidates:
            return name
    return None


def first_generation(ctx: Context, p: Platform, config: str) -> tuple[str, str, Generation] | None:
    """(model, prompt, generation settings) of :func:`_first_group` of ``config``: its first model the run selects
    and its first prompt; None where no selected group of ``p`` runs ``config``."""
    name = _first_group(ctx, p, config)
    if name is None:
        return None
    g = ctx.matrix.groups[name]
    return ctx.selection.model_names(name)[0], g.prompts[0], g.generation


def sanitized_configs(ctx: Context, p: Platform) -> list[str]:
    """The configurations whose generation ``--sanitize`` runs on ``p``, in matrix order: those that set
    ``sanitize: true``, and by default each pin configuration (harness.matrix.loading) whose first group
    on ``p`` needs one GPU; a configuration with ``sanitize: false`` never.  Only those some group of ``p`` that
    the run selects runs (``--group``, ``--model``: harness.matrix.selection)."""
    out = []
    for name, config in ctx.matrix.configs.items():
        group = _first_group(ctx, p, name)
        if group is None or config.sanitize is False:
            continue
        if config.sanitize or (pin_configuration(p, config) and ctx.matrix.groups[group].min_gpus < 2):
            out.append(name)
    return out


def sanitized_run(ctx: Context, p: Platform, config: str, model: str, prompt: str, tool: str,
                  gen: Generation, label: str = "") -> tuple[GenerationResult, Path, GenerationSpec]:
    """Run ``config``'s llama-completion on ``model`` and ``prompt`` with the settings ``gen`` under ``tool``; its
    files are ``<prompt>.<label or tool>.*`` (:func:`sanitized_stem`).  Returns the result, the sanitizer's log and
    the spec (its launcher is the sanitizer's).  Raises OSError where the program cannot be started."""
    side = Side(p.name, config)
    spec = ctx.hooks(p).completion(side, ctx.model_path(model), ctx.matrix.prompts[prompt].text, gen)
    stem = sanitized_stem(ctx.run.layout.config(p.name, config), model, prompt, label or tool)
    log = stem.with_name(stem.name + ".sanitizer.log")
    stem.parent.mkdir(parents=True, exist_ok=True)
    spec = replace(spec, launcher=(*sanitizer_launcher(tool, log, gpu_of(p)), *spec.launcher))
    return run_generation(spec, stem), log, spec


def judge_run(result: GenerationResult, log: Path, tool: str, what: str) -> tuple[str, str, list[Failure]]:
    """(status, detail, failures) of one generation under ``tool`` (``what`` names it: ``moe-large/story``): failed
    with the first error where the tool reported one (or the generation did not succeed), passed otherwise."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    first = gpu.first_sanitizer_error(text)
    counts = gpu.SANITIZER_SUMMARY.findall(text)
    errors = sum(int(n) for n in counts)
    cost = f"{result.seconds:.1f} s under {tool}"
    if first or errors or result.status != "ok":
        why = first.text() if first else (f"{errors} error(s)" if errors else
                                          f"generation {result.status}: {result.error_line or result.signal or ''}")
        detail = f"{tool}: {what}: first error: {why} ({cost})"
        return STEP_FAILED, detail, [Failure("exception", model=what.split("/")[0], status=tool, message=detail)]
    if not counts:
        return STEP_FAILED, f"{tool}: {what}: no summary line (ERROR SUMMARY, RACECHECK SUMMARY) in the sanitizer's log ({cost})", [
            Failure("exception", model=what.split("/")[0], status=tool, message="no sanitizer summary")]
    return STEP_PASSED, f"{tool}: {what}: 0 errors over {N_PREDICT} tokens ({cost})", []


def run_sanitized(ctx: Context) -> None:
    """With ``--sanitize``: the step ``generate-<tool>`` of every pin configuration of each GPU platform whose fork
    build passed (see the module)."""
    tool = ctx.opts.sanitize
    if not tool:
        return
    for p in ctx.platforms("test"):
        if gpu_of(p).sanitizer is None or ctx.build_variant(p, "fork").status != STEP_PASSED:
            continue
        step = f"generate-{tool}"
        for name in sanitized_configs(ctx, p):
            where = first_generation(ctx, p, name)
            assert where is not None
            if not shutil.which(gpu_of(p).sanitizer or ""):
                ctx.run.record_step(StepRecord(p.name, name, step, STEP_SKIPPED,
                                               detail=f"{gpu_of(p).sanitizer} not found"))
                continue
            model, prompt, gen = where
            t0 = time.monotonic()
            with ctx.doing(p.name, name, step), ctx.console.step(f"[{p.name}] {step} {name}") as shown:
                try:
                    result, log, _ = sanitized_run(ctx, p, name, model, prompt, tool,
                                                   replace(gen, n_predict=N_PREDICT))
                    status, detail, failures = judge_run(result, log, tool, f"{model}/{prompt}")
                except OSError as exc:
                    status, detail, failures = STEP_ERROR, str(exc), [Failure("exception", message=str(exc))]
                    log = ctx.run.layout.config(p.name, name)
                shown.finish(status, detail, log)
            ctx.run.record_step(StepRecord(p.name, name, step, status, round(time.monotonic() - t0, 1), detail,
                                           ctx.run.layout.relative(log), failures))


def rerun_crashes(ctx: Context) -> None:
    """Every generation of a GPU platform's configuration that crashed in this run's comparisons, run once more
    with llama-completion under memcheck; one ``crash-memcheck`` step per configuration with such a crash, recorded
    as it finishes and shown as a console step (``[<platform>] crash-memcheck <config>``)."""
    for platform, configs in ctx.generated.items():
        p = ctx.matrix.platform(platform)
        if gpu_of(p).sanitizer is None:
            continue
        for name in configs:
            generate = ctx.run.step(platform, name, "generate")
            crashed = [f for f in (generate.failures if generate else []) if f.kind == "generation" and f.status == CRASHED]
            if not crashed:
                continue
            t0 = time.monotonic()
            with ctx.doing(platform, name, CRASH_LABEL), ctx.console.step(f"[{platform}] {CRASH_LABEL} {name}") as shown:
                found = _rerun_crashed(ctx, p, name, crashed)
                status = STEP_FAILED if any(s == STEP_FAILED for s, _ in found) else found[0][0]
                detail = "; ".join(d for _, d in found)
                shown.finish(status, detail)
            ctx.run.record_step(StepRecord(platform, name, CRASH_LABEL, status, round(time.monotonic() - t0, 1),
                                           detail))


def _rerun_crashed(ctx: Context, p: Platform, name: str, crashed: list[Failure]) -> list[tuple[str, str]]:
    """(status, detail) of each (model, prompt) of ``crashed`` (generation facts of configuration ``name`` on
    ``p``) run once more under memcheck, in order, each pair once; one ``skipped`` when the tool is missing."""
    seen = set()
    found = []
    for fact in crashed:
        if (fact.model, fact.prompt) in seen:
            continue
        seen.add((fact.model, fact.prompt))
        if not shutil.which(gpu_of(p).sanitizer or ""):
            found.append((STEP_SKIPPED, f"{gpu_of(p).sanitizer} not found"))
            break
        try:
            gen = (first_generation(ctx, p, name) or (None, None, ctx.matrix.generation))[2]
            result, log, _ = sanitized_run(ctx, p, name, fact.model, fact.prompt, CRASH_TOOL, gen, CRASH_LABEL)
            status, detail, _ = judge_run(result, log, CRASH_TOOL, f"{fact.model}/{fact.prompt}")
            write_json(log.with_suffix(".json"), {"crash": fact.text(), "status": status, "detail": detail})
        except OSError as exc:
            status, detail = STEP_ERROR, str(exc)
        found.append((status, detail))
    return found


#: ``--sanitize``: a short generation of each pin configuration under the tool (``test``).
STAGE = Stage("generate-sanitized", command="test", role="outputs", reads=("matrix", "builds", "models"),
              writes=("steps", "files"), steps=(StepSpec("generate-", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "sanitizer-log"),),
              run=run_sanitized, asked_by="sanitize")
#: A crashed GPU generation run once more under memcheck (``compare-outputs``).
CRASH_STAGE = Stage("crash-memcheck", command="compare-outputs", role="outputs", reads=("matrix", "builds", "models", "records"),
                    writes=("steps", "files"), steps=(StepSpec(CRASH_LABEL, (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "sanitizer-log"),),
                    run=rerun_crashes)
