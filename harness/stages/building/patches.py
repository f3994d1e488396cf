"""Stage 2: the fork's patch series in ``patches/``.

The series is one ``git format-patch`` file per commit plus an order file
``patches/series`` (one file name per line; blank lines and lines starting
with ``#`` are ignored).  This module reads and validates the series, imports
it onto the upstream base commit with ``git am --3way``, exports a branch back
into patch files, and checks that the files on disk are exactly what an
export of the applied series would write (the CI "series is up to date" check).

Determinism rules (so patch bytes and commit ids do not depend on the machine):

* every git call is an argument list run with a fixed environment: ``LC_ALL=C``,
  ``TZ=UTC``, no system or global git config (``GIT_CONFIG_NOSYSTEM=1``,
  ``GIT_CONFIG_GLOBAL=/dev/null``), no inherited ``GIT_*`` variables, and
  ``-c`` overrides for every repository-level setting that changes what
  ``git am`` commits or what ``git format-patch`` writes;
* commits made by :func:`apply_series` take author, author date and message
  from the patch, the committer identity from :data:`COMMITTER_NAME` /
  :data:`COMMITTER_EMAIL`, and the committer date from the author date
  (``git am --committer-date-is-author-date``), so applying the same series on
  the same base always gives the same commit ids;
* :func:`export_series` writes ``--zero-commit --full-index --no-signature
  --no-numbered --keep-subject --no-stat`` patches with the diff options fixed
  on the command line; re-exporting an unchanged series is byte-identical.

File names are derived from the commit subject only (``<slug>.patch``, no
``0001-`` number): the order lives in ``series``, so inserting or reordering a
patch changes only ``series`` and the patches involved.

Longer than 400 lines: apply, export and check read and write the one format above, and
splitting them would split its reader from its writer.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ...common.errors import InputError
from ...common.fs import decode_utf8, read_utf8
from ...common.proc import command_line

if TYPE_CHECKING:
    from .source import BaseTree

#: Name of the order file inside the patches directory.
SERIES_FILE = "series"
#: Suffix of patch files; every file with it in the patches directory must be listed in ``series``.
PATCH_SUFFIX = ".patch"
#: Branch that :func:`apply_series` creates (or resets) at the base commit before importing.
FORK_BRANCH = "fork"
#: Committer identity of the commits :func:`apply_series` creates (part of their commit ids).
COMMITTER_NAME = "llama.cpp fork patch series"
COMMITTER_EMAIL = "patches@localhost"
#: Longest subject slug in a patch file name, in characters (git format-patch's own default is 64).
SLUG_MAX_CHARS = 64
#: Most lines kept per section (rejected hunks, conflicts, git am output) of a PatchApplyError.
REPORT_MAX_LINES = 200
#: Most unified-diff lines :func:`check_series` shows for one changed file.
CHECK_DIFF_MAX_LINES = 30

_SERIES_HEADER = (
    "# Order in which the patches are applied with git am, one file name per line.\n"
    "# Written by python -m harness patches export; lines starting with # are ignored.\n"
)

#: ``-c`` settings for every git call: no CRLF conversion, paths past Windows' MAX_PATH (260
#: characters; git for Windows refuses them otherwise), no user attributes/excludes/hooks,
#: no signing, no recorded conflict resolutions, UTF-8 messages.
_BASE_CONFIG = (
    "core.autocrlf=false",
    "core.longpaths=true",
    "core.safecrlf=false",
    "core.quotePath=true",
    f"core.attributesFile={os.devnull}",
    f"core.excludesFile={os.devnull}",
    f"core.hooksPath={os.devnull}",
    "commit.gpgSign=false",
    "rerere.enabled=false",
    "i18n.commitEncoding=UTF-8",
    "i18n.logOutputEncoding=UTF-8",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    f"user.name={COMMITTER_NAME}",
    f"user.email={COMMITTER_EMAIL}",
)

#: Settings that change format-patch bytes and have no command-line negation.
_FORMAT_CONFIG = (
    "format.mboxrd=false",
    "diff.suppressBlankEmpty=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "core.abbrev=12",
)

#: ``git format-patch`` options for one commit written to stdout.  Every diff option is
#: explicit so that repository config (diff.algorithm, diff.context, diff.orderFile,
#: diff.renames, format.*) cannot change the bytes.
_FORMAT_PATCH_ARGS = (
    "format-patch",
    "--stdout",
    "--zero-commit",
    "--full-index",
    "--binary",
    "--no-signature",
    "--no-numbered",
    "--keep-subject",
    "--no-stat",
    "--no-thread",
    "--no-attach",
    "--no-cover-letter",
    "--no-notes",
    "--no-signoff",
    "--no-base",
    "--no-add-header",
    "--no-to",
    "--no-cc",
    "--no-from",
    "--no-force-in-body-from",
    "--no-encode-email-headers",
    "--no-show-signature",
    "--encoding=UTF-8",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--unified=3",
    "--inter-hunk-context=0",
    "--no-renames",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    f"-O{os.devnull}",
)

#: ``git am`` options: three-way fallback, CRs kept, subject kept verbatim (the export uses
#: --keep-subject), no scissors/Message-Id/signing, committer date = author date.
AM_ARGS = (
    "am",
    "--3way",
    "--keep-cr",
    "--keep",
    "--utf8",
    "--no-scissors",
    "--no-message-id",
    "--no-gpg-sign",
    "--whitespace=warn",
    "--committer-date-is-author-date",
)


#: Lines of git am's failure message about resuming the session, dropped because it is aborted.
_AM_RESUME_ADVICE = (
    "When you have resolved this problem",
    "If you prefer to skip this patch",
    "To restore the original branch",
    "hint: Use 'git am --show-current-patch",
)


class PatchError(InputError):
    """A problem with the patch series; the message names the patch, file and line involved."""


class PatchApplyError(PatchError):
    """A patch of the series did not apply.

    ``patch`` is the patch file name, ``rejected`` the text explaining what did not apply:
    the rejected hunks (``git apply --reject``), the conflicts ``git am --3way`` left, and
    git am's own message.
    """

    def __init__(self, message: str, *, patch: str, rejected: str) -> None:
        super().__init__(message)
        self.patch = patch
        self.rejected = rejected


@dataclass(frozen=True)
class Patch:
    """One patch file of the series.

    ``name`` is the file name as listed in ``series``, ``path`` its location, ``sha256``
    the hex digest of its bytes, and ``subject`` the commit subject it carries.
    """

    name: str
    path: Path
    sha256: str
    subject: str


# --------------------------------------------------------------------------- git runner


#: What every git call gets in its environment beside the caller's (whose ``GIT_*`` it loses): a fixed locale,
#: time zone, committer and no system or global configuration.
_GIT_SETTINGS = {
    "LC_ALL": "C",
    "LANG": "C",
    "TZ": "UTC",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_COMMITTER_NAME": COMMITTER_NAME,
    "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL,
}


def _git_env() -> dict[str, str]:
    """The environment for every git call: the caller's, minus ``GIT_*``, plus fixed settings."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("GIT_") or key == "GIT_EXEC_PATH"}
    env.update(_GIT_SETTINGS)
    env.pop("LANGUAGE", None)
    return env


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _clip(text: str, max_lines: int = REPORT_MAX_LINES) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"])


