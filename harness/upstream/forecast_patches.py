"""The patch stage of an upstream forecast: every patch of the series tried on another upstream commit.

Each patch is applied with ``git am -3`` on top of the ones that applied before it, and the series
goes on past a failure: a conflicting patch is left out, and every later patch that still applies
is recorded as applied without it.  Each patch gets one status of
harness.common.statuses.PATCH:

* ``clean``: ``git apply --check`` takes it as it is (hunks may sit at other line numbers);
* ``3-way``: it does not apply as it is, but ``git am -3`` merges it through the blobs its
  ``index`` lines name (the series is written with ``--full-index``, and the old base's objects
  are fetched into the trial repository so that those blobs exist);
* ``already-upstream``: its reverse applies (the new base holds its result), or ``git am -3``
  says ``No changes -- Patch already applied``; nothing is committed for it;
* ``conflict``: ``git am -3`` leaves conflicts.  For each conflicting region the file, the hunk
  of the patch it comes from (its ``@@`` header, matched by the lines the patch wanted there)
  and the upstream lines it met (the ``HEAD`` side of git's conflict markers, with their line
  number in the new base) are recorded; a file that git could not merge at all (gone upstream,
  or a blob missing) is recorded with the hunks that do not apply and the reason git gave.

The git runner, environment and ``git am`` options are harness.stages.building.patches' own, so a patch
that applies here applies the same way when the forecast's fork tree is prepared.
"""

from __future__ import annotations

import difflib
import re
import time
from pathlib import Path
from typing import Sequence

from ..common.statuses import PATCH_3WAY, PATCH_ALREADY_UPSTREAM, PATCH_CLEAN, PATCH_CONFLICT
from ..record.forecast import HunkConflict, PatchOutcome
from ..stages.building.patch_diff import added_files, diff_files
from ..stages.building.patches import AM_ARGS, Git, Patch, reset_to_base

#: Ref under which the old base's commit is kept in the trial repository (its blobs serve 3-way merges).
OLD_BASE_REF = "refs/forecast/old-base"
#: Most upstream lines kept per conflicting region (the rest are counted).
MET_MAX_LINES = 40
#: ``-c`` settings of the trial's git am: two-sided conflict markers, whatever the user's config says.
MERGE_CONFIG = ("merge.conflictStyle=merge",)
_FAILED_AT = re.compile(r"^error: patch failed: (?P<file>.+?):(?P<line>\d+)$", re.M)
_GIT_REASON = re.compile(r"^(?:error|fatal): (?P<msg>.+)$", re.M)


def _hunks(patch: Patch) -> dict[str, list]:
    """The patch's hunks by target path (unidiff's Hunk objects); {} when unidiff cannot read the diff."""
    return {(f.target_file[2:] if f.target_file.startswith("b/") else f.path): list(f) for f in diff_files(patch)}


def _header(hunk) -> str:
    """``@@ -a,b +c,d @@ section`` of a unidiff Hunk."""
    head = f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
    return f"{head} {hunk.section_header}".rstrip()


def _wanted(hunk) -> list[str]:
    """The lines a hunk leaves in the file: context and added lines, without their newline."""
    return [ln.value.rstrip("\n") for ln in hunk if not ln.is_removed]


def _clip(lines: list[str]) -> list[str]:
    if len(lines) <= MET_MAX_LINES:
        return lines
    return lines[:MET_MAX_LINES] + [f"... ({len(lines) - MET_MAX_LINES} more lines)"]


def conflict_regions(text: str) -> list[tuple[int, list[str], list[str]]]:
    """The conflicts git's two-sided markers left in ``text``: (1-based line of upstream's file where its
    side starts, counting upstream's lines only, upstream's lines (``<<<<<<<`` side), the patch's lines
    (``>>>>>>>`` side))."""
    regions = []
    ours: list[str] | None = None
    theirs: list[str] | None = None
    start = upstream_line = 0
    for line in text.splitlines():
        if line.startswith("<<<<<<< "):
            ours, theirs, start = [], None, upstream_line + 1
        elif line == "=======" and ours is not None and theirs is None:
            theirs = []
        elif line.startswith(">>>>>>> ") and ours is not None and theirs is not None:
            regions.append((start, ours, theirs))
            ours = theirs = None
        elif theirs is not None:
            theirs.append(line)
        else:
            upstream_line += 1
            if ours is not None:
                ours.append(line)
    return regions


def _best_hunk(hunks: list, lines: list[str]):
    """The hunk whose written lines are most like ``lines`` (difflib ratio); None for no hunks."""
    return max(hunks, key=lambda h: difflib.SequenceMatcher(None, _wanted(h), lines).ratio(), default=None)


