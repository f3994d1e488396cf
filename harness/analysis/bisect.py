"""Bisect: which patch of the series, or which upstream commit, makes a check fail.

``python -m harness bisect -- --platform P --check test:NAME|group:G[:MODEL[:PROMPT]]``
finds the first patch of the series that makes the check fail (see
:func:`bisect_first_bad` and :class:`SeriesBisector`); with ``--upstream GOOD..BAD
[--repo PATH]`` it finds the first upstream commit on BAD's first-parent line that makes
the check fail with the whole series applied on top (:class:`UpstreamBisector`).

Every position is built with harness.stages.building.build and checked with harness.stages.native_tests.native_tests
(``test:``) or harness.stages.outputs.compare (``group:``); the base tree comes from harness.stages.building.source,
models from harness.matrix.models and the CMake options from harness.stages.building.builds.cmake_options.

Longer than 400 lines: the series bisector and the upstream bisector share one check (a position built, then
tested or compared), its record and its command line; split per bisector, both halves would import all
three.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..args import parse_defines, split_names
from ..common.errors import InputError
from ..record.layout import BUILD_FILES
from ..common.statuses import IDENTICAL, STEP_ERROR, STEP_PASSED
from ..record.native_tests import CASE_PASSED, CASE_SKIPPED


class BisectError(InputError):
    """The range cannot be bisected: the check fails at the good end or passes at the bad end."""


def bisect_first_bad(n: int, check: Callable[[int], bool], *, good: int = 0, bad: int | None = None,
                     cache: dict[int, bool] | None = None, name: Callable[[int], str] | None = None) -> int:
    """The first k in (good, bad] with check(k) False, by binary search; k counts applied patches.

    ``n`` is the number of patches; ``check(k)`` builds base + patches 1..k and returns
    True when the check passes.  ``good`` (default 0, the unpatched base) must pass and
    ``bad`` (default n, the whole series) must fail; otherwise BisectError, naming the
    end that is wrong.  Outcomes are memoised in ``cache`` (k -> passed), which callers
    may share between calls; each k is checked at most once.  Assumes one transition from
    pass to fail in the range (as git bisect does); with several, one of them is found.
    ``name(k)`` words position k in those errors when k is not a patch count (the upstream
    bisection passes commit positions).  Returns k: patch number k (1-based) is the first
    bad patch.  Raises ValueError for bounds outside 0 <= good < bad <= n.
    """
    bad = n if bad is None else bad
    if not 0 <= good < bad <= n:
        raise ValueError(f"need 0 <= good < bad <= n; got good={good}, bad={bad}, n={n}")
    memo = cache if cache is not None else {}

    def passes(k: int) -> bool:
        if k not in memo:
            memo[k] = bool(check(k))
        return memo[k]

    def where(k: int) -> str:
        if name is not None:
            return name(k)
        return "the unpatched base (k=0)" if k == 0 else f"k={k} (patches 1..{k})"

    if not passes(good):
        raise BisectError(f"the check fails at {where(good)}; it must pass at the good end"
                          + ("" if name else " (choose another --good)"))
    if passes(bad):
        raise BisectError(f"the check passes at {where(bad)}; it must fail at the bad end, "
                          "so there is nothing to bisect")
    lo, hi = good, bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return hi



def _tokenize_with(tokenize: Callable[..., Any], binary: Path, model: Path, work: Path, text: bytes) -> Any:
    """``tokenize(binary, model, text, work)``: the tokenizer of one bisection step, its arguments bound first
    (functools.partial) so that each comparison keeps its own build's binary and model."""
    return tokenize(binary, model, text, work)

@dataclass
class BisectResult:
    """The first bad patch (1-based ``first_bad`` with its file name and subject) and each k's outcome."""

    first_bad: int
    patch: str
    subject: str
    outcomes: dict[int, dict[str, Any]]


