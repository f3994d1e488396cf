"""Downloads into the harness cache through ``pip download``, never kept partial, checked before every use.

pip copies what it downloads into its ``-d`` directory; a full disk or a killed pip leaves a partial file there,
which every later run would find and fail on.  :func:`pip_download` lets pip write into a temporary directory
beside the cache's, checks each file it left (the hash the lock or the matrix records, or the archive's own
checksums) and renames only the good ones into place.  :func:`cached_or_fetched` is the rule every cached
download follows: a cached file is checked before use, one that fails is fetched again once, and what still
fails is an error of the environment (harness.common.errors.EnvironmentProblem, exit 2).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from . import errors
from .fs import EnvironmentProblem, free_space, room_problem, sha256_file

#: Where a cached file that failed its check and is fetched again is told (a warning on stderr).
log = logging.getLogger(__name__)

#: A check of a downloaded file: what is wrong with it, or None when it is whole.
Check = Callable[[Path], "str | None"]


def sha256_check(expected: str) -> Check:
    """A check that the file's sha256 is ``expected`` (hex)."""
    def check(path: Path) -> str | None:
        actual = sha256_file(path)
        return None if actual == expected.lower() else f"sha256 {actual} where {expected.lower()} is pinned"
    return check


def archive_check(path: Path) -> str | None:
    """What is wrong with a wheel (zip) or sdist (``.tar.gz``) by its own checksums (every member's CRC read), or
    None when it reads whole: the check of a download whose hash nothing records."""
    try:
        if path.name.endswith(".whl") or zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
            return None if bad is None else f"member {bad} fails its CRC"
        with tarfile.open(path) as tf:
            for member in tf:
                if member.isfile():
                    reader = tf.extractfile(member)
                    while reader is not None and reader.read(1 << 20):
                        pass
        return None
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError) as exc:
        return f"not a whole archive ({exc})"


def pip_error(stderr: str) -> str:
    """pip's failure in one line: the exception a traceback of pip's ends with (``OSError: [Errno 28] No space
    left on device``), else its last ``ERROR:`` line (pip's own words), else its last line; never the lines of
    the traceback itself."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if any(ln.startswith("Traceback") for ln in lines):
        return lines[-1]
    said = [ln.removeprefix("ERROR:").strip() for ln in lines if ln.startswith("ERROR:")]
    return (said or lines or ["(no output)"])[-1]


#: Words of pip's output that say the disk, not the download, failed (errno 28, 122 and 30).
STORAGE_WORDS = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def pip_download(pip: Sequence[str], args: Sequence[str], into: Path, check: Check,
                 pick: Callable[[Path], bool] = lambda _p: True) -> tuple[list[Path], str]:
    """Run ``pip download -d <temporary> *args`` (``pip``: the command prefix) and move each file it left that
    ``pick`` selects and ``check`` passes into ``into``; the temporary directory is removed, partial files with
    it.  Returns (the files moved, pip's failure in one line or "").  Raises EnvironmentProblem naming ``into``
    and its free space when the cache has no room (a full or read-only disk), OSError when pip cannot start."""
    into.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=into))
    kept: list[Path] = []
    problems: list[str] = []
    try:
        done = subprocess.run([*pip, "download", "-d", str(tmp), *args], capture_output=True, text=True,
                              check=False)
        for path in sorted(tmp.iterdir()):
            if not pick(path):
                continue
            problem = check(path)
            if problem is None:
                os.replace(path, into / path.name)
                kept.append(into / path.name)
            else:
                problems.append(f"{path.name}: {problem}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    room = room_problem(into, "cache directory")
    if room is not None and (done.returncode or problems):
        raise room
    full = next((w for w in STORAGE_WORDS if w in done.stderr), None)
    if full is not None:  # pip's copy into a disk that filled up, or its own temporary directory's
        raise EnvironmentProblem(f"cache directory {into}: {full} while pip downloaded {' '.join(args[-1:])} "
                                        f"({free_space(into)}; pip's temporary directory {tempfile.gettempdir()}: "
                                        f"{free_space(Path(tempfile.gettempdir()))})")
    failure = pip_error(done.stderr) if done.returncode else ""
    return kept, "; ".join([*problems, *([failure] if failure else [])])


def cached_or_fetched(find: Callable[[], Path | None], fetch: Callable[[], str], check: Check, what: str) -> Path:
    """The cached file ``find`` returns, checked by ``check`` before use; one that fails is deleted, saying so,
    and fetched again (``fetch`` returns pip's failure in one line, or ""), once.  Raises EnvironmentProblem
    naming ``what`` when nothing whole is there after that fetch."""
    cached = find()
    if cached is not None:
        problem = check(cached)
        if problem is None:
            return cached
        log.warning("warning: %s: cached file %s fails its check (%s); it is fetched again", what, cached, problem)
        cached.unlink(missing_ok=True)
    failure = fetch()
    fetched = find()
    if fetched is not None:
        problem = check(fetched)  # a file another process put there meanwhile is checked too
        if problem is None:
            return fetched
        fetched.unlink(missing_ok=True)
        failure = f"{fetched.name}: {problem}"
    raise errors.EnvironmentProblem(f"{what}: fetched again and still not whole: {failure or 'pip left no file'}")

