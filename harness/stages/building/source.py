"""Stage 1: obtain upstream llama.cpp at the pinned commit.

Sources from ``matrix.yaml`` are tried in order (local checkout, trimmed mirror
archive, git remote, PyPI sdist of llama-cpp-python).  The first that yields a
tree verified to be the pinned commit becomes the *base repository*: a plain
git repository in the cache whose ``HEAD`` holds exactly that tree, on which
the patch series is applied.  Which source was used is recorded next to it.

Downloads and extractions are cached (``$HARNESS_CACHE_DIR``, else
``$XDG_CACHE_HOME/llama-fork-harness``, else ``~/.cache/llama-fork-harness``)
and never fetched twice.

Longer than 400 lines: every source of the base (a checkout, the trimmed mirror, git, the sdist) ends in
the same verification of the same tree, which is this module's one job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Collection, Sequence

from ...matrix.config import Matrix, Source
from ...common.errors import EnvironmentProblem, InputError
from ...common.downloads import archive_check, cached_or_fetched, pip_download, sha256_check
from ...common.fs import EnvironmentProblem as StorageProblem
from ...common.fs import sha256_file, storage_problem, temporary_dir, writable_dir
from ...common.locks import Rank, exclusive

#: Paths left out of the trimmed mirror (issue 4: ~10 MB without models/ and docs/),
#: except the vocab files listed in MIRROR_KEEP, which the synthetic models need.
MIRROR_EXCLUDE = ("models/", "docs/", "media/")
MIRROR_KEEP = ("models/ggml-vocab-llama-spm.gguf",)
MIRROR_MANIFEST = "HARNESS-MIRROR.json"
#: What upstream's suite reads of models/ (docs/upstream-tests.md): the chat templates, and each vocabulary that
#: test-tokenizer-0 checks (a ``models/ggml-vocab-*.gguf`` with its ``.inp`` and ``.out`` beside it).  The mirror
#: leaves them out; the data archive beside it (:func:`data_archive`) carries them.
SUITE_TEMPLATES = "models/templates/"
SUITE_VOCAB = "models/ggml-vocab-"
#: Identity used for commits the harness creates (archive imports, applied patches).
GIT_IDENTITY = ("llama.cpp fork harness", "harness@localhost")
#: ``-c`` options of every git call: files byte for byte (no CRLF conversion), and paths longer
#: than Windows' MAX_PATH of 260 characters, which git for Windows refuses without core.longpaths.
GIT_CONFIG = ("-c", "core.autocrlf=false", "-c", "core.longpaths=true")


class SourceError(InputError):
    """No source produced the pinned commit; the message lists what each source said."""


# --------------------------------------------------------------------------- identity by content
#
# A commit id proves a tree only to whoever trusts the git objects it was read from; a mirror
# archive, an unpacked sdist or a cache directory is just files.  So every base tree is
# checked by content against the pinned commit's file list (``base.files`` in matrix.yaml:
# ``mode blob path`` lines from ``git ls-tree -r``, the file's sha256 pinned beside it).
# What "the pinned commit's files" means depends on the source kind:
#
# * local, git, pypi-sdist: every file of the commit, nothing more (llama-cpp-python 0.3.36
#   vendors the whole commit as a git submodule checkout; an sdist that lacked a file would be
#   refused, naming it);
# * archive (the trimmed mirror): every file of the commit except those under MIRROR_EXCLUDE
#   that are not in MIRROR_KEEP, plus the mirror's own HARNESS-MIRROR.json.

#: First line of a file list; the rest are ``<mode> <blob id> <path>`` lines sorted by path.
FILES_HEADER = "# llama.cpp {commit}: mode, git blob id and path of every file (git ls-tree -r)"


@dataclass(frozen=True)
class PinnedFiles:
    """The pinned commit's files: path -> (git mode, git blob id), read from ``path``."""

    commit: str
    path: Path
    entries: dict[str, tuple[str, str]]

    def expected(self, kind: str, present: Collection[str] = ()) -> dict[str, tuple[str, str]]:
        """The files a tree from a source of ``kind`` must hold (see the rules above); for an archive, also those
        of ``present`` (the tree's paths) that are the suite's data (:func:`suite_data`): the data archive may
        carry all of it or none, and a file it carries must be the pinned one."""
        if kind != "archive":
            return self.entries
        data = suite_data(self.entries) & set(present)
        return {p: e for p, e in self.entries.items()
                if not p.startswith(MIRROR_EXCLUDE) or p in MIRROR_KEEP or p in data}


