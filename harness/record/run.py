"""An open run (:class:`Run`): the results directory held by one process (harness.common.locks.RunLock),
its steps and comparisons recorded and the summary rewritten after every step, so that a run that dies keeps
everything it collected.  No run overwrites another: run ids are UTC timestamps plus a random suffix
(:func:`check_run_id` for one given) and the directory is created exclusively.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..common.errors import InputError
from ..common.fs import describe, writable_dir, write_text_whole
from ..common.locks import RunInUse, RunLock
from .run_id import RUN_ID_ENV, chain_alive, current_chain, new_run_id
from ..common.statuses import (KILLED, STEP, VERDICT_FAILED, VERDICT_IN_PROGRESS, VERDICT_INCOMPLETE, VERDICT_PASSED,
                               VERDICT_SKIPPED, RUN_FORK, check_run_kind)
from .records import RECORD_VERSION, StepRecord, ComparisonRecord
from .layout import RunLayout
from .json_files import load_records, judged_json, write_json
from .summary_md import SummaryView, render_markdown
from .verdict import unproven_notes

#: A run id: a plain name (a folder of the results directory, never a path), as new_run_id makes them.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: Names of the results directory that are not runs.
RESERVED_RUN_IDS = frozenset({"latest", "junit", "LATEST"})


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is a plain name (:data:`RUN_ID`, not ``..`` and not one of :data:`RESERVED_RUN_IDS`);
    raises InputError naming it otherwise (``--run-id ../../x`` would write outside the results directory)."""
    if not RUN_ID.fullmatch(run_id) or ".." in run_id or run_id in RESERVED_RUN_IDS:
        raise InputError(f"run id {run_id!r} (--run-id or HARNESS_RUN_ID) is not a plain name: use letters, digits, "
                         "'.', '_' and '-' (no '/' and no '..'), not 'latest' or 'junit'; it names a folder of the "
                         "results directory")
    return run_id


#: Space a run holds back while it runs (``<run>/.reserve``, removed by Run.close): when the disk
#: fills up, giving it up lets the summary still be written (a summary of 16 comparisons is ~20 KiB).
RESERVE_BYTES = 256 * 1024
RESERVE_NAME = ".reserve"

#: The chain of commands that holds a run (harness.record.run_id), in ``<run>/.chain``; seconds a process of that
#: chain waits for the run's lock, held for a moment by another chain's process on its way to being refused.
CHAIN_NAME = ".chain"
CHAIN_WAIT_S = 30.0


