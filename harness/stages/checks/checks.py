"""A check: a stage that only reads what the comparisons recorded, one call per platform that ran them.

A check reads the run directory and the matrix and returns the steps it decided, one per
configuration, to its stage; it never runs a program, so it runs in seconds.  :func:`check_stage` makes
a check a stage of ``compare-outputs`` (harness.stages.shape.Stage) that runs after the
comparisons on every platform in ``ctx.generated`` and, like every stage, records and shows its
steps itself (:func:`run_check`): one console step per platform, a line per step it decided and
an end line that counts them; a check that raises on one platform is recorded there as an
``error`` step and the other platforms are still checked.  The checks:

* harness.stages.checks.expectations: placement, pinning and warnings of each configuration;
* harness.stages.checks.reloads: repeated loads of the pin configurations give back what they took.

A new check is a module with a :data:`Check` and its ``STAGE = check_stage(...)``, and one line in
harness.stages.table.STAGES; JUnit writes the steps of every stage of role ``checks`` as
``checks-<platform>.xml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from ...matrix.config import Matrix, Platform
from ...record.records import StepRecord
from ...record.run import Run
from ...common.statuses import STEP, STEP_ERROR, STEP_FAILED, STEP_INCOMPLETE, STEP_PASSED, STEP_SKIPPED
from ...record.verdict import PASSES, count_text, failing_names, judge
from ..shape import Context, Signs, Stage, StepSpec


@dataclass(frozen=True)
class CheckContext:
    """What a check gets: the ``matrix``, the ``platform`` whose comparisons finished, the ``run``
    (its layout and steps so far) and ``configs``, the configurations that generated on that
    platform in this stage (in the order of their generate steps)."""

    matrix: Matrix
    platform: Platform
    run: Run
    configs: Sequence[str]


#: A check: context in, the steps it decided out (harness.record.records.StepRecord).
Check = Callable[[CheckContext], Iterable[StepRecord]]

#: The statuses a check's steps take (harness.common.statuses.STEP): ``incomplete`` when a record it
#: needs is missing, ``error`` when the check itself raised.
CHECK_STATUSES = (STEP_PASSED, STEP_FAILED, STEP_SKIPPED, STEP_INCOMPLETE, STEP_ERROR)


def check_platforms(ctx: Context, step: str, check: Check, only: str = "") -> Iterator[StepRecord]:
    """The steps ``check`` decides on each platform of ``ctx.generated`` (in the order the comparisons ran
    them; ``only``: that platform alone); where it raises, one ``error`` step of config ``-`` named ``step`` with
    the exception."""
    for name, configs in list(ctx.generated.items()):
        if only and name != only:
            continue
        try:
            steps = list(check(CheckContext(ctx.matrix, ctx.matrix.platform(name), ctx.run, configs)))
        except Exception as exc:  # a broken record must not lose the other platforms' results
            steps = [StepRecord(name, "-", step, STEP_ERROR, detail=f"{type(exc).__name__}: {exc}")]
        yield from steps


def run_check(ctx: Context, step: str, check: Check) -> None:
    """Run ``check`` on each platform of ``ctx.generated`` (:func:`check_platforms`) and record every step it
    decides in ``ctx.run``, each said in one line (``[<platform>] <step> <config>: <status> — <detail>``) inside
    one console step per platform, ``[<platform>] <step>``, whose end line counts the steps by their verdict
    (harness.record.verdict) and names the failing ones: ``failed`` where one fails, else the first alarming status
    of a step that does not pass (harness.common.statuses.STEP: ``error``, ``incomplete``), else the first status of
    one (``skipped``), else ``passed``.  A platform where the check decides no step (the reloads of a platform without a pin
    configuration) shows nothing."""
    for name in list(ctx.generated):
        decided = list(check_platforms(ctx, step, check, only=name))
        if not decided:
            continue
        with ctx.console.step(f"[{name}] {step}") as shown:
            for record in decided:
                ctx.run.record_step(record)
                ctx.say(f"[{record.platform}] {record.step} {record.config}: {record.status} — {record.detail}")
            rows = judge(decided, ())
            names = failing_names(rows)
            unproven = [s.status for s, r in zip(decided, rows) if r.verdict.verdict != PASSES]
            alarming = [st for st in unproven if st in STEP.alarming]
            status = STEP_FAILED if names else (alarming or unproven or [STEP_PASSED])[0]
            shown.finish(status, count_text(rows, "step") + (f"; fails: {names}" if names else ""))


def check_stage(step: str, check: Check, evidence: str = "detail", signs: Signs | None = None) -> Stage:
    """``check`` as a stage of ``compare-outputs`` (:func:`run_check`) that records steps named ``step`` whose
    failures are read from ``evidence`` (harness.stages.shape.EVIDENCE; see the module docstring), or signed by
    the check's own ``signs`` (harness.stages.shape.StepSpec.signs)."""

    def run(ctx: Context) -> None:
        run_check(ctx, step, check)
    return Stage(step, command="compare-outputs", role="checks", reads=("matrix", "records"), writes=("steps", "files"),
                 steps=(StepSpec(step, CHECK_STATUSES, evidence, signs=signs),), run=run)
