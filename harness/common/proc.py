"""Child processes in their own process groups, and what an interrupt does to them.

Every program the harness starts (cmake, ninja, ctest, llama-completion,
llama-tokenize, servers, test binaries) goes through :func:`run` or
:func:`start`: each child leads a new process group (a new session on POSIX,
``CREATE_NEW_PROCESS_GROUP`` on Windows), so the compilers ninja forks or the
threads of a server are one unit.  A child that times out, or that is running
when the harness is interrupted (SIGINT, SIGTERM) or fails with an exception,
has its whole group terminated: SIGTERM, then SIGKILL after
:data:`GRACE_S` seconds, and is waited for.  No child outlives the harness.
A harness killed with SIGKILL cannot do this; what it started under a lock is
found by :data:`HOLDS_ENV` and ended by the next holder (harness.common.locks).

:func:`handle_signals` turns SIGINT and SIGTERM into :class:`Interrupted`, a
``BaseException`` (like ``KeyboardInterrupt``), so the ``except Exception``
handlers that keep one failing platform from stopping the others do not
swallow it; the stage runner records the run as incomplete and exits with
``128 + signal`` (130 for SIGINT, 143 for SIGTERM), the shell convention.

Longer than 400 lines: starting a child, ending its group, the holders a killed harness left and the
signal handling are one mechanism: each needs the live children and the process groups the others keep.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Sequence

from .win_job import tie_children_to_this_process

#: Seconds a process group gets between SIGTERM and SIGKILL (ninja needs a moment to stop its
#: compilers and clean up partial outputs; 5 s is ample for that and short for a user waiting).
GRACE_S = 5.0

#: The variable every child gets in its environment: the tokens (space-separated) of the locks this process
#: holds when it starts the child (harness.common.locks).  Children inherit it, so the compilers that ninja
#: forks carry it too, and a later holder of a lock can find what a killed holder left running.
HOLDS_ENV = "HARNESS_LOCK_HOLDS"

_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_holds: list[str] = []
_group_logs: list[Path] = []  # files each child's process group id is appended to (see recording_groups)
_stopping: list[int] = []  # the signal of a stop in force (see stop_children)


class Interrupted(BaseException):
    """The harness got SIGINT or SIGTERM; ``signum`` says which and ``exit_code`` is 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def signal_name(self) -> str:
        """SIGINT or SIGTERM."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


@dataclass
class Completed:
    """A finished child: ``returncode`` (negative: killed by that signal; None: timed out) and
    ``seconds`` of wall time; ``timed_out`` when the harness killed it after its timeout."""

    argv: list[str]
    returncode: int | None
    seconds: float
    timed_out: bool = False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    return True


def terminate(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Terminate ``proc`` and every process of its group, then wait for ``proc``.

    POSIX: SIGTERM to the group; after ``grace_s`` seconds any member still
    alive gets SIGKILL.  Windows: CTRL_BREAK_EVENT to the group, then
    ``TerminateProcess``.  Safe to call for a process that already exited.
    """
    if os.name == "nt":  # pragma: no cover - exercised on Windows only
        if proc.poll() is None:
            try:
                proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
                proc.wait(timeout=grace_s)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        proc.wait()
        return
    pgid = proc.pid
    if not _group_alive(pgid):
        proc.wait()
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader so its pid stops counting as a group member
        if not _group_alive(pgid):
            break
        time.sleep(0.05)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    while _group_alive(pgid) and time.monotonic() < deadline + grace_s:
        time.sleep(0.05)  # members killed with SIGKILL are reaped by init; wait until they are gone


def raise_if_stopping() -> None:
    """Raise :class:`Interrupted` in a thread other than the main one while :func:`stop_children` is in force."""
    if _stopping and threading.current_thread() is not threading.main_thread():
        raise Interrupted(_stopping[0])


@contextmanager
def stop_children(signum: int = signal.SIGTERM) -> Iterator[None]:
    """For the block, the harness is stopping: every child is terminated, a thread other than the main one
    that starts a child or waits for one gets :class:`Interrupted` (``signum``), as the main thread got it
    from the signal, so what it was doing is recorded as interrupted, not as failed; the block joins those
    threads.  Children are terminated again as the block ends, for one started as the stop came."""
    _stopping[:] = [signum]
    try:
        terminate_all()
        yield
        terminate_all()
    finally:
        _stopping.clear()