def _nearest_window(current: list[str], hunk) -> tuple[int, list[str]]:
    """Where in the new base's file ``current`` a hunk that does not apply met upstream: the window of its
    pre-image's length most like the pre-image (difflib ratio; ties: nearest its old line number)."""
    before = [ln.value.rstrip("\n") for ln in hunk if not ln.is_added]
    size = max(1, len(before))
    best, best_key = 0, (-1.0, 0)
    for start in range(0, max(1, len(current) - size + 1)):
        ratio = difflib.SequenceMatcher(None, before, current[start:start + size]).ratio()
        key = (ratio, -abs(start + 1 - hunk.source_start))
        if key > best_key:
            best, best_key = start, key
    return best + 1, current[best:best + size]


def _at_head(git: Git, path: str) -> list[str] | None:
    """The lines of ``path`` at HEAD (the new base with the patches applied so far); None when it has no such file."""
    proc = git.run(["show", f"HEAD:{path}"], check=False)
    return None if proc.returncode else proc.stdout.decode("utf-8", errors="replace").splitlines()


def _unplaced(git: Git, patch: Patch, path: str, hunks: list, why: str) -> list[HunkConflict]:
    """Conflicts of ``path`` without git's markers: one for a file HEAD lacks (its first hunk, with the count
    of the others), else the first hunk that does not apply, with the upstream lines most like its pre-image."""
    current = _at_head(git, path)
    if current is None:
        more = f" (and {len(hunks) - 1} more hunks)" if len(hunks) > 1 else ""
        first = hunks[0] if hunks else None
        return [HunkConflict(path, (_header(first) if first else "?") + more, _clip(_wanted(first)) if first else [],
                             0, [], f"{path} is not in the new base with the patches applied so far")]
    for hunk in hunks:
        check = git.run(["apply", "--check", f"--include={path}", str(patch.path.resolve())], check=False)
        if check.returncode == 0:
            continue
        at, met = _nearest_window(current, hunk)
        return [HunkConflict(path, _header(hunk), _clip(_wanted(hunk)), at, _clip(met), why)]
    return []


def _renamed_from(git: Git, hunks: dict[str, list], unmerged: list[str], sides: list[list[str]]) -> str:
    """The path the patch names for an unmerged file it does not name: upstream renamed it and git's 3-way merge
    followed the rename.  Of the patch's files that HEAD lacks and git did not leave unmerged, the one whose
    hunks are most like the patch's sides of the conflict (``sides``, difflib ratio); '' when there is none."""
    gone = [f for f in hunks if f not in unmerged and _at_head(git, f) is None]

    def likeness(name: str) -> float:
        return max((difflib.SequenceMatcher(None, _wanted(h), side).ratio() for h in hunks[name] for side in sides),
                   default=0.0)
    return max(gone, key=likeness, default="")


def _conflicts(git: Git, patch: Patch, said: str) -> list[HunkConflict]:
    """Every conflicting place of ``patch`` after a failed ``git am -3`` (before it is aborted).

    Where the 3-way merge ran, the conflicts are its unmerged files: each region between git's markers,
    or (a file one side deleted) the file.  Where it could not run (``said``: git's output names the
    reason, e.g. a blob missing), the files ``git apply`` names as failing, each with its first hunk
    that does not apply.
    """
    hunks = _hunks(patch)
    found: list[HunkConflict] = []
    unmerged = [p for p in git.out(["diff", "--name-only", "--diff-filter=U"], check=False).splitlines() if p]
    for path in unmerged:
        full = git.cwd / path
        text = full.read_text(encoding="utf-8", errors="replace") if full.is_file() else ""
        regions = conflict_regions(text)
        renamed = "" if path in hunks else _renamed_from(git, hunks, unmerged, [theirs for _, _, theirs in regions])
        for line, ours, theirs in regions:
            hunk = _best_hunk(hunks.get(renamed or path, []), theirs)
            found.append(HunkConflict(path, _header(hunk) if hunk else "?", _clip(theirs), line, _clip(ours),
                                      renamed_from=renamed))
        if not regions:  # deleted on one side: git names the file, there are no markers
            found += _unplaced(git, patch, path, hunks.get(path, []), "git left no conflict markers")
    if unmerged:
        return found
    reasons = [m.group("msg") for m in _GIT_REASON.finditer(said)
               if not m.group("msg").startswith(("patch failed", "Failed to merge")) and "patch does not apply"
               not in m.group("msg")]
    why = "; ".join(dict.fromkeys(reasons)) or "git am -3 could not merge it"
    for path in dict.fromkeys(m.group("file") for m in _FAILED_AT.finditer(said)):
        found += _unplaced(git, patch, path, hunks.get(path, []), why)
    return found