@dataclass
class Bisector:
    """What both bisectors are given and keep: ``patches`` (the series), the ``platform`` whose
    ``cmake_options`` and ``targets`` every build uses, the ``check`` run at each position k
    (``check(bisector, k)`` returns (passed, detail)), the ``work_dir`` all builds sit below
    (ccache's base_dir), build ``jobs``, ``say`` for progress lines, and ``outcomes``: k -> what the
    check found there.  Subclasses say what position k is and how its tree is made.
    """

    patches: Sequence[Any]  # harness.stages.building.patches.Patch
    platform: str
    cmake_options: Mapping[str, str]
    targets: tuple[str, ...]
    check: Callable[[Any, int], tuple[bool, str]]
    work_dir: Path
    jobs: int | None = None
    say: Callable[[str], None] = print
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _build(self, name: str, source: Path, here: Path, options: Mapping[str, str],
               key_parts: Mapping[str, str]) -> Any:
        """Build ``source`` into ``here/build`` (logs in ``here/logs``) with ccache based at ``work_dir``;
        returns harness.stages.building.build.BuildResult (its key: the options, targets and ``key_parts``)."""
        from ..stages.building.build import BuildRequest, build, ccache_env
        req = BuildRequest(self.platform, name, source, (here / "build").resolve(), dict(options),
                           tuple(self.targets), dict(key_parts), self.jobs, env=ccache_env(self.work_dir.resolve()))
        return build(req, here / "logs")

    def _first_bad(self, n: int, label: Callable[[int], str], **bounds: Any) -> int:
        """:func:`bisect_first_bad` over positions 0..n with :meth:`passes`; a BisectError gets each checked
        position's detail appended (``label(k)`` names it).  ``bounds``: bisect_first_bad's keywords."""
        try:
            return bisect_first_bad(n, self.passes, **bounds)
        except BisectError as exc:
            ends = [f"{label(k)}: {o['detail']}" for k, o in sorted(self.outcomes.items())]
            raise BisectError(f"{exc}\n  " + "\n  ".join(ends)) from None

    def passes(self, k: int) -> bool:
        """Run the check at k, record it in ``outcomes`` and say it; True when it passed."""
        raise NotImplementedError


@dataclass
class SeriesBisector(Bisector):
    """Applies patches 1..k of ``patches`` onto ``base``, builds, and runs ``check`` for each k asked.

    Every k has its own directory ``work_dir/k<k>/``: ``llama.cpp/`` the source tree
    (harness.stages.building.source.prepare_tree; re-made only when the prefix changes), ``build/`` the
    build directory (harness.stages.building.build.build, whose key makes a rebuild of an unchanged prefix
    a no-op), ``logs/`` configure/build/patch logs, and whatever the check writes.  All
    k directories sit at the same depth and ccache's base_dir is ``work_dir``, so objects
    a patch does not touch come from the cache when another k is built.
    For k > 0 LLAMA_FORK_SERIES names the prefix.  The other fields: :class:`Bisector`.
    """

    base: Any = field(kw_only=True)  # harness.stages.building.source.BaseTree
    _builds: dict[int, Any] = field(default_factory=dict, repr=False)

    def k_dir(self, k: int) -> Path:
        """``work_dir/k<k>``: everything of the build with patches 1..k."""
        return self.work_dir / f"k{k}"

    def dir_at(self, k: int, variant: str = "fork") -> Path:
        """The directory of the ``base`` (k=0) or ``fork`` (patches 1..k) build a check at k uses."""
        return self.k_dir(0 if variant == "base" else k)

    def build_at(self, k: int, variant: str = "fork") -> Any:
        """The ``base`` (k=0) or ``fork`` (patches 1..k) build for a check at k; see :meth:`build`."""
        return self.build(0 if variant == "base" else k)

    def point(self, k: int) -> str:
        """Position k in words for check details: ``k=<k>``."""
        return f"k={k}"

    def tree(self, k: int) -> Path:
        """The source tree holding base + patches 1..k (created or reused); raises PatchApplyError."""
        from ..stages.building.patches import apply_series, series_digest
        from ..stages.building.source import prepare_tree
        logs = self.k_dir(k) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if k == 0:
            return prepare_tree(self.base, self.work_dir, "k0")
        return prepare_tree(self.base, self.work_dir, f"k{k}", series_digest(list(self.patches[:k])),
                            lambda repo, rev: apply_series(repo, rev, self.patches, upto=k,
                                                           log=logs / BUILD_FILES["patches"]))

    def build(self, k: int) -> Any:
        """Build base + patches 1..k once per process; returns harness.stages.building.build.BuildResult."""
        if k in self._builds:
            return self._builds[k]
        from ..stages.building.patches import series_digest, series_label
        prefix = list(self.patches[:k])
        options = dict(self.cmake_options)
        if k:
            options["LLAMA_FORK_SERIES"] = series_label(prefix, total=len(self.patches))
        source = self.tree(k)
        result = self._build(f"bisect-k{k}", source, self.k_dir(k), options,
                             {"base": self.base.commit, "series": series_digest(prefix)})
        self._builds[k] = result
        return result

    def passes(self, k: int) -> bool:
        """Run the check at k, record (passed, detail) in ``outcomes`` and say it; True when it passed."""
        passed, detail = self.check(self, k)
        self.outcomes[k] = {"passed": passed, "detail": detail}
        label = "the unpatched base" if k == 0 else f"patches 1..{k} (last: {self.patches[k - 1].name})"
        self.say(f"k={k} {label}: {'pass' if passed else 'FAIL'} — {detail}")
        return passed

    def run(self, good: int = 0, bad: int | None = None) -> BisectResult:
        """Bisect over k in [good, bad] (default [0, n]) and return the first bad patch.

        Raises BisectError (with the failing end's detail) when the range cannot be bisected,
        and harness.stages.building.patches.PatchApplyError when a patch does not apply.
        """
        k = self._first_bad(len(self.patches), self.point, good=good, bad=bad, cache={})
        patch = self.patches[k - 1]
        return BisectResult(k, patch.name, patch.subject, dict(sorted(self.outcomes.items())))