def suite_data(paths: Collection[str]) -> set[str]:
    """The paths of ``paths`` (a commit's files) that upstream's suite reads and the mirror leaves out: every file
    under :data:`SUITE_TEMPLATES`, and each ``models/ggml-vocab-*.gguf`` that has a ``.inp`` beside it, with its
    ``.inp`` and ``.out`` (test-tokenizer-0's inputs and expected tokens)."""
    out = {p for p in paths if p.startswith(SUITE_TEMPLATES)}
    for p in paths:
        if p.startswith(SUITE_VOCAB) and p.endswith(".gguf") and p + ".inp" in paths:
            out |= {p, p + ".inp"} | ({p + ".out"} if p + ".out" in paths else set())
    return out - set(MIRROR_KEEP)


def data_archive(mirror: Path) -> Path:
    """The data archive that belongs to the mirror archive ``mirror``: ``<name>.data.tar.xz`` beside it
    (``llama.cpp-<commit12>.tar.gz`` -> ``llama.cpp-<commit12>.data.tar.xz``), its sha256 in ``<that>.sha256``."""
    return mirror.with_name(mirror.name.removesuffix(".tar.gz") + ".data.tar.xz")


def read_pinned_files(path: Path, sha256: str, commit: str) -> PinnedFiles:
    """Read the file list at ``path``; raises SourceError when its sha256 is not ``sha256`` (the
    digest matrix.yaml pins), its header names another commit than ``commit``, or a line is malformed."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"pinned file list {path}: {exc.strerror}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise SourceError(f"pinned file list {path} has sha256 {actual}; matrix.yaml pins {sha256}")
    lines = data.decode("utf-8").splitlines()
    if not lines or lines[0] != FILES_HEADER.format(commit=commit):
        raise SourceError(f"{path}:1: expected the header {FILES_HEADER.format(commit=commit)!r}")
    entries = {}
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split(" ", 2)
        if len(parts) != 3 or len(parts[1]) != 40:
            raise SourceError(f"{path}:{number}: expected '<mode> <blob id> <path>', got {line!r}")
        entries[parts[2]] = (parts[0], parts[1])
    return PinnedFiles(commit, path, entries)


def write_pinned_files(base: "BaseTree", out: Path) -> str:
    """Write the file list of ``base.commit`` (read with ``git ls-tree`` after ``git fsck`` proved
    the objects) to ``out``; returns its sha256 for matrix.yaml.  Needs a base from git
    (``git_rev == commit``)."""
    if base.git_rev != base.commit:
        raise SourceError("the file list is derived from a base obtained from git (local, git or pypi-sdist)")
    git(["fsck", "--full", "--no-dangling"], base.path)
    lines = [FILES_HEADER.format(commit=base.commit)]
    lines += [f"{mode} {blob} {path}" for mode, blob, path in ls_tree(base.path, base.commit)]
    data = ("\n".join(lines) + "\n").encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob with content ``data``: sha1 of ``blob <size>\\0`` + data (hex)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_files(tree: Path) -> dict[str, tuple[str, str]]:
    """Every file of the work tree ``tree`` (``.git`` left out): path -> (git mode, blob id),
    computed from the files' bytes (a symbolic link's blob is its target)."""
    found: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != ".git" or Path(dirpath) != tree]
        for d in list(dirnames):
            if (Path(dirpath) / d).is_symlink():
                filenames.append(d)
                dirnames.remove(d)
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(tree).as_posix()
            if rel == ".git":
                continue
            if full.is_symlink():
                found[rel] = ("120000", git_blob_id(os.readlink(full).encode()))
            else:
                mode = "100755" if os.access(full, os.X_OK) else "100644"
                found[rel] = (mode, git_blob_id(full.read_bytes()))
    return found


def first_difference(tree: Path, expected: dict[str, tuple[str, str]], extra_ok: Sequence[str] = ()) -> str | None:
    """The first path (in sorted order) where ``tree``'s files differ from ``expected``, with how;
    None when they are the same.  ``extra_ok``: paths the tree may hold besides."""
    have = tree_files(tree)
    for path in sorted(set(have) | set(expected)):
        if path in extra_ok:
            continue
        if path not in have:
            return f"{path}: missing"
        if path not in expected:
            return f"{path}: not a file of the pinned commit"
        (mode, blob), (want_mode, want_blob) = have[path], expected[path]
        if blob != want_blob:
            return f"{path}: content differs (blob {blob}, pinned {want_blob})"
        if mode != want_mode and os.name != "nt":
            return f"{path}: mode {mode}, pinned {want_mode}"
    return None


@dataclass(frozen=True)
class BaseTree:
    """The verified base repository.

    ``path`` is a git repository whose ``HEAD`` (``git_rev``) holds upstream
    ``commit``; ``git_rev`` equals ``commit`` unless the tree came from an
    archive mirror (then it is a local import commit of the same tree).
    ``source`` describes where it came from; ``data`` is the sha256 of the data archive unpacked into
    it (:func:`data_archive`), "" without one.
    """

    path: Path
    commit: str
    git_rev: str
    source: str
    data: str = ""


def cache_dir() -> Path:
    """The harness's download cache directory (created if missing).

    ``$HARNESS_CACHE_DIR`` wins, then ``$XDG_CACHE_HOME/llama-fork-harness``,
    then ``~/.cache/llama-fork-harness`` (the XDG base directory default).
    Raises harness.common.fs.EnvironmentProblem when it cannot be a writable directory.
    """
    return writable_dir(storage_places(Path("."))["cache directory"], "cache directory")


def storage_places(work_dir: Path) -> dict[str, Path]:
    """The directories a run writes besides its results, by what the messages call them: the harness cache, the
    work trees and the temporary directory (harness.common.fs.storage_problem probes them)."""
    env = os.environ.get("HARNESS_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    cache = Path(env) if env else (Path(xdg) if xdg else Path.home() / ".cache") / "llama-fork-harness"
    return {"cache directory": cache, "work directory": Path(work_dir), "temporary directory": temporary_dir()}


def raise_storage_problem(exc: BaseException | None, work_dir: Path) -> None:
    """Raise the environment's share of ``exc`` (or of a failure that raised nothing, ``exc`` None) as
    harness.common.fs.EnvironmentProblem (exit 2, naming the directory and its free space): a full or read-only
    cache, work tree or temporary directory is never the fork's failure.  Returns when there is none."""
    problem = storage_problem(exc, storage_places(work_dir))
    if problem is not None:
        raise problem from None


