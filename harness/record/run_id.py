"""Run ids (``20261130T120501Z-3fa2``) and the chain that holds one; standard library only, so that noxfile.py can
use it in any Python.

A *chain* is one invocation that runs a run's commands one process after the other: ``nox -s build test
compare-outputs`` (each session a harness process of its own), or one harness process.  It is named by the
process that lives from its first command to its last (nox's, or the harness's own): its pid and the time the
OS started it, ``<pid>:<start>``, so a pid the OS gives to another process later does not name the same chain.
The harness records a run's chain in ``<run>/.chain`` (harness.record.run.Run) and refuses the run id to any
other chain while that one lives: a second ``nox`` invocation with the same ``HARNESS_RUN_ID`` cannot slip in
between the sessions of the first.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from typing import Mapping

#: The variable a chain's process gives every harness process it starts: its chain name (:func:`chain_of`).
CHAIN_ENV = "HARNESS_CHAIN"
RUN_ID_ENV = "HARNESS_RUN_ID"


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id: UTC time to the second plus 4 random hex digits, e.g. 20261130T120501Z-3fa2."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def _start_time(pid: int) -> str:
    """When the OS started process ``pid``, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``, proc(5));
    "" where there is no such file (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def chain_of(pid: int | None = None) -> str:
    """The chain name of process ``pid`` (default: this one): ``<pid>:<start time>`` (:func:`_start_time`)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def chain_alive(chain: str) -> bool:
    """Whether the process that names ``chain`` (:func:`chain_of`) still runs: its pid exists with the same start
    time.  Without ``/proc`` (not Linux) a chain is taken for ended: nothing is refused there."""
    pid, _, start = chain.strip().partition(":")
    if not pid.isdigit() or not start:
        return False
    return _start_time(int(pid)) == start


def current_chain(environ: Mapping[str, str] | None = None) -> str:
    """The chain this harness process belongs to: ``$HARNESS_CHAIN`` when a chain's process (noxfile.py) gave it,
    else this process's own (:func:`chain_of`)."""
    env = os.environ if environ is None else environ
    return env.get(CHAIN_ENV) or chain_of()


def chain_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What noxfile.py gives every harness process of its invocation: the run id (``$HARNESS_RUN_ID`` as given,
    an empty one included, which the harness then refuses; else a new one) and this process's chain name.  Call
    it once, in the process that lives from the first session to the last."""
    env = os.environ if environ is None else environ
    given = env.get(RUN_ID_ENV)
    return {RUN_ID_ENV: new_run_id() if given is None else given, CHAIN_ENV: chain_of()}
