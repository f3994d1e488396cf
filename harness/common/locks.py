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

Every lock that can be waited for has a place in one global order, :class:`Rank` and then
its lock file's absolute path, and a thread waits only for a lock after every lock it
holds (:func:`ordered` checks it and raises :class:`LockOrderError` otherwise).  A cycle
of waits between processes needs one thread that waits for a lock before one it holds,
so two runs can never wait on each other for ever, whatever order they ask for builds
in (docs/interrupts.md, "The lock order").  A thread that a lock holder may wait for
(the compile thread and the lanes, joined by the main thread that holds build
directories) takes only locks after the holder's (:func:`joined_by_holder_of`).

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
import threading
import uuid
from contextlib import ExitStack, contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Callable, Iterator

import filelock

from . import proc
from .console import current_step
from .errors import InputError


class Rank(IntEnum):
    """The kinds of lock in the global order, first to last (docs/interrupts.md, "The lock order").

    Within a rank, locks are ordered by their lock file's absolute path.  A source tree or the
    CUDA toolkit layout comes after the build directories because a run holds its builds for
    reading until it ends and prepares the source tree of a later build meanwhile; nothing
    else is taken while a source tree, the toolkit layout or a result cache entry is held.
    """

    FORECAST = 0  # a forecast directory, held for a whole forecast (harness.upstream.forecast)
    BUILD = 1  # a build directory: read while a run uses its binaries, written while it is built
    COMPILE = 2  # a compile-only directory of the CUDA compile step (harness.stages.building.cuda_compile)
    SOURCE = 3  # the source cache entry of the base, a variant's source tree (harness.stages.building.source)
    TOOLKIT = 4  # the CUDA toolkit layout in the harness cache
    CACHE_EVICT = 5  # the result cache's eviction (harness.record.cache)
    CACHE_ENTRY = 6  # one result cache entry


class LockOrderError(RuntimeError):
    """A thread asked for a lock that is not after every lock it holds: a bug of the harness, which could
    make two runs wait on each other for ever."""


#: Per thread: ``held``, the order keys of the locks it holds; ``floor``, the rank its locks must be after.
_thread = threading.local()


def order_key(rank: Rank, lock_file: str | Path) -> tuple[int, str]:
    """The place of ``lock_file`` (a lock of kind ``rank``) in the global order: the rank, then the absolute path."""
    return int(rank), os.path.abspath(lock_file)


def _describe(key: tuple[int, str]) -> str:
    return f"{Rank(key[0]).name.lower()} lock {key[1]}"


def joined_by_holder_of(rank: Rank) -> None:
    """Mark the calling thread as one that a thread holding locks of ``rank`` or before may wait for (join): from
    now on it may take only locks of later ranks.  A ThreadPoolExecutor's ``initializer`` (the compile thread,
    the lanes of the comparisons), since a wait for the thread counts as a wait for every lock it asks for."""
    _thread.floor = rank


@contextmanager
def ordered(rank: Rank, lock_file: str | Path) -> Iterator[None]:
    """Record, for the block, that this thread holds (or is about to wait for) ``lock_file`` of kind ``rank``.

    Enter it before waiting for the lock.  Raises LockOrderError, before any wait, when the lock is not after
    every lock this thread holds, or not after the rank :func:`joined_by_holder_of` set for this thread.
    """
    key = order_key(rank, lock_file)
    held: list[tuple[int, str]] = _thread.__dict__.setdefault("held", [])
    floor = getattr(_thread, "floor", None)
    if floor is not None and key[0] <= floor:
        raise LockOrderError(f"{_describe(key)} asked for by a thread that a holder of {floor.name.lower()} locks "
                             "may wait for; such a thread takes only later locks (harness.common.locks.Rank)")
    if held and max(held) >= key:
        raise LockOrderError(f"{_describe(key)} asked for while holding {_describe(max(held))}; locks are taken in "
                             "the order of harness.common.locks.Rank, then by path")
    held.append(key)
    try:
        yield
    finally:
        held.remove(key)


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