# --------------------------------------------------------------------------- upstream bisect


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


def upstream_repo(matrix: Any, repo: Path | None, revs: Sequence[str], cache: Path,
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
    either rev names no commit of ``repo``, when GOOD is not an ancestor of BAD, or when
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
        raise InputError(f"--upstream {good}..{bad}: GOOD and BAD are the same commit {ids['GOOD'][:12]}")
    if git(["merge-base", "--is-ancestor", ids["GOOD"], ids["BAD"]], repo, check=False).returncode != 0:
        raise InputError(f"--upstream {good}..{bad}: GOOD {ids['GOOD'][:12]} is not an ancestor of "
                               f"BAD {ids['BAD'][:12]} in {repo}")
    listed = git(["rev-list", "--first-parent", "--reverse", "--format=%H%x00%s", f"{ids['GOOD']}..{ids['BAD']}"],
                 repo).stdout
    commits = [UpstreamCommit(*line.split("\0", 1)) for line in listed.splitlines() if "\0" in line]
    if not commits:
        raise InputError(f"--upstream {good}..{bad}: no commit between GOOD and BAD on BAD's first-parent line")
    subject = git(["log", "-1", "--format=%s", ids["GOOD"]], repo).stdout.strip()
    return [UpstreamCommit(ids["GOOD"], subject), *commits]


def first_parent(repo: Path, sha: str) -> str | None:
    """The first parent of commit ``sha`` in ``repo`` (full id), or None for a root commit."""
    return _resolve_commit(repo, f"{sha}^1")


@dataclass
class UpstreamBisectResult:
    """The first bad upstream commit and every commit checked.

    ``first_bad``/``subject``: the commit; ``index``: its position on the first-parent line
    (0 is GOOD, ``candidates`` is BAD); ``series_applies``: False when the patch series did
    not apply there (the commit then counts as failing); ``not_applied``: commit id -> the
    patch file that did not apply, for every commit checked; ``outcomes``: commit id ->
    {index, subject, passed, detail, builds}.
    """

    first_bad: str
    subject: str
    index: int
    candidates: int
    series_applies: bool
    not_applied: dict[str, str]
    outcomes: dict[str, dict[str, Any]]


@dataclass
class UpstreamBisector(Bisector):
    """Builds upstream ``commits[k]`` with the whole patch series applied and runs ``check`` at k.

    ``commits`` comes from :func:`upstream_commits` (0 = GOOD, last = BAD) in ``repo``.
    Every commit has ``work_dir/<commit12>/fork/`` (the tree with the series applied by
    harness.stages.building.patches.apply_series with the commit as base, ``build/``, ``logs/``) and, when
    a check compares against upstream itself, ``work_dir/<commit12>/base/`` (the commit
    unpatched).  All sit at the same depth and ccache's base_dir is ``work_dir``; the
    build key holds the commit and series digest, so a commit built before is not built
    again.  When the series does not apply at a commit, its fork build is an ``error``
    whose detail says so, the check fails there, and ``not_applied`` names the patch.
    The other fields: :class:`Bisector`.
    """

    repo: Path = field(kw_only=True)
    commits: Sequence[UpstreamCommit] = field(kw_only=True)
    not_applied: dict[int, str] = field(default_factory=dict)
    _builds: dict[tuple[int, str], Any] = field(default_factory=dict, repr=False)

    def dir_at(self, k: int, variant: str = "fork") -> Path:
        """``work_dir/<commit12>/<variant>``: tree, build and logs of commit k, patched (fork) or not (base)."""
        return self.work_dir / self.commits[k].short / variant

    def k_dir(self, k: int) -> Path:
        """The patched build's directory of commit k (``dir_at(k, "fork")``)."""
        return self.dir_at(k, "fork")

    def point(self, k: int) -> str:
        """Position k in words for check details: the commit's short id."""
        return f"upstream {self.commits[k].short}"

    def tree(self, k: int, variant: str = "fork") -> Path:
        """The source tree of commit k, with the series applied for ``fork``; raises PatchApplyError."""
        from ..stages.building.patches import prepare_series_tree
        from ..stages.building.source import BaseTree, prepare_tree
        commit = self.commits[k]
        logs = self.dir_at(k, variant) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        base = BaseTree(self.repo, commit.sha, commit.sha, f"upstream {self.repo}")
        if variant == "base":
            return prepare_tree(base, self.work_dir, f"{commit.short}/base")
        return prepare_series_tree(base, self.work_dir, f"{commit.short}/fork", list(self.patches),
                                   log=logs / BUILD_FILES["patches"])

    def build_at(self, k: int, variant: str = "fork") -> Any:
        """Build commit k (``fork``: with the series; ``base``: without) once per process.

        Returns harness.stages.building.build.BuildResult; status ``error`` with a detail naming the patch
        when the series does not apply at the commit.
        """
        if (k, variant) in self._builds:
            return self._builds[(k, variant)]
        from ..stages.building.build import BuildResult
        from ..stages.building.patches import PatchApplyError, series_digest, series_label
        commit, here = self.commits[k], self.dir_at(k, variant)
        try:
            source = self.tree(k, variant)
        except PatchApplyError as exc:
            position = [p.name for p in self.patches].index(exc.patch) + 1
            self.not_applied[k] = exc.patch
            result = BuildResult(self.platform, f"bisect-upstream-{variant}", STEP_ERROR, "", (here / "build").resolve(),
                                 0.0, False, detail=(f"the patch series does not apply at {commit.short}: patch "
                                                     f"{position} of {len(self.patches)}, {exc.patch}, does not "
                                                     f"apply (log {here / 'logs' / BUILD_FILES['patches']})"))
            self._builds[(k, variant)] = result
            return result
        options = dict(self.cmake_options)
        key_parts = {"base": commit.sha}
        if variant == "fork":
            options["LLAMA_FORK_SERIES"] = series_label(list(self.patches))
            key_parts["series"] = series_digest(list(self.patches))
        result = self._build(f"bisect-upstream-{variant}", source, here, options, key_parts)
        self._builds[(k, variant)] = result
        return result

    def build(self, k: int) -> Any:
        """The patched build of commit k (``build_at(k, "fork")``)."""
        return self.build_at(k, "fork")

    def _builds_at(self, k: int) -> dict[str, str]:
        """Per variant built for commit k: ``reused`` (up to date), ``built``, ``series did not apply``
        or the failed build's status."""
        out = {}
        for (at, variant), b in sorted(self._builds.items()):
            if at != k:
                continue
            if variant == "fork" and k in self.not_applied:
                out[variant] = "series did not apply"
            else:
                out[variant] = "reused" if b.up_to_date else ("built" if b.status == STEP_PASSED else b.status)
        return out

    def passes(self, k: int) -> bool:
        """Run the check at commit k, record it in ``outcomes`` and say it; True when it passed."""
        passed, detail = self.check(self, k)
        commit = self.commits[k]
        builds = self._builds_at(k)
        self.outcomes[k] = {"index": k, "subject": commit.subject, "passed": passed, "detail": detail,
                            "builds": builds}
        end = " (GOOD)" if k == 0 else " (BAD)" if k == len(self.commits) - 1 else ""
        shown = ", ".join(f"{v} {s}" for v, s in builds.items())
        self.say(f"[{k}/{len(self.commits) - 1}] {commit.short} {commit.subject}{end}: "
                 f"{'pass' if passed else 'FAIL'} — {detail}" + (f" [build: {shown}]" if shown else ""))
        return passed

    def _name(self, k: int) -> str:
        commit = self.commits[k]
        end = "GOOD" if k == 0 else "BAD" if k == len(self.commits) - 1 else "commit"
        extra = f"; the patch series does not apply there ({self.not_applied[k]})" if k in self.not_applied else ""
        return f"{end} {commit.short} ({commit.subject}{extra})"

    def run(self) -> UpstreamBisectResult:
        """Bisect over the commits and return the first bad one.

        Raises BisectError (with each checked end's detail) when GOOD fails or BAD passes.
        """
        k = self._first_bad(len(self.commits) - 1, lambda i: self.commits[i].short, name=self._name)
        commit = self.commits[k]
        return UpstreamBisectResult(commit.sha, commit.subject, k, len(self.commits) - 1, k not in self.not_applied,
                                    {self.commits[i].sha: p for i, p in sorted(self.not_applied.items())},
                                    {self.commits[i].sha: o for i, o in sorted(self.outcomes.items())})


# --------------------------------------------------------------------------- checks


@dataclass
class TestCheck:
    """Check ``test:<name>``: the ctest test ``name`` (with any of ``labels``) passes at k."""

    name: str
    labels: Sequence[str]
    timeout_s: float = 900

    __test__ = False  # not a pytest class

    def __call__(self, bisector: Any, k: int) -> tuple[bool, str]:
        """Build k's fork and run the test; (passed, detail).  A build failure or a missing test is a failure.

        ``bisector`` is a SeriesBisector or UpstreamBisector.
        """
        from ..stages.native_tests.native_tests import run_ctest
        built = bisector.build_at(k, "fork")
        if built.status != STEP_PASSED:
            return False, f"build {built.status}: {built.detail}"
        missing = self.build_test_target(built.build_dir, bisector.dir_at(k, "fork") / "logs")
        if missing:
            return False, missing
        run = run_ctest(built.build_dir, self.labels, [self.name], bisector.dir_at(k, "fork") / f"tests-{self.name}",
                        timeout_s=self.timeout_s)
        case = next((c for c in run.cases if c.name == self.name), None)
        if case is None or case.status == CASE_SKIPPED:
            return False, (f"test {self.name} is not registered with ctest at {bisector.point(k)} "
                           f"(labels {', '.join(self.labels)})")
        if case.status != CASE_PASSED:
            return False, f"{self.name} failed{': ' + case.message if case.message else ''} (log {run.log})"
        return True, f"{self.name} passed"

    def build_test_target(self, build_dir: Path, logs: Path) -> str:
        """Build the executable the test starts, which the bisector's targets may not hold (a test of upstream's suite is named
        after its vocabulary, ``test-tokenizer-0-falcon``, and starts ``test-tokenizer-0``), as ctest describes it
        (harness.stages.native_tests.upstream_suite.suite_targets); "" when built, else why not."""
        from ..stages.building.build import find_tool
        from ..stages.native_tests.upstream_suite import ctest_commands, suite_targets
        try:
            command = ctest_commands(build_dir).get(self.name, [])
        except OSError as exc:
            return f"the tests of {build_dir} cannot be read: {exc}"
        targets = suite_targets([command], build_dir)  # ninja decides whether it is out of date
        if not targets:
            return ""
        from ..common import proc
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"build-{self.name}.log", "wb") as fh:
            done = proc.run([find_tool("cmake") or "cmake", "--build", str(build_dir), "--target", *targets],
                            stdout=fh, stderr=subprocess.STDOUT)
        return "" if done.returncode == 0 else (f"building {', '.join(targets)} for {self.name} failed "
                                                f"(log {logs / f'build-{self.name}.log'})")


