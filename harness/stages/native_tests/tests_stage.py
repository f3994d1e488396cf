"""The ``test`` step: the fork's native tests through ctest, by label (harness.stages.native_tests.native_tests), on
each selected platform whose fork build passed; with ``--sanitize`` once more under compute-sanitizer
(step ``test-<tool>``).  A label whose tests, libraries and environment are byte-identical to a passed
run is reused (harness.stages.native_tests.test_cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ...kinds.registry import gpu_of, os_of
from ...record import gpu
from ...record.native_tests import SanitizerRecord
from ...record.json_files import write_json
from ...record.records import Failure, StepRecord
from ...common.console import REUSED
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_SKIPPED
from ..shape import Context, Stage, StepSpec
from .test_cache import run_tests_reusing


def run_tests(ctx: Context) -> None:
    """Run the native tests (ctest, by label) of the fork build of each selected platform; a label whose
    tests, libraries and environment are byte-identical to a passed run is reused (harness.stages.native_tests.test_cache)."""
    for p in ctx.platforms("test"):
        fork = ctx.build_variant(p, "fork")
        if fork.status != STEP_PASSED:
            # could not run for want of its build: an error as the speed rules record it (STEP declares it so),
            # not a skip, with the build's detail whole (a failed git fetch ends with what went wrong)
            ctx.run.record_step(StepRecord(p.name, "fork", "test", STEP_ERROR,
                                           detail=f"not run: fork build {fork.status}: {fork.detail}",
                                           failures=[Failure("blocked", build="fork")]))
            continue
        try:
            emulator = ctx.emulator(p)
        except RuntimeError as exc:
            ctx.run.record_step(StepRecord(p.name, "fork", "test", STEP_ERROR, detail=str(exc),
                                           failures=[Failure("exception", message=str(exc))]))
            continue
        runs: list[tuple[str, tuple[str, ...]]] = [(ctx.run.layout.test_step(), ())]
        kind = gpu_of(p)
        if ctx.opts.sanitize:
            runs.append((ctx.run.layout.test_step(ctx.opts.sanitize),
                         kind.sanitizer_argv(ctx.opts.sanitize, "test") if kind.sanitizer else ()))
        for step, wrapper in runs:
            target_dir = ctx.run.layout.tests(p.name, step)

            def file(name: str, step: str = step, platform: str = p.name) -> Path:
                return ctx.run.layout.tests_file(platform, step, name)
            if step != ctx.run.layout.test_step() and not wrapper:
                ctx.run.record_step(StepRecord(p.name, "fork", step, STEP_SKIPPED,
                                               detail=f"no sanitizer on {kind.described}"))
                continue
            if wrapper and not shutil.which(wrapper[0]):
                ctx.run.record_step(StepRecord(p.name, "fork", step, STEP_SKIPPED,
                                               detail=f"{wrapper[0]} not found"))
                continue
            with ctx.doing(p.name, "fork", step), ctx.console.step(f"[{p.name}] {step}") as shown:
                tr, reused = run_tests_reusing(
                    ctx.results_cache, ctx.run.id, fork.build_dir, p.test_labels, p.test_targets, target_dir,
                    wrapper=wrapper, reference_junit=file("junit", "test"),
                    env=emulator.env if emulator else None, emulator_argv=emulator.argv if emulator else (),
                    gpu=gpu_of(p), exe_suffix=os_of(p).executable_suffix)
                all_reused = bool(reused.labels) and all(c.message.startswith("reused") for c in tr.cases)
                shown.finish(REUSED if all_reused else tr.status, tr.detail, file("log"))
            detail = tr.detail
            if wrapper:
                summary = gpu.sanitizer_summary(file("log"))
                detail += f"; {summary}" if summary else ""
                write_json(file("sanitizer"), SanitizerRecord(ctx.opts.sanitize or "", summary))
            facts = gpu.test_log_facts(file("log"))
            if facts:
                write_json(file("gpu_facts"), facts)
            write_json(file("run"), tr)
            ctx.run.record_step(StepRecord(p.name, "fork", step, tr.status, round(tr.seconds, 1), detail,
                                           ctx.run.layout.relative(file("junit")),
                                           cached=", ".join(reused.run_ids) if all_reused else ""))
        ctx.builds.write_environment(p)


STAGE = Stage("test", command="test", role="native_tests", reads=("matrix", "builds"), writes=("steps", "files"),
              steps=(StepSpec("test", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "test-logs", timed=True),
                     StepSpec("test-", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "test-logs", timed=True)),
              run=run_tests)
