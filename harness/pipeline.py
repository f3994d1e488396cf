"""The run loop: the stages of each command, in order, for the selected platforms.

Each command of the command line (``build``, ``test``, ``compare-outputs``) runs its stages of
harness.stages.table.STAGES in table order, every stage through the one shape of
harness.stages.shape.Stage: a stage records and shows its own steps as they finish, the loop runs a
stage ``beside`` in a thread of its own until its command ends, and on an interrupt or an exception
stops every child process, records what was in progress and writes the summary.  Nothing here knows
what a stage does.  A failure in one platform or configuration is recorded by its stage and the
others still run.
"""

from __future__ import annotations

import os
import secrets
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

from .common import proc
from .common.console import Console
from .common.errors import HarnessError
from .matrix.config import Matrix
from .matrix.model_sources.registry import ModelStore
from .matrix.selection import Selection
from .record.cache import ResultCache, max_bytes_from_env
from .record.junit import publish_latest, write_run_junit
from .record.leftovers import GROUPS_NAME
from .record.progress import InProgress, describe_abort
from .record.run import Run
from .common.statuses import VERDICT_EXIT_CODES
from .stages.building.builds import Builds
from .stages.building.source import BaseTree, cache_dir
from .stages.options import Options
from .stages.outputs.sessions import Sessions
from .stages.shape import Context, Stage
from .stages.table import STAGES, stages_of, steps_of_role, undeclared

__all__ = ["Options", "STRICT_ENV", "StageReturned", "UndeclaredStep", "open_context", "run_command", "run_stage", "run_stages"]

#: Set to ``1`` (the test suite does, tests/conftest.py), a step that no stage declares with its status stops the
#: run with :class:`UndeclaredStep`; otherwise it is recorded and named in one console line.
STRICT_ENV = "HARNESS_STRICT_STAGES"


class UndeclaredStep(RuntimeError):
    """A stage recorded a step, or a status of one, that its declaration does not name (harness.stages.shape
    .StepSpec); the message lists them."""


def open_context(matrix: Matrix, run: Run, opts: Options, say: Callable[[str], None] | None = None,
                 console: Console | None = None, bases: Mapping[str, BaseTree] | None = None) -> Context:
    """The context of a run of ``matrix`` recorded in ``run`` with ``opts`` (harness.stages.shape.Context), with
    the run's builds (harness.stages.building.builds.Builds), models and program sessions
    (harness.stages.outputs.sessions.Sessions); ``say`` defaults to the console's, ``bases``: variant -> its
    base tree where the caller gives one (Builds)."""
    console = console or Console()
    say = say or console.say
    cache = cache_dir()
    progress = InProgress(run)
    results_cache = ResultCache(cache / "results", max_bytes_from_env(), read=not opts.no_cache)
    builds = Builds(matrix, run, opts, console, say, progress, cache, bases)
    models = ModelStore(matrix.models, cache, lambda: builds.base().path, matrix.path, builds.quantize_tool)
    sessions = Sessions(matrix, run, builds, progress, results_cache, console)
    selection = Selection.of(matrix, opts.platforms, opts.groups, opts.models)
    return Context(matrix, run, opts, console, say, progress, results_cache, builds, models, sessions, selection)


class StageReturned(TypeError):
    """A stage's ``run`` returned something: a stage records its steps itself (harness.stages.shape.Stage), so what
    it returns would be lost."""


def run_stage(ctx: Context, stage: Stage) -> None:
    """Run ``stage``, which records and shows its own steps (harness.stages.shape.Stage.run); what it raises
    propagates.  Raises :class:`StageReturned` when its ``run`` returns anything but None (steps handed back
    to the loop instead of recorded: one console shape for every stage)."""
    ctx.run.stage_started(stage.name)
    run: Callable[[Context], object] = stage.run  # typed to return None, a stage may still return steps
    returned = run(ctx)
    if returned is not None:
        raise StageReturned(f"stage {stage.name} returned {type(returned).__name__}: a stage records its steps "
                            f"itself (ctx.run.record_step) and returns None")


def run_command(ctx: Context, stages: Sequence[Stage]) -> None:
    """Run ``stages`` (one command's) in order with :func:`run_stage`: a stage ``beside`` in a thread of its
    own, waited for after the last stage.  An interrupt or an exception stops those threads' children and
    waits for them (harness.common.proc.stop_and_wait), then propagates; so does what a thread raised."""
    pools: list[ThreadPoolExecutor] = []
    running: list[Future] = []
    try:
        for stage in stages:
            if stage.beside:
                pools.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix=stage.name))
                running.append(pools[-1].submit(run_stage, ctx, stage))
            else:
                run_stage(ctx, stage)
        for future in running:
            future.result()
    except BaseException as exc:
        if running:
            proc.stop_and_wait(running, getattr(exc, "signum", signal.SIGTERM))
        raise
    finally:
        for pool in pools:
            pool.shutdown(wait=True)