@dataclass
class GroupCheck:
    """Check ``group:<group>[:model[:prompt]]``: every candidate's greedy output equals the reference's.

    Configurations built from ``base`` use the bisector's base build at k (the unpatched
    base for a patch bisection, the unpatched commit for an upstream one), those built from
    ``fork`` its fork build at k.  ``configs``: name -> harness.matrix.config.RunConfig;
    ``model_paths``: model name -> GGUF path; ``prompts``: prompt id -> text;
    ``generation``: harness.matrix.config.Generation.  Generations are cached per (build
    directory, config, model, prompt), so a reference shared by every k is run once.
    """

    group: Any  # harness.matrix.config.Group
    configs: Mapping[str, Any]
    model_paths: Mapping[str, Path]
    prompts: Mapping[str, str]
    generation: Any
    _cache: dict[tuple, list] = field(default_factory=dict, repr=False)

    def _runs(self, bisector: Any, k: int, config: str, model: str, prompt: str) -> list:
        from ..stages.outputs.compare import GenerationSpec, run_generation
        cfg = self.configs[config]
        where = bisector.dir_at(k, cfg.build)
        key = (where, config, model, prompt)
        if key not in self._cache:
            built = bisector.build_at(k, cfg.build)
            if built.status != STEP_PASSED:
                raise RuntimeError(f"{cfg.build} build for {bisector.point(k)} {built.status}: {built.detail}")
            runs = []
            for r in range(1, self.generation.repeats + 1):
                spec = GenerationSpec(binary=built.bin_dir / "llama-completion", model=self.model_paths[model],
                                      prompt=self.prompts[prompt], n_predict=self.generation.n_predict,
                                      seed=self.generation.seed, ctx_size=self.generation.ctx_size,
                                      args=tuple(cfg.args), env=dict(cfg.env), timeout_s=self.generation.timeout_s)
                runs.append(run_generation(spec, where / "gen" / config / model / f"{prompt}.r{r}"))
            self._cache[key] = runs
        return self._cache[key]

    def __call__(self, bisector: Any, k: int) -> tuple[bool, str]:
        """Run the group's comparisons at k; (passed, detail naming the first non-identical prompt)."""
        from functools import partial

        from ..stages.outputs.compare import compare_runs, tokenize
        g = self.group
        for model in self.model_paths:
            for prompt in self.prompts:
                try:
                    ref_runs = self._runs(bisector, k, g.reference, model, prompt)
                    tok_bin = bisector.build_at(k, self.configs[g.reference].build).bin_dir / "llama-tokenize"
                    for cand in g.candidates:
                        cand_runs = self._runs(bisector, k, cand, model, prompt)
                        pc = compare_runs(prompt, g.reference, ref_runs, cand, cand_runs,
                                          partial(_tokenize_with, tokenize, tok_bin, self.model_paths[model],
                                                  bisector.dir_at(k, "fork") / "tokenize"))
                        if pc.status != IDENTICAL:
                            return False, f"{model}/{prompt}: {cand} vs {g.reference}: {pc.detail}"
                except RuntimeError as exc:
                    return False, str(exc)
        return True, f"{g.name}: every prompt identical"


