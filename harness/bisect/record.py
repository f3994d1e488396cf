"""Bisect's own record of a run: ``bisect.json`` and ``bisect.md`` in the run's folder.

Per failing row: the first bad patch (its subject and the files it touches) and the last good point, the verdict
text at both (the run's own words, harness.record.verdict), every point judged, and the cost: builds made, builds
reused and seconds.  A row the search could not pin to one patch says why (``outcome``, :data:`OUTCOMES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..record.json_files import write_json
from ..stages.building.patches import Patch
from ..record.layout import RunLayout

if TYPE_CHECKING:  # read for its type only: patch_info reads the patches it is given
    from ..stages.building.patches import Patch

#: How a row's bisection ended: ``found`` (one first bad patch), ``range`` (every point between the last good and
#: the first bad one was undecided), ``fails at the base`` (the row fails with no patch applied and at every point
#: probed below the run: no patch is to blame; a row that fails at the base but passes at a later point is
#: bisected from there, harness.bisect.last_good_in_series), ``undecided at the base`` (with no patch applied the row could not be judged).
#: Across upstream commits (harness.bisect.upstream) the ends must bracket the row: ``not good at GOOD`` (the row
#: fails, or cannot be judged, with the series on GOOD) and ``not bad at BAD`` (it passes, or cannot be judged, with
#: the series on BAD: a commit where the series does not apply is neither good nor bad).
FOUND, RANGE, AT_BASE, UNDECIDED_BASE = "found", "range", "fails at the base", "undecided at the base"
NOT_GOOD_AT_GOOD, NOT_BAD_AT_BAD = "not good at GOOD", "not bad at BAD"
OUTCOMES = (FOUND, RANGE, AT_BASE, UNDECIDED_BASE, NOT_GOOD_AT_GOOD, NOT_BAD_AT_BAD)


@dataclass(frozen=True)
class PatchInfo:
    """A patch of the series: ``position`` (1-based), file ``name``, ``subject`` and the ``files`` it touches."""

    position: int
    name: str
    subject: str
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommitInfo:
    """An upstream commit of a bisection across upstream commits: ``position`` on BAD's first-parent line (0 is
    GOOD), its full id ``sha``, ``subject`` and the ``files`` it changes (``git diff-tree``)."""

    position: int
    sha: str
    subject: str
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class PointVerdict:
    """A row at one point: ``k`` (patches applied, 0 the base; across upstream commits, the commit's position),
    ``outcome`` (good, bad, undecided), ``text`` (the verdict in the run's words) and ``run`` (the point's run
    directory, "" for the bisected run itself or a commit where the series does not apply, which runs nothing)."""

    k: int
    outcome: str
    text: str
    run: str = ""


@dataclass
class RowBisect:
    """The bisection of one failing row (module doc).  ``first_bad`` is None unless ``outcome`` is found or range;
    ``last_good`` is the k of the last good point (None when the base is not good)."""

    id: str
    outcome: str
    first_bad: PatchInfo | CommitInfo | None
    last_good: int | None
    at_first_bad: str
    at_last_good: str
    points: list[PointVerdict]
    builds_made: int = 0
    builds_reused: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        """The result in one line, for the console and the Markdown."""
        if isinstance(self.first_bad, CommitInfo):
            c = self.first_bad
            if self.outcome == FOUND:
                return f"{self.id}: first bad upstream commit {c.sha} ({c.subject})"
            return (f"{self.id}: first bad upstream commit between positions {(self.last_good or 0) + 1} and "
                    f"{c.position} (every commit between was undecided); {c.position} is {c.sha} ({c.subject})")
        if self.outcome == FOUND and self.first_bad is not None:
            return f"{self.id}: first bad patch {self.first_bad.position} {self.first_bad.name} ({self.first_bad.subject})"
        if self.outcome == RANGE and self.first_bad is not None:
            return (f"{self.id}: first bad patch between {(self.last_good or 0) + 1} and {self.first_bad.position} "
                    f"(every point between was undecided); {self.first_bad.position} is {self.first_bad.name}")
        return f"{self.id}: {self.outcome} — {self.at_first_bad}"


@dataclass
class BisectRecord:
    """What ``bisect.json`` holds: the ``run`` bisected, its ``series`` (patch file names, in order), one
    :class:`RowBisect` per row and the whole bisection's cost (``points`` run, builds, seconds)."""

    run: str
    series: list[str]
    rows: list[RowBisect] = field(default_factory=list)
    #: across upstream commits: ``good``, ``bad``, ``repo``, ``commits`` (id and subject, in order, GOOD first) and
    #: ``not_applied`` (commit id -> the patch that does not apply there); None for a bisection across the series
    upstream: dict[str, Any] | None = None  # Any: JSON data of several shapes (ids, the commits' pairs, a map)
    points: list[dict[str, str | int | float]] = field(default_factory=list)
    builds_made: int = 0
    builds_reused: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:  # Any: JSON data, as asdict gives it
        """The record as JSON data."""
        return asdict(self)


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _point(rec: BisectRecord, k: int) -> str:
    """Point ``k`` in bisect.md's table: the patch count, or the commit's position and short id."""
    return str(k) if rec.upstream is None else f"{k} `{rec.upstream['commits'][k][0][:12]}`"


def _no_run(rec: BisectRecord) -> str:
    """The run cell of a point without a run of its own: the bisected run itself (across the series), or nothing
    (across upstream commits, where only a commit the series does not apply on runs nothing)."""
    return "the bisected run" if rec.upstream is None else "none: the series does not apply"


def markdown(rec: BisectRecord) -> str:
    """``bisect.md``: one section per row (first bad patch, last good point, the verdict at both, the points and
    the cost), then the cost of the whole bisection."""
    across = "" if rec.upstream is None else (
        f"Across the upstream commits {rec.upstream['good']}..{rec.upstream['bad']} of {rec.upstream['repo']}, each "
        f"with the whole series; the series does not apply at {len(rec.upstream['not_applied'])} commit(s) checked, "
        "which are neither good nor bad and were stepped around, as git bisect skip does.")
    out = [f"# Bisect of run {rec.run}", "", *([across, ""] if across else []),
           f"{len(rec.rows)} failing row(s); series of {len(rec.series)} patch(es). Cost: {len(rec.points)} point(s) "
           f"run, {rec.builds_made} build(s) made, {rec.builds_reused} reused, {rec.seconds:.1f} s.", ""]
    for r in rec.rows:
        out += [f"## {_md(r.id)}", "", f"**{_md(r.line())}**", ""]
        if isinstance(r.first_bad, CommitInfo):
            out.append(f"- first bad: upstream commit `{r.first_bad.sha}` — {_md(r.first_bad.subject)}; "
                       f"files: {', '.join(f'`{f}`' for f in r.first_bad.files) or 'none'}")
            out.append(f"- verdict there: {_md(r.at_first_bad)}")
        elif r.first_bad is not None:
            out.append(f"- first bad: patch {r.first_bad.position} `{r.first_bad.name}` — {_md(r.first_bad.subject)}; "
                       f"files: {', '.join(f'`{f}`' for f in r.first_bad.files) or 'none'}")
            out.append(f"- verdict there: {_md(r.at_first_bad)}")
        if r.last_good is not None:
            where = "the unpatched base (k=0)" if r.last_good == 0 else f"patches 1..{r.last_good}"
            if rec.upstream is not None:
                sha, subject = rec.upstream["commits"][r.last_good]
                where = f"upstream commit `{sha}` ({_md(subject)}) with the whole series"
            out.append(f"- last good: {where}; verdict there: {_md(r.at_last_good)}")
        out.append(f"- cost: {r.builds_made} build(s) made, {r.builds_reused} reused, {r.seconds:.1f} s")
        out += ["", "| k | outcome | verdict | run |" if rec.upstream is None else "| commit | outcome | verdict | run |",
                "|---|---|---|---|"]
        out += [f"| {_point(rec, p.k)} | {p.outcome} | {_md(p.text)[:300]} | {_md(p.run) or _no_run(rec)} |"
                for p in r.points]
        out.append("")
    return "\n".join(out) + "\n"


def write(run_dir: Path, rec: BisectRecord) -> tuple[Path, Path]:
    """Write ``bisect.json`` and ``bisect.md`` into ``run_dir``; returns their paths.  Raises OSError."""
    layout = RunLayout(run_dir)
    write_json(layout.bisect_json, rec.to_json())
    layout.bisect_md.write_text(markdown(rec), encoding="utf-8")
    return layout.bisect_json, layout.bisect_md


def patch_info(patches: Sequence[Patch], k: int) -> PatchInfo:
    """Patch ``k`` (1-based) of ``patches`` (harness.stages.building.patches.Patch) with the files its diff touches,
    as unidiff reads them (none where it cannot read the diff)."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError
    p = patches[k - 1]
    try:
        files = tuple(f.path for f in PatchSet(p.path.read_text(encoding="utf-8", errors="replace")))
    except UnidiffParseError:
        files = ()
    return PatchInfo(k, p.name, p.subject, files)