class Git:
    """Runs git in one repository with the fixed environment, optionally appending to a log file."""

    def __init__(self, cwd: Path, log: Path | None = None) -> None:
        if shutil.which("git") is None:
            raise PatchError("git is not installed (not found on PATH)")
        self.cwd = cwd
        self.log = log

    def run(self, args: Sequence[str], *, check: bool = True, stdin: bytes | None = None,
            config: Sequence[str] = (), env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[bytes]:
        """Run ``git <config> args`` in ``cwd``; raise PatchError with git's stderr when ``check`` and it fails."""
        cmd = ["git"]
        for setting in (*_BASE_CONFIG, *config):
            cmd += ["-c", setting]
        cmd += list(args)
        added = {**_GIT_SETTINGS, **(env or {})}
        proc = subprocess.run(cmd, cwd=self.cwd, env={**_git_env(), **(env or {})},
                              input=stdin, capture_output=True, check=False)
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as fh:
                fh.write(f"$ {command_line(cmd, added, self.cwd)}\n# exit {proc.returncode}\n")
                for stream in (proc.stdout, proc.stderr):
                    if stream:
                        fh.write(_text(stream).rstrip("\n") + "\n")
        if check and proc.returncode != 0:
            raise PatchError(f"git {' '.join(args)} failed in {self.cwd} (exit {proc.returncode}): "
                             f"{_text(proc.stderr).strip()}")
        return proc

    def out(self, args: Sequence[str], *, check: bool = True) -> str:
        """Stdout of ``git args`` as text, stripped."""
        return _text(self.run(args, check=check).stdout).strip()

    def commit_id(self, rev: str) -> str:
        """Full id of commit ``rev``; PatchError naming the repository when it is not a commit there."""
        proc = self.run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], check=False)
        if proc.returncode != 0:
            raise PatchError(f"{self.cwd}: {rev!r} is not a commit in this repository")
        return _text(proc.stdout).strip()

    def am_in_progress(self) -> bool:
        """Whether an unfinished ``git am`` session (its rebase-apply directory) exists."""
        state = self.out(["rev-parse", "--git-path", "rebase-apply"])
        return (self.cwd / state).is_dir()

    def clean_tree(self) -> None:
        """Discard index and work tree changes and untracked (not ignored) files."""
        self.run(["reset", "--quiet", "--hard", "HEAD"])
        self.run(["clean", "-ffdq"])