def stop_and_wait(futures: Iterable[Future], signum: int = signal.SIGTERM) -> None:
    """Stop what other threads run for ``futures`` (:func:`stop_children` with ``signum``) and wait until every
    one is done, terminating children again every 0.2 s, also one a thread started as the stop came."""
    with stop_children(signum):
        pending = set(futures)
        while pending:
            terminate_all()
            _, pending = wait(pending, timeout=0.2)


def command_line(argv: Sequence[str | os.PathLike], env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> str:
    """``argv`` as one POSIX shell line that runs it again when pasted: every word quoted (shlex.join),
    preceded by ``env VAR=value …`` for the variables ``env`` adds to the environment (as :func:`start`
    adds them; :data:`HOLDS_ENV`, the harness's own bookkeeping, left out) and by ``cd DIR &&`` for a
    working directory ``cwd``.  The line each log of a program the harness runs starts with, after ``$ ``."""
    added = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items() if k != HOLDS_ENV]
    line = shlex.join(str(a) for a in argv)
    if added:
        line = " ".join(["env", *added, line])
    return f"cd {shlex.quote(str(cwd))} && {line}" if cwd is not None else line


#: prctl(2)'s option that gives a process a signal when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """The function a child runs after fork and before exec on Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` through
    ctypes, so the kernel sends it SIGTERM when the harness dies, SIGKILL included; a harness already gone by then
    is found by the parent pid and the child ends itself the same way.  None elsewhere, or without a C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return in_child


