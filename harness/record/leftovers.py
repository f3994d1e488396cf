"""What a harness process killed mid-way (SIGKILL, a crash) leaves, found and ended by the next run.

A run in progress keeps ``<run>/.groups`` (harness.common.proc.recording_groups: the process group
of every child it started, one a line) and, in summary.json's ``in_progress``, its pid and the token
every child carries in its environment.  A process that ends, whatever way it ends short of being
killed, removes ``.groups``; so a ``.groups`` beside a run no live process owns belongs to a
process that died.  :func:`settle_killed_runs` ends the groups of every such run under a results
directory, whatever its run id, and rewrites its summary as it reads once its process is known to
be dead (harness.record.json_files.settle_dead_progress: ``incomplete``, interrupted: killed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..common import proc
from ..common.locks import RunInUse, RunLock
from .layout import RunLayout
from .run import Run

#: The file of a run directory that lists its children's process groups while a process runs it.
GROUPS_NAME = ".groups"


@dataclass(frozen=True)
class Settled:
    """A run whose harness process was found dead: ``run_dir``, and ``ended``: how many processes it had left
    running that were ended."""

    run_dir: Path
    ended: int


def settle_killed_runs(results_root: Path, skip: Path | None = None) -> list[Settled]:
    """End what every run under ``results_root`` (but ``skip``, the caller's own) whose harness process died
    mid-way left running, and rewrite its summary.json and summary.md as ``incomplete`` (interrupted: killed).

    A run is taken only when no live process holds it (harness.common.locks.RunLock, taken for the
    moment it is settled); one held is running and left alone.  Returns the runs settled.  Raises
    OSError when a summary cannot be rewritten.
    """
    settled = []
    for groups in sorted(Path(results_root).glob(f"*/{GROUPS_NAME}")):
        run_dir = groups.parent
        if skip is not None and run_dir.resolve() == skip.resolve():
            continue
        lock = RunLock(run_dir)
        try:
            lock.acquire()
        except RunInUse:
            continue
        try:
            try:
                raw = json.loads(RunLayout(run_dir).summary_json.read_text(encoding="utf-8"))
                token = str((raw.get("in_progress") or {}).get("token") or "")
            except (OSError, ValueError, AttributeError):
                token = ""
            ended = proc.end_run_leftovers(groups, token) if token else 0
            if RunLayout(run_dir).summary_json.is_file():
                Run(run_dir.parent, run_dir.name, create=False).write_summary()  # loaded as settled
            groups.unlink(missing_ok=True)
            settled.append(Settled(run_dir, ended))
        finally:
            lock.release()
    return settled