# --------------------------------------------------------------------------- reading


def _parse_patch_file(path: Path, data: bytes) -> tuple[dict[str, str], str, bytes]:
    """Split a format-patch file the way ``git am --keep`` does (``git mailinfo -k``).

    Returns (headers Author/Email/Subject/Date, commit message body, diff bytes).
    """
    with tempfile.TemporaryDirectory(prefix="patch-mailinfo-") as tmp:
        scratch = Path(tmp)
        git = Git(scratch)
        proc = git.run(["mailinfo", "-k", "-u", "--no-scissors", "msg", "diff"], stdin=data,
                       check=False, env={"GIT_CEILING_DIRECTORIES": str(scratch.parent)})
        if proc.returncode != 0:
            raise PatchError(f"{path}: git mailinfo cannot read it as a patch e-mail: "
                             f"{_text(proc.stderr).strip()}")
        headers: dict[str, str] = {}
        for line in _text(proc.stdout).splitlines():
            key, sep, value = line.partition(": ")
            if sep:
                headers[key] = value.strip()
        body = _text((scratch / "msg").read_bytes())
        diff = (scratch / "diff").read_bytes()
        if diff.strip():
            # git apply reads the diff without a tree: a hunk cut short or a count that lies is malformed input,
            # not a patch that no longer applies (that is the build's to find)
            parsed = git.run(["apply", "--numstat", "-"], stdin=diff, check=False,
                             env={"GIT_CEILING_DIRECTORIES": str(scratch.parent)})
            if parsed.returncode != 0:
                raise PatchError(f"{path}: malformed diff: {_malformed_where(data, diff, _text(parsed.stderr))}")
    return headers, body, diff


def _malformed_where(data: bytes, diff: bytes, stderr: str) -> str:
    """git apply's complaint about ``diff`` (the diff part of the patch file ``data``) in one line, its
    ``at line N`` (of the diff) turned into the line of the patch file."""
    first = next((line for line in stderr.splitlines() if line.strip()), "git apply cannot read it").strip()
    first = first.removeprefix("error: ")
    m = re.search(r"at line (\d+)", first)
    start = data.find(diff.split(b"\n", 1)[0])
    if m and start >= 0:
        line = data.count(b"\n", 0, start) + int(m.group(1))
        first = f"{first[:m.start()]}at line {line}{first[m.end():]}"
    return f"{first} (git apply --numstat); fix or re-export the patch (python -m harness patches export)"


#: Header lines of a git diff that name a path (the path follows the prefix).
_PATH_HEADERS = (b"--- ", b"+++ ", b"rename from ", b"rename to ", b"copy from ", b"copy to ")