def run_stages(matrix: Matrix, run: Run, opts: Options, stages: Sequence[str],
               say: Callable[[str], None] | None = None, bases: Mapping[str, BaseTree] | None = None,
               table: tuple[Stage, ...] = STAGES) -> int:
    """Run the commands ``stages`` (build, test, compare-outputs) in order, each its stages of ``table``; return
    the exit code of the run's verdict (harness.common.statuses.VERDICT_EXIT_CODES: 0 passed, 1 failed, 3
    incomplete or nothing ran).

    On SIGINT/SIGTERM (harness.common.proc.Interrupted) or any exception every child
    process group is terminated, the steps in progress are recorded as
    ``interrupted`` and the commands not reached as not run, the summary is
    written (``overall: incomplete`` unless something already failed) and,
    for a signal, 128 + its number is returned (130, 143); any other
    exception is raised again once the summary is written.  ``bases``: variant -> its base tree
    (harness.stages.building.builds.Builds).
    """
    ctx = open_context(matrix, run, opts, say, bases=bases)
    token = f"run:{run.id}:{os.getpid()}:{secrets.token_hex(4)}"
    run.begin(" ".join(stages), [s.name for command in stages for s in stages_of(command, table) if s.asked(opts)],
              token)
    try:
        with proc.recording_groups(run.dir / GROUPS_NAME, token):
            return _run_commands(ctx, run, stages, table)
    finally:
        ctx.close()


def _run_commands(ctx: Context, run: Run, stages: Sequence[str], table: tuple[Stage, ...]) -> int:
    """The body of :func:`run_stages` once the run is begun (harness.record.run.Run.begin)."""
    say = ctx.say
    for i, command in enumerate(stages):
        # what the result cache stores in a command is served to other runs only once the command has ended as it
        # should: a step interrupted, a run stopped by an error or killed leaves nothing to be reused
        ctx.results_cache.hold(f"{run.progress['token'] if run.progress else run.id}:{command}")
        try:
            run_command(ctx, stages_of(command, table))
            ctx.results_cache.publish()
            if i == len(stages) - 1:
                _check_declared(ctx, table)
        except BaseException as exc:
            proc.terminate_all()
            try:
                ctx.results_cache.discard()
            except OSError:
                pass  # a cache that cannot be written: its entries stay pending, never served
            why = describe_abort(exc)
            if not isinstance(exc, HarnessError):  # bad input: its one error: line comes from harness.cli
                say(f"{why}: stopping; every child process is terminated")
            run.end()  # the verdict is computed from here on, whatever the summary can still be written
            try:
                ctx.progress.record_unfinished(why)
                run.mark_incomplete(f"{command}: {why}; did not finish")
                for later in stages[i + 1:]:
                    run.mark_incomplete(f"{later}: not run ({why})")
                _finish(run, ctx.results_cache, table)
            except OSError as werr:  # e.g. the disk is full: what was written before stays
                say(f"error: the summary could not be updated ({werr}); {run.layout.summary_json} "
                    f"holds the run up to the last step that was written")
            if isinstance(exc, (proc.Interrupted, KeyboardInterrupt)):
                return proc.exit_code_for(exc)
            raise
    _finish(run, ctx.results_cache, table)
    return VERDICT_EXIT_CODES[run.overall()]


def _check_declared(ctx: Context, table: tuple[Stage, ...]) -> None:
    """Hold what the stages recorded so far to what ``table``'s stages declare (harness.stages.table.undeclared):
    raise UndeclaredStep under :data:`STRICT_ENV`, else say each step that no stage declares."""
    found = undeclared(list(ctx.run.steps), table)
    if found and os.environ.get(STRICT_ENV) == "1":
        raise UndeclaredStep("steps no stage declares with their status: " + "; ".join(found))
    for line in found:
        ctx.say(f"warning: {line}: no stage declares this step with this status (harness/stages/table.py)")


def _finish(run: Run, cache: ResultCache | None = None, table: tuple[Stage, ...] = STAGES) -> None:
    """Write what a run leaves: the cache counts, summary.json and summary.md, JUnit in the run's ``junit/`` and
    its copy in ``results/junit/`` (the checks file holds the steps of ``table``'s stages of role ``checks``).  The signatures and the report are views of the record,
    written by the command line once this returns (harness.views.run_views)."""
    run.end()
    if cache is not None:
        run.count_cache(cache.stats)
        cache.stats.clear()
    run.write_summary()
    write_run_junit(run.dir, run.steps, run.comparisons, steps_of_role("checks", table))
    publish_latest(run.dir, run.root)