#: Lock file -> the console step of this process that holds it ("" for a thread outside any step): the message of
#: a wait says whether the holder is another step of this run, by its title, or another harness process.
_held_here: dict[str, str] = {}


@contextmanager
def exclusive(target: Path, what: str, rank: Rank, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock on ``target`` (a lock of kind ``rank``) for the block, waiting as long as another
    process holds it.

    ``what`` names the resource in the message ``say`` gets when it has to wait.  Raises LockOrderError
    (:func:`ordered`) when this thread holds a lock that is not before it.
    """
    lock = filelock.FileLock(str(lock_path(target)), is_singleton=False)
    with ordered(rank, lock.lock_file):
        try:
            lock.acquire(blocking=False)
        except filelock.Timeout:
            if say:
                holder = _held_here.get(lock.lock_file)
                waiter = current_step()
                say((f"{waiter}: " if waiter else "") + f"waiting for {what}: " + ("another harness process holds " + lock.lock_file if holder is None
                                               else f"another step of this run ({holder}) is using it" if holder
                                               else "another step of this run is using it"))
            lock.acquire()
        _held_here[lock.lock_file] = current_step()
        try:
            with _owned(lock.lock_file, say):
                yield
        finally:
            _held_here.pop(lock.lock_file, None)
            lock.release()


@contextmanager
def plain(lock_file: Path, rank: Rank) -> Iterator[None]:
    """Hold the ``filelock.FileLock`` at ``lock_file`` (a lock of kind ``rank``, no holder token: nothing is
    started under it) for the block, waiting as long as another process holds it.

    Raises LockOrderError (:func:`ordered`) when this thread holds a lock that is not before it.
    """
    with ordered(rank, lock_file), filelock.FileLock(str(lock_file), is_singleton=False):
        yield


class BuildLock:
    """The reader/writer lock of one build directory (``<build_dir>.lock``, an SQLite file); ``key`` its place
    in the global order (:func:`order_key`, rank BUILD)."""

    def __init__(self, build_dir: Path):
        self.path = lock_path(build_dir)
        self.key = order_key(Rank.BUILD, self.path)
        self._lock = filelock.ReadWriteLock(str(self.path), is_singleton=False)
        self._hold: ExitStack | None = None

    def _acquire(self, mode: str, say: Callable[[str], None] | None) -> None:
        hold = ExitStack()
        hold.enter_context(ordered(Rank.BUILD, self.path))  # raises LockOrderError before any wait
        acquire = self._lock.acquire_write if mode == "write" else self._lock.acquire_read
        try:
            try:
                acquire(blocking=False)
            except filelock.Timeout:
                if say:
                    say(f"waiting to {'build in' if mode == 'write' else 'use'} {self.path.with_suffix('')}: "
                        f"another harness process is {'using' if mode == 'write' else 'building'} it")
                acquire(timeout=-1)
        except BaseException:
            hold.close()
            raise
        self._hold = hold

    def _release(self) -> None:
        self._lock.release()
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    @contextmanager
    def write(self, say: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the lock for writing (a build): waits for every reader and writer to leave.

        Raises LockOrderError (:func:`ordered`) when this thread holds a lock that is not before it.
        """
        self._acquire("write", say)
        try:
            with _owned(str(self.path), say):
                yield
        finally:
            self._release()

    def read(self, say: Callable[[str], None] | None = None) -> None:
        """Take the lock for reading (running the binaries) until :meth:`release`; waits for a writer.

        Raises LockOrderError (:func:`ordered`) when this thread holds a lock that is not before it.
        """
        self._acquire("read", say)

    def release(self) -> None:
        """Release a hold taken with :meth:`read`."""
        self._release()
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

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting at most ``wait_s`` seconds (default: not at all); raises RunInUse naming the
        holder's pid when it is taken."""
        try:
            self._lock.acquire(timeout=wait_s) if wait_s > 0 else self._lock.acquire(blocking=False)
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
