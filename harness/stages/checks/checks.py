"""A check: a stage that only reads what the comparisons recorded, one call per platform that ran them.

A check reads the run directory and the matrix and returns the steps it decided, one per
configuration; it never runs a program, so it runs in seconds.  :func:`check_stage` makes a
check a stage of ``compare-outputs`` (harness.stages.shape.Stage) that runs after the
comparisons on every platform in ``ctx.generated``; a check that raises on one platform is
recorded there as an ``error`` step and the other platforms are still checked.  The checks:

* harness.stages.checks.expectations: placement, pinning and warnings of each configuration.

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
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_INCOMPLETE, STEP_PASSED, STEP_SKIPPED
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


def check_platforms(ctx: Context, step: str, check: Check) -> Iterator[StepRecord]:
    """The steps ``check`` decides on each platform of ``ctx.generated`` (in the order the comparisons ran
    them); where it raises, one ``error`` step of config ``-`` named ``step`` with the exception."""
    for name, configs in list(ctx.generated.items()):
        try:
            steps = list(check(CheckContext(ctx.matrix, ctx.matrix.platform(name), ctx.run, configs)))
        except Exception as exc:  # a broken record must not lose the other platforms' results
            steps = [StepRecord(name, "-", step, STEP_ERROR, detail=f"{type(exc).__name__}: {exc}")]
        yield from steps


def check_stage(step: str, check: Check, evidence: str = "detail", signs: Signs | None = None) -> Stage:
    """``check`` as a stage of ``compare-outputs`` that records steps named ``step`` whose failures are read from
    ``evidence`` (harness.stages.shape.EVIDENCE; see the module docstring), or signed by the check's own ``signs``
    (harness.stages.shape.StepSpec.signs)."""
    return Stage(step, command="compare-outputs", role="checks", reads=("matrix", "records"), writes=("steps", "files"),
                 steps=(StepSpec(step, CHECK_STATUSES, evidence, signs=signs),),
                 run=lambda ctx: check_platforms(ctx, step, check))