def _unquote(raw: bytes) -> str:
    """A path as git prints it: plain, or C-quoted in double quotes when it holds special bytes."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1].encode("latin-1", errors="replace").decode("unicode_escape", errors="replace")
    return text.split("\t", 1)[0]


def check_line_endings(path: Path, data: bytes) -> None:
    """Raise PatchError when the patch file ``path`` has CRLF line endings.

    format-patch writes LF; a patch whose own header lines end in CR LF was converted by
    a checkout (``core.autocrlf=true``, the Git for Windows default), and ``git am``
    would then reject hunks without a word about line endings.  Content lines that end
    in CR LF because the patched file has them are fine (the series is applied with
    ``--keep-cr``); only the header is looked at.
    """
    first = data.split(b"\n", 1)[0]
    if first.endswith(b"\r"):
        raise PatchError(f"{path}: the patch file has CRLF (Windows) line endings, line 1 included; it was "
                         "converted on checkout (core.autocrlf=true) and would not apply. Restore it byte-exact: "
                         "git config core.autocrlf false, then git checkout -- patches/ "
                         "(the repository's .gitattributes keeps patches/ unconverted)")


def check_paths(path: Path, data: bytes) -> None:
    """Raise PatchError naming the line when a diff header of ``path`` names an absolute path
    (``/x``, ``C:/x``) or one with a ``..`` component: such a patch would write outside the tree,
    or at a place in it that its name hides, so it is refused before ``git am`` runs."""
    in_header = False
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.startswith(b"diff --git "):
            in_header = True
            continue
        if line.startswith((b"@@", b"GIT binary patch", b"Binary files")):
            in_header = False
        if not in_header:
            continue
        for prefix in _PATH_HEADERS:
            if not line.startswith(prefix):
                continue
            name = _unquote(line[len(prefix):])
            if name == "/dev/null":
                break
            if prefix in (b"--- ", b"+++ ") and name[:2] in ("a/", "b/"):
                name = name[2:]
            parts = name.replace("\\", "/").split("/")
            if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
                raise PatchError(f"{path}:{number}: the diff names the absolute path {name!r}; "
                                 "a patch may only change files inside the source tree")
            if ".." in parts:
                raise PatchError(f"{path}:{number}: the diff names the path {name!r}, which climbs out with "
                                 "'..'; a patch may only change files inside the source tree")
            break


def _read_patch(path: Path) -> Patch:
    data = path.read_bytes()
    try:
        decode_utf8(path, data, "the patch")
    except InputError as exc:
        raise PatchError(str(exc)) from None
    check_line_endings(path, data)
    check_paths(path, data)
    if not re.search(rb"^Subject:", data, flags=re.MULTILINE):
        raise PatchError(f"{path}: not a git format-patch file (no 'Subject:' header)")
    headers, body, diff = _parse_patch_file(path, data)
    subject = headers.get("Subject", "")
    if not subject:
        raise PatchError(f"{path}: the 'Subject:' header is empty")
    for key, header in (("Email", "From:"), ("Date", "Date:")):
        if not headers.get(key):
            raise PatchError(f"{path}: no author '{header}' header; git am needs it to reproduce the commit")
    if not body.strip():
        raise PatchError(f"{path}: the commit message has a subject ({subject!r}) but no body; "
                         "each patch's message must say why the patch exists")
    if not diff.strip():
        raise PatchError(f"{path}: contains no diff")
    return Patch(name=path.name, path=path, sha256=hashlib.sha256(data).hexdigest(), subject=subject)


def read_series(patches_dir: Path) -> list[Patch]:
    """Read and validate the patch series in ``patches_dir``.

    Takes the directory holding ``series`` and the ``*.patch`` files; returns the patches
    in series order.  Raises PatchError when: ``series`` is missing or not UTF-8; a line
    is not a plain ``NAME.patch`` file name, names a file that does not exist, or repeats
    an earlier line (the message gives ``series`` path and line number); a ``*.patch``
    file in the directory is not listed; or a patch is not format-patch output (no
    ``Subject:``, no author ``From:``/``Date:``, no diff) or its message has no body below
    the subject (each patch's message says why it exists).
    """
    series_path = patches_dir / SERIES_FILE
    if not series_path.is_file():
        raise PatchError(f"{series_path}: series file not found")
    try:
        text = read_utf8(series_path, "the series file")
    except InputError as exc:
        raise PatchError(str(exc)) from None
    listed: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        name = raw.strip()
        if not name or name.startswith("#"):
            continue
        where = f"{series_path}:{lineno}"
        if ("/" in name or "\\" in name or name.startswith(".")
                or not name.endswith(PATCH_SUFFIX)):
            raise PatchError(f"{where}: {name!r} is not a patch file name (expected NAME{PATCH_SUFFIX} "
                             f"inside {patches_dir})")
        if name in listed:
            raise PatchError(f"{where}: {name} is listed twice (first on line {listed[name]})")
        if not (patches_dir / name).is_file():
            raise PatchError(f"{where}: {name} is listed but {patches_dir / name} does not exist")
        listed[name] = lineno
    unlisted = sorted(p.name for p in patches_dir.glob(f"*{PATCH_SUFFIX}") if p.name not in listed)
    if unlisted:
        raise PatchError(f"{patches_dir}: {', '.join(unlisted)} not listed in {series_path} "
                         "(add it to the series or delete it)")
    return [_read_patch(patches_dir / name) for name in listed]


def series_digest(patches: Sequence[Patch]) -> str:
    """Hex sha256 identifying the series: its order, file names and file contents.

    Hashes, in order, each patch's name and the sha256 of its bytes (recorded when it was
    read), each field NUL-terminated so no two different series share an input.  Build
    caches are keyed by it; a change to any byte, name or position changes it.
    """
    return digest_of_series([(patch.name, patch.sha256) for patch in patches])


def digest_of_series(entries: Sequence[tuple[str, str]]) -> str:
    """:func:`series_digest` of a series given as (file name, sha256 of its bytes) pairs in series order, as a
    run's environment.json records it (:func:`series_env_summary`)."""
    digest = hashlib.sha256()
    for name, sha256 in entries:
        digest.update(name.encode("utf-8") + b"\0" + sha256.encode("ascii") + b"\0")
    return digest.hexdigest()


