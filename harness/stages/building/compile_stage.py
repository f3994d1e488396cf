"""The ``compile`` step: a CUDA platform compiled, not run, on a machine without a GPU
(harness.stages.building.cuda_compile).

It runs beside the builds, in a thread of its own (after a code edit each is mostly one compiler on one
changed file, so the two overlap on the cores; docs/cache.md); together they run at most the job
budget's slots of jobs at once (harness.stages.building.builds.Builds.job_budget).  The fork compiles the
units its series touches, then the base the same units on the fork's plan.  A compile step whose inputs
are byte-identical to a passed one is reused (harness.stages.building.compile_cache).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ...common.errors import EnvironmentProblem
from ...common.locks import Rank, exclusive, joined_by_holder_of
from ...kinds.registry import gpu_of
from ...matrix.config import Platform
from ...matrix.platforms import compiles_instead
from ...record.json_files import write_json
from ...record.layout import BUILD_FILES
from ...record.records import Failure, StepRecord
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_SKIPPED
from .engine_target import ENGINE_TARGET, engine_cmake_options, engine_source_digest
from ..shape import Context, Stage, StepSpec
from .build import ccache_env, compiler_launcher_options, find_tool
from .compile_cache import compile_reusing, step_identity
from .cuda_compile import CompileResult, Plan, ToolkitMissing, assemble_toolkit, changed_files, compile_tree
from .patches import PatchApplyError, series_label
from .source import raise_storage_problem


def run_compile(ctx: Context) -> None:
    """The compile steps of every selected platform that :func:`harness.matrix.platforms.compiles_instead` names:
    the fork, then the base on the fork's plan where a comparison of the platform uses the base.

    It runs in a thread beside the builds, which the build stage's thread may wait for while it holds builds:
    so this thread takes only locks after those (harness.common.locks.joined_by_holder_of)."""
    joined_by_holder_of(Rank.BUILD)
    for p in (ctx.matrix.platform(n) for n in ctx.selection.platform_names()):
        if not compiles_instead(p):
            continue
        fork = compile_variant(ctx, p, "fork")
        if fork is not None and fork.plan is not None and "base" in ctx.builds.variants_for(p):
            compile_variant(ctx, p, "base", like=fork.plan)


def compile_options(ctx: Context, p: Platform, variant: str) -> dict[str, str]:
    """CMake options of the compile step: the platform's, its ``compile_only`` ones, ccache, the engine target
    with the GPU kind's probe (engine_target.engine_cmake_options), the series label, --gpu-arch (as the GPU
    kind's architecture variable) and -D overrides (the toolkit's are added by :func:`compile_variant`)."""
    opts = {**p.cmake, **p.compile_only_cmake, **compiler_launcher_options(gpu_of(p).device_language),
            **engine_cmake_options(gpu_of(p))}
    arch_variable = gpu_of(p).arch_cmake
    if ctx.opts.cuda_arch and arch_variable:
        opts[arch_variable] = ctx.opts.cuda_arch
    if variant == "fork":
        opts["LLAMA_FORK_SERIES"] = series_label(ctx.builds.patches())
    opts.update(ctx.opts.cmake_defines)
    return opts


def compile_variant(ctx: Context, p: Platform, variant: str, like: Plan | None = None) -> CompileResult | None:
    """Run the ``compile`` step (harness.stages.building.cuda_compile) for ``variant`` of ``p`` and record it.

    The fork compiles the units its series touches; the base (``like``: the fork's plan) the same
    units.  Returns None when the step was skipped (a CUDA wheel missing: the reason names it)
    or could not start (recorded as ``error`` with its failure fact).
    """
    logs = ctx.run.layout.compile_logs(p.name, variant)
    with ctx.doing(p.name, variant, "compile"), \
            ctx.console.step(f"[{p.name}] compile {variant}", watch=logs / BUILD_FILES["build"]) as shown:
        result, status, detail, log = _compile_variant(ctx, p, variant, like)
        shown.finish(status, detail, log if log is not None and status not in (STEP_PASSED, STEP_SKIPPED) else "")
        return result


def _compile_variant(ctx: Context, p: Platform, variant: str,
                     like: Plan | None) -> tuple[CompileResult | None, str, str, Path | None]:
    logs = ctx.run.layout.compile_logs(p.name, variant)
    start = time.monotonic()
    result: CompileResult | None = None
    failures: list[Failure] = []
    log: Path | None = None
    reused = ""  # the run a passed compile step with the same inputs was taken from (docs/cache.md)
    try:
        work = ctx.opts.work_dir.resolve()
        toolkit = assemble_toolkit(ctx.builds.cache)
        base = ctx.builds.base()
        tree = ctx.builds.prepare_source(base, work, variant, logs)
        if variant == "fork":
            changed = changed_files(tree, base.git_rev)
            targets = [*p.targets, ENGINE_TARGET, *p.test_targets]
        else:
            changed = dict(like.changed) if like else {}
            targets = [*p.targets, ENGINE_TARGET]
        options = {**compile_options(ctx, p, variant), **toolkit.cmake_options()}
        write_json(ctx.run.layout.compile_file(p.name, variant, "toolkit"), toolkit)
        build_dir = work / variant / f"compile-{p.name}"
        cmake, ninja = find_tool("cmake") or "cmake", find_tool("ninja") or "ninja"
        with exclusive(build_dir, f"the {variant} compile directory of {p.name}", Rank.COMPILE, ctx.say):
            identity = step_identity(tree, build_dir, work, options, changed, targets, like, cmake, ninja,
                                     str(toolkit.nvcc), ccache_env(work), engine_source_digest(gpu_of(p)))
            result, reused = compile_reusing(
                ctx.results_cache, ctx.run.id, identity, lambda: compile_tree(
                    tree, build_dir, options, changed, targets, logs, cmake=cmake, ninja=ninja,
                    jobs=ctx.opts.jobs or os.cpu_count() or 2, env=ccache_env(work), like=like,
                    budget=ctx.builds.job_budget()), logs)
        status, detail = result.status, result.detail
        log = result.logs.get("build") or result.logs.get("configure")
    except ToolkitMissing as exc:
        status, detail = STEP_SKIPPED, str(exc)
    except EnvironmentProblem:
        raise  # the machine's, not the fork's: the run stops, exit 2 (harness.pipeline)
    except Exception as exc:  # a broken input must not stop other platforms: record it
        raise_storage_problem(exc, ctx.opts.work_dir)
        status, detail = STEP_ERROR, f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PatchApplyError):
            failures.append(Failure("patch", patch=exc.patch, message=str(exc)))
        else:
            failures.append(Failure("exception", message=detail))
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / BUILD_FILES["error"]
        log.write_text(detail + "\n")
    ctx.run.record_step(StepRecord(p.name, variant, "compile", status, round(time.monotonic() - start, 1),
                                   detail, ctx.run.layout.relative(log) if log else "", failures,
                                   cached=reused))
    return result, status, detail, log


STAGE = Stage("compile", command="build", role="building", reads=("matrix", "source"),
              writes=("builds", "steps", "files"),
              steps=(StepSpec("compile", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "compile-logs"),), run=run_compile, beside=True)
