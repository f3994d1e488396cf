"""A roll's record for reviewers: ``results/<run>/roll.md`` (also the pull request's body) and ``roll.json``.

roll.md holds the old and new commit with their dates and the number of upstream commits between them; per
patch its outcome (clean, 3-way, dropped because upstream holds it, resolved by hand) with its diff against its
old version; the pin's parts and what became of each source; what upstream itself changed in the outputs (old
base against new base: first divergent token, KL); the fork's verdict on the new base with its failing steps,
its speed ratios beside the old pin's last passed run, triage against that run; and what was not run.

A roll stopped at a conflict writes the same record so far (:func:`write_stopped`): the patch and the hunks it
met, for the person on duty.
"""

from __future__ import annotations

import difflib
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..record.forecast import HunkConflict
from ..record.json_files import write_json
from ..common.statuses import IDENTICAL, RUN_FORK, STEP, VERDICT_PASSED
from ..stages.building.source import BaseTree
from .roll_state import OUTCOMES, SKIPPED_BY_HAND, State

if TYPE_CHECKING:  # their types only: forecast.py imports this module through roll
    from ..matrix.config import Matrix
    from .forecast import Onto

#: Most lines of a patch's diff against its old version shown in roll.md (the rest are counted).
DIFF_MAX_LINES = 120