def series_label(patches: Sequence[Patch], total: int | None = None) -> str:
    """The LLAMA_FORK_SERIES value naming ``patches`` in the fork's ``--version``.

    ``"3 patches, sha256 0123456789ab"`` (the first 12 hex digits of
    :func:`series_digest`); with ``total``, a prefix of a longer series:
    ``"2 of 3 patches, sha256 …"``.
    """
    count = f"{len(patches)} of {total}" if total is not None else f"{len(patches)}"
    return f"{count} patches, sha256 {series_digest(patches)[:12]}"


def prepare_series_tree(base: BaseTree, work: Path, variant: str, patches: Sequence[Patch],
                        log: Path | None = None) -> Path:
    """``work/<variant>/llama.cpp`` holding ``base`` plus ``patches`` (harness.stages.building.source.prepare_tree).

    Re-made only when the base, the series or the tree itself changed; raises
    PatchApplyError naming the patch that does not apply.
    """
    from .source import prepare_tree
    return prepare_tree(base, work, variant, series_digest(patches),
                        lambda repo, rev: apply_series(repo, rev, patches, log=log))


def series_env_summary(patches: Sequence[Patch]) -> list[dict[str, str]]:
    """The series as recorded with results: ``[{"name": ..., "sha256": ...}]`` in series order."""
    return [{"name": patch.name, "sha256": patch.sha256} for patch in patches]


# --------------------------------------------------------------------------- applying


def reset_to_base(git: Git, base: str) -> None:
    """Put ``git.cwd`` on branch FORK_BRANCH at ``base`` with a clean work tree."""
    if git.am_in_progress():
        git.run(["am", "--quit"])
    git.run(["checkout", "--quiet", "--force", "-B", FORK_BRANCH, base])
    git.clean_tree()


def _rejected_hunks(git: Git, patch: Patch) -> str:
    """Apply ``patch`` with ``git apply --reject`` on the clean tree and return the .rej hunks.

    Leaves the tree clean again (the applied part is in the index, so a hard reset drops it).
    """
    proc = git.run(["apply", "--index", "--reject", str(patch.path.resolve())], check=False)
    stderr = _text(proc.stderr)
    parts: list[str] = []
    for match in re.finditer(r"^Applying patch (.+) with \d+ rejects?\.\.\.$", stderr, flags=re.MULTILINE):
        rej = git.cwd / f"{match.group(1)}.rej"
        if rej.is_file():
            parts.append(_text(rej.read_bytes()).rstrip("\n"))
            rej.unlink()
    searched = [line for line in stderr.splitlines() if not line.startswith(("Checking patch", "Applied patch"))]
    git.clean_tree()
    if parts:
        return "\n".join(parts) + "\n" + "\n".join(searched)
    return "\n".join(searched)


