"""Bisect across upstream commits: the first upstream commit that makes a row of a run fail with the series on top.

``python -m harness bisect [RUN] --upstream GOOD..BAD [--check ID] [--repo PATH]`` takes the failing rows of RUN
as the series bisect does (harness.bisect.rows: ``--check`` picks one by the id the run's records give it) and
finds, for each, the first commit on BAD's first-parent line after GOOD at which it fails.  Each point is a commit
with the whole series applied on top, run through RUN's own stages on RUN's own selection
(harness.bisect.points.run_point, the stage table) with the matrix's base moved to that commit
(harness.matrix.config.onto_matrix); the row is judged there by the verdict that run recorded
(harness.record.verdict), as at a point of the series.  A commit where the series does not apply runs nothing: it
is neither good nor bad but undecided, stepped around as ``git bisect skip`` steps around a commit, so a first
bad commit with such commits just before it ends as a range (harness.bisect.search).  GOOD must be good and BAD
bad for a row to be searched; a row whose ends do not bracket it says which end.  The forecast's ``--bisect``
runs the same (:func:`bisect_upstream`) on the forecast's run.

Every commit has a work directory of its own, ``<work-dir>/bisect-upstream/<commit12>/`` (all at one depth, so
ccache, based at each, serves one commit's objects to the next), which a later bisect finds up to date; the
points' runs are ``<work-dir>/bisect-upstream/runs/<run-id>-<commit12>/``, of kind ``bisect``.  The result goes to
RUN's folder as ``bisect.json`` and ``bisect.md`` (harness.bisect.record; it replaces an earlier bisect's record
of that run).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..common.errors import InputError
from ..matrix.config import Matrix, Source, onto_matrix
from ..record.layout import RunLayout
from ..record.summary import RunSummary
from ..stages.building.patches import Patch
from .points import Point, RunCommandLine, narrowed, narrowing, run_point
from .record import FOUND, NOT_BAD_AT_BAD, NOT_GOOD_AT_GOOD, RANGE, BisectRecord, CommitInfo, RowBisect
from .rows import Seen, Target, suite_tests
from .search import BAD, GOOD, search


class BisectError(InputError):
    """The range cannot be bisected: GOOD and BAD name no commits to search between (exit code 2)."""


@dataclass(frozen=True)
class UpstreamCommit:
    """One upstream commit: its full id (``sha``) and subject line."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        """The first 12 hex digits of the id (names its build directory)."""
        return self.sha[:12]


def _resolve_commit(repo: Path, rev: str) -> str | None:
    """The full id of commit ``rev`` in ``repo``, or None when it names no commit there."""
    from ..stages.building.source import git
    if rev.startswith("-"):
        return None
    proc = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _is_git_repo(path: Path) -> bool:
    """Whether ``path`` itself is a git repository (work tree or bare), not a directory inside one."""
    from ..stages.building.source import git
    return git(["rev-parse", "--git-dir"], path, check=False,
               env={"GIT_CEILING_DIRECTORIES": str(path.resolve().parent)}).returncode == 0


def fetched_clone(url: str, dest: Path, revs: Sequence[str], say: Callable[[str], None] = print) -> Path:
    """A bare repository at ``dest`` holding ``revs``, fetched from ``url`` when they are missing.

    Created empty on first use; when a rev does not resolve there, every branch and tag of
    ``url`` is fetched, and a rev that still does not resolve (a commit id no branch holds)
    is fetched on its own and kept under ``refs/bisect-upstream/``.  Revs that the remote
    does not have are left missing (the caller reports them).  Returns ``dest``; raises
    harness.stages.building.source.SourceError when git cannot create or fetch into it.
    """
    from ..stages.building.source import git
    if not (dest / "HEAD").is_file():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        git(["init", "--quiet", "--bare", str(tmp)])
        tmp.rename(dest)
    if all(_resolve_commit(dest, r) for r in revs):
        return dest
    say(f"fetching the branches and tags of {url} into {dest}")
    git(["fetch", "--quiet", "--tags", "--force", url, "+refs/heads/*:refs/heads/*"], dest)
    for rev in revs:
        if _resolve_commit(dest, rev) is None and \
                git(["fetch", "--quiet", url, rev], dest, check=False).returncode == 0:
            sha = _resolve_commit(dest, "FETCH_HEAD")
            if sha:
                git(["update-ref", f"refs/bisect-upstream/{sha}", sha], dest)
    return dest


def upstream_repo(matrix: Matrix, repo: Path | None, revs: Sequence[str], cache: Path,
                  say: Callable[[str], None] = print) -> Path:
    """The git repository the upstream commits ``revs`` (GOOD and BAD) are taken from.

    ``repo`` (``--repo``) wins and must be a git repository.  Otherwise the first ``local``
    source of ``matrix`` (harness.matrix.config.Matrix) whose path exists, is a git repository and
    holds every rev; else a bare clone under ``cache/upstream/`` fetched from the first
    ``git`` source's URL (see :func:`fetched_clone`).  Raises InputError naming what
    was tried when none qualifies, and harness.stages.building.source.SourceError when fetching fails.
    """
    if repo is not None:
        if not repo.is_dir() or not _is_git_repo(repo):
            raise InputError(f"--repo {repo}: not a git repository")
        return repo.resolve()
    tried: list[str] = []
    for src in matrix.sources:
        if src.kind != "local" or src.path is None or not src.path.exists():
            continue
        if not _is_git_repo(src.path):
            tried.append(f"local source {src.path} is not a git repository")
            continue
        missing = [r for r in revs if _resolve_commit(src.path, r) is None]
        if not missing:
            return src.path.resolve()
        tried.append(f"local source {src.path} has no commit {', '.join(missing)}")
    for src in matrix.sources:
        if src.kind == "git" and src.url:
            dest = cache / "upstream" / hashlib.sha256(src.url.encode()).hexdigest()[:16]
            for line in tried:
                say(f"note: {line}")
            return fetched_clone(src.url, dest, revs, say)
    tried.append("the matrix lists no git source to fetch from")
    raise InputError(f"{matrix.path}: no repository holds {' and '.join(revs)} ({'; '.join(tried)}); "
                           "name one with --repo")


def upstream_commits(repo: Path, good: str, bad: str) -> list[UpstreamCommit]:
    """GOOD followed by ``git rev-list --first-parent --reverse GOOD..BAD``, with subjects.

    Index 0 is GOOD (must pass), the last is BAD (must fail).  Raises InputError when
    either rev names no commit of ``repo``, and BisectError when GOOD is BAD or not an ancestor of BAD, or when
    the range holds no commit.
    """
    from ..stages.building.source import git
    ids = {}
    for label, rev in (("GOOD", good), ("BAD", bad)):
        sha = _resolve_commit(repo, rev)
        if sha is None:
            raise InputError(f"--upstream: {label} {rev!r} is not a commit in {repo}")
        ids[label] = sha
    if ids["GOOD"] == ids["BAD"]:
        raise BisectError(f"--upstream {good}..{bad}: GOOD and BAD are the same commit {ids['GOOD'][:12]}")
    if git(["merge-base", "--is-ancestor", ids["GOOD"], ids["BAD"]], repo, check=False).returncode != 0:
        raise BisectError(f"--upstream {good}..{bad}: GOOD {ids['GOOD'][:12]} is not an ancestor of "
                               f"BAD {ids['BAD'][:12]} in {repo}")
    listed = git(["rev-list", "--first-parent", "--reverse", "--format=%H%x00%s", f"{ids['GOOD']}..{ids['BAD']}"],
                 repo).stdout
    commits = [UpstreamCommit(*line.split("\0", 1)) for line in listed.splitlines() if "\0" in line]
    if not commits:
        raise BisectError(f"--upstream {good}..{bad}: no commit between GOOD and BAD on BAD's first-parent line")
    subject = git(["log", "-1", "--format=%s", ids["GOOD"]], repo).stdout.strip()
    return [UpstreamCommit(ids["GOOD"], subject), *commits]


def first_parent(repo: Path, sha: str) -> str | None:
    """The first parent of commit ``sha`` in ``repo`` (full id), or None for a root commit."""
    return _resolve_commit(repo, f"{sha}^1")


def commit_files(repo: Path, sha: str) -> tuple[str, ...]:
    """The files commit ``sha`` of ``repo`` changes against its first parent (``git diff-tree``); () for a root
    commit or where git cannot tell."""
    from ..stages.building.source import git
    parent = first_parent(repo, sha)
    if parent is None:
        return ()
    done = git(["diff-tree", "--no-commit-id", "--name-only", "-r", parent, sha], repo, check=False)
    return tuple(done.stdout.split()) if done.returncode == 0 else ()


@dataclass
class UpstreamPoints:
    """The points of one bisection of run ``run_id`` across ``commits`` (:func:`upstream_commits`, GOOD first) of
    ``repo``: ``command`` how the run was started, ``matrix`` its matrix, ``patches`` its whole series (read from
    ``series``), ``platforms`` those of the rows bisected, ``root`` the bisection's directory
    (``<work-dir>/bisect-upstream``), ``say`` for progress lines.  Each commit is run at most once (:meth:`at`);
    ``not_applied``: position -> the patch that does not apply on that commit."""

    run_id: str
    command: RunCommandLine
    matrix: Matrix
    patches: Sequence[Patch]
    series: Path
    platforms: Sequence[str]
    repo: Path
    commits: Sequence[UpstreamCommit]
    root: Path
    say: Callable[[str], None] = print
    runs: dict[int, Point] = field(default_factory=dict)
    not_applied: dict[int, str] = field(default_factory=dict)

    def label(self, i: int) -> str:
        """Position ``i`` in progress lines: the commit's short id, its position and which end it is."""
        end = " GOOD" if i == 0 else " BAD" if i == len(self.commits) - 1 else ""
        return f"upstream {self.commits[i].short} ({i}/{len(self.commits) - 1}{end})"

    def _skipped(self, i: int) -> str:
        return (f"the patch series does not apply at upstream {self.commits[i].short} ({self.not_applied[i]} does not "
                "apply): nothing ran there, neither good nor bad")

    def at(self, i: int) -> Point | str:
        """The point of commit ``i`` with the whole series on top, run now or earlier in this bisection; where the
        series does not apply on the commit, why, in words (nothing is run there).

        The series is applied into the point's fork tree by harness.stages.building.patches.prepare_series_tree, as
        the build stage applies it (which then finds the tree made); raises harness.stages.building.source.SourceError
        when the commit's tree cannot be obtained."""
        if i in self.not_applied:
            return self._skipped(i)
        if i not in self.runs:
            from ..common.locks import Rank, exclusive
            from ..stages.building.patches import PatchApplyError, prepare_series_tree
            from ..stages.building.source import cache_dir, obtain_base
            commit = self.commits[i]
            matrix = onto_matrix(self.matrix, commit.sha, Source("local", path=self.repo))
            work = (self.root / commit.short).resolve()
            log: list[str] = []
            base = obtain_base(matrix, cache_dir(), log)
            try:
                # under the lock the build stage takes on the same tree (harness.stages.building.builds)
                with exclusive(work / "fork" / "llama.cpp", "the fork source tree", Rank.SOURCE, self.say):
                    prepare_series_tree(base, work, "fork", self.patches, log=work / "series-on-commit.log")
            except PatchApplyError as exc:
                self.not_applied[i] = exc.patch
                return self._skipped(i)
            self.say(f"bisect: {self.label(i)}: {', '.join(self.command.stages)} with the {len(self.patches)} "
                     f"patch(es) on {commit.subject!r}")
            self.runs[i] = run_point(i, f"{self.run_id}-{commit.short}", self.command, matrix, self.platforms,
                                     self.series, work, self.root / "runs", [f"upstream={commit.short}"])
        return self.runs[i]