def _parse_check(spec: str) -> tuple[str, list[str]]:
    kind, _, rest = spec.partition(":")
    parts = [p for p in rest.split(":")] if rest else []
    if kind not in ("test", "group") or not parts or not parts[0] or (kind == "test" and len(parts) != 1) \
            or len(parts) > 3:
        raise InputError(f"--check {spec!r}: expected test:<ctest-name> or group:<group>[:model[:prompt]]")
    return kind, parts


def _parse_range(spec: str) -> tuple[str, str]:
    good, sep, bad = spec.partition("..")
    if not sep or not good or not bad or bad.startswith(".") or ".." in bad or "-" in (good[0], bad[0]):
        raise InputError(f"--upstream {spec!r}: expected GOOD..BAD (two commits, e.g. b6000..b6100)")
    return good, bad


def check_targets(spec: str, platform: Any = None, build_dir: Path | None = None) -> tuple[str, ...]:
    """The build targets that bisect check ``spec`` needs at each step: for ``test:NAME``, the executable ctest
    starts for NAME in ``build_dir`` (a finished build of ``platform``, read by
    harness.stages.native_tests.upstream_suite.ctest_commands: a test of upstream's suite is named after its input,
    ``test-tokenizer-0-falcon`` starts ``test-tokenizer-0``), else the test's own name, as the platform's
    ``test_targets`` are; llama-completion and llama-tokenize (generation and tokenization) for ``group:...``.
    Raises InputError for a malformed spec."""
    kind, parts = _parse_check(spec)
    if kind != "test":
        return ("llama-completion", "llama-tokenize")
    if platform is not None and build_dir is not None and parts[0] not in platform.test_targets \
            and (build_dir / "CTestTestfile.cmake").is_file():
        from ..stages.native_tests.upstream_suite import ctest_commands, suite_targets
        try:
            found = suite_targets([ctest_commands(build_dir).get(parts[0], [])], build_dir)
        except OSError:
            found = []
        if found:
            return tuple(found)
    return (parts[0],)