def _popen(argv: list[str], kwargs: dict[str, Any]) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` in the spawner thread (:func:`_spawner`) on Linux, registered as live."""
    proc = subprocess.Popen(argv, preexec_fn=_parent_death_signal(), **kwargs)
    with _live_lock:
        _live.add(proc)
        for log in _group_logs:
            try:
                with open(log, "a", encoding="ascii") as fh:
                    fh.write(f"{proc.pid}\n")  # the child leads its group: its pid is the group id
            except OSError:
                pass  # a full disk: the token in the child's environment still finds it (end_run_leftovers)
        _tell_guard(f"+{proc.pid}")
    return proc


_spawn_pool: list[ThreadPoolExecutor] = []


def _spawner() -> ThreadPoolExecutor:
    """The one thread every child is started from on Linux.  The kernel sends the parent-death signal when the
    *thread* that forked the child ends (prctl(2)), and the harness's worker threads end before their children
    may (the speed stage starts engines in a pool it shuts down); this thread lives as long as the process."""
    with _live_lock:
        if not _spawn_pool:
            _spawn_pool.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-spawner"))
        return _spawn_pool[0]


_guard: list[subprocess.Popen] = []


def _tell_guard(line: str) -> None:
    """Write ``line`` to this process's guard (harness.common.guard), starting it first when there is none; called
    with ``_live_lock`` held.  A guard that cannot be started or written to is done without: the next run still
    ends what a killed one left (:func:`end_run_leftovers`)."""
    if os.name == "nt":  # pragma: no cover - the harness runs on Linux
        return
    try:
        if not _guard or _guard[0].poll() is not None:
            _guard[:] = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("guard.py"))],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)]
        stdin = _guard[0].stdin
        assert stdin is not None
        stdin.write(f"{line}\n".encode("ascii"))
        stdin.flush()
    except (OSError, ValueError):
        pass


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
          stdin: IO | int | None = subprocess.DEVNULL, stdout: IO | int | None = None,
          stderr: IO | int | None = None) -> subprocess.Popen:
    """Start ``argv`` (a list, never a shell string) as the leader of a new process group that dies with the
    harness.

    ``env`` is added on top of ``os.environ``; :data:`HOLDS_ENV` names the
    :func:`holding` tokens in force.  The child is registered until
    :func:`finish` or :func:`terminate_all` handles it.  On Linux the child gets the parent-death signal
    (SIGTERM, :func:`_parent_death_signal`), and the harness's guard (harness.common.guard) ends its whole group
    once the harness is gone, so a harness killed with SIGKILL leaves no ctest, test or engine running 5 s
    later.  On Windows the harness is first put into a job object that ends its processes when it ends
    (harness.common.win_job).  Raises OSError when the program cannot be started, :class:`Interrupted` in another thread than
    the main one while :func:`stop_children` is in force.
    """
    raise_if_stopping()
    kwargs: dict[str, Any] = {}
    if os.name == "nt":  # pragma: no cover
        tie_children_to_this_process()  # a job object ends the child with the harness (harness.common.win_job)
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    else:
        kwargs["start_new_session"] = True
    full_env = {**os.environ, **(env or {})}
    if _holds:
        full_env[HOLDS_ENV] = " ".join([*full_env.get(HOLDS_ENV, "").split(), *_holds])
    kwargs.update(stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=full_env)
    if not sys.platform.startswith("linux"):
        return _popen(list(argv), kwargs)
    return _spawner().submit(_popen, list(argv), kwargs).result()


def _forget(proc: subprocess.Popen) -> None:
    """Unregister ``proc``, which has been waited for (its group is gone or ended)."""
    with _live_lock:
        if proc in _live:
            _live.discard(proc)
            _tell_guard(f"-{proc.pid}")


def finish(proc: subprocess.Popen, timeout_s: float | None = None) -> tuple[int | None, bool]:
    """Wait for ``proc`` (at most ``timeout_s`` seconds) and unregister it.

    Returns (exit code, timed out).  On timeout the group is terminated and the
    exit code is None.  On any exception while waiting (an interrupt among
    them) the group is terminated and the exception propagates; in another
    thread than the main one a child ended while :func:`stop_children` is in
    force raises :class:`Interrupted`.  Members of
    the group that outlive a leader which exited normally are terminated too.
    """
    try:
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            terminate(proc)
            return None, True
        if os.name != "nt" and _group_alive(proc.pid):
            terminate(proc)
        raise_if_stopping()  # the child was ended by a stop: not its own outcome
        return rc, False
    except BaseException:
        terminate(proc)
        raise
    finally:
        _forget(proc)


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident set size of process ``pid`` in bytes, as the kernel counts it: ``VmHWM`` of
    ``/proc/<pid>/status`` (kB there; proc(5)), which includes page-locked memory the process touched.
    None where there is no such file (not Linux, the process has ended, or it may not be read)."""
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
        stdin: IO | int | None = subprocess.DEVNULL, stdout: IO | int | None = None, stderr: IO | int | None = None,
        timeout_s: float | None = None) -> Completed:
    """Run ``argv`` to completion in its own process group; see :func:`start` and :func:`finish`.

    ``stdout``/``stderr`` are file objects or ``subprocess`` constants (None:
    inherited).  Returns a :class:`Completed`.  Raises OSError when the program
    cannot be started; re-raises an interrupt after terminating the group.
    """
    t0 = time.monotonic()
    proc = start(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr)
    rc, timed_out = finish(proc, timeout_s)
    return Completed(list(argv), rc, time.monotonic() - t0, timed_out)


def run_capture(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                timeout_s: float | None = None, merge_stderr: bool = False) -> tuple[Completed, bytes, bytes]:
    """Like :func:`run` with stdout (and stderr, or both merged) captured: (completed, stdout, stderr) bytes.

    Output goes through temporary files rather than pipes, so a child that
    writes a lot never blocks and the wait stays interruptible.
    """
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        done = run(argv, env=env, cwd=cwd, stdout=out, stderr=out if merge_stderr else err, timeout_s=timeout_s)
        out.seek(0)
        err.seek(0)
        return done, out.read(), err.read()


def live() -> list[subprocess.Popen]:
    """The children started through this module that have not been waited for yet."""
    with _live_lock:
        return list(_live)


def terminate_all() -> int:
    """Terminate every registered child's process group (see :func:`terminate`); returns how many."""
    procs = live()
    for p in procs:
        terminate(p)
        _forget(p)
    return len(procs)


@contextmanager
def holding(token: str) -> Iterator[None]:
    """Within the block, every child started gets ``token`` in :data:`HOLDS_ENV` (see :func:`end_holders`)."""
    _holds.append(token)
    try:
        yield
    finally:
        _holds.remove(token)


@contextmanager
def recording_groups(log: Path, token: str) -> Iterator[None]:
    """Within the block, the process group id of every child started is appended to ``log`` (one a line) and
    every child carries ``token`` in :data:`HOLDS_ENV`: what a later process needs to end what this one left
    running if it is killed (:func:`end_run_leftovers`).  ``log`` is removed when the block ends."""
    with holding(token):
        _group_logs.append(log)
        try:
            yield
        finally:
            _group_logs.remove(log)
            log.unlink(missing_ok=True)


def _group_members(pgid: int, token: str) -> list[int]:
    """The live pids of process group ``pgid`` whose environment carries ``token`` (/proc; [] elsewhere)."""
    return [pid for pid in holders(token) if _pgid_of(pid) == pgid]


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def end_run_leftovers(log: Path, token: str, grace_s: float = GRACE_S) -> int:
    """End what a killed harness process left running: each process group recorded in ``log``
    (:func:`recording_groups`) that still has a member carrying ``token`` (a group id the OS gave to
    something else since has none, and is left alone), then any other process carrying ``token``
    (:func:`end_holders`).  SIGTERM to each group, SIGKILL after ``grace_s`` seconds; waits until they are
    gone.  Returns how many processes were found; 0 where ``log`` cannot be read and nothing carries the
    token."""
    try:
        pgids = {int(line) for line in log.read_text(encoding="ascii").split() if line.isdigit()}
    except OSError:
        pgids = set()
    own = os.getpgrp()
    found = {pgid: _group_members(pgid, token) for pgid in pgids - {own}}
    found = {pgid: pids for pgid, pids in found.items() if pids}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in found:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(_group_alive(pgid) for pgid in found) and time.monotonic() < deadline:
            time.sleep(0.05)
    return sum(len(p) for p in found.values()) + end_holders(token, grace_s)


def holders(token: str) -> list[int]:
    """The pids of the live processes (other than this one) whose environment carries ``token`` in
    :data:`HOLDS_ENV`, read from ``/proc/<pid>/environ``; processes we may not read, and zombies, are left
    out.  Always empty where there is no ``/proc`` (Windows, macOS)."""
    found = []
    want = token.encode()
    prefix = HOLDS_ENV.encode() + b"="
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc/self/environ").exists() else ():
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix) and want in var[len(prefix):].split():
                found.append(int(entry.name))
    return [pid for pid in found if pid != os.getpid()]


def end_holders(token: str, grace_s: float = GRACE_S) -> int:
    """End every process :func:`holders` finds for ``token``, with its process group, and wait until it is gone.

    For what a holder killed with SIGKILL left running (a ``cmake --build``,
    its ninja and compilers): SIGTERM to each one's group (so ninja stops its
    compilers and cleans partial outputs), SIGKILL after ``grace_s`` seconds
    to anything still carrying the token.  This process's own group is never
    signalled.  Returns how many processes were found (0: nothing to do).
    """
    found = holders(token)
    if not found:
        return 0
    own = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in holders(token):
            try:
                pgid = os.getpgid(pid)
                if pgid != own:
                    os.killpg(pgid, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while holders(token) and time.monotonic() < deadline:
            time.sleep(0.05)
    return len(found)


@contextmanager
def handle_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread.

    A second signal while the first is being handled is ignored, so the
    clean-up (terminating children, writing the summary) is not cut short.
    Previous handlers are restored on exit.  Only usable from the main thread.
    """
    fired: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise Interrupted(signum)

    wanted = [signal.SIGINT, signal.SIGTERM]
    old = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_passing_signals(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` in this process's own group and wait for it, passing on every SIGINT and SIGTERM we get.

    For a wrapper (noxfile.py) whose child stops its own children and records
    its run when interrupted: the wrapper neither dies at once on SIGTERM
    (leaving the child running) nor kills the child, it waits for it.  A
    terminal's Ctrl-C reaches both; the child ignores the copy we pass on
    (:func:`handle_signals`).  ``env`` is added on top of ``os.environ``.
    A wrapper killed outright (SIGKILL, the task manager) takes the child with
    it, as the harness takes its own children (:func:`start`): the child gets
    SIGTERM, stops its children and records the run interrupted.
    Returns the child's exit code, ``128 + signal`` when a signal killed it.
    Raises OSError when the program cannot be started.  Only usable from the
    main thread.
    """
    if os.name == "nt":  # pragma: no cover - Windows only
        tie_children_to_this_process()
    child = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, preexec_fn=_parent_death_signal())

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        if os.name == "nt" and signum == signal.SIGINT:  # pragma: no cover - the console sends it to the child too
            return
        if child.poll() is None:
            child.send_signal(signum)

    old = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def exit_code_for(exc: BaseException) -> int:
    """The process exit code for an exception that ended a run: 128 + signal for an interrupt, else 1."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return 1


__all__ = ["GRACE_S", "HOLDS_ENV", "Completed", "Interrupted", "end_holders", "end_run_leftovers", "exit_code_for",
           "finish", "handle_signals", "holders", "holding", "live", "raise_if_stopping", "recording_groups", "run",
           "run_capture", "run_passing_signals", "start", "terminate", "terminate_all"]
