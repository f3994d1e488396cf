"""Bisect across upstream commits: the first upstream commit that makes a test fail with the series on top.

``python -m harness bisect --upstream GOOD..BAD --platform P --check test:NAME [--repo PATH]`` finds the first
commit on BAD's first-parent line that makes the ctest test NAME fail with the whole series applied
(:class:`UpstreamBisector`); the forecast's ``--bisect`` calls it between the pinned base and the new one.
Every commit is built with harness.stages.building.build and the test run by
harness.stages.native_tests.native_tests.run_ctest; :func:`bisect_first_bad` is its search.

Longer than 400 lines: the commits' repository (a local source or a fetched clone), the commits' builds and the
check share one record and one command line.
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
from ..common.statuses import STEP_ERROR, STEP_PASSED
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


def _parse_check(spec: str) -> str:
    """The test name of ``--check test:NAME`` (the upstream bisection's check); InputError for anything else."""
    kind, _, name = spec.partition(":")
    if kind != "test" or not name or ":" in name:
        raise InputError(f"--check {spec!r}: with --upstream, expected test:<ctest-name> (a run's failing rows of "
                         "every kind are bisected across the series: bisect [RUN] [--check ID])")
    return name


def _parse_range(spec: str) -> tuple[str, str]:
    good, sep, bad = spec.partition("..")
    if not sep or not good or not bad or bad.startswith(".") or ".." in bad or "-" in (good[0], bad[0]):
        raise InputError(f"--upstream {spec!r}: expected GOOD..BAD (two commits, e.g. b6000..b6100)")
    return good, bad


def check_targets(name: str, platform: Any = None, build_dir: Path | None = None) -> tuple[str, ...]:
    """The build targets that the check of test ``name`` needs at each commit: the executable ctest starts for
    ``name`` in ``build_dir`` (a finished build of ``platform``, read by
    harness.stages.native_tests.upstream_suite.ctest_commands: a test of upstream's suite is named after its input,
    ``test-tokenizer-0-falcon`` starts ``test-tokenizer-0``), else the test's own name, as the platform's
    ``test_targets`` are."""
    if platform is not None and build_dir is not None and name not in platform.test_targets \
            and (build_dir / "CTestTestfile.cmake").is_file():
        from ..stages.native_tests.upstream_suite import ctest_commands, suite_targets
        try:
            found = suite_targets([ctest_commands(build_dir).get(name, [])], build_dir)
        except OSError:
            found = []
        if found:
            return tuple(found)
    return (name,)


def _print_upstream(result: UpstreamBisectResult) -> None:
    print(f"first bad upstream commit: {result.first_bad} {result.subject}")
    if not result.series_applies:
        print(f"  the patch series did not apply at this commit ({result.not_applied[result.first_bad]} does not "
              "apply); it counts as failing, so the check itself was not run there")
    others = [f"{sha[:12]} ({patch})" for sha, patch in result.not_applied.items() if sha != result.first_bad]
    if others:
        print(f"  the patch series did not apply at {', '.join(others)} either (counted as failing)")


def run(args: argparse.Namespace) -> int:
    """``python -m harness bisect --upstream GOOD..BAD --platform P --check test:NAME [--repo PATH]``.

    Bisects the upstream commits of ``git rev-list --first-parent --reverse GOOD..BAD`` (GOOD must pass, BAD
    must fail), each built with the whole series applied on top, and prints ``first bad upstream commit: <sha>
    <subject>``; a commit where the series does not apply counts as failing and the output says so.  Builds are
    kept under ``<work-dir>/bisect-upstream/<platform>/<commit12>/`` and reused by later runs.  Prints each
    commit checked; returns 0 when a first bad commit is found.  Raises harness.common.errors.InputError
    subclasses (exit code 2 through harness.cli) for bad input or a range that cannot be bisected (BisectError:
    the check fails at GOOD or passes at BAD).
    """
    from ..matrix.config import load_matrix
    from ..stages.building.patches import read_series
    from ..stages.building.builds import cmake_options
    from ..stages.building.source import cache_dir
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    platforms = split_names(args.platform)
    if len(platforms) != 1:
        raise InputError(f"bisect --upstream builds one platform: pass exactly one --platform (got {len(platforms)})")
    if args.check is None:
        raise InputError("bisect --upstream needs --check test:<ctest-name>")
    name = _parse_check(args.check)
    revs = _parse_range(args.upstream)
    matrix = load_matrix(args.matrix)
    platform = matrix.platform(platforms[0])
    patches = read_series(args.patches_dir)
    options = cmake_options(platform, "base", cuda_arch=args.cuda_arch, defines=parse_defines(args.defines))
    labels = (*platform.test_labels, *((matrix.upstream_tests.label,) if platform.upstream_tests else ()))
    check = TestCheck(name, tuple(dict.fromkeys(labels)))
    targets = check_targets(name, platform, args.work_dir.resolve() / "fork" / f"build-{platform.name}")
    repo = upstream_repo(matrix, args.repo, revs, cache_dir(), say)
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
    if args.json:
        print(json.dumps(asdict(found), indent=2))
    else:
        _print_upstream(found)
    return 0
