"""Problems with the machine's file systems, told in one line: which path, and why.

A results or cache directory that cannot be written (read-only file system, no
permission), that is a file, or a disk that fills up mid-run is the
environment's fault, not the fork's: the harness names the path and the cause
and exits with 2, without a traceback (harness.cli).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping

from . import errors

#: errno values that mean "the environment cannot hold our files" rather than a bug of ours.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                                errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENAMETOOLONG})


class EnvironmentProblem(errors.EnvironmentProblem):
    """A path the harness needs cannot be used; the message names the path and the cause (exit code 2)."""


def is_environment_error(exc: BaseException) -> bool:
    """True for an OSError whose errno says the file system refused us (full, read-only, not a directory...)."""
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS


def describe(exc: OSError) -> str:
    """``<path>: <cause>`` for an OSError, e.g. ``results/x/summary.json: No space left on device``."""
    cause = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"{exc.filename}: {cause}"
    return cause


def writable_dir(path: Path, what: str) -> Path:
    """Create ``path`` (with parents) if needed and prove it is a writable directory; return it.

    ``what`` names the role in the message ("results directory", "cache
    directory").  Raises EnvironmentProblem naming the path and the cause:
    not a directory, read-only file system, permission denied, no space left.
    """
    try:
        if path.exists() and not path.is_dir():
            raise EnvironmentProblem(f"{what} {path}: not a directory")
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        try:
            probe.write_bytes(b"x")
        finally:
            probe.unlink(missing_ok=True)  # a full disk leaves no probe behind
    except OSError as exc:
        raise EnvironmentProblem(f"{what} {path}: {describe(exc)}{free_note(exc, path)}") from None
    return path


#: errno values that mean the file system holding a path cannot take more: full, over quota, read-only.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})

#: Bytes a room probe writes (:func:`room_problem`): a download or a build that fails for want of space fails
#: with less than this left, and a few hundred KiB of logs still need it.
PROBE_BYTES = 1 << 20


def free_space(path: Path) -> str:
    """How much the file system holding ``path`` (or its nearest existing parent) has free, e.g. ``12.0 MiB
    free``; "free space unknown" where it cannot be asked."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**20:.1f} MiB free"


def free_note(exc: OSError, path: Path) -> str:
    """`` (<free space>)`` for a storage error (:data:`STORAGE_ERRNOS`) at ``path``, else ""."""
    return f" ({free_space(path)})" if exc.errno in STORAGE_ERRNOS else ""


def existing_dir(path: Path, what: str) -> Path:
    """``path`` or, when it does not exist yet, its nearest existing parent: where a directory to be made would
    take its room from, found without making it.  Raises EnvironmentProblem naming ``what`` when that is not a
    directory."""
    at = Path(path)
    while not at.exists() and at != at.parent:
        at = at.parent
    if not at.is_dir():
        raise EnvironmentProblem(f"{what} {path}: {at} is not a directory")
    return at


def room_problem(path: Path, what: str, need: int = PROBE_BYTES) -> EnvironmentProblem | None:
    """Whether ``path`` (a directory, made if missing) can take ``need`` more bytes: writes and removes a probe of
    that size.  Returns the EnvironmentProblem naming ``what``, the path, the cause and the free space when it
    cannot (full, over quota, read-only, not writable), else None."""
    probe = Path(path) / f".room-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(bytes(need))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return EnvironmentProblem(f"{what} {path}: {exc.strerror or exc} ({free_space(path)})")
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def storage_problem(exc: BaseException | None, places: Mapping[str, Path]) -> EnvironmentProblem | None:
    """The environment's share of ``exc``, a failure while writing under ``places`` (what -> directory: the cache,
    the work trees, the temporary directory): an EnvironmentProblem already, or a failure while one of the places
    has no room (:func:`room_problem`, the first such place named).  None when every place has room and ``exc``
    is no storage error: then the failure is what it says."""
    if isinstance(exc, errors.EnvironmentProblem):
        return exc if isinstance(exc, EnvironmentProblem) else EnvironmentProblem(str(exc))
    for what, path in places.items():
        problem = room_problem(path, what)
        if problem is not None:
            return problem
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        where = exc.filename or next(iter(places.values()), "")
        return EnvironmentProblem(f"{where}: {exc.strerror or exc} ({free_space(Path(where))})")
    return None


def temporary_dir() -> Path:
    """The temporary directory the programs the harness starts use (compilers, pip): ``$TMPDIR`` as set, even one
    that Python's tempfile passes over because it cannot be written, else Python's."""
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir())


def read_utf8(path: Path, what: str) -> str:
    """The text of the file at ``path``, which must be UTF-8 (a matrix, a patch, a series file).

    ``what`` names its role in the message.  Raises errors.InputError as :func:`decode_utf8` does;
    FileNotFoundError and other OSErrors as reading raises them.
    """
    return decode_utf8(path, Path(path).read_bytes(), what)


def decode_utf8(path: Path, data: bytes, what: str) -> str:
    """``data`` (the bytes of the file at ``path``) decoded as UTF-8.  Raises errors.InputError naming the
    file, the line and byte offset (from 0) of the first byte that is not UTF-8, and ``what`` the file is
    (exit code 2)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise errors.InputError(f"{path}:{line}: {what} is not UTF-8 text: byte offset {exc.start} "
                                f"(0x{data[exc.start]:02x}: {exc.reason}); save it as UTF-8") from None


def replace_whole(path: Path, write: Callable[[Path], object]) -> None:
    """Replace ``path`` whole: ``write`` fills ``<path>.<pid>-<thread>.tmp``, which is then renamed over ``path``.

    A reader never sees half a file, two threads or processes writing the same
    file at once each rename a whole one of their own, and a failed write (a
    full disk, an interrupt) leaves no ``.tmp`` behind.  An OSError that names no file (a
    write that ran out of space names none) is raised again naming ``path``,
    so the one-line error says which file could not be written.
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def write_text_whole(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`replace_whole`."""
    replace_whole(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def sha256_files(paths: Iterable[Path]) -> str:
    """Hex sha256 over ``paths`` in the order given, each as its file name, a NUL byte, its bytes and a
    NUL byte: the digest of a set of source files, for build and cache keys (a changed byte or a renamed
    file changes it).  Raises OSError for a file that cannot be read."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
