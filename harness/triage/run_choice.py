"""Which runs triage compares: a run named by id, directory or ``latest`` (:func:`resolve_run`), the runs of a
results directory by start time (:func:`known_runs`), what a run is (:func:`run_kind`: only ``fork`` runs are the
fork's history), and the fork's run before one that covers its platforms and groups (:func:`previous_run`), with
why an earlier run is not comparable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from ..common.errors import InputError
from ..record.layout import BUILD_FILES, RunLayout
from ..record.records import RecordError
from ..common.statuses import RUN_FORECAST, RUN_FORK, RUN_SERIES, STEP_INTERRUPTED, VERDICT_INCOMPLETE
from ..record.environment import read_environment
from ..record.inputs import read_run_info
from ..record.summary import RunSummary, read_run


#: How many known run ids an "unknown run" error lists.
KNOWN_RUNS_SHOWN = 5


class TriageInputError(InputError):
    """A run id or directory that does not name a results run, or no run to compare with."""


# --------------------------------------------------------------------------- runs


#: What triage says when A and B are one run.
SAME_RUN_WARNING = "warning: A and B are the same run ({run}): nothing can have changed; name an earlier run as A"


def started_at(run_dir: Path) -> str:
    """When the run started (run.json), else when its summary was last written, else ""; raises RecordError
    naming run.json when it is not JSON or not a run record."""
    try:
        started = read_run_info(RunLayout(run_dir).run_json).started
    except FileNotFoundError:
        started = ""
    if started:
        return started
    try:
        return read_run(run_dir).updated
    except (OSError, RecordError):
        return ""


def known_runs(results_dir: Path) -> list[Path]:
    """Run directories under ``results_dir`` (those holding summary.json), oldest first.

    Ordered by the start time in run.json (then summary.json's ``updated``), then by id;
    run ids are UTC timestamps, so both orders agree for runs the harness created.
    """
    if not results_dir.is_dir():
        return []
    runs = [d for d in results_dir.iterdir()
            if d.is_dir() and not d.is_symlink() and RunLayout(d).summary_json.is_file()]
    return sorted(runs, key=lambda d: (started_at(d), d.name))


def _latest(results_dir: Path) -> Path | None:
    link = results_dir / "latest"
    marker = results_dir / "LATEST"
    newest = link if link.is_dir() else (results_dir / marker.read_text().strip() if marker.is_file() else None)
    if newest is not None and newest.is_dir():
        if RunLayout(newest).summary_json.is_file():
            return newest.resolve()
        # the newest run was stopped before it recorded anything: never fall back to an older one
        raise TriageInputError(f"the newest run {newest.resolve().name} in {results_dir} is incomplete: it has no "
                               "summary.json (it was stopped before it recorded a step); name two runs to compare")
    runs = known_runs(results_dir)
    return runs[-1] if runs else None


def _unknown(spec: str, results_dir: Path) -> TriageInputError:
    runs = [d.name for d in known_runs(results_dir)]
    if runs:
        shown = ", ".join(reversed(runs[-KNOWN_RUNS_SHOWN:]))
        more = f" (and {len(runs) - KNOWN_RUNS_SHOWN} older)" if len(runs) > KNOWN_RUNS_SHOWN else ""
        return TriageInputError(f"unknown run {spec!r}: no {results_dir / spec} with a summary.json; "
                                f"known runs, newest first: {shown}{more}")
    return TriageInputError(f"unknown run {spec!r}: {results_dir} holds no runs")


def resolve_run(spec: str, results_dir: Path) -> Path:
    """The run directory ``spec`` names: a directory with summary.json, a run id under
    ``results_dir``, or ``latest``.  Raises TriageInputError naming ``spec`` and listing
    a few known run ids when it names none.
    """
    direct = Path(spec)
    if RunLayout(direct).summary_json.is_file():
        return direct.resolve()
    if spec == "latest":
        latest = _latest(results_dir)
        if latest:
            return latest
    candidate = results_dir / spec
    if RunLayout(candidate).summary_json.is_file():
        return candidate.resolve()
    raise _unknown(spec, results_dir)


def incomplete_reasons(summary: RunSummary) -> list[str]:
    """Why a run is incomplete (its ``incomplete`` list, plus its interrupted steps); [] for a complete run."""
    reasons = list(summary.incomplete)
    for s in summary.steps:
        if s.status == STEP_INTERRUPTED:
            what = f"{s.platform}: {s.step} {s.config}: interrupted"
            if not any(what.rsplit(":", 1)[0] in r for r in reasons):
                reasons.append(what)
    if summary.overall == VERDICT_INCOMPLETE and not reasons:
        reasons.append("the run's verdict is incomplete")
    return reasons


def _covered(run_dir: Path) -> set[str]:
    """The platforms the run in ``run_dir`` ran (RunSummary.covered_platforms); none without a summary.json.
    Raises TriageInputError naming the file when its summary cannot be read."""
    try:
        return read_run(run_dir).covered_platforms()
    except FileNotFoundError:
        return set()
    except RecordError as exc:
        raise TriageInputError(str(exc)) from None


#: The series label a fork build is configured with (harness.stages.building.patches.series_label), as the
#: command line that heads its configure.log gives it: the first 12 hex digits of the series digest.
_SERIES_LABEL = re.compile(r"-DLLAMA_FORK_SERIES=[^,']*patches, sha256 ([0-9a-f]{12})")


def recorded_series(run_dir: Path, platform: str) -> str | None:
    """The digest of the patch series the run built on ``platform``: from its environment.json's ``patches``
    (harness.stages.building.patches.digest_of_series), else the first 12 hex digits its fork build was
    configured with (``LLAMA_FORK_SERIES`` on the command line heading ``build-fork/configure.log``); None
    where the run recorded neither (a fork build found up to date in a run without environment.json)."""
    from ..stages.building.patches import digest_of_series
    layout = RunLayout(run_dir)
    try:
        patches = read_environment(layout.environment_json(platform)).patches
    except (OSError, RecordError):
        patches = None
    if patches is not None and all("name" in p and "sha256" in p for p in patches):
        return digest_of_series([(str(p["name"]), str(p["sha256"])) for p in patches])
    try:
        with (layout.build_logs(platform, "fork") / BUILD_FILES["configure"]).open(encoding="utf-8",
                                                                                  errors="replace") as fh:
            head = fh.readline()
    except OSError:
        return None
    found = _SERIES_LABEL.search(head)
    return found.group(1) if found else None


def same_series(a: str | None, b: str | None) -> bool | None:
    """Whether two recorded series (:func:`recorded_series`: a digest or its first 12 hex digits) are one;
    None where either is unknown."""
    if a is None or b is None:
        return None
    return a.startswith(b) or b.startswith(a)


def _groups(run_dir: Path) -> set[str]:
    """The comparison groups a run ran: those of its comparisons and of its speed rules' steps
    (``speed:<group>:<metric>``); none without a readable summary."""
    try:
        summary = read_run(run_dir)
    except (FileNotFoundError, RecordError):
        return set()
    groups = {c.group for c in summary.comparisons}
    return groups | {s.step.split(":")[1] for s in summary.steps if s.step.startswith("speed:") and s.step.count(":") >= 2}


def run_kind(run_dir: Path, series: Mapping[str, str | None] | None = None) -> str:
    """What the run in ``run_dir`` is (harness.common.statuses.RUN_KINDS): the ``kind`` its run.json records.

    A run recorded before runs had kinds (run.json without ``kind``, or none) is read as a ``forecast`` where it
    holds forecast.json, as ``series`` where ``series`` (platform -> the digest of the series the caller takes as
    the fork's own, :func:`recorded_series`) names a platform on which the run recorded another series (the
    planted faults of results/evidence/), and as ``fork`` otherwise.  Raises RecordError naming run.json when it
    is not a run record."""
    try:
        kind = read_run_info(RunLayout(run_dir).run_json).kind
    except FileNotFoundError:
        kind = None
    if kind is not None:
        return kind
    if RunLayout(run_dir).forecast_json.is_file():
        return RUN_FORECAST
    if any(same_series(digest, recorded_series(run_dir, p)) is False for p, digest in (series or {}).items()):
        return RUN_SERIES
    return RUN_FORK


def _why_not_comparable(a: Path, platforms: set[str], groups: set[str], series: Mapping[str, str | None]) -> str:
    """Why run ``a`` is no earlier state of the fork's run that covers ``platforms`` and ``groups`` ("" where it
    is one): it is not a ``fork`` run (:func:`run_kind`; ``series``: the series that run recorded, for runs
    without a kind), or it does not cover those platforms or groups."""
    try:
        kind = run_kind(a, series)
    except RecordError as exc:
        raise TriageInputError(str(exc)) from None
    if kind != RUN_FORK:
        return f"{kind} runs, not the fork's"
    if not platforms <= _covered(a):
        return "of other platforms"
    if not groups <= _groups(a):
        return "of other groups"
    return ""


def previous_run(b: Path, results_dir: Path) -> Path:
    """The newest ``fork`` run before ``b`` (in :func:`known_runs` order) that covers b's platforms and comparison
    groups: the earlier state of what ``b`` checked.

    "Covers" means it ran a superset of the platforms and groups b ran (:func:`_groups`); only the fork's own
    runs count (:func:`run_kind`), whatever ``b`` is, so a planted fault, a forecast, a roll or a bisect point
    beside the run is never its baseline.  Raises TriageInputError when there is none, saying how many earlier
    runs were passed over and why.
    """
    wanted, groups = _covered(b), _groups(b)
    series = {p: recorded_series(b, p) for p in wanted}
    runs = known_runs(results_dir)
    names = [r.resolve() for r in runs]
    earlier = runs[:names.index(b.resolve())] if b.resolve() in names else runs
    passed_over: dict[str, int] = {}
    for run in reversed(earlier):
        if run.resolve() == b.resolve():
            continue
        why = _why_not_comparable(run, wanted, groups, series)
        if not why:
            return run.resolve()
        passed_over[why] = passed_over.get(why, 0) + 1
    over = "; ".join(f"{n} {why}" for why, n in sorted(passed_over.items()))
    raise TriageInputError(f"no fork run before {b.name} in {results_dir} covers its platforms "
                           f"({', '.join(sorted(wanted)) or 'none'}) and groups ({', '.join(sorted(groups)) or 'none'})"
                           f"{f' ({over})' if over else ''}; name two runs to compare")