def bisect_row(target: Target, points: UpstreamPoints, say: Callable[[str], None]) -> RowBisect:
    """The bisection of ``target`` across ``points``' commits: GOOD judged first (a row not good there is not
    searched, and BAD is not run for it), then BAD, then the search between (harness.bisect.search)."""
    n = len(points.commits) - 1
    seen = Seen(target, points.at, say, points.label)
    at, verdicts = seen.outcome, seen.verdicts
    row: RowBisect
    if at(0) != GOOD:
        row = RowBisect(target.id, NOT_GOOD_AT_GOOD, None, None, "", verdicts[0].text, [])
    elif at(n) != BAD:
        row = RowBisect(target.id, NOT_BAD_AT_BAD, None, 0, verdicts[n].text, verdicts[0].text, [])
    else:
        found = search(at, 0, n)
        first = points.commits[found.first_bad]
        info = CommitInfo(found.first_bad, first.sha, first.subject, commit_files(points.repo, first.sha))
        row = RowBisect(target.id, FOUND if found.exact else RANGE, info, found.last_good,
                        verdicts[found.first_bad].text, verdicts[found.last_good].text, [])
    row.points = [verdicts[k] for k in sorted(verdicts)]
    row.builds_made, row.builds_reused, row.seconds = seen.cost(points.runs)
    return row