def _apply_failure(git: Git, base: str, patch: Patch, index: int, total: int,
                   am: subprocess.CompletedProcess[bytes]) -> PatchApplyError:
    """Collect what did not apply, abort git am, leave the tree clean and build the error."""
    conflicted = git.out(["diff", "--name-only", "--diff-filter=U"], check=False)
    conflicts = git.out(["diff"], check=False) if conflicted else ""
    git.run(["am", "--abort"], check=False)
    if git.am_in_progress():
        git.run(["am", "--quit"])
    git.clean_tree()
    rejects = _rejected_hunks(git, patch)
    last_good = git.commit_id("HEAD")
    sections = []
    if rejects.strip():
        sections.append(f"Hunks that did not apply (git apply --reject):\n{_clip(rejects)}")
    if conflicts:
        sections.append(f"Conflicts git am --3way left in {conflicted.replace(chr(10), ', ')}:\n"
                        f"{_clip(conflicts)}")
    said = [line for line in _text(am.stdout + am.stderr).splitlines()
            if not line.startswith(_AM_RESUME_ADVICE)]
    sections.append(f"git am said (its session was then aborted):\n{_clip(chr(10).join(said))}")
    rejected = "\n\n".join(sections)
    message = (f"{patch.path}: patch {index} of {total} ({patch.subject!r}) does not apply on "
               f"{base[:12]} + {index - 1} earlier patch(es).\n"
               f"{git.cwd} is left clean at {last_good[:12]}: the base plus the {index - 1} "
               f"patch(es) that applied.\n\n{rejected}")
    return PatchApplyError(message, patch=patch.name, rejected=rejected)


def apply_series(repo: Path, base_commit: str, patches: Sequence[Patch], *,
                 upto: int | None = None, log: Path | None = None) -> list[str]:
    """Import the series onto ``base_commit`` in the git work tree ``repo``; return the new commit ids.

    ``repo`` must contain ``base_commit``; whatever it had checked out is discarded: an
    unfinished ``git am`` is dropped, branch ``fork`` is (re)created at the base, local
    changes and untracked files are removed (ignored files such as build directories are
    kept).  Then ``patches[:upto]`` (all when ``upto`` is None) are imported one at a time
    with ``git am --3way --keep-cr``, committer date = author date, so the same series on
    the same base always gives the same commit ids.  Every git command and its output is
    appended to ``log`` when given.

    Raises ValueError for ``upto`` outside 0..len(patches), PatchError when the base is not
    a commit of ``repo`` or git fails, and PatchApplyError when a patch does not apply: then
    ``git am`` is aborted, ``repo`` is left clean at the base plus the patches that applied,
    and the error names the patch file and carries the hunks that did not apply.
    """
    if upto is not None and not 0 <= upto <= len(patches):
        raise ValueError(f"upto={upto} is outside 0..{len(patches)} (the series has {len(patches)} patches)")
    selected = list(patches if upto is None else patches[:upto])
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    git = Git(repo, log)
    base = git.commit_id(base_commit)
    reset_to_base(git, base)
    commits: list[str] = []
    parent = base
    for index, patch in enumerate(selected, start=1):
        proc = git.run([*AM_ARGS, str(patch.path.resolve())], check=False)
        if proc.returncode != 0:
            raise _apply_failure(git, base, patch, index, len(selected), proc)
        head = git.commit_id("HEAD")
        if git.out(["rev-parse", f"{head}^"]) != parent:
            raise PatchError(f"{patch.path}: git am did not create exactly one commit on {parent[:12]}")
        commits.append(head)
        parent = head
    return commits


# --------------------------------------------------------------------------- exporting


def _slug(subject: str) -> str:
    """File-name stem for a subject: lower case, runs of other than [a-z0-9._] become '-'."""
    slug = re.sub(r"[^a-z0-9._]+", "-", subject.lower())
    slug = re.sub(r"\.{2,}", ".", slug).strip("-.")
    return slug[:SLUG_MAX_CHARS].rstrip("-.") or "patch"