def _make_check(spec: str, matrix: Any, platform: Any, models: Any, build_dir: Path | None = None) \
        -> tuple[Callable[[Any, int], tuple[bool, str]], tuple[str, ...]]:
    """The check ``spec`` names and the build targets it needs (``build_dir``: the platform's fork build of the
    work directory, where it exists: :func:`check_targets`); InputError for an unknown group/model/prompt.

    ``models`` is a harness.matrix.model_sources.registry.ModelStore; a model that cannot be made is bad input here.
    """
    kind, parts = _parse_check(spec)
    if kind == "test":
        labels = (*platform.test_labels, *((matrix.upstream_tests.label,) if platform.upstream_tests else ()))
        return TestCheck(parts[0], tuple(dict.fromkeys(labels))), check_targets(spec, platform, build_dir)
    if parts[0] not in matrix.groups:
        raise InputError(f"--check {spec}: unknown group {parts[0]!r} "
                         f"(known: {', '.join(sorted(matrix.groups))})")
    group = matrix.groups[parts[0]]
    chosen_models = [parts[1]] if len(parts) > 1 else list(group.models)
    prompts = [parts[2]] if len(parts) > 2 else list(group.prompts)
    for m in chosen_models:
        if m not in group.models:
            raise InputError(f"--check {spec}: group {group.name} has no model {m!r} "
                             f"(it has: {', '.join(group.models)})")
    for p in prompts:
        if p not in group.prompts:
            raise InputError(f"--check {spec}: group {group.name} has no prompt {p!r} "
                             f"(it has: {', '.join(group.prompts)})")
    model_paths = {}
    for m in chosen_models:
        try:
            model_paths[m] = models.path(m)
        except Exception as exc:  # a model that cannot be assembled is bad input here
            raise InputError(f"model {m}: {type(exc).__name__}: {exc}") from exc
    check = GroupCheck(group, matrix.configs, model_paths, {p: matrix.prompts[p].text for p in prompts},
                       group.generation)
    return check, check_targets(spec)


