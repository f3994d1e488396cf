"""Upstream forecast: what the patch series would hit on another upstream commit, before anyone rebases.

``python -m harness forecast --onto SOURCE [--platform P ...] [--bisect [ID]]`` (``nox -s forecast --``):

1. obtains the other upstream from SOURCE (:func:`parse_onto`) through harness.stages.building.source, by
   content: the commit is recorded and a tree that is not that commit is refused;
2. tries every patch on it (harness.upstream.forecast_patches): clean, 3-way, already upstream
   or conflict, never stopping at the first failure;
3. builds, tests and compares what applied through harness.pipeline, the stages and records of a
   normal run (the CUDA compile step where there is no GPU), with two kinds of greedy comparison:
   the new base against the new fork (the matrix's own groups), and the old (pinned) base against
   the new base (one ``old-base-vs-new-base`` group per group of upstream's build against the
   fork's, ``expect: informational``), which shows what upstream itself changed in the outputs;
4. writes ``forecast.json`` and ``forecast.md`` into the run directory, and the run's report.html
   gets a forecast section (harness.views.report), with a one-line verdict:
   ``the series moves cleanly``, ``n patches need work: ...`` or ``builds but outputs change: ...``;
5. with ``--bisect [ID]`` and a source with git history holding both commits, bisects the forecast run's
   failing rows (the one ID names, else every one) across the upstream commits between the pinned base and the
   new one, each with the whole series on top, through the same stages and verdict (harness.bisect.upstream).

Exit codes (harness.common.errors): 0 the series moves cleanly; 1 patches need work or outputs
change; 2 bad input or environment; 3 nothing failed but something asked for did not run.

Longer than 400 lines: the five steps above share one forecast directory, one run and one record
(forecast.json, forecast.md), and the command line that drives them; the patch trials are
forecast_patches.py and the bisection bisect.py already.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..args import split_names
from ..common.errors import EXIT_FAILED, EXIT_PASSED, InputError
from ..matrix.config import Matrix, RunConfig, Source, load_matrix, onto_matrix
from ..record.forecast import ForecastRecord, ForecastStage, UpstreamComparison
from ..record.json_files import write_json
from ..record.layout import BUILD_FILES, RunLayout
from ..record.records import ComparisonRecord, StepRecord
from ..common.statuses import IDENTICAL, PATCH, PATCH_CONFLICT, RUN_FORECAST, STEP, VERDICT_EXIT_CODES
from ..stages.command_names import STAGE_COMMANDS
from ..stages.building.patches import SERIES_FILE, Patch, apply_series, read_series, series_digest
from ..common.locks import Rank, exclusive
from ..stages.building.source import BaseTree, SourceError, archive_commit, cache_dir, git, obtain_base, unpacked_sdist
from ..record.summary import read_run
from ..stages.building.patch_diff import added_files, defined_targets
from .forecast_patches import PatchOutcome, try_series

#: The upstream that llama-cpp-python's sdists vendor, and where.
SDIST_SUBDIR = "vendor/llama.cpp"
#: The build variant and configuration prefix of the old (pinned) base in a forecast's matrix.
OLD_VARIANT = "old-base"
#: Name of the comparison group of the old base against the new one made from group ``base-vs-fork``.
OLD_VS_NEW = "old-base-vs-new-base"
_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ForecastError(InputError):
    """A forecast that cannot start: an unreadable SOURCE, a commit that is not there (exit code 2)."""


# --------------------------------------------------------------------------- SOURCE


@dataclass(frozen=True)
class Onto:
    """The other upstream, as ``--onto`` named it: a matrix ``source`` and, where the spec says it, the commit."""

    spec: str
    source: Source
    commit: str | None


def parse_onto(spec: str) -> Onto:
    """Read ``--onto SOURCE``; every way matrix.yaml can name a base:

    * ``pypi-sdist:PACKAGE==VERSION[#sha256=HEX]``: the sdist's ``vendor/llama.cpp`` checkout;
    * ``URL@COMMIT`` where URL is ``https://``, ``ssh://``, ``git://``, ``file://`` or ``git@host:path``
      (a git remote; COMMIT: 40 hex digits);
    * ``PATH.tar.gz#sha256=HEX`` (or with ``PATH.tar.gz.sha256`` beside it): a mirror archive written by
      ``source export-mirror``;
    * ``PATH[@REV]``: a local git checkout (default REV: its HEAD).

    Raises ForecastError naming what is wrong.
    """
    text = spec.strip()
    if text.startswith("pypi-sdist:"):
        rest, _, digest = text[len("pypi-sdist:"):].partition("#sha256=")
        package, sep, version = rest.partition("==")
        if not sep or not package or not version or (digest and not _SHA256.match(digest)):
            raise ForecastError(f"--onto {spec!r}: expected pypi-sdist:PACKAGE==VERSION[#sha256=HEX]")
        return Onto(spec, Source("pypi-sdist", package=package, version=version, sha256=digest or None,
                                 subdir=SDIST_SUBDIR), None)
    if re.match(r"^(?:https?|ssh|git|file)://", text) or re.match(r"^[\w.-]+@[\w.-]+:", text):
        url, sep, commit = text.rpartition("@")
        if not sep or not _SHA.match(commit) or not url or url.endswith(":"):
            raise ForecastError(f"--onto {spec!r}: a git remote needs its commit: URL@<40 hex digits>")
        return Onto(spec, Source("git", url=url), commit)
    path_text, _, digest = text.partition("#sha256=")
    if path_text.endswith((".tar.gz", ".tgz", ".tar")):
        path = Path(path_text)
        sidecar = Path(path_text + ".sha256")
        if digest and not _SHA256.match(digest):
            raise ForecastError(f"--onto {spec!r}: #sha256= needs 64 hex digits")
        if not digest and not sidecar.is_file():
            raise ForecastError(f"--onto {spec!r}: an archive needs its sha256 (#sha256=HEX or {sidecar})")
        if not path.is_file():
            raise ForecastError(f"--onto {spec!r}: {path} does not exist")
        return Onto(spec, Source("archive", path=path.resolve(), sha256=digest or None,
                                 sha256_file=None if digest else sidecar.resolve()), archive_commit(path))
    path_part, sep, rev = text.rpartition("@") if "@" in text else (text, "", "")
    path = Path(path_part)
    if not path.is_dir():
        raise ForecastError(f"--onto {spec!r}: not a pypi-sdist:, a git URL@COMMIT, an archive or an existing "
                            f"directory")
    found = git(["rev-parse", "--verify", "--quiet", f"{rev or 'HEAD'}^{{commit}}"], path, check=False)
    if found.returncode != 0:
        raise ForecastError(f"--onto {spec!r}: {rev or 'HEAD'} is not a commit of {path}")
    return Onto(spec, Source("local", path=path.resolve()), found.stdout.strip())


def obtain_pinned_and_onto(matrix: Matrix, onto: Onto, say: Callable[[str], None]) -> tuple[BaseTree, BaseTree]:
    """The pinned base tree and the other upstream's (:func:`obtain_onto`), both from the harness's download cache;
    what obtaining the pinned one logged is said through ``say``.  Raises SourceError."""
    cache = cache_dir()
    log: list[str] = []
    old = obtain_base(matrix, cache, log)
    for line in log:
        say(line)
    return old, obtain_onto(matrix, onto, cache, say)


def obtain_onto(matrix: Matrix, onto: Onto, cache: Path, say: Callable[[str], None]) -> BaseTree:
    """The verified base repository of the other upstream (harness.stages.building.source.obtain_base, cached like
    the pinned base).  An sdist's commit is the HEAD of its vendored checkout.  Raises SourceError."""
    commit = onto.commit
    if commit is None:
        _, vendored = unpacked_sdist(onto.source, cache)
        head = git(["rev-parse", "HEAD"], vendored, check=False)
        if head.returncode != 0:
            raise SourceError(f"{onto.spec}: {vendored} is not a git checkout ({head.stderr.strip()})")
        commit = head.stdout.strip()
    log: list[str] = []
    try:
        return obtain_base(onto_matrix(matrix, commit, onto.source), cache, log)
    finally:
        for line in log:
            say(line)


def forecast_base(new: BaseTree, old: BaseTree, patches: Sequence[Patch], where: Path) -> BaseTree:
    """A repository at ``where`` checked out at ``new``'s commit that also holds ``old``'s commit with the
    whole series applied on it (branch ``forecast-old-fork``): every blob a patch's index lines name, the
    states between patches included, is there for a 3-way merge.  Returned as the BaseTree the forecast's
    trees are made from; made again when its stamp (the two commits and the series digest) differs."""
    stamp = where.with_name(where.name + ".stamp")
    wanted = f"{new.git_rev} {old.git_rev} {series_digest(patches)}"
    if where.exists() and not (stamp.is_file() and stamp.read_text().strip() == wanted):
        shutil.rmtree(where)
    if not where.exists():
        stamp.unlink(missing_ok=True)
        tmp = where.with_name(where.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        git(["init", "--quiet", str(tmp)])
        for repo, rev, ref in ((new.path, new.git_rev, "forecast-new-base"), (old.path, old.git_rev, "forecast-old-base")):
            git(["fetch", "--quiet", "--no-tags", str(repo), f"+{rev}:refs/heads/{ref}"], tmp)
        apply_series(tmp, old.git_rev, patches)
        git(["branch", "--quiet", "--force", "forecast-old-fork", "HEAD"], tmp)
        git(["checkout", "--quiet", "--detach", new.git_rev], tmp)
        tmp.rename(where)
        stamp.write_text(wanted + "\n")
    return BaseTree(where, new.commit, new.git_rev, new.source)


# --------------------------------------------------------------------------- the forecast's matrix


def write_applied_series(outcomes: Sequence[PatchOutcome], patches: Sequence[Patch], out: Path) -> list[Patch]:
    """Write the patches that applied (clean or 3-way), in series order, as a series in ``out``; returns it
    as harness.stages.building.patches.read_series reads it back."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    chosen = [p for p, o in zip(patches, outcomes) if o.applied]
    for p in chosen:
        shutil.copyfile(p.path, out / p.name)
    (out / SERIES_FILE).write_text("# the patches of the series that applied on the forecast's upstream\n"
                                   + "".join(f"{p.name}\n" for p in chosen))
    return read_series(out)


def without_left_out_tests(matrix: Matrix, platforms: Sequence[str], outcomes: Sequence[PatchOutcome],
                           patches: Sequence[Patch]) -> tuple[Matrix, list[str]]:
    """``matrix`` without the test targets of ``platforms`` whose source (``tests/<target>.cpp``) a
    patch that was left out would have created, or whose definition its added CMake lines hold
    (harness.stages.building.patch_diff.defined_targets): the fork cannot build them, and that is the
    conflict's consequence, already reported.  Returns the matrix and one line per target dropped."""
    gone = {}
    for o, p in zip(outcomes, patches):
        if not o.applied:
            for path in added_files(p):
                gone[Path(path).stem] = (path, p.name)
            for target, cmake in defined_targets(p).items():
                gone.setdefault(target, (f"its definition in {cmake}", p.name))
    plats, dropped = dict(matrix.platforms), []
    for name in platforms:
        q = matrix.platform(name)
        keep = tuple(t for t in q.test_targets if t not in gone)
        dropped += [f"{name}: test target {t} not built: {gone[t][0]} comes with {gone[t][1]}, which was left out"
                    for t in q.test_targets if t in gone]
        plats[name] = replace(q, test_targets=keep)
    return replace(matrix, platforms=plats), dropped


def with_old_base(matrix: Matrix, platforms: Sequence[str]) -> tuple[Matrix, dict[str, str]]:
    """``matrix`` plus, for every group of ``platforms`` whose reference is upstream's build and whose
    candidates include the fork's, a group comparing the same reference configuration on the old base
    (config ``old-<reference>``, build ``old-base``) against the new base: ``expect: informational``, so an
    upstream change is recorded with its first divergent token and does not fail the run.  The group's
    speed rules, if any, judge the new base against the old one (a slowdown of upstream's own is a failing
    step of the base, which the verdict lists as not attributed to a patch).  Returns the matrix and
    {new group: the group it was made from}."""
    configs, groups, made = dict(matrix.configs), dict(matrix.groups), {}
    plats = dict(matrix.platforms)
    for name in platforms:
        p = matrix.platform(name)
        extra = []
        for g in p.groups:
            group = matrix.groups[g]
            ref = matrix.configs[group.reference]
            if ref.build != "base" or group.reference_platform or \
                    not any(matrix.configs[c].build == "fork" for c in group.candidates):
                continue
            old = f"old-{ref.name}"
            configs[old] = RunConfig(old, OLD_VARIANT, ref.args, ref.env, f"{ref.name} built from the pinned base")
            new = OLD_VS_NEW if g == "base-vs-fork" else f"{OLD_VS_NEW}-{g}"
            speed = group.speed
            if speed is not None:
                # the group's rules judge the new base against the old one: one rule per metric of the
                # fork's candidates, its candidate the new base and its reference the old base (the loader
                # names the group's reference in every rule, which here would measure the new base against itself)
                rules = {(r.metric, r.min_ratio): replace(r, candidate=ref.name, reference=old) for r in speed.rules
                         if matrix.configs[r.candidate].build == "fork"}
                speed = replace(speed, rules=tuple(rules.values())) if rules else None
            groups[new] = replace(group, name=new, reference=old, candidates=(ref.name,), expect="informational",
                                  speed=speed, description=f"{g}'s reference on the pinned base against the new base")
            made[new] = g
            extra.append(new)
        plats[name] = replace(p, groups=(*p.groups, *extra))
    return replace(matrix, configs=configs, groups=groups, platforms=plats), made


# --------------------------------------------------------------------------- verdict


def _failing_file(signature: dict | None) -> str | None:
    """The source file a ``compile_error`` signature names (its key is ``<file>: error...: <message>``)."""
    if not signature or signature.get("kind") != "compile_error":
        return None
    return str(signature.get("key", "")).split(": error", 1)[0] or None


def verdict(outcomes: Sequence[PatchOutcome], steps: Sequence[StepRecord], comparisons: Sequence[ComparisonRecord],
            signatures: dict[tuple, dict], old_groups: Sequence[str]) -> tuple[str, list[dict], list[dict]]:
    """The forecast's one-line verdict, the patches that need work and the output changes of the fork.

    A conflicting patch needs work; so does an applied patch that changes the file a failing step's
    compile error names; a failing step no patch's files explain (upstream's own build included) is
    listed after the patches, "not attributed to a patch".  Output changes
    are failed comparisons outside ``old_groups`` (new base against new fork).  Returns (verdict,
    [{patch|step, why}], [{group, model, prompt, candidate, reference, difference}]).
    """
    work: list[dict] = []
    for o in outcomes:
        if o.status == PATCH_CONFLICT:
            work.append({"patch": o.name, "why": f"conflict: {o.detail.removeprefix('conflicts in ')}"})
    for s in steps:
        consequence = s.failures and all(f.kind == "blocked" for f in s.failures)
        if not STEP.is_failure(s.status) or consequence or s.config.startswith("old-"):
            continue  # the old base is the pinned one; a step blocked by a failed build repeats that failure
        sig = signatures.get((s.platform, s.config, s.step))
        summary = (sig or {}).get("summary") or s.detail
        file = _failing_file(sig)
        owners = [o.name for o in outcomes if o.applied and file and file in o.files]
        for name in owners:
            work.append({"patch": name, "why": f"{s.step} {s.platform}/{s.config}: {summary}"})
        if not owners:
            work.append({"step": f"{s.step} {s.platform}/{s.config}", "why": summary})
    changes = [{"platform": c.platform, "group": c.group, "model": c.model, "prompt": c.prompt,
                "candidate": c.candidate, "reference": c.reference, "difference": _difference(c)}
               for c in comparisons if c.group not in old_groups and c.failed()]
    if work:
        n = len({w["patch"] for w in work if "patch" in w})
        line = f"{n} patch{'es' if n != 1 else ''} need{'' if n != 1 else 's'} work"
        named = [f"{w['patch']} ({w['why']})" for w in work if "patch" in w]
        others = [f"{w['step']} ({w['why']})" for w in work if "step" in w]
        line += (": " + "; ".join(named) if named else "")
        line += ("; not attributed to a patch: " + "; ".join(others) if others else "")
    elif changes:
        line = "builds but outputs change: " + "; ".join(
            f"{c['platform']} {c['group']} {c['model']}/{c['prompt']}: {c['difference']}" for c in changes)
    else:
        line = "the series moves cleanly"
    return line, work, changes


def _difference(c: ComparisonRecord) -> str:
    return c.difference() or c.status


# --------------------------------------------------------------------------- report


def forecast_record(run_dir: Path, *, onto: Onto, new: BaseTree, old: BaseTree, outcomes: Sequence[PatchOutcome],
                    old_groups: dict[str, str], seconds: dict[str, float], incomplete: Sequence[str],
                    applied_series: Sequence[str] = (), not_built: Sequence[str] = (),
                    bisect: Mapping[str, Any] | None = None) -> ForecastRecord:
    """The forecast record of the run in ``run_dir`` (its summary and signatures read back), written as
    ``forecast.json`` by :meth:`ForecastRecord.to_json`."""
    from ..triage.signatures import load_signatures
    run = read_run(run_dir)
    sigs = {(e["platform"], e["config"], e["step"]): e["signature"] for e in load_signatures(run_dir)
            if e.get("step") != "compare"}
    line, work, changes = verdict(outcomes, run.steps, run.comparisons, sigs, list(old_groups))
    first = next((ForecastStage(s.platform, s.config, s.step, detail=s.detail,
                                signature=sigs.get((s.platform, s.config, s.step)))
                  for s in run.steps if STEP.is_failure(s.status)), None)
    return ForecastRecord(
        onto={"spec": onto.spec, "commit": new.commit, "source": new.source},
        old_base={"commit": old.commit, "source": old.source},
        written=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        verdict=line, needs_work=tuple(work), output_changes=tuple(changes),
        upstream_comparisons=tuple(UpstreamComparison(c.platform, c.group, c.model, c.prompt, c.status,
                                                      _difference(c))
                                   for c in run.comparisons if c.group in old_groups),
        patches=tuple(outcomes),
        stages=tuple(ForecastStage(s.platform, s.config, s.step, s.status, s.seconds, s.detail,
                                   sigs.get((s.platform, s.config, s.step))) for s in run.steps),
        first_failure=first, incomplete=tuple(incomplete), not_built=tuple(not_built), seconds=dict(seconds),
        applied_series=tuple(applied_series), bisect=bisect)


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def forecast_markdown(rec: ForecastRecord) -> str:
    """``forecast.md``: the verdict, one row per patch (with each conflict's hunk and the upstream lines
    it met), then one row per stage, the first failing step with its signature, and the times."""
    onto, old = rec.onto, rec.old_base
    out = [f"# Forecast: the series onto {onto['commit'][:12]}", "",
           f"- onto: `{onto['spec']}` → upstream {onto['commit']} ({onto['source']})",
           f"- from: the pinned base {old['commit']} ({old['source']})",
           f"- written {rec.written}", "", f"**Verdict: {rec.verdict}**", "",
           "Upstream's own output changes (old base against new base, not the series'): "
           + (f"{len(rec.upstream_output_changes)} of {len(rec.upstream_comparisons)} comparisons."
              if rec.upstream_comparisons else "none compared."), "",
           "## Patches", "", "| # | patch | status | detail | applied without |", "|---|---|---|---|---|"]
    for p in rec.patches:
        out.append(f"| {p.index} | {_md(p.name)} | {PATCH.icon(p.status)} | {_md(p.detail)} | "
                   f"{_md(', '.join(p.applied_without))} |")
    for p in rec.patches:
        for c in p.conflicts:
            out += ["", f"### {p.name}: `{c.file}` `{c.hunk}`", ""]
            if c.reason:
                out.append(f"Why: {c.reason}")
                out.append("")
            where = f"line {c.upstream_line} of the new base" if c.upstream_line else "not in the new base"
            out += ["The patch writes:", "", "```", *c.wanted, "```", "",
                    f"Upstream has there ({where}):", "", "```", *c.upstream, "```"]
    out += ["", "## Stages", "", "| platform | config | step | status | seconds | detail | signature |",
            "|---|---|---|---|---|---|---|"]
    for s in rec.stages:
        sig = s.signature or {}
        out.append(f"| {s.platform} | {s.config} | {s.step} | {STEP.icon(s.status)} | {s.seconds} | "
                   f"{_md(s.detail)[:200]} | {_md(sig.get('kind', ''))} {_md(sig.get('summary', ''))[:160]} |")
    first = rec.first_failure
    out += ["", "## First failing step", ""]
    if first:
        sig = first.signature or {}
        out.append(f"{first.step} {first.platform}/{first.config}: {sig.get('kind', 'other')} — "
                   f"{_md(sig.get('summary') or first.detail)}")
    else:
        out.append("none")
    out += ["", "## Upstream's own output changes (old base against new base)", ""]
    if rec.upstream_comparisons:
        for u in rec.upstream_comparisons:
            out.append(f"- {u.platform} {u.group} {u.model}/{u.prompt}: {u.status}"
                       + (f" — {_md(u.difference)}" if u.status != IDENTICAL else ""))
    else:
        out.append("none compared")
    if rec.not_built:
        out += ["", "## Not built", "", *[f"- {_md(i)}" for i in rec.not_built]]
    if rec.incomplete:
        out += ["", "## Not run", "", *[f"- {_md(i)}" for i in rec.incomplete]]
    if rec.bisect:
        out += ["", "## Upstream bisect", "", f"```\n{json.dumps(rec.bisect, indent=2)}\n```"]
    out += ["", "## Times (seconds)", "", *[f"- {k}: {v}" for k, v in rec.seconds.items()], ""]
    return "\n".join(out)


def exit_code(rec: ForecastRecord, overall: str | None) -> int:
    """1 when patches need work or outputs change; else the run's verdict's code (0 passed, 3 something asked
    for did not run), or 0 for a patch stage alone (``overall`` None: --patches-only)."""
    if rec.needs_work or rec.output_changes:
        return EXIT_FAILED
    return EXIT_PASSED if overall is None else VERDICT_EXIT_CODES[overall]


# --------------------------------------------------------------------------- bisect


def upstream_bisect(args: argparse.Namespace, onto: Onto, old: BaseTree, new: BaseTree, run_dir: Path,
                    say: Callable[[str], None]) -> dict[str, Any]:
    """The failing rows of the forecast's run in ``run_dir`` (``--bisect ID``: the one ID names; ``--bisect`` alone:
    every one) bisected across the upstream commits OLD..NEW, each with the whole series on top, through the
    forecast's stages (harness.bisect.upstream.bisect_upstream) in the repository holding the history (the local
    checkout or git remote named by ``--onto``); returns bisect.json's record as JSON data, or {error} when it
    cannot be bisected there."""
    from ..bisect.points import RunCommandLine
    from ..bisect.rows import failing_rows
    from ..bisect.upstream import bisect_upstream
    if onto.source.kind == "local":
        repo = onto.source.path
    elif onto.source.kind == "git":
        repo = None
    else:
        return {"error": f"{onto.source.kind} sources carry no upstream history to bisect"}
    try:
        _, summary, targets = failing_rows(str(run_dir), args.results_dir, args.bisect or None)
        rec = bisect_upstream(run_dir, summary, targets, RunCommandLine(tuple(STAGE_COMMANDS), args), old.commit,
                              new.commit, repo, say)
    except InputError as exc:
        return {"error": str(exc)}
    for row in rec.rows:
        say(f"forecast: upstream bisect: {row.line()}")
    return rec.to_json()


# --------------------------------------------------------------------------- command


def main(argv: Sequence[str]) -> int:
    """``forecast`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("forecast", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness forecast --onto SOURCE ...``; returns the exit code (module docstring).

    Raises ForecastError / harness.stages.building.source.SourceError (exit 2) when the source cannot be read
    or is not the commit it claims, and harness.stages.building.patches.PatchError for a broken series.
    """
    started = time.monotonic()
    say = print
    matrix = load_matrix(args.matrix)
    platforms = split_names(args.platform) or [p for p in ("linux-x86_64-cpu", "linux-x86_64-cuda")
                                               if p in matrix.platforms]
    for name in platforms:
        matrix.platform(name)
    onto = parse_onto(args.onto)
    patches = read_series(args.patches_dir)
    old, new = obtain_pinned_and_onto(matrix, onto, say)
    obtained = time.monotonic()
    say(f"forecast: onto {new.commit} ({new.source}), from the pinned base {old.commit[:12]}")
    work = (args.work_dir / "forecast" / new.commit[:12]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    with exclusive(work, f"the forecast directory {work}", Rank.FORECAST, say):  # one forecast of a commit at a time
        return _forecast(args, matrix, platforms, onto, patches, old, new, work, started, obtained, say)


def _forecast(args: argparse.Namespace, matrix: Matrix, platforms: list[str], onto: Onto, patches: list[Patch],
              old: BaseTree, new: BaseTree, work: Path, started: float, obtained: float,
              say: Callable[[str], None]) -> int:
    """The patch stage, the stages and the report of :func:`main`, in the forecast directory ``work``."""
    from ..common import proc
    from ..args import stage_options
    from ..pipeline import run_stages
    from ..record.run import Run
    from ..views.report import write_report
    from ..views.run_views import settle_killed, write_views
    base = forecast_base(new, old, patches, work / "upstream")
    trial = work / "trial"
    shutil.rmtree(trial, ignore_errors=True)
    git(["clone", "--quiet", "--no-checkout", str(base.path), str(trial)])
    outcomes = try_series(trial, base.git_rev, patches, log=work / BUILD_FILES["patches"])
    tried = time.monotonic()
    for o in outcomes:
        extra = f" (applied without {', '.join(o.applied_without)})" if o.applied_without else ""
        say(f"forecast: patch {o.index} {o.name}: {o.status} — {o.detail}{extra}")
    seconds = {"obtain": round(obtained - started, 1), "patches": round(tried - obtained, 1)}
    applied = write_applied_series(outcomes, patches, work / "patches")
    fmatrix, dropped = without_left_out_tests(onto_matrix(matrix, new.commit, Source("local", path=base.path)),
                                              platforms, outcomes, patches)
    fmatrix, old_groups = with_old_base(fmatrix, platforms)
    for line in dropped:
        say(f"forecast: {line}")
    groups = split_names(args.group)
    if groups:
        groups += [g for g, src in old_groups.items() if src in groups]
    opts = stage_options(args, platforms=platforms, groups=groups, work_dir=work, patches_dir=work / "patches")
    stages = [] if args.patches_only else list(STAGE_COMMANDS)
    with proc.handle_signals():
        run = Run.open(args.results_dir, args.run_id, argv=sys.argv, kind=RUN_FORECAST)
        try:
            if stages:
                try:
                    settle_killed(run.root, run.dir, say)
                    rc = run_stages(fmatrix, run, opts, stages, bases={"base": base, OLD_VARIANT: old})
                finally:
                    write_views(run.dir)  # the signatures the forecast's stages name; the report again below
            else:
                run.write_summary()
                rc = EXIT_PASSED
            seconds["stages"] = round(time.monotonic() - tried, 1)
            seconds["total"] = round(time.monotonic() - started, 1)
            rec = forecast_record(run.dir, onto=onto, new=new, old=old, outcomes=outcomes, old_groups=old_groups,
                                  seconds=seconds, incomplete=read_run(run.dir).incomplete,
                                  applied_series=[p.name for p in applied], not_built=dropped,
                                  bisect=upstream_bisect(args, onto, old, new, run.dir, say)
                                  if args.bisect is not None else None)
            write_json(RunLayout(run.dir).forecast_json, rec.to_json())
            RunLayout(run.dir).forecast_md.write_text(forecast_markdown(rec), encoding="utf-8")
            write_report(run.dir)  # again: it shows the forecast too
        finally:
            run.close()
    say(f"forecast: {rec.verdict}")
    say(f"forecast: {RunLayout(run.dir).forecast_md} (patch stage {seconds['patches']} s, total {seconds['total']} s)")
    if rc >= 128:
        return rc
    return exit_code(rec, run.overall() if stages else None)