def bisect_upstream(run_dir: Path, summary: RunSummary, targets: Sequence[Target], command: RunCommandLine,
                    good: str, bad: str, repo: Path | None, say: Callable[[str], None]) -> BisectRecord:
    """Bisect ``targets`` (failing rows of the run in ``run_dir``, whose summary is ``summary`` and whose stages and
    options are ``command``) across the upstream commits GOOD..BAD of ``repo`` (None: :func:`upstream_repo`), each
    with the run's whole series on top (module doc); writes ``bisect.json`` and ``bisect.md`` into ``run_dir`` and
    returns the record.  Raises InputError for commits that cannot be found or bisected, and
    harness.stages.building.source.SourceError when a commit's tree cannot be obtained."""
    from ..matrix.config import load_matrix
    from ..stages.building.patches import read_series
    from ..stages.building.source import cache_dir
    from .record import write
    started = time.monotonic()
    command = narrowed(command, suite_tests(targets))
    matrix = load_matrix(command.args.matrix)
    series = Path(command.args.patches_dir)
    patches = read_series(series)
    where = upstream_repo(matrix, repo, (good, bad), cache_dir(), say)
    commits = upstream_commits(where, good, bad)
    if first_parent(where, commits[1].sha) != commits[0].sha:
        say(f"note: GOOD {commits[0].short} is not on BAD's first-parent line; the candidates are the "
            f"commits of that line GOOD does not reach, from {commits[1].short} on")
    platforms = list(dict.fromkeys(t.platform for t in targets))
    points = UpstreamPoints(summary.run_id, command, matrix, patches, series, platforms, where, commits,
                            (Path(command.args.work_dir) / "bisect-upstream").resolve(), say)
    say(f"bisect: run {run_dir.name}: {len(targets)} failing row(s) across {len(commits) - 1} upstream commit(s) "
        f"after {commits[0].short} on the first-parent line of {commits[-1].short} in {where}, each with the "
        f"{len(patches)} patch(es) of {series}; each point runs {' '.join(command.stages)} on {', '.join(platforms)}"
        f"{narrowing(command)}")
    rec = BisectRecord(summary.run_id, [p.name for p in patches])
    for target in targets:
        rec.rows.append(bisect_row(target, points, say))
        say(f"bisect: {rec.rows[-1].line()}")
    rec.upstream = {"good": commits[0].sha, "bad": commits[-1].sha, "repo": str(where),
                    "commits": [[c.sha, c.subject] for c in commits],
                    "not_applied": {commits[i].sha: p for i, p in sorted(points.not_applied.items())}}
    rec.points = [{"k": p.k, "commit": commits[p.k].sha, "run": str(p.run_dir), "builds_made": p.made,
                   "builds_reused": p.reused, "seconds": p.seconds} for p in sorted(points.runs.values(), key=lambda p: p.k)]
    rec.builds_made = sum(p.made for p in points.runs.values())
    rec.builds_reused = sum(p.reused for p in points.runs.values())
    rec.seconds = round(time.monotonic() - started, 1)
    write(run_dir, rec)
    return rec


