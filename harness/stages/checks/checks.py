"""The shape every check of a finished platform shares: one call per platform after its comparisons.

A check reads what the comparisons recorded (the run directory, the matrix) and returns
the steps it decided, one per configuration; :func:`run_checks` records them in the run.
A check never runs a program: it judges records, so it runs in seconds and a failure
in one check leaves every other result in place.  The checks, in order:

* harness.stages.checks.expectations: placement, pinning and warnings of each configuration.

The list the compare-outputs stage runs is harness.stages.checks.registered_checks (a new check is
one line there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ...matrix.config import Matrix, Platform
from ...record.results import Run, StepRecord


@dataclass(frozen=True)
class CheckContext:
    """What a check gets: the ``matrix``, the ``platform`` whose comparisons finished, the ``run``
    (its layout and steps so far) and ``configs``, the configurations that generated on that
    platform in this stage (in the order of their generate steps)."""

    matrix: Matrix
    platform: Platform
    run: Run
    configs: Sequence[str]


#: A check: context in, the steps it decided out (harness.record.results.StepRecord).
Check = Callable[[CheckContext], Iterable[StepRecord]]


def run_checks(ctx: CheckContext, checks: Sequence[Check], say: Callable[[str], None]) -> None:
    """Run ``checks`` on ``ctx`` in order and record each step they return in ``ctx.run``, with one
    console line per step (``say``).  A check that raises is recorded as an ``error`` step of config
    ``-`` naming the exception; the other checks still run."""
    for check in checks:
        try:
            steps = list(check(ctx))
        except Exception as exc:  # a broken record must not lose the other checks' results
            name = getattr(check, "__module__", "check").rsplit(".", 1)[-1]
            steps = [StepRecord(ctx.platform.name, "-", name, "error", detail=f"{type(exc).__name__}: {exc}")]
        for step in steps:
            ctx.run.record_step(step)
            say(f"[{step.platform}] {step.step} {step.config}: {step.status} — {step.detail}")
