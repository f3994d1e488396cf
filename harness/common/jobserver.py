"""One job budget for everything the harness builds at once: a GNU make jobserver pool it hosts.

The CPU builds, the CUDA compile step (a thread beside them) and a cross build each run a ninja.
Given ``-j N`` each, two of them ran 2N jobs at once (issue 31: 5 compilers on 2 cores).  Here
they share one pool of job slots through the protocol the tools already speak, the GNU make
jobserver (https://www.gnu.org/software/make/manual/html_node/POSIX-Jobserver.html):

- the harness makes a FIFO in a private temporary directory and writes one byte, a token, into it
  per slot (``-j N``, else the cores this process may use); the directory goes when the run ends,
  or, for a harness killed with SIGKILL, when the next one opens its pool;
- every build process it starts (a CMake configure, a ``cmake --build``, a ``ninja``) gets
  ``MAKEFLAGS=-jN --jobserver-auth=fifo:PATH`` and no ``-j``: ninja 1.13 joins the pool as a client
  when MAKEFLAGS names one and no ``-j`` is given (its release notes; an explicit ``-j`` turns the
  client off), prints ``ninja: Jobserver mode detected`` and reads a token for every job beyond its
  first, writing it back when the job ends.  ``CMAKE_BUILD_PARALLEL_LEVEL`` is set empty, which
  makes ``cmake --build`` pass no ``-j`` (CMake's documentation of that variable);
- a client's first job runs on its implicit slot, which the pool does not see: so the harness
  takes a token before it starts each build process and gives it back when the process ends
  (:meth:`JobBudget.slot`).  A configure runs its compiler checks one after another on that slot.

So every ninja edge (compile or link) and every configure's check holds one of the N tokens: at
most N jobs at once across the threads of one harness process.  The pool only hosts tokens; which
job runs next is ninja's choice, as with GNU make.  The pool is one process's: two harness runs on
one machine each have their own, unless they are given one to share: where ``HARNESS_JOB_POOL`` names a pool
another process hosts (``-jN --jobserver-auth=fifo:PATH``, as in MAKEFLAGS), the harness joins it as a client
instead of hosting its own (:func:`shared_pool`; the project's test suite hosts one for every run its tests
start side by side, tests/conftest.py).

Where it cannot work the budget falls back to what each build did before (``-j N`` to each ninja
where given, the compile step ``-j`` cores) and :meth:`JobBudget.describe` says why, for the step's
log: a host without POSIX FIFOs (Windows: ninja's client there takes a named semaphore, which the
harness does not host), a ninja older than 1.13, or a FIFO that cannot be made.

No library is used for the pool: the PyPI packages for the protocol are clients (gnumake-tokenpool
waits for a token with SIGALRM, which only the main thread may use); hosting is a FIFO and N bytes.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import stat
import subprocess
import tempfile
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import proc

#: The first ninja release that joins a jobserver as a client (ninja 1.13.0 release notes, "fifo" style on POSIX).
NINJA_CLIENT_SINCE = (1, 13)
#: The name of a pool's directory in the temporary directory, before ``<pid>-<random>``.
PREFIX = "harness-jobs-"
#: The byte GNU make writes as a token; clients write back the byte they read.
TOKEN = b"+"
#: The variable naming a pool to join instead of hosting one: ``-jN --jobserver-auth=fifo:PATH`` (JobBudget.env's
#: MAKEFLAGS of the host)
POOL_ENV = "HARNESS_JOB_POOL"
_POOL_SPEC = re.compile(r"-j(?P<slots>\d+) --jobserver-auth=fifo:(?P<fifo>\S+)")
#: Seconds between two looks for a stop (harness.common.proc.stop_children) while waiting for a token.
POLL_S = 0.2


def ninja_version(ninja: str) -> tuple[int, ...] | None:
    """The version ``ninja --version`` prints, as numbers (``1.13.2.git.kitware...`` -> (1, 13, 2));
    None when it cannot be run or prints no version."""
    try:
        out = subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)*)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


@dataclass
class JobBudget:
    """A pool of ``slots`` job slots shared by every build process started with it.

    ``fifo``: the pool's FIFO, None where there is no pool; ``why_not`` then says why (the step's
    log gets it through :meth:`describe`).  Make one with :meth:`open`; :meth:`close` removes the FIFO.
    """

    slots: int
    fifo: Path | None = None
    why_not: str = ""
    #: True where the pool is another process's (HARNESS_JOB_POOL), joined rather than hosted
    joined: bool = False
    _fd: int = field(default=-1, repr=False)
    _remove: weakref.finalize | None = field(default=None, repr=False)

    @classmethod
    def open(cls, jobs: int | None, cores: int, ninja: str | None) -> "JobBudget":
        """A pool of ``jobs`` slots (``-j``), else ``cores``, for builds run with ``ninja``; where
        :data:`POOL_ENV` names a pool another process hosts, that pool, joined (:meth:`join`), whatever ``jobs`` says.

        Returns a budget without a pool (``why_not`` set) where this host has no POSIX FIFOs, where
        ``ninja`` is missing or older than :data:`NINJA_CLIENT_SINCE`, or where the FIFO cannot be
        made.  Raises nothing.
        """
        slots = max(1, jobs or cores)
        if os.name != "posix" or not hasattr(os, "mkfifo"):
            return cls(slots, why_not="this host has no POSIX FIFOs (on Windows ninja's jobserver client takes a "
                                      "named semaphore, which the harness does not host)")
        version = ninja_version(ninja) if ninja else None
        if version is not None and version[:2] >= NINJA_CLIENT_SINCE:
            shared = cls.join(os.environ.get(POOL_ENV, ""))
            if shared is not None:
                return shared
        if version is None:
            return cls(slots, why_not=f"the version of ninja ({ninja or 'not found'}) is unknown")
        if version[:2] < NINJA_CLIENT_SINCE:
            return cls(slots, why_not=f"ninja {'.'.join(map(str, version))} has no jobserver client (ninja "
                                      f"{'.'.join(map(str, NINJA_CLIENT_SINCE))} has; requirements.txt pins it)")
        _sweep(Path(tempfile.gettempdir()))
        home = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        fifo = home / "pool"
        if any(c.isspace() for c in str(fifo)):  # MAKEFLAGS is split at white space
            shutil.rmtree(home, ignore_errors=True)
            return cls(slots, why_not=f"the temporary directory {home.parent} has white space in its path")
        try:
            os.mkfifo(fifo, 0o600)
            fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # read and write ends in one: never blocks on open
        except OSError as exc:
            shutil.rmtree(home, ignore_errors=True)
            return cls(slots, why_not=f"no FIFO could be made in {home} ({exc})")
        os.write(fd, TOKEN * slots)
        budget = cls(slots, fifo, "", _fd=fd)
        budget._remove = weakref.finalize(budget, _remove, fd, home)  # also at exit, where close() was not called
        return budget

    @classmethod
    def join(cls, spec: str) -> "JobBudget | None":
        """The pool another process hosts, as ``spec`` names it (``-jN --jobserver-auth=fifo:PATH``, the value
        of :data:`POOL_ENV`), joined: its tokens are taken and given back, never added, and :meth:`close` leaves
        the FIFO to its host.  None where ``spec`` is empty, names no slot count or no FIFO, or the FIFO cannot
        be opened (the caller then hosts a pool of its own).  Raises nothing."""
        m = _POOL_SPEC.fullmatch(spec.strip())
        if not m:
            return None
        fifo = Path(m.group("fifo"))
        try:
            if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                return None
            fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            return None
        budget = cls(max(1, int(m.group("slots"))), fifo, "", joined=True, _fd=fd)
        budget._remove = weakref.finalize(budget, _close_fd, fd)
        return budget

    @property
    def governs(self) -> bool:
        """True when the pool hosts the slots (the jobserver works here)."""
        return self.fifo is not None

    def env(self) -> dict[str, str]:
        """Variables for a build process's environment: MAKEFLAGS naming the pool and an empty
        CMAKE_BUILD_PARALLEL_LEVEL (so ``cmake --build`` passes no ``-j``); {} without a pool."""
        if not self.governs:
            return {}
        return {"MAKEFLAGS": f"-j{self.slots} --jobserver-auth=fifo:{self.fifo}", "CMAKE_BUILD_PARALLEL_LEVEL": ""}

    def jobs_option(self, jobs: int | None) -> list[str]:
        """The ``-j`` option of a ninja (or ``cmake --build``): none where the pool governs (an explicit
        ``-j`` would turn ninja's client off), else ``-j jobs`` where ``jobs`` is given, as before the pool."""
        return [] if self.governs or not jobs else ["-j", str(jobs)]

    def describe(self) -> str:
        """One line for a build step's log: the shared budget, or why there is none."""
        if self.governs and self.joined:
            return (f"jobs: at most {self.slots} at once across every build of the processes sharing the pool "
                    f"{POOL_ENV} names (GNU make jobserver, fifo:{self.fifo}; this step holds one token while it "
                    "runs)")
        if self.governs:
            return (f"jobs: at most {self.slots} at once across every build of this run (GNU make jobserver, "
                    f"fifo:{self.fifo}; this step holds one token while it runs)")
        return f"jobs: no shared budget ({self.why_not}); this step runs as its own -j says"

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one token of the pool for the block (the implicit slot of the process started in it);
        waits until one is free.  Without a pool, holds nothing.

        While waiting, a stop of the harness (harness.common.proc.stop_children) raises
        :class:`~harness.common.proc.Interrupted` in a thread other than the main one, and a signal
        the main thread's handler turns into an exception ends the wait there.
        """
        if not self.governs:
            yield
            return
        token = self._take()
        try:
            yield
        finally:
            if self._fd >= 0:  # not closed meanwhile
                os.write(self._fd, token)

    def _take(self) -> bytes:
        while True:
            proc.raise_if_stopping()
            ready, _, _ = select.select([self._fd], [], [], POLL_S)
            if ready:
                try:
                    token = os.read(self._fd, 1)
                except BlockingIOError:  # another thread or a ninja took it first
                    continue
                if token:
                    return token

    def close(self) -> None:
        """Remove the pool (its FIFO and directory; a joined pool's only this process's end of it); the budget
        then has no pool.  Safe to call twice."""
        if self._remove is not None:
            self._remove()  # a finalizer runs once
        self.fifo, self._fd, self.why_not = None, -1, "closed"


def _sweep(tmp: Path) -> int:
    """Remove the pools in ``tmp`` whose process is gone (a harness killed with SIGKILL cannot remove its
    own; the process id is in the directory's name).  Returns how many were removed."""
    removed = 0
    for home in tmp.glob(f"{PREFIX}*-*"):
        pid = home.name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(home, ignore_errors=True)
            removed += 1
        except OSError:  # alive, someone else's
            pass
    return removed


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _remove(fd: int, home: Path) -> None:
    _close_fd(fd)
    shutil.rmtree(home, ignore_errors=True)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no affinity on Windows and macOS
        return os.cpu_count() or 1