def git(args: Sequence[str], cwd: Path | None = None, *, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``git`` with ``args`` (a list, never a shell string) and return the completed process.

    Raises SourceError with git's stderr when ``check`` and git exits non-zero.  ``GIT_OPTIONAL_LOCKS=0``:
    a read such as ``git status`` leaves ``.git/index`` alone (it would otherwise write the index back
    with refreshed file times), so checking a tree does not make builds of it that list the index as a
    CMake input (llama.cpp's build-info) reconfigure, while another thread compiles from it.
    """
    full_env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", **(env or {})}
    proc = subprocess.run(["git", *GIT_CONFIG, *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SourceError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc


def _verify_checkout(repo: Path, commit: str) -> str | None:
    """Return None when ``repo``'s HEAD is ``commit`` with a clean tree, else the reason it is not."""
    head = git(["rev-parse", "HEAD"], repo, check=False)
    if head.returncode != 0:
        return f"not a git checkout ({head.stderr.strip()})"
    if head.stdout.strip() != commit:
        return f"HEAD is {head.stdout.strip()}, expected the pinned commit {commit}"
    dirty = git(["status", "--porcelain", "--untracked-files=no"], repo, check=False)
    if dirty.stdout.strip():
        first = dirty.stdout.strip().splitlines()[0]
        return f"tree differs from commit {commit[:12]} (e.g. {first!r})"
    return None


def _clone_at(src: str, dest: Path, commit: str) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    git(["clone", "--quiet", "--no-checkout", src, str(tmp)])
    git(["checkout", "--quiet", "--detach", commit], tmp)
    reason = _verify_checkout(tmp, commit)
    if reason:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(reason)
    tmp.rename(dest)


def _from_local(src: Source, dest: Path, commit: str) -> str:
    if src.path is None or not src.path.exists():
        raise SourceError(f"path {src.path} does not exist")
    if git(["cat-file", "-e", f"{commit}^{{commit}}"], src.path, check=False).returncode != 0:
        raise SourceError(f"{src.path} does not contain commit {commit}")
    _clone_at(str(src.path), dest, commit)
    return commit


def _from_git(src: Source, dest: Path, commit: str) -> str:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    git(["init", "--quiet"], tmp)
    git(["fetch", "--quiet", "--depth", "1", str(src.url), commit], tmp)
    git(["checkout", "--quiet", "--detach", "FETCH_HEAD"], tmp)
    reason = _verify_checkout(tmp, commit)
    if reason:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(reason)
    tmp.rename(dest)
    return commit


def _sdist_in(into: Path, package: str, version: str) -> Path | None:
    """The cached sdist of ``package`` ``version`` in ``into``, or None."""
    stem = f"{package.replace('-', '_')}-{version}".lower()
    found = sorted(c for c in into.glob("*.tar.gz") if c.name.lower().startswith(stem)) if into.is_dir() else []
    return found[0] if found else None


def _pip_download_sdist(src: Source, into: Path) -> Path:
    """The sdist of ``src`` in ``into``, checked before use against ``src.sha256`` (its own checksums where the
    matrix pins none); a cached one that fails is fetched again once, and pip's download is kept only whole
    (harness.common.downloads).  Raises EnvironmentProblem when it is still not whole after that, or when the
    cache has no room for it."""
    assert src.package and src.version
    package, version = src.package, src.version
    check = sha256_check(src.sha256) if src.sha256 else archive_check

    def fetch() -> str:
        # only the package itself must be an sdist: its build requirements may come as wheels, or pip
        # would compile them (CMake among them) from source just to read the sdist's metadata; pip may fail
        # after saving the sdist (preparing metadata): the file, checked, is what counts
        _, failure = pip_download((sys.executable, "-m", "pip"), ("--no-binary", package, "--no-deps", "--quiet",
                                                                  f"{package}=={version}"), into, check,
                                  pick=lambda p: p.name.endswith(".tar.gz"))
        return failure

    return cached_or_fetched(lambda: _sdist_in(into, package, version), fetch, check,
                             f"the sdist of {package}=={version} in {into}")


def unpacked_sdist(src: Source, cache: Path) -> tuple[Path, Path]:
    """(the sdist archive, its vendored upstream checkout ``src.subdir``) of a ``pypi-sdist`` source,
    downloaded and unpacked into ``cache`` once.  Raises EnvironmentProblem when pip yields no whole sdist
    (its sha256 is not ``src.sha256``, when set, after one fetch again), SourceError when it has no
    ``src.subdir``."""
    assert src.package and src.version and src.subdir
    sdist = _pip_download_sdist(src, cache / "downloads")
    unpacked = cache / "sdists" / sdist.name.removesuffix(".tar.gz")
    if not unpacked.exists():
        tmp = unpacked.with_name(unpacked.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="tar")
        tmp.rename(unpacked)
    roots = [p for p in unpacked.iterdir() if p.is_dir()]
    vendored = roots[0] / src.subdir if len(roots) == 1 else unpacked / src.subdir
    if not vendored.exists():
        raise SourceError(f"{sdist.name} has no {src.subdir}")
    return sdist, vendored


def _from_pypi_sdist(src: Source, dest: Path, commit: str, cache: Path) -> str:
    sdist, vendored = unpacked_sdist(src, cache)
    reason = _verify_checkout(vendored, commit)
    if reason:
        raise SourceError(f"{sdist.name}:{src.subdir}: {reason}")
    _clone_at(str(vendored), dest, commit)
    return commit


def _archive_digest(src: Source) -> str | None:
    if src.sha256:
        return src.sha256
    if src.sha256_file and src.sha256_file.exists():
        return src.sha256_file.read_text().split()[0]
    return None


def archive_commit(path: Path) -> str:
    """The upstream commit a mirror archive at ``path`` names in its HARNESS-MIRROR.json (not yet verified:
    :func:`obtain_base` checks the archive's sha256 and the manifest again).  Raises SourceError when the
    archive cannot be read or has no manifest naming a commit."""
    try:
        with tarfile.open(path) as tf:
            member = tf.extractfile(MIRROR_MANIFEST)
            manifest = json.loads(member.read()) if member else {}
    except (OSError, KeyError, tarfile.TarError, ValueError) as exc:
        raise SourceError(f"archive {path}: no readable {MIRROR_MANIFEST} ({exc})") from None
    commit = manifest.get("commit") if isinstance(manifest, dict) else None
    if not isinstance(commit, str) or len(commit) != 40:
        raise SourceError(f"archive {path}: {MIRROR_MANIFEST} names no full commit id")
    return commit


def _data_digest(src: Source) -> str:
    """The sha256 its ``.sha256`` file gives of the data archive beside ``src``'s mirror; "" without a data
    archive.  Raises SourceError for an archive without its ``.sha256``, or one whose bytes are not that digest."""
    if src.kind != "archive" or src.path is None:
        return ""
    data = data_archive(src.path)
    if not data.exists():
        return ""
    digest_file = Path(str(data) + ".sha256")
    if not digest_file.exists():
        raise SourceError(f"data archive {data} has no {digest_file.name}; write it with `source export-mirror`")
    expected = digest_file.read_text().split()[0]
    actual = sha256_file(data)
    if actual != expected:
        raise SourceError(f"data archive {data}: sha256 {actual} does not match {digest_file.name}'s {expected}")
    return expected


def _unpack_data(data: Path, tmp: Path) -> None:
    """Unpack the data archive ``data`` into ``tmp``; raises SourceError for a member that is not the suite's data
    (under ``models/``: :data:`SUITE_TEMPLATES` or :data:`SUITE_VOCAB`), which the file list then checks."""
    with tarfile.open(data) as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.startswith((SUITE_TEMPLATES, SUITE_VOCAB)):
                raise SourceError(f"data archive {data}: {m.name} is not the suite's data (models/)")
        tf.extractall(tmp, filter="data")


def _from_archive(src: Source, dest: Path, commit: str) -> str:
    if src.path is None or not src.path.exists():
        raise SourceError(f"archive {src.path} does not exist")
    expected = _archive_digest(src)
    if expected is None:
        raise SourceError(f"archive {src.path} has no sha256 (set sha256 or sha256_file)")
    actual = sha256_file(src.path)
    if actual != expected:
        raise SourceError(f"archive {src.path}: sha256 {actual} does not match expected {expected}")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(src.path) as tf:
        tf.extractall(tmp, filter="tar")
    if _data_digest(src):
        _unpack_data(data_archive(src.path), tmp)
    manifest_path = tmp / MIRROR_MANIFEST
    if not manifest_path.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(f"archive {src.path} has no {MIRROR_MANIFEST}; write mirrors with `source export-mirror`")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("commit") != commit:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(f"archive {src.path} is commit {manifest.get('commit')}, expected the pinned {commit}")
    name, email = GIT_IDENTITY
    ident = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": name,
             "GIT_COMMITTER_EMAIL": email, "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
             "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z"}
    git(["init", "--quiet"], tmp)
    git(["add", "--all", "--force", "."], tmp)
    git(["commit", "--quiet", "--no-verify", "-m", f"upstream llama.cpp {commit} (trimmed mirror)"], tmp, env=ident)
    rev = git(["rev-parse", "HEAD"], tmp).stdout.strip()
    tmp.rename(dest)
    return rev


def base_cache_entry(matrix: Matrix, cache: Path) -> Path:
    """The directory of ``cache`` that holds (or will hold) the base tree of ``matrix.base_commit``.

    12 hex digits name it: with all 40, paths of the base tree pass Windows' MAX_PATH below a
    runner's workspace (harness.tools.path_budget); its record beside it keeps the full commit.
    """
    return cache / "base" / matrix.base_commit[:12]


def cached_base(matrix: Matrix, cache: Path) -> Path | None:
    """The base tree an earlier :func:`obtain_base` left in ``cache``, without checking or obtaining
    anything (a later obtain_base checks it); None when there is none yet."""
    dest = base_cache_entry(matrix, cache)
    return dest if dest.is_dir() and dest.with_name(matrix.base_commit + ".json").is_file() else None


def obtain_base(matrix: Matrix, cache: Path | None = None, log: list[str] | None = None) -> BaseTree:
    """Return the verified base repository for ``matrix.base_commit``, creating it if needed.

    Sources are tried in matrix order; each failure's reason is appended to
    ``log`` (if given) and to the final SourceError when all fail.  A base
    already in the cache is reused without network access.  The cache entry
    is locked (harness.common.locks) while it is checked or filled.
    """
    cache = cache or cache_dir()
    dest = base_cache_entry(matrix, cache)
    # one process fills a cache entry; another waits and then finds it there
    with exclusive(dest, f"the source cache entry {dest}", Rank.SOURCE, (log.append if log is not None else None)):
        return _obtain_base(matrix, cache, dest, log)


def _cached_data_wanted(matrix: Matrix, tree: BaseTree) -> str:
    """The data digest a cached archive tree should hold: that of the data archive beside the mirror it came from
    (``tree.source``), "" without one or when that source is gone; a digest that cannot be read keeps the tree's."""
    for src in matrix.sources:
        if src.kind == "archive" and src.describe() == tree.source:
            try:
                return _data_digest(src)
            except (SourceError, OSError):
                return tree.data
    return tree.data


def _cached_difference(dest: Path, expected: dict[str, tuple[str, str]], extra_ok: Sequence[str]) -> str | None:
    """Where the cached base repository ``dest`` differs from ``expected``: a work-tree change
    (``git status``, untracked files included) or a HEAD tree other than the pinned files."""
    changed = git(["status", "--porcelain", "--untracked-files=all"], dest, check=False)
    if changed.returncode != 0:
        return f"not a git repository ({changed.stderr.strip()})"
    if changed.stdout.strip():
        return f"{changed.stdout.splitlines()[0][3:]}: changed in the cache ({changed.stdout.splitlines()[0][:2].strip()})"
    head = {path: (mode, blob) for mode, blob, path in ls_tree(dest, "HEAD") if path not in extra_ok}
    for path in sorted(set(head) | set(expected)):
        if head.get(path) != expected.get(path):
            return f"{path}: {'missing' if path not in head else 'differs from the pinned commit'}"
    return None


def _obtain_base(matrix: Matrix, cache: Path, dest: Path, log: list[str] | None) -> BaseTree:
    commit = matrix.base_commit
    record = dest.with_name(commit + ".json")
    say = log.append if log is not None else (lambda _line: None)
    pinned = None
    if matrix.base_files and matrix.base_files_sha256:
        pinned = read_pinned_files(matrix.base_files, matrix.base_files_sha256, commit)
    else:
        say(f"source: no pinned file list for {commit[:12]} in {matrix.path} (base.files); "
            "base trees are checked by commit id only")
    if dest.exists() and record.exists():
        info = json.loads(record.read_text())
        tree = BaseTree(path=dest, commit=commit, git_rev=info["git_rev"], source=info["source"],
                        data=info.get("data", ""))
        kind = "archive" if tree.git_rev != commit else "git"
        head = [e[2] for e in ls_tree(dest, "HEAD")] if kind == "archive" else []
        problem = _cached_difference(dest, pinned.expected(kind, head), (MIRROR_MANIFEST,)) if pinned else None
        if problem is None and kind == "archive" and tree.data != _cached_data_wanted(matrix, tree):
            problem = "the data archive beside the mirror changed"
        if problem is None:
            return tree
        say(f"source: the cached base {dest} is not the pinned commit by content (first differing path "
            f"{problem}); removed, obtaining it again")
        record.unlink()
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    reasons: list[str] = []
    environment = False  # a source failed for want of a whole download: the machine's, not the matrix's
    for src in matrix.sources:
        try:
            if src.kind == "local":
                rev = _from_local(src, dest, commit)
            elif src.kind == "archive":
                rev = _from_archive(src, dest, commit)
            elif src.kind == "git":
                rev = _from_git(src, dest, commit)
            elif src.kind == "pypi-sdist":
                rev = _from_pypi_sdist(src, dest, commit, cache)
            else:  # the schema admits no other kind
                raise SourceError(f"unknown source kind {src.kind}")
        except StorageProblem:
            raise  # a full or read-only cache: no other source can do better
        except (SourceError, OSError, tarfile.TarError, EnvironmentProblem) as exc:
            environment |= isinstance(exc, EnvironmentProblem)
            reasons.append(f"{src.describe()}: {exc}")
            if log is not None:  # whole: the end of git's error line says what went wrong
                log.append(f"source {src.describe()}: failed, the next source is tried: {exc}")
            continue
        present = [f.relative_to(dest).as_posix() for f in (dest / "models").rglob("*") if f.is_file()]
        problem = first_difference(dest, pinned.expected(src.kind, present), (MIRROR_MANIFEST,)) if pinned else None
        if problem is not None:
            # the tree is not the pinned commit, whatever its commit id or checksum says: never keep it
            shutil.rmtree(dest, ignore_errors=True)
            if src.kind == "pypi-sdist":
                shutil.rmtree(cache / "sdists", ignore_errors=True)  # unpacked again from the verified sdist
            why = f"refused: its files are not those of the pinned commit (first differing path {problem})"
            reasons.append(f"{src.describe()}: {why}")
            say(f"source {src.describe()}: {why}; removed from the cache")
            continue
        tree = BaseTree(path=dest, commit=commit, git_rev=rev, source=src.describe(), data=_data_digest(src))
        if src.kind == "archive" and not tree.data:
            say(f"source {src.describe()}: no data archive {data_archive(src.path).name if src.path else ''} beside it: "
                "upstream's tests that read models/ are skipped, each naming its missing file")
        record.write_text(json.dumps(asdict(tree), default=str, indent=2))
        if log is not None:
            log.append(f"source {src.describe()}: used")
        return tree
    storage = storage_problem(None, {"cache directory": cache, "temporary directory": temporary_dir()})
    if storage is not None:
        raise storage  # a full or read-only cache or temporary directory, not the sources
    why = f"no source produced the pinned commit {commit}:\n  " + "\n  ".join(reasons)
    raise EnvironmentProblem(why) if environment else SourceError(why)


def ls_tree(repo: Path, rev: str) -> list[tuple[str, str, str]]:
    """(mode, blob id, path) of every file of ``rev`` in ``repo`` (``git ls-tree -r``), sorted by path."""
    out = git(["ls-tree", "-r", "--full-tree", "-z", rev], repo).stdout
    files = []
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob":
            files.append((mode, blob, path))
    return sorted(files, key=lambda e: e[2])


def _mirror_paths(repo: Path, commit: str) -> list[tuple[str, str, str]]:
    """(mode, blob id, path) of every file of ``commit`` that the trimmed mirror keeps, sorted by path."""
    return [e for e in ls_tree(repo, commit) if not e[2].startswith(MIRROR_EXCLUDE) or e[2] in MIRROR_KEEP]


def export_mirror(base: BaseTree, out: Path) -> tuple[Path, str]:
    """Write a trimmed, reproducible ``.tar.gz`` of the base tree to ``out`` and ``out.sha256`` beside it.

    Leaves out MIRROR_EXCLUDE (keeping MIRROR_KEEP), adds HARNESS-MIRROR.json
    naming the upstream commit.  File order, modes and times are fixed (mtime
    0, owner 0), so the same commit always gives the same bytes and digest.
    Requires a base from a git source (``git_rev == commit``).  Returns
    (archive path, hex sha256).
    """
    if base.git_rev != base.commit:
        raise SourceError("export-mirror needs a base obtained from git (local, git or pypi-sdist source)")
    entries = _mirror_paths(base.path, base.commit)
    manifest = json.dumps({"commit": base.commit, "excluded": list(MIRROR_EXCLUDE),
                           "kept": list(MIRROR_KEEP), "files": len(entries)}, indent=2).encode()
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
        _write_tar(base, entries, gz, manifest)
    return _publish(tmp, out)


def export_data(base: BaseTree, mirror: Path, leave_out: Collection[str] = ()) -> tuple[Path, str]:
    """Write the data archive of the mirror ``mirror`` (:func:`data_archive`): upstream's suite data of the base
    tree (:func:`suite_data`, but those of ``leave_out``), a reproducible ``.tar.xz`` (xz preset 6: 11.4 MB for
    the 63 MB of commit 0c1e57098bba's data) with its ``.sha256`` beside.  Requires a base from a git source.
    Returns (archive path, hex sha256)."""
    if base.git_rev != base.commit:
        raise SourceError("export-mirror needs a base obtained from git (local, git or pypi-sdist source)")
    tree = ls_tree(base.path, base.commit)
    data = suite_data([e[2] for e in tree]) - set(leave_out)
    out = data_archive(mirror)
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as raw, lzma.LZMAFile(raw, "wb", preset=6) as xz:
        _write_tar(base, [e for e in tree if e[2] in data], xz, None)
    return _publish(tmp, out)


def _publish(tmp: Path, out: Path) -> tuple[Path, str]:
    """Move the archive written at ``tmp`` to ``out`` and write ``out.sha256``; (out, hex sha256)."""
    digest = sha256_file(tmp)
    tmp.replace(out)
    Path(str(out) + ".sha256").write_text(f"{digest}  {out.name}\n")
    return out, digest


def _write_tar(base: BaseTree, entries: Sequence[tuple[str, str, str]], stream: io.BufferedIOBase,
               manifest: bytes | None) -> None:
    """Write a tar of ``entries`` ((mode, blob id, path) of ``base``'s commit, read with ``git cat-file``) to
    ``stream``, ``manifest`` first as :data:`MIRROR_MANIFEST` where given; modes, owners and times fixed."""
    batch = subprocess.Popen(["git", *GIT_CONFIG, "cat-file", "--batch"], cwd=base.path, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert batch.stdin and batch.stdout
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def add(path: str, data: bytes, mode: int) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
        if manifest is not None:
            add(MIRROR_MANIFEST, manifest, 0o644)
        for mode, blob, path in entries:
            batch.stdin.write(blob.encode() + b"\n")
            batch.stdin.flush()
            header = batch.stdout.readline().split()
            size = int(header[2])
            data = batch.stdout.read(size)
            batch.stdout.read(1)
            if mode == "120000":
                info = tarfile.TarInfo(path)
                info.type, info.linkname, info.mtime = tarfile.SYMTYPE, data.decode(), 0
                tf.addfile(info)
            else:
                add(path, data, 0o755 if mode == "100755" else 0o644)
    batch.stdin.close()
    batch.wait()


def tree_state(tree: Path) -> tuple[str, bool]:
    """(HEAD commit id, whether tracked files differ from it) of the work tree ``tree``."""
    head = git(["rev-parse", "HEAD"], tree).stdout.strip()
    dirty = bool(git(["status", "--porcelain", "--untracked-files=no"], tree).stdout.strip())
    return head, dirty


def prepare_tree(base: BaseTree, work: Path, variant: str, series_digest: str | None = None,
                 apply: Callable[[Path, str], object] | None = None) -> Path:
    """Return the source tree ``work/<variant>/llama.cpp`` for a build variant.

    ``base``: a clone of the base repository at ``base.git_rev``.  ``fork``:
    the same plus the patch series, imported by ``apply(repo, base_rev)``
    (see harness.stages.building.patches).  A tree is reused only when the base, the
    ``series_digest`` and its HEAD are what the last preparation left and no
    tracked file was edited since; otherwise it is prepared again, so a build
    never labels other code with the series' name.  Reuse leaves every file's
    mtime alone, so a rebuild stays a no-op; a base obtained again (a new import
    commit of a mirror) is fetched into an existing clone.  Both variants sit at the same
    depth under ``work`` so their build commands differ only in the variant
    directory, which ccache's base_dir removes.
    """
    tree = work / variant / "llama.cpp"
    stamp = work / variant / "tree.stamp"
    wanted = f"{base.git_rev} {series_digest or '-'}"
    if tree.exists() and stamp.exists():
        recorded = stamp.read_text().split()
        head, dirty = tree_state(tree)
        if recorded[:2] == wanted.split() and recorded[2:] == [head] and not dirty:
            return tree
    if not (tree / ".git").exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.parent.mkdir(parents=True, exist_ok=True)
        git(["clone", "--quiet", "--no-checkout", str(base.path), str(tree)])
    stamp.unlink(missing_ok=True)
    if git(["cat-file", "-e", f"{base.git_rev}^{{commit}}"], tree, check=False).returncode != 0:
        # the base was obtained again since the clone (another mirror, its data archive changed): its HEAD
        git(["fetch", "--quiet", str(base.path), "HEAD"], tree)
    if apply is None:
        git(["checkout", "--quiet", "--force", "--detach", base.git_rev], tree)
    else:
        apply(tree, base.git_rev)
    stamp.write_text(f"{wanted} {tree_state(tree)[0]}\n")
    return tree


def unexported_work(work: Path, variant: str) -> str | None:
    """Why the tree ``work/<variant>/llama.cpp`` holds work a new apply would lose, or None.

    Commits made after the last apply and edits to tracked files count.
    """
    tree = work / variant / "llama.cpp"
    stamp = work / variant / "tree.stamp"
    if not (tree / ".git").exists():
        return None
    head, dirty = tree_state(tree)
    if dirty:
        return f"{tree} has uncommitted changes"
    recorded = stamp.read_text().split() if stamp.exists() else []
    if recorded[2:] and recorded[2] != head:
        return f"{tree} has commits made after the last apply (HEAD {head[:12]})"
    return None


def scratch_tree(base: BaseTree) -> Path:
    """A throw-away clone of the base repository in a temp dir (caller removes it)."""
    path = Path(tempfile.mkdtemp(prefix="harness-scratch-")) / "tree"
    git(["clone", "--quiet", "--no-checkout", str(base.path), str(path)])
    return path