def try_patch(git: Git, patch: Patch, index: int, *, leave_conflict: bool = False) -> PatchOutcome:
    """Apply ``patch`` (series position ``index``) on HEAD of ``git.cwd`` and classify it.

    Leaves the tree clean: at a new commit for clean and 3-way, at the same HEAD otherwise; with
    ``leave_conflict`` a conflicting patch's ``git am`` session is left as git stops it (the conflict in the
    work tree, for a person to resolve and ``git am --continue``: harness.upstream.roll).
    """
    start = time.monotonic()
    hunks = _hunks(patch)
    files = sorted(hunks)
    where = str(patch.path.resolve())

    def outcome(status: str, detail: str, **more) -> PatchOutcome:
        return PatchOutcome(index, patch.name, patch.subject, status, files, detail,
                            seconds=round(time.monotonic() - start, 2), **more)

    head = git.commit_id("HEAD")
    forward = git.run(["apply", "--check", where], check=False)
    if forward.returncode == 0:
        status = PATCH_CLEAN
    elif git.run(["apply", "--check", "--reverse", where], check=False).returncode == 0:
        return outcome(PATCH_ALREADY_UPSTREAM, "its reverse applies: the new base already holds its changes")
    else:
        status = PATCH_3WAY
    am = git.run([*AM_ARGS, where], check=False, config=MERGE_CONFIG)
    said = (am.stdout + am.stderr + forward.stderr).decode("utf-8", errors="replace")
    if am.returncode == 0:
        new = git.commit_id("HEAD")
        if new == head:
            return outcome(PATCH_ALREADY_UPSTREAM, "git am -3: no changes left, the patch is already applied")
        detail = "applies as it is" if status == PATCH_CLEAN else "merged by git am -3 (the plain apply fails)"
        return outcome(status, detail, commit=new)
    conflicts = _conflicts(git, patch, said)
    places = ", ".join(dict.fromkeys(f"{c.place()} {c.hunk.split(' @@')[0]} @@" for c in conflicts)) or "see the log"
    if leave_conflict:
        return outcome(PATCH_CONFLICT, f"conflicts in {places}", conflicts=conflicts)
    git.run(["am", "--abort"], check=False)
    if git.am_in_progress():
        git.run(["am", "--quit"])
    git.run(["reset", "--quiet", "--hard", head])
    git.clean_tree()
    return outcome(PATCH_CONFLICT, f"conflicts in {places}", conflicts=conflicts)


def try_series(repo: Path, base_rev: str, patches: Sequence[Patch], *, old_repo: Path | None = None,
               old_rev: str | None = None, log: Path | None = None) -> list[PatchOutcome]:
    """Try every patch of ``patches`` onto ``base_rev`` in the git work tree ``repo``; never stops early.

    ``repo`` is reset to branch ``fork`` at ``base_rev`` (harness.stages.building.patches.apply_series'
    rules).  When ``old_repo``/``old_rev`` are given (the pinned base the series was written
    on), that commit is fetched into ``repo`` under OLD_BASE_REF first, so that the blobs the
    patches' index lines name exist for 3-way merges.  Each patch is tried on top of those that
    applied (:func:`try_patch`); a patch that applied after one or more conflicts records them
    in ``applied_without``.  Every git command is appended to ``log``.  Returns one outcome per
    patch, in series order; ``repo`` is left at the last applied patch.  Raises
    harness.stages.building.patches.PatchError when git itself fails (not a patch that does not apply).
    """
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    git = Git(repo, log)
    if old_repo is not None and old_rev is not None:
        git.run(["fetch", "--quiet", "--no-tags", str(old_repo), f"+{old_rev}:{OLD_BASE_REF}"])
    reset_to_base(git, git.commit_id(base_rev))
    outcomes: list[PatchOutcome] = []
    left_out: list[str] = []
    created: dict[str, str] = {}  # path -> the left-out patch that creates it
    for index, patch in enumerate(patches, start=1):
        result = try_patch(git, patch, index)
        if result.applied and left_out:
            result.applied_without = list(left_out)
        if result.status == PATCH_CONFLICT:
            for c in result.conflicts:
                if c.upstream_line == 0 and c.file in created:
                    c.reason = f"{c.file} comes with {created[c.file]}, which was left out"
            left_out.append(patch.name)
            created.update({path: patch.name for path in added_files(patch)})
        outcomes.append(result)
    return outcomes