class Run:
    """An open results directory; records steps and comparisons and keeps the summary current.  ``kind``: what
    the run is (harness.common.statuses.RUN_KINDS), written into a new run's run.json; a command continuing a run
    of another recorded kind is refused (InputError)."""

    def __init__(self, root: Path, run_id: str, *, create: bool = True, argv: Iterable[str] = (),
                 kind: str = RUN_FORK):
        self.kind = check_run_kind(kind)
        self.root = root
        self.id = run_id
        self.dir = root / run_id
        self.layout = RunLayout(self.dir)
        self.steps: list[StepRecord] = []
        self.comparisons: list[ComparisonRecord] = []
        self.skipped_platforms: dict[str, str] = {}
        self.incomplete: list[str] = []
        self.cache: dict[str, dict[str, int]] = {}  # result cache events per kind (harness.record.cache.EVENTS)
        self.progress: dict[str, Any] | None = None  # while a command runs: see begin()
        self.interrupted = ""  # "killed": a harness process died while it ran the run (settle_dead_progress)
        self.commands: list[str] = []  # the stage commands begun in this run, by any of its processes (begin)
        self._lock: RunLock | None = None
        self._records = threading.RLock()  # steps, comparisons and the summary files, from any thread
        now = datetime.now(timezone.utc).isoformat()
        if create:
            writable_dir(root, "results directory")
        if create and not self.dir.exists():
            self.dir.mkdir(parents=True, exist_ok=False)
            self._own()
            write_json(self.layout.run_json, {"run_id": run_id, "kind": kind, "started": now,
                                               "commands": [{"argv": list(argv), "started": now}]})
            self._point_latest()
        elif self.dir.exists():
            if create:
                self._own()
                self._join_chain()
            if self.layout.summary_json.exists():
                self._load()
            if create and self.layout.run_json.exists():
                # a later stage continues the run (HARNESS_RUN_ID or --run-id): record its command too
                info = json.loads(self.layout.run_json.read_text(encoding="utf-8"))
                if info.get("kind") not in (None, kind):
                    self.close()
                    raise InputError(f"run {run_id} is a {info['kind']} run ({self.layout.run_json}); this command "
                                     f"runs a {kind} run: choose another --run-id (or HARNESS_RUN_ID)")
                info.setdefault("commands", []).append({"argv": list(argv), "started": now})
                write_json(self.layout.run_json, info)

    def _own(self) -> None:
        """Hold the run directory for this process (harness.common.locks.RunLock; raises RunInUse when taken)
        and set RESERVE_BYTES aside in it, for the summary of a run that fills the disk."""
        self._lock = RunLock(self.dir)
        self._lock.acquire(wait_s=CHAIN_WAIT_S if self._chain_holder() == current_chain() else 0.0)
        chain = self.dir / CHAIN_NAME
        if not chain.exists():
            write_text_whole(chain, current_chain() + "\n")
        reserve = self.dir / RESERVE_NAME
        with open(reserve, "wb") as fh:
            fh.write(bytes(RESERVE_BYTES))

    def _chain_holder(self) -> str:
        """The chain recorded as holding the run (harness.record.run_id), or "" when none is."""
        try:
            return (self.dir / CHAIN_NAME).read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            return ""

    def _join_chain(self) -> None:
        """Continue the run in this process's chain (harness.record.run_id.current_chain), before anything is
        recorded: refused (RunInUse, exit 2) while another chain that holds the run lives, e.g. a second ``nox``
        invocation with the same HARNESS_RUN_ID between two sessions of the first; a run whose chain has ended
        is taken over.  Raises RunInUse after giving the run directory up again."""
        holder, mine = self._chain_holder(), current_chain()
        if holder and holder != mine and chain_alive(holder):
            self.close()
            raise RunInUse(f"run {self.id} belongs to another invocation that is still running (process "
                           f"{holder.partition(':')[0]}, between or in its commands); a run id belongs to one chain "
                           f"of commands: wait for it to end or choose another --run-id")
        if holder != mine:
            write_text_whole(self.dir / CHAIN_NAME, mine + "\n")

    def close(self) -> None:
        """Give the run directory and its reserve up (a later process may continue the run)."""
        (self.dir / RESERVE_NAME).unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @classmethod
    def open(cls, root: Path, run_id: str | None = None, argv: Iterable[str] = (), *,
             kind: str = RUN_FORK) -> "Run":
        """Open run ``run_id`` under ``root`` (continuing it if it exists) or start a new one of ``kind``.

        ``kind`` (harness.common.statuses: ``RUN_FORK``, the default, ``RUN_FORECAST``, ``RUN_ROLL``,
        ``RUN_BISECT``, ``RUN_SERIES``) is what the caller creates: run.json records it, and only ``fork`` runs are the fork's
        history (harness.triage.run_choice).  A run continued with another kind than it recorded is refused
        (InputError); ValueError for a kind not declared.

        Several stages of one invocation (``nox -s build test compare-outputs``)
        share a run through the HARNESS_RUN_ID environment variable, one
        process after the other: a run held by a live process is refused
        (RunInUse).  Raises EnvironmentProblem when ``root`` cannot hold runs, InputError for a run id
        that is not a plain name (:func:`check_run_id`).
        """
        if run_id is None:
            run_id = os.environ.get(RUN_ID_ENV)
        run_id = new_run_id() if run_id is None else run_id
        check_run_id(run_id)  # an empty --run-id or HARNESS_RUN_ID is refused as any name that is not plain
        return cls(root, run_id, argv=argv, kind=kind)

    def _point_latest(self) -> None:
        link = self.root / "latest"
        tmp = self.root / f".latest-{self.id}"
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(self.id, target_is_directory=True)
            tmp.replace(link)
        except OSError:
            (self.root / "LATEST").write_text(self.id + "\n")

    def _load(self) -> None:
        self.steps, self.comparisons, data = load_records(self.dir)
        self.skipped_platforms = dict(data.get("skipped_platforms", {}))
        self.incomplete = list(data.get("incomplete", []))
        self.cache = {k: dict(v) for k, v in (data.get("cache") or {}).items()}
        self.interrupted = str(data.get("interrupted") or "")
        self.commands = [str(c) for c in data.get("commands") or []]
        self.progress = data.get("in_progress")

    def count_cache(self, stats: Mapping[str, Mapping[str, int]]) -> None:
        """Add one process's result cache counts (kind -> event -> n, harness.record.cache) to the run's."""
        for kind, events in stats.items():
            mine = self.cache.setdefault(kind, {})
            for event, n in events.items():
                mine[event] = mine.get(event, 0) + n

    def platform_dir(self, platform: str) -> Path:
        """``results/<run-id>/<platform>/`` (created)."""
        path = self.layout.platform(platform)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record_step(self, step: StepRecord) -> None:
        """Add or replace (same platform, config, step) a step record and rewrite the summary."""
        key = (step.platform, step.config, step.step)
        with self._records:
            for i, s in enumerate(self.steps):
                if (s.platform, s.config, s.step) == key:
                    self.steps[i] = step  # keep the table's order stable
                    break
            else:
                self.steps.append(step)
            self.write_summary()

    def step(self, platform: str, config: str, step: str) -> StepRecord | None:
        """The recorded step (platform, config, step), or None."""
        for s in self.steps:
            if (s.platform, s.config, s.step) == (platform, config, step):
                return s
        return None

    def record_comparisons(self, records: Iterable[ComparisonRecord]) -> None:
        """Add comparison records (replacing same platform/group/model/prompt/candidate) and rewrite the summary."""
        new = list(records)
        keys = {(r.platform, r.group, r.model, r.prompt, r.candidate) for r in new}
        with self._records:
            self.comparisons = [c for c in self.comparisons
                                if (c.platform, c.group, c.model, c.prompt, c.candidate) not in keys] + new
            self.write_summary()

    def mark_incomplete(self, reason: str) -> None:
        """Record that something the user asked for did not run (e.g. an explicitly selected platform was skipped)."""
        with self._records:
            if reason not in self.incomplete:
                self.incomplete.append(reason)
            self.write_summary()

    def overall(self) -> str:
        """The run's verdict.

        ``in-progress`` while a command runs (:meth:`begin` to :meth:`end`: no verdict yet); then, from the
        outcomes the statuses declare (:data:`STEP`, :data:`COMPARISON`): ``failed`` when a step has a failure
        status or a comparison fails (:meth:`ComparisonRecord.failed`, by its group's ``expect``); else
        ``incomplete`` when something explicitly asked for did not run, or a step has an unproven status
        (interrupted, or could not read what it checks); else ``skipped`` when no step has a success status and
        there is no comparison; else ``passed``.  Only ``passed`` is a success.
        """
        if self.progress is not None:
            return VERDICT_IN_PROGRESS
        if any(STEP.is_failure(s.status) for s in self.steps) or any(c.failed() for c in self.comparisons):
            return VERDICT_FAILED
        if self.incomplete or any(s.status in STEP.unproven for s in self.steps):
            return VERDICT_INCOMPLETE
        if not any(s.status in STEP.successes for s in self.steps) and not self.comparisons:
            return VERDICT_SKIPPED
        return VERDICT_PASSED

    def notes(self) -> list[str]:
        """What the verdict does not cover, in words: killed, the stages still to run, platforms skipped, what passing
        steps do not prove (harness.record.verdict.unproven_notes)."""
        n = len(self.skipped_platforms)
        notes = [KILLED] if self.interrupted == "killed" else []
        if self.progress is not None:
            notes.append("to run: " + ", ".join(self.progress["to_run"]) if self.progress["to_run"]
                         else "its last stages running")
        if n:
            notes.append(f"{n} platform{'s' if n != 1 else ''} skipped")
        return notes + unproven_notes(self.steps)

    def summary_view(self) -> SummaryView:
        """What summary.md shows of this run now (:func:`render_markdown`)."""
        return SummaryView(self.id, self.overall(), self.notes(), list(self.steps), list(self.comparisons),
                           list(self.incomplete), dict(self.skipped_platforms), dict(self.cache), self.layout)

    def headline(self) -> str:
        """The verdict with what it does not cover and what failed, e.g. ``failed (2 platforms skipped): p fork
        build: patch x.patch does not apply`` (:meth:`SummaryView.headline`)."""
        return self.summary_view().headline()

    def begin(self, command: str, to_run: Iterable[str], token: str) -> None:
        """Record that this process runs ``command`` (e.g. ``build test``): the verdict is ``in-progress``
        until :meth:`end`, with the stages ``to_run`` (names, in order; :meth:`stage_started` takes each off)
        and the steps in progress (:meth:`doing`).  ``token``: what every child of the run carries in its
        environment (harness.common.proc.HOLDS_ENV), for a later run to end what a killed one left."""
        with self._records:
            self.commands += [c for c in command.split() if c not in self.commands]
            self.progress = {"pid": os.getpid(), "command": command, "to_run": list(to_run), "doing": [],
                             "token": token, "started": datetime.now(timezone.utc).isoformat()}
            self.write_summary()

    def stage_started(self, stage: str) -> None:
        """Take ``stage`` off the stages still to run of :meth:`begin` and rewrite the summary."""
        with self._records:
            if self.progress is not None and stage in self.progress["to_run"]:
                self.progress["to_run"].remove(stage)
                self.write_summary()

    def doing(self, steps: Iterable[tuple[str, str, str, bool]]) -> None:
        """Record the steps in progress, (platform, config, step, recheck) each (harness.record.progress.Doing):
        a run killed mid-way has them read as ``interrupted`` (:func:`settle_dead_progress`)."""
        with self._records:
            if self.progress is not None:
                self.progress["doing"] = [list(d) for d in steps]
                self.write_summary()

    def end(self) -> None:
        """The command ended (done, stopped or refused): drop the in-progress record, so the verdict is
        computed from the records; the caller writes the summary."""
        with self._records:
            self.progress = None

    def _write_summary_files(self) -> None:
        write_json(self.layout.summary_json, {
            "run_id": self.id, "record_version": RECORD_VERSION, "updated": datetime.now(timezone.utc).isoformat(),
            "overall": self.overall(), "commands": self.commands,
            "configurations": [judged_json(s) for s in self.steps],
            "comparisons": [judged_json(c) for c in self.comparisons],
            "skipped_platforms": self.skipped_platforms, "incomplete": self.incomplete, "cache": self.cache,
            **({"in_progress": self.progress} if self.progress is not None else {}),
            **({"interrupted": self.interrupted} if self.interrupted else {})})
        write_text_whole(self.layout.summary_md, render_markdown(self.summary_view()))

    def write_summary(self) -> None:
        """Write summary.json and summary.md for everything recorded so far, each replaced whole.

        When the disk is full the first time, the run's reserve (RESERVE_BYTES) is
        given up so that both files can still be written, saying the run is
        incomplete because the file system is full; the OSError (naming the file
        that could not be written) is then raised.  Raises OSError otherwise.
        """
        try:
            with self._records:
                self._write_summary_files()
        except OSError as exc:
            reserve = self.dir / RESERVE_NAME
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not reserve.exists():
                raise
            reserve.unlink()
            self.incomplete.append(f"stopped: the file system holding {self.dir} is full ({describe(exc)})")
            self._write_summary_files()
            raise


#: Lines of a detail a summary table cell shows, each whole (an error line cut in the middle loses what it says);
