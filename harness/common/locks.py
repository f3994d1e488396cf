"""Locks between harness processes that share a work directory, a cache or a results directory.

All locks come from the ``filelock`` library (pinned in requirements.txt) and
are released by the operating system when their process dies, even by SIGKILL,
so a crashed run never leaves a stale lock behind.

* :func:`exclusive`: one holder at a time (``filelock.FileLock``): a source
  tree being prepared, a source-cache entry being filled, a run directory.
* :func:`build_lock`: a reader/writer lock per build directory
  (``filelock.ReadWriteLock``).  A build holds it for writing while it
  configures and builds; test and generation stages hold it for reading while
  they run the binaries (and check under it that the build is up to date), so no
  build in another process relinks a library under a running
  ``llama-completion``, and any number of readers share an up-to-date build.
  ``filelock`` (>= 3.21) provides this lock on SQLite's own locking, which
  lets us use one library for every lock instead of adding ``fasteners``.

A lock that is busy is waited for; the wait is announced once through ``say``.

A holder killed with SIGKILL cannot stop its children, and the OS releases its
lock at once: a ``cmake --build`` it started would go on writing into the tree
under the next holder.  So every exclusive or write hold has a token, kept in
``<lock>.holder`` while it is held and given to every child started meanwhile
(harness.common.proc.holding); the next process that takes the lock and finds a
token there ends the processes that still carry it (proc.end_holders) before
it touches the tree.  A holder that ends normally has waited for its children
and removes the file.  This needs ``/proc`` (Linux); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import filelock

from . import proc
from .errors import InputError


def lock_path(target: Path) -> Path:
    """The lock file guarding ``target``: ``<target>.lock`` beside it (its parent is created)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.with_name(target.name + ".lock")


@contextmanager
def _owned(lock_file: str, say: Callable[[str], None] | None) -> Iterator[None]:
    """The block of a just-taken exclusive or write lock: end what a killed earlier holder left running, then
    hold a fresh token in ``<lock_file>.holder`` for the children started in the block (see the module)."""
    holder = Path(lock_file + ".holder")
    try:
        left = holder.read_text().strip()
    except FileNotFoundError:
        left = ""
    if left:
        ended = proc.end_holders(left)
        if ended and say:
            say(f"ended {ended} process(es) that a killed harness process left running under {lock_file}")
    token = uuid.uuid4().hex
    holder.write_text(token + "\n")
    try:
        with proc.holding(token):
            yield
    finally:
        holder.unlink(missing_ok=True)


@contextmanager
def exclusive(target: Path, what: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock on ``target`` for the block, waiting as long as another process holds it.

    ``what`` names the resource in the message ``say`` gets when it has to wait.
    """
    lock = filelock.FileLock(str(lock_path(target)), is_singleton=False)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        if say:
            say(f"waiting for {what}: another harness process, or another step of this one, holds {lock.lock_file}")
        lock.acquire()
    try:
        with _owned(lock.lock_file, say):
            yield
    finally:
        lock.release()


class BuildLock:
    """The reader/writer lock of one build directory (``<build_dir>.lock``, an SQLite file)."""

    def __init__(self, build_dir: Path):
        self.path = lock_path(build_dir)
        self._lock = filelock.ReadWriteLock(str(self.path), is_singleton=False)

    def _acquire(self, mode: str, say: Callable[[str], None] | None) -> None:
        acquire = self._lock.acquire_write if mode == "write" else self._lock.acquire_read
        try:
            acquire(blocking=False)
        except filelock.Timeout:
            if say:
                say(f"waiting to {'build in' if mode == 'write' else 'use'} {self.path.with_suffix('')}: "
                    f"another harness process is {'using' if mode == 'write' else 'building'} it")
            acquire(timeout=-1)

    @contextmanager
    def write(self, say: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the lock for writing (a build): waits for every reader and writer to leave."""
        self._acquire("write", say)
        try:
            with _owned(str(self.path), say):
                yield
        finally:
            self._lock.release()

    def read(self, say: Callable[[str], None] | None = None) -> None:
        """Take the lock for reading (running the binaries) until :meth:`release`; waits for a writer."""
        self._acquire("read", say)

    def release(self) -> None:
        """Release a hold taken with :meth:`read`."""
        self._lock.release()
        self._lock.close()


class RunInUse(InputError):
    """The run directory is held by another live process."""


class RunLock:
    """Exclusive ownership of a run directory for the life of a process.

    The holder's pid is written to ``<run>/.owner`` for the refusal message.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._lock = filelock.FileLock(str(run_dir / ".lock"), is_singleton=False)

    def acquire(self) -> None:
        """Take the lock without waiting; raises RunInUse naming the holder's pid when it is taken."""
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            owner = (self.run_dir / ".owner").read_text().strip() if (self.run_dir / ".owner").exists() else "?"
            raise RunInUse(f"run {self.run_dir.name} is in use by another live harness process (pid {owner}); "
                           f"wait for it to end or choose another --run-id") from None
        (self.run_dir / ".owner").write_text(f"{os.getpid()}\n")

    @staticmethod
    def live_owner(run_dir: Path) -> int | None:
        """The pid of another live process writing the run ``run_dir``, or None (read from ``.owner``,
        which the owner removes when it ends; a pid that no longer exists, or this process, does not count)."""
        try:
            pid = int((run_dir / ".owner").read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return None if pid == os.getpid() else pid

    def release(self) -> None:
        """Give the run directory up (also happens when the process exits) and remove ``.owner``."""
        (self.run_dir / ".owner").unlink(missing_ok=True)
        self._lock.release()