def _parse_range(spec: str) -> tuple[str, str]:
    good, sep, bad = spec.partition("..")
    if not sep or not good or not bad or bad.startswith(".") or ".." in bad or "-" in (good[0], bad[0]):
        raise InputError(f"--upstream {spec!r}: expected GOOD..BAD (two commits, e.g. b6000..b6100)")
    return good, bad


def run(args: argparse.Namespace) -> int:
    """``python -m harness bisect [RUN] --upstream GOOD..BAD [--check ID] [--repo PATH]`` (module doc).

    Prints each point judged and one line per row; writes bisect.json, bisect.md and RUN's report again.  Returns 0
    when every row bisected has one first bad commit, 1 when one ended as a range or its ends did not bracket it.
    Raises harness.common.errors.InputError subclasses (exit code 2 through harness.cli) for bad input: a range
    that is not GOOD..BAD, commits not found, a run without failing rows or a ``--check`` naming none of them.
    """
    from ..views.report import write_report
    from .points import command_line
    from .rows import failing_rows
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    good, bad = _parse_range(args.upstream)
    run_dir, summary, chosen = failing_rows(args.run, args.results_dir, args.check)
    # with --json, standard output holds the JSON alone: the stages' console lines go to standard error
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        rec = bisect_upstream(run_dir, summary, chosen, command_line(run_dir), good, bad, args.repo, say)
    write_report(run_dir)
    if args.json:
        print(json.dumps(rec.to_json(), indent=2))
    else:
        for row in rec.rows:
            print(row.line())
        skipped = (rec.upstream or {}).get("not_applied", {})
        if skipped:
            print("the patch series does not apply at " + ", ".join(f"{sha[:12]} ({p})" for sha, p in skipped.items())
                  + ": neither good nor bad, stepped around")
        print(f"bisect: {RunLayout(run_dir).bisect_md} ({len(rec.points)} point(s), {rec.builds_made} build(s) made, "
              f"{rec.builds_reused} reused, {rec.seconds:.1f} s)")
    return 0 if all(r.outcome == FOUND for r in rec.rows) else 1