def export_series(repo: Path, base_commit: str, out_dir: Path) -> list[Patch]:
    """Write the commits ``base_commit..HEAD`` of ``repo`` as the series in ``out_dir``.

    One file per commit, named from its subject (``<slug>.patch``; a repeated slug gets
    ``-2``, ``-3``...), written with fixed format-patch options so that re-exporting an
    unchanged series is byte-identical; files whose bytes are unchanged are not rewritten.
    Writes ``series`` in commit order and deletes ``*.patch`` files of ``out_dir`` that are
    no longer part of it.  Returns the series as read back by :func:`read_series`.

    Raises PatchError (before writing anything) when ``base_commit`` is not an ancestor of
    HEAD, the range contains a merge or an empty commit, or a commit message has no body.
    """
    git = Git(repo)
    base = git.commit_id(base_commit)
    head = git.commit_id("HEAD")
    if git.run(["merge-base", "--is-ancestor", base, head], check=False).returncode != 0:
        raise PatchError(f"{repo}: {base_commit} is not an ancestor of HEAD ({head[:12]})")
    merges = git.out(["rev-list", "--merges", f"{base}..{head}"])
    if merges:
        raise PatchError(f"{repo}: {base[:12]}..HEAD contains merge commit(s) {merges.split()[0][:12]}; "
                         "a patch series must be linear")
    commits = git.out(["rev-list", "--reverse", f"{base}..{head}"]).split()
    files: list[tuple[str, bytes]] = []
    taken: set[str] = set()
    for commit in commits:
        subject = git.out(["log", "-1", "--format=%s", commit])
        if not git.out(["log", "-1", "--format=%b", commit]):
            raise PatchError(f"{repo}: commit {commit[:12]} ({subject!r}) has no message body; "
                             "each patch's message must say why the patch exists")
        content = git.run([*_FORMAT_PATCH_ARGS, "-1", commit], config=_FORMAT_CONFIG).stdout
        if not content:
            raise PatchError(f"{repo}: commit {commit[:12]} ({subject!r}) changes nothing")
        stem = _slug(subject)
        name, n = f"{stem}{PATCH_SUFFIX}", 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}{PATCH_SUFFIX}"
        taken.add(name)
        files.append((name, content))

    out_dir.mkdir(parents=True, exist_ok=True)
    series = (_SERIES_HEADER + "".join(f"{name}\n" for name, _ in files)).encode("utf-8")
    for name, content in [*files, (SERIES_FILE, series)]:
        target = out_dir / name
        if not target.is_file() or target.read_bytes() != content:
            target.write_bytes(content)
    for stale in out_dir.glob(f"*{PATCH_SUFFIX}"):
        if stale.name not in taken:
            stale.unlink()
    return read_series(out_dir)


# --------------------------------------------------------------------------- checking


def _file_difference(label: Path, current: bytes, expected: bytes) -> str:
    diff = list(difflib.unified_diff(
        _text(current).splitlines(), _text(expected).splitlines(),
        fromfile=f"{label} (on disk)", tofile=f"{label} (as exported)", lineterm="", n=1))
    shown = diff[:CHECK_DIFF_MAX_LINES]
    if len(diff) > len(shown):
        shown.append(f"... ({len(diff) - len(shown)} more diff lines)")
    if not diff:  # differences the text view cannot show (line endings, invalid UTF-8)
        shown.append("(differs only in line endings or bytes that are not UTF-8)")
    return f"{label}: changed; export writes different bytes:\n" + "\n".join(shown)


def check_series(repo_scratch: Path, base_commit: str, patches_dir: Path) -> list[str]:
    """Check that ``patches_dir`` holds exactly what exporting the applied series writes.

    Applies the series from ``patches_dir`` onto ``base_commit`` in ``repo_scratch`` (a git
    work tree that is reset, see :func:`apply_series`), exports it to a temporary
    directory and compares the two file sets (``series`` and ``*.patch``).  Returns one
    human-readable line per difference — file missing, file export would remove, file
    changed (with the first lines of a unified diff) — and ``[]`` when up to date.

    Raises PatchError for an invalid series and PatchApplyError when a patch does not apply.
    """
    patches = read_series(patches_dir)
    apply_series(repo_scratch, base_commit, patches)
    differences: list[str] = []
    with tempfile.TemporaryDirectory(prefix="patch-check-") as tmp:
        expected_dir = Path(tmp)
        export_series(repo_scratch, base_commit, expected_dir)
        current = {SERIES_FILE} | {p.name for p in patches_dir.glob(f"*{PATCH_SUFFIX}")}
        expected = {SERIES_FILE} | {p.name for p in expected_dir.glob(f"*{PATCH_SUFFIX}")}
        order = [SERIES_FILE] + [p.name for p in patches]
        order += sorted((current | expected) - set(order))
        for name in order:
            label = patches_dir / name
            if name not in expected:
                differences.append(f"{label}: not written by export (its commit exports under another "
                                   "name); export would delete it")
            elif name not in current:
                differences.append(f"{label}: missing; export writes it")
            else:
                have, want = label.read_bytes(), (expected_dir / name).read_bytes()
                if have != want:
                    differences.append(_file_difference(label, have, want))
    return differences
