"""The steps in progress, so that an interrupt or an exception can record each as ``interrupted``.

A stage marks a step with :meth:`InProgress.doing` for as long as it runs; the run loop
(harness.pipeline) calls :meth:`InProgress.record_unfinished` once when the run is stopped.
Several threads may mark steps at once (the compile step runs beside the builds, the lanes
of the comparisons beside each other).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ..common import proc
from ..common.errors import HarnessError
from .records import StepRecord
from .run import Run
from ..common.statuses import STEP_INTERRUPTED, STEP_PASSED


@dataclass(frozen=True)
class Doing:
    """One step in progress: ``platform``, ``config``, ``step``, ``started`` (time.monotonic seconds) and
    ``recheck``: the step only checks that a record this run already holds is still true (a build found up
    to date by a later stage), so an interrupt keeps that record where it passed."""

    platform: str
    config: str
    step: str
    started: float
    recheck: bool = False


class InProgress:
    """The steps of ``run`` in progress, in the order they started."""

    def __init__(self, run: Run):
        self.run = run
        self._doing: list[Doing] = []
        self._lock = threading.Lock()

    @contextmanager
    def doing(self, platform: str, config: str, step: str, recheck: bool = False) -> Iterator[None]:
        """Mark (platform, config, step) as in progress for the block, so an interrupt can name it.

        An exception leaving the block keeps the mark for :meth:`record_unfinished`.
        """
        entry = Doing(platform, config, step, time.monotonic(), recheck)
        with self._lock:
            self._doing.append(entry)
            self._note()
        yield
        with self._lock:
            self._doing.remove(entry)
            self._note()

    def _note(self) -> None:
        """Keep the run's record of the steps in progress current (harness.record.run.Run.doing), so that a
        run killed mid-way names them."""
        self.run.doing(dict.fromkeys((d.platform, d.config, d.step, d.recheck) for d in self._doing))

    def forget(self, keep: Callable[[Doing], bool]) -> None:
        """Drop the marks that ``keep`` returns False for: steps their stage has recorded with what they did."""
        with self._lock:
            self._doing = [d for d in self._doing if keep(d)]
            self._note()

    def record_unfinished(self, why: str) -> None:
        """Record every step still in progress as ``interrupted`` (``why``: e.g. "interrupted by SIGINT"), latest
        first, and the run as incomplete; a recheck whose step this run recorded as passed keeps that record."""
        with self._lock:
            doing, self._doing = list(self._doing), []
        for d in reversed(doing):
            earlier = self.run.step(d.platform, d.config, d.step)
            if d.recheck and earlier is not None and earlier.status == STEP_PASSED:
                continue
            self.run.record_step(StepRecord(d.platform, d.config, d.step, STEP_INTERRUPTED,
                                            round(time.monotonic() - d.started, 1), f"{why}; did not finish"))
            self.run.mark_incomplete(f"{d.platform}: {d.step} {d.config}: {why}; did not finish")


def describe_abort(exc: BaseException) -> str:
    """Words for what ended a run early: "interrupted by SIGINT", "refused: <message>" for bad input found
    while it ran (harness.common.errors.HarnessError), or the exception's type and message."""
    if isinstance(exc, proc.Interrupted):
        return f"interrupted by {exc.signal_name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(exc, HarnessError):
        return f"refused: {exc}"
    return f"stopped by {type(exc).__name__}: {exc}"
