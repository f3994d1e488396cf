"""What a run tells the person (or CI log) watching it: step lines, progress, annotations.

Every step prints a start line and an end line with its status and time; a step
that failed also prints the log to read.  While a long step runs, its progress
(ninja's ``[n/N]`` read from the build log, generations k of n) shows as a
progress bar on a terminal (``rich``) and as one line every
:data:`HEARTBEAT_S` seconds elsewhere (CI logs), so a log never goes quiet for
minutes.  On GitHub Actions (``GITHUB_ACTIONS=true``) each top-level step folds
into a ``::group::`` and a failed step becomes an ``::error`` annotation
(workflow commands, docs.github.com "Workflow commands for GitHub Actions").
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, TextIO

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from .statuses import STEP, STEP_INTERRUPTED, STEP_PASSED

#: Seconds between progress lines of a running step when the output is not a terminal.
HEARTBEAT_S = 10.0

#: How often a watched log is read for progress, in seconds.
WATCH_S = 0.5

#: ninja's status line: ``[n/N] Building CXX object ...`` (its default NINJA_STATUS is "[%f/%t] ").
NINJA_PROGRESS = re.compile(rb"^\[(\d+)/(\d+)\] ", re.M)

#: The word of a step whose results came from the result cache (docs/cache.md): no status of a record, so it
#: has its mark here.  Every other end line takes its mark from the step status's declaration
#: (harness.common.statuses.STEP); a status without one is shown with a bullet.
REUSED = "reused"
REUSED_MARK = "♻"


def end_mark(status: str) -> str:
    """The mark the console puts before a step's end line with ``status``: the declared step status's
    :attr:`~harness.common.statuses.Status.mark`, ``♻`` for :data:`REUSED`, a bullet for anything else."""
    declared = STEP.by_name.get(status)
    if declared and declared.mark:
        return declared.mark
    return REUSED_MARK if status == REUSED else "•"


#: Per thread: the titles of the console steps it runs, outermost first (:func:`current_step`).
_running = threading.local()


def current_step() -> str:
    """The title of the innermost console step the calling thread runs (e.g. ``[linux-x86_64-cuda] compile
    fork``), "" when it runs none: how a message names a step of the run without naming a thread."""
    titles = getattr(_running, "titles", [])
    return titles[-1] if titles else ""


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"


@dataclass
class Step:
    """One running step: its title, progress (``done`` of ``total``, ``what`` in words) and outcome."""

    title: str
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    total: int | None = None
    what: str = ""
    status: str = STEP_PASSED
    detail: str = ""
    log: str = ""
    _task: int | None = None

    def progress_text(self) -> str:
        """``[n/N] what`` (or ``what``) of the progress so far; '' when there is none."""
        count = f"[{self.done}/{self.total}]" if self.total else ""
        return " ".join(x for x in (count, self.what) if x)

    def finish(self, status: str, detail: str = "", log: str | Path = "") -> None:
        """Set the outcome the end line shows: a status name (harness.common.statuses.STEP), a detail, the log to read."""
        self.status, self.detail, self.log = status, detail, str(log) if log else ""


class Console:
    """Step lines, progress and CI annotations on ``out`` (default: standard output).

    ``interactive``: draw progress bars (default: ``out`` is a terminal); ``github``: write
    GitHub Actions workflow commands (default: ``GITHUB_ACTIONS=true``); ``heartbeat_s``:
    seconds between progress lines when not interactive.
    """

    def __init__(self, out: TextIO | None = None, *, interactive: bool | None = None, github: bool | None = None,
                 heartbeat_s: float = HEARTBEAT_S):
        self.out = out or sys.stdout
        self.rich = RichConsole(file=self.out, highlight=False, markup=False, emoji=False, soft_wrap=True)
        self.interactive = self.rich.is_terminal if interactive is None else interactive
        self.github = os.environ.get("GITHUB_ACTIONS") == "true" if github is None else github
        self.heartbeat_s = heartbeat_s
        self._steps: list[Step] = []
        self._progress: Progress | None = None
        self._lock = threading.Lock()

    # ----- plain lines ---------------------------------------------------------------------
    def say(self, line: str) -> None:
        """Print one line (above any progress bar)."""
        with self._lock:
            if self._progress is not None:
                self._progress.console.print(line)
            else:
                self.out.write(line + "\n")
                self.out.flush()

    def error(self, message: str, title: str = "") -> None:
        """An ``::error`` annotation on GitHub Actions; elsewhere nothing (the end line already says it)."""
        if self.github:
            props = f" title={_escape_property(title)}" if title else ""
            self.say(f"::error{props}::{_escape_data(message)}")

    # ----- steps ------------------------------------------------------------------------------
    @contextmanager
    def step(self, title: str, *, watch: Path | None = None, total: int | None = None) -> Iterator[Step]:
        """Print a start line, show progress while the block runs, then an end line; yields the Step.

        ``watch``: a log file to read ninja's ``[n/N]`` progress from (only what is written
        after the step starts).  ``total``: the count of units (e.g. generations) the block
        reports with :meth:`advance`.  The block sets the outcome with ``Step.finish``; an
        exception leaving it ends the step as ``interrupted`` and is raised again.
        """
        step = Step(title, total=total)
        outermost = not self._steps
        titles = _running.__dict__.setdefault("titles", [])
        titles.append(title)
        if self.github and outermost:
            self.say(f"::group::{title}")
        self.say(f"▶ {title}")
        self._steps.append(step)
        self._show(step)
        stop = threading.Event()
        threads = []
        if watch is not None:
            threads.append(threading.Thread(target=self._watch, args=(step, watch, stop), daemon=True))
        if not self.interactive and self.heartbeat_s > 0:
            threads.append(threading.Thread(target=self._heartbeat, args=(step, stop), daemon=True))
        for t in threads:
            t.start()
        try:
            yield step
        except BaseException:
            step.finish(STEP_INTERRUPTED, "stopped by an error or a signal")
            raise
        finally:
            titles.remove(title)
            stop.set()
            for t in threads:
                t.join()
            self._hide(step)
            self._steps.remove(step)
            self._end(step, outermost)

    def advance(self, step: Step, by: int = 1, what: str = "") -> None:
        """Count ``by`` more units of ``step`` done; ``what`` says which (e.g. ``fork story.r1``)."""
        step.done += by
        if what:
            step.what = what
        self._update(step)

    # ----- internals -----------------------------------------------------------------------
    def _end(self, step: Step, outermost: bool) -> None:
        took = _seconds(time.monotonic() - step.started)
        mark = end_mark(step.status)
        line = f"{mark} {step.title}: {step.status}" + (f" — {step.detail}" if step.detail else "")
        self.say(f"{line} ({took})")
        bad = step.status in STEP.alarming
        if bad and step.log:
            self.say(f"  log: {step.log}")
        if self.github and outermost:
            self.say("::endgroup::")
        if bad:
            where = f" (log: {step.log})" if step.log else ""
            self.error(f"{step.detail or step.status}{where}", f"{step.title}: {step.status}")

    def _show(self, step: Step) -> None:
        if not self.interactive:
            return
        with self._lock:
            if self._progress is None:
                self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                          MofNCompleteColumn(), TimeElapsedColumn(), console=self.rich,
                                          transient=True)
                self._progress.start()
            step._task = self._progress.add_task(step.title, total=step.total)

    def _update(self, step: Step) -> None:
        with self._lock:
            if self._progress is not None and step._task is not None:
                self._progress.update(TaskID(step._task), completed=step.done, total=step.total,
                                      description=f"{step.title} {step.what}".strip())

    def _hide(self, step: Step) -> None:
        with self._lock:
            if self._progress is None or step._task is None:
                return
            self._progress.remove_task(TaskID(step._task))
            if not self._progress.tasks:
                self._progress.stop()
                self._progress = None

    def _watch(self, step: Step, log: Path, stop: threading.Event) -> None:
        try:
            offset = log.stat().st_size
        except OSError:
            offset = 0
        tail = b""
        while not stop.wait(WATCH_S):
            try:
                with open(log, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError:
                continue
            if not chunk:
                continue
            offset += len(chunk)
            text = tail + chunk
            tail = text[text.rfind(b"\n") + 1:]
            found = NINJA_PROGRESS.findall(text)
            if found:
                done, total = found[-1]
                step.done, step.total = int(done), int(total)
                self._update(step)

    def _heartbeat(self, step: Step, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            progress = step.progress_text()
            took = _seconds(time.monotonic() - step.started)
            self.say(f"  … {step.title}: {progress + ', ' if progress else ''}{took}")