def commit_date(repo: Path, commit: str) -> str:
    """The committer date of ``commit`` in ``repo`` (ISO 8601), '' when the repository lacks it."""
    proc = subprocess.run(["git", "log", "-1", "--format=%cI", commit], cwd=repo, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def commits_between(onto: Onto, old: str, new: str) -> tuple[int | None, str]:
    """How many upstream commits ``new`` has that ``old`` has not (``git rev-list --count old..new``), read
    from the history of the roll's source ``onto`` (harness.upstream.forecast.Onto): a local checkout's own,
    a git remote's commits fetched without trees or blobs.  (None, why) where the source has no history (an
    sdist's shallow checkout, a mirror archive) or git cannot count."""
    kind = onto.source.kind
    if kind == "local" and onto.source.path is not None:  # a local source always names its checkout
        return _count(onto.source.path, old, new)
    if kind == "git":
        with tempfile.TemporaryDirectory(prefix="roll-history-") as tmp:
            subprocess.run(["git", "init", "--quiet", tmp], capture_output=True)
            fetch = subprocess.run(["git", "fetch", "--quiet", "--no-tags", "--filter=tree:0", str(onto.source.url),
                                    new], cwd=tmp, capture_output=True, text=True)
            if fetch.returncode:
                return None, f"git fetch of its history failed: {fetch.stderr.strip()[:200]}"
            return _count(Path(tmp), old, new)
    return None, f"a {kind} source carries no upstream history"


def _count(repo: Path, old: str, new: str) -> tuple[int | None, str]:
    if subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=repo, capture_output=True).returncode:
        return None, f"{old[:12]} is not an ancestor of {new[:12]} in {repo}"
    proc = subprocess.run(["git", "rev-list", "--count", f"{old}..{new}"], cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        return None, proc.stderr.strip()
    return int(proc.stdout.strip()), ""


def upstream_facts(onto: Onto, old: BaseTree, new: BaseTree) -> dict[str, Any]:
    """The dates of both commits and the count of upstream commits between them (:func:`commits_between`), as
    RollRecord's fields ``old_date``, ``new_date``, ``between`` and ``between_why``: read once when the roll
    starts and kept in its state, so that roll.md says the same at a stop as at the end."""
    between, why = commits_between(onto, old.commit, new.commit)
    return {"old_date": commit_date(old.path, old.commit), "new_date": commit_date(new.path, new.commit),
            "between": between, "between_why": why}


def patch_diff(old: str, new: str) -> list[str]:
    """The unified diff of a patch file's old text against its new one, ``index`` lines left out (their blob
    ids change with any upstream change to the file); at most DIFF_MAX_LINES lines."""
    def keep(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("index ")]
    diff = list(difflib.unified_diff(keep(old), keep(new), "old", "new", lineterm="", n=2))
    if len(diff) > DIFF_MAX_LINES:
        diff = diff[:DIFF_MAX_LINES] + [f"... ({len(diff) - DIFF_MAX_LINES} more lines)"]
    return diff


def speed_ratios(run_dir: Path) -> dict[tuple[str, str, str, str, str], float]:
    """(platform, model, candidate, reference, metric) -> median candidate tok/s over median reference tok/s
    of every pair the speed stage measured interleaved in ``run_dir`` (bench.json, harness.record.bench)."""
    from ..record.bench import bench_measurements, bench_platforms, read_bench
    out = {}
    for platform in bench_platforms(run_dir):
        data = read_bench(run_dir, platform) or {}
        try:
            found = bench_measurements(data)
        except ValueError:
            continue
        by = {(m.model, m.pair, m.config): m for m in found}
        for (model, pair, config), m in by.items():
            if len(pair) != 2 or config != pair[1] or (model, pair, pair[0]) not in by:
                continue
            ref = by[(model, pair, pair[0])]
            for metric in ("pp", "tg"):
                a, b = getattr(ref, metric), getattr(m, metric)
                if a and b and statistics.median(a) > 0:
                    out[(platform, model, config, pair[0], metric)] = statistics.median(b) / statistics.median(a)
    return out


@dataclass
class RollRecord:
    """What a roll did and found; :func:`markdown` renders it."""

    onto: str
    old: dict
    new: dict
    branch: str
    commit: str
    outcomes: list[dict]
    pin: list[str]
    old_patches: dict[str, str]
    started: float
    new_patches: dict[str, str] = field(default_factory=dict)
    between: int | None = None
    between_why: str = ""
    old_date: str = ""
    new_date: str = ""
    stopped: dict | None = None
    not_verified: str = ""
    run_id: str = ""
    overall: str = ""
    headline: str = ""
    failing: list[str] = field(default_factory=list)
    upstream_changes: list[str] = field(default_factory=list)
    platforms: list[str] = field(default_factory=list)
    matrix_platforms: list[str] = field(default_factory=list)
    old_groups: dict[str, str] = field(default_factory=dict)
    speed: list[str] = field(default_factory=list)
    old_run: str = ""
    triage: str = ""
    not_run: list[str] = field(default_factory=list)
    verify_seconds: float = 0.0
    pin_seconds: float = 0.0


    def triage_against_old_pin(self, results_dir: Path, run_dir: Path, matrix: Matrix) -> None:
        """Read the run in ``run_dir``: its verdict, failing steps, upstream's own output changes (the
        ``old_groups``), speed ratios beside those of the newest passed run of the old pin, triage against that
        run, and what did not run."""
        from ..record.summary import read_run
        from ..triage.speed_ratios import rule_factors, same_mode_upstream
        from ..triage.triage import diff_runs, format_report
        run = read_run(run_dir)
        self.overall = run.overall
        self.failing = [f"{s.step} {s.platform}/{s.config}: {s.status} — {s.detail}"[:300]
                        for s in run.steps if STEP.is_failure(s.status)]
        self.failing += [f"compare {c.platform} {c.group} {c.model}/{c.prompt}: {c.status} — {c.difference()}"[:300]
                         for c in run.comparisons if c.group not in self.old_groups and c.failed()]
        for c in run.comparisons:
            if c.group in self.old_groups:
                kl = (c.kl or {}).get("mean")
                what = IDENTICAL if c.status == IDENTICAL else f"{c.status}: {c.difference()}"
                self.upstream_changes.append(f"{c.platform} {c.model}/{c.prompt}: {what}"
                                             + (f"; KL mean {kl:.3g} nats" if kl is not None else ""))
        self.not_run = list(run.incomplete)
        self.not_run += [f"{p}: {why}" for p, why in run.skipped_platforms.items()]
        from ..matrix.platforms import cannot_run
        for name in self.matrix_platforms:
            if name not in self.platforms and name not in run.skipped_platforms:
                why = cannot_run(matrix.platform(name))
                self.not_run.append(f"{name}: not selected (--platform)" + (f"; this machine: {why}" if why else ""))
        olds = [d for d in runs_of_pin(results_dir, self.old["commit"]) if d.resolve() != run_dir.resolve()]
        new_ratios = speed_ratios(run_dir)
        old_ratios = speed_ratios(olds[0]) if olds else {}
        for key in sorted(new_ratios):
            platform, model, cand, ref, metric = key
            before = f"{old_ratios[key]:.2f}x" if key in old_ratios else "-"
            self.speed.append(f"| {platform} | {model} | {cand} / {ref} | {metric} | {new_ratios[key]:.2f}x | {before} |")
        if olds:
            self.old_run = olds[0].name
            report = diff_runs(olds[0], run_dir, False, same_mode_upstream(matrix), rule_factors(matrix))
            self.triage = format_report(report)

    def verdict_line(self) -> str:
        """One line: where the roll stopped, or the new pin's verdict."""
        if self.stopped:
            return f"stopped at patch {self.stopped['index']} {self.stopped['name']}: conflict"
        if self.not_verified:
            return f"the new pin is committed; {self.not_verified}"
        return f"the new pin {self.overall}" + (f" ({len(self.failing)} failing)" if self.failing else "")

    def to_json(self) -> dict:
        """The record as roll.json holds it."""
        out = dict(vars(self))
        out.pop("old_patches")
        out.pop("new_patches")
        return out


def _date(text: str) -> str:
    return text or "date unknown"


def markdown(rec: RollRecord) -> str:
    """roll.md (module docstring)."""
    old, new = rec.old, rec.new
    between = (f"{rec.between} upstream commits" if rec.between is not None else f"unknown ({rec.between_why})")
    out = [f"# Roll upstream llama.cpp {old['commit'][:12]} → {new['commit'][:12]}", "",
           f"- old pin: `{old['commit']}` ({_date(rec.old_date)}), from {old['source']}",
           f"- new pin: `{new['commit']}` ({_date(rec.new_date)}), from {new['source']} (`--onto {rec.onto}`)",
           f"- between them: {between}",
           f"- branch `{rec.branch}`" + (f", commit `{rec.commit[:12]}`" if rec.commit else ""), "",
           f"**Verdict: {rec.verdict_line()}**", ""]
    out += ["## Patches", "", "| # | patch | outcome | detail |", "|---|---|---|---|"]
    for o in rec.outcomes:
        out.append(f"| {o['index']} | {o['name']} | {OUTCOMES[o['outcome']]} | {o['detail'].replace('|', '/')} |")
    if rec.stopped:
        s = rec.stopped
        out.append(f"| {s['index']} | {s['name']} | **conflict: the roll stopped here** | "
                   f"{s['detail'].replace('|', '/')} |")
        for c in (HunkConflict(**c) for c in s["conflicts"]):
            where = f"line {c.upstream_line} of the new base" if c.upstream_line else "not in the new base"
            renamed = f" (upstream renamed it from `{c.renamed_from}`)" if c.renamed_from else ""
            out += ["", f"### {s['name']}: `{c.file}` `{c.hunk}`{renamed}", ""]
            if c.reason:
                out += [f"Why: {c.reason}", ""]
            out += ["The patch writes:", "", "```", *c.wanted, "```", "", f"Upstream has there ({where}):", "",
                    "```", *c.upstream, "```"]
    for o in rec.outcomes:
        if o["outcome"] in ("dropped", SKIPPED_BY_HAND) or o["name"] not in rec.new_patches:
            continue
        diff = patch_diff(rec.old_patches.get(o["name"], ""), rec.new_patches.get(o["name"], ""))
        out += ["", f"### {o['name']}: against its old version", ""]
        out += ["```diff", *diff, "```"] if diff else ["unchanged (index lines aside)"]
    out += ["", "## The pin", "", *[f"- {line}" for line in rec.pin]]
    if rec.stopped:
        out += ["", "## What next", "",
                "The dev tree holds the conflict. Resolve it there, `git add` the files, `git am --continue` "
                "(or `git am --skip` to drop the patch), then `llama-fork-harness roll --continue`; "
                "`roll --abort` returns to the branch the roll started from (docs/roll.md)."]
        return "\n".join(out) + "\n"
    out += ["", "## What upstream changed in the outputs (old base against new base)", ""]
    out += [f"- {line}" for line in rec.upstream_changes] or ["none compared"]
    out += ["", f"## The fork on the new base (run {rec.run_id or '-'})", ""]
    if rec.not_verified:
        out.append(rec.not_verified)
    else:
        out.append(f"Verdict: **{rec.overall}**; the main job took {rec.verify_seconds} s.")
        out += ["", *[f"- {line}" for line in rec.failing]] if rec.failing else ["", "Nothing failed."]
    out += ["", "## Speed ratios (median tok/s, candidate over reference, interleaved in one run)", ""]
    if rec.speed:
        out += [f"| platform | model | pair | metric | new pin | old pin ({rec.old_run or 'no passed run'}) |",
                "|---|---|---|---|---|---|", *rec.speed]
    else:
        out.append("none measured")
    out += ["", "## Against the old pin's last passed run" + (f" ({rec.old_run})" if rec.old_run else ""), ""]
    out += ["```text", rec.triage.rstrip("\n"), "```"] if rec.triage else \
        ["no passed run of the old pin in the results directory: nothing to triage against"]
    out += ["", "## Not run", ""]
    out += [f"- {line}" for line in rec.not_run] or ["nothing"]
    out += ["", "## Times", "", f"- the series exported and the pin written and committed: {rec.pin_seconds} s",
            f"- the main job on the new pin: {rec.verify_seconds} s"]
    return "\n".join(out) + "\n"


def write_record(rec: RollRecord, run_dir: Path) -> Path:
    """Write ``roll.md`` and ``roll.json`` into ``run_dir``; returns roll.md's path."""
    path = run_dir / "roll.md"
    path.write_text(markdown(rec), encoding="utf-8")
    write_json(run_dir / "roll.json", rec.to_json())
    return path


def write_stopped(state: State, path: Path) -> Path:
    """The record of a roll stopped at a conflict (harness.upstream.roll.State), written to ``path``: the patches
    done, the one that stopped it with the hunks it met, what next."""
    rec = RollRecord(onto=state["onto"], old=state["old"], new=state["new"], branch=state["branch"], commit="",
                     outcomes=state["outcomes"], pin=["not written: the roll stopped before the pin"], old_patches={},
                     started=state["started"], stopped=state["stopped"], **state["upstream"])
    path.write_text(markdown(rec), encoding="utf-8")
    return path


def runs_of_pin(results_dir: Path, commit: str) -> list[Path]:
    """The fork's runs under ``results_dir`` (harness.triage.run_choice.run_kind) whose every platform built
    ``commit`` as its base (its environment.json, harness.record.environment) and that passed, newest first."""
    from ..record.environment import read_environment
    from ..record.layout import RunLayout
    from ..record.records import RecordError
    from ..record.summary import read_run
    from ..triage.run_choice import known_runs, run_kind
    found = []
    for d in reversed(known_runs(results_dir)):
        try:
            if run_kind(d) != RUN_FORK:
                continue
            run = read_run(d)
            envs = [RunLayout(d).environment_json(p) for p in sorted(run.covered_platforms())]
            if envs and {read_environment(e).base_commit for e in envs} == {commit} and run.overall == VERDICT_PASSED:
                found.append(d)
        except (OSError, RecordError, ValueError):
            continue
    return found