def _print_upstream(result: UpstreamBisectResult) -> None:
    print(f"first bad upstream commit: {result.first_bad} {result.subject}")
    if not result.series_applies:
        print(f"  the patch series did not apply at this commit ({result.not_applied[result.first_bad]} does not "
              "apply); it counts as failing, so the check itself was not run there")
    others = [f"{sha[:12]} ({patch})" for sha, patch in result.not_applied.items() if sha != result.first_bad]
    if others:
        print(f"  the patch series did not apply at {', '.join(others)} either (counted as failing)")


def main(argv: Sequence[str]) -> int:
    """``bisect`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bisect", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness bisect -- --platform P --check test:NAME|group:G[:M[:P]] [--good K] [--bad K]``
    or ``... --upstream GOOD..BAD [--repo PATH]``.

    Without --upstream: bisects the patch series (apply 1..k, build, check) and prints the
    first bad patch.  With it: bisects the upstream commits of ``git rev-list
    --first-parent --reverse GOOD..BAD`` (GOOD must pass, BAD must fail), each built with
    the whole series applied on top, and prints ``first bad upstream commit: <sha>
    <subject>``; a commit where the series does not apply counts as failing and the output
    says so.  Builds are kept under ``<work-dir>/bisect/<platform>/k<k>`` and
    ``<work-dir>/bisect-upstream/<platform>/<commit12>/`` and reused by later runs.
    Prints each position checked; returns 0 when a first bad patch or commit is found.
    Raises harness.common.errors.InputError subclasses (exit code 2 through harness.cli) for bad
    input or a range that cannot be bisected (BisectError: the check fails at the good end
    or passes at the bad end).
    """
    from ..matrix.config import load_matrix
    from ..matrix.model_sources.registry import ModelStore
    from ..stages.building.quantize_tool import built_tool
    from ..stages.building.patches import read_series
    from ..stages.building.builds import cmake_options
    from ..stages.building.source import cache_dir, obtain_base
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    platforms = split_names(args.platform)
    if len(platforms) != 1:
        raise InputError(f"bisect builds one platform: pass exactly one --platform (got {len(platforms)})")
    _parse_check(args.check)
    if args.upstream is None and args.repo is not None:
        raise InputError("--repo needs --upstream GOOD..BAD")
    if args.upstream is not None and (args.good is not None or args.bad is not None):
        raise InputError("--good/--bad pick positions in the patch series; with --upstream the range "
                         "is GOOD..BAD")
    revs = _parse_range(args.upstream) if args.upstream is not None else None
    matrix = load_matrix(args.matrix)
    platform = matrix.platform(platforms[0])
    patches = read_series(args.patches_dir)
    options = cmake_options(platform, "base", cuda_arch=args.cuda_arch, defines=parse_defines(args.defines))
    cache = cache_dir()
    base_tree: list[Any] = []

    def base() -> Any:
        if not base_tree:
            log: list[str] = []
            base_tree.append(obtain_base(matrix, cache, log))
            for line in log:
                say(line)
        return base_tree[0]

    # a derived model takes llama-quantize from the finished base build of the work dir (it builds nothing here)
    models = ModelStore(matrix.models, cache, lambda: base().path, matrix.path,
                        lambda: built_tool(matrix, args.work_dir))
    check, targets = _make_check(args.check, matrix, platform, models,
                                 args.work_dir.resolve() / "fork" / f"build-{platform.name}")
    if revs is not None:
        repo = upstream_repo(matrix, args.repo, revs, cache, say)
        commits = upstream_commits(repo, *revs)
        if first_parent(repo, commits[1].sha) != commits[0].sha:
            say(f"note: GOOD {commits[0].short} is not on BAD's first-parent line; the candidates are the "
                f"commits of that line GOOD does not reach, from {commits[1].short} on")
        say(f"bisecting {len(commits) - 1} upstream commit(s) after {commits[0].short} on the first-parent line "
            f"of {commits[-1].short} in {repo}, each with the {len(patches)} patch(es) of {args.patches_dir}")
        upstream = UpstreamBisector(patches, platform.name, options, targets, check,
                                    args.work_dir.resolve() / "bisect-upstream" / platform.name, args.jobs, say,
                                    repo=repo, commits=commits)
        found = upstream.run()
    else:
        bisector = SeriesBisector(patches, platform.name, options, targets, check,
                                  args.work_dir.resolve() / "bisect" / platform.name, args.jobs, say, base=base())
        try:
            result = bisector.run(args.good or 0, args.bad)
        except ValueError as exc:  # --good/--bad outside the series
            raise InputError(str(exc)) from None
    if revs is not None:
        if args.json:
            print(json.dumps(asdict(found), indent=2))
        else:
            _print_upstream(found)
        return 0
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(f"first bad patch: {result.first_bad} of {len(patches)}: {result.patch} ({result.subject})")
    return 0
