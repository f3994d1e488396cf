"""The rows a bisection follows, and how one is judged at a point: by the run's own verdict.

A row is what harness.record.verdict.judge returns for a run (a step or a comparison, named as every view names
it), or one failure of a failing step where the step holds several: one expectation (``<rule> <model>``), one
test of upstream's suite or test-backend-ops (the test's name), one generation (``<model>/<prompt>``).  Its id
is the row's name, and for a failure ``<row name>: <item>``: what ``bisect --check`` takes.

At a point (a run of the same stages on a prefix of the series) the row is found by its identity and judged by
the verdict that run recorded: ``fails`` is bad, ``passes`` good, ``not run`` or a row the point did not record
undecided.  A speed rule that the speed stage could not measure (status ``error``: too few samples, an engine
that failed) is undecided too: its rule decided nothing there (docs/speed.md); so is a row whose step could not
run because a build it needs did not pass (every failure ``blocked``), as ``git bisect skip`` skips a commit
that does not build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..common.errors import InputError
from ..common.statuses import STEP_ERROR
from ..record.layout import RunLayout
from ..record.records import Failure
from ..record.summary import RunSummary
from ..record.verdict import FAILS, Row, judge
from .points import Point
from .record import PointVerdict
from .search import BAD, GOOD, UNDECIDED

#: The step names of the speed stage's rules start so (harness.stages.speed.speed: ``speed:<group>:<metric>``).
SPEED_PREFIX = "speed:"


def failure_item(f: Failure) -> str:
    """What names failure ``f`` among its step's failures, "" for a kind that names nothing of its own: an
    expectation ``<rule> <model>``, a test of upstream's suite its name, a generation ``<model>/<prompt>``."""
    if f.kind == "expectation":
        return f"{f.status} {f.model}"
    if f.kind == "upstream-test":
        return f.message.split(":", 1)[0].strip()
    if f.kind == "generation":
        return f"{f.model}/{f.prompt}"
    return ""


@dataclass(frozen=True)
class Target:
    """One failing row of a run to bisect: ``id`` (what ``--check`` takes), the judged ``row``
    (harness.record.verdict.Row) and ``item`` (a failure of the row's step, "" for the row itself)."""

    id: str
    row: Row
    item: str = ""

    @property
    def platform(self) -> str:
        """The platform the row was recorded on."""
        return self.row.key["platform"]

    @property
    def is_speed(self) -> bool:
        """True for a speed rule's step."""
        return self.row.kind == "step" and self.row.key["step"].startswith(SPEED_PREFIX)


@dataclass(frozen=True)
class Judged:
    """A target at one point: ``outcome`` (good, bad or undecided) and ``text``, the verdict in the run's words."""

    outcome: str
    text: str


def _identity(row: Row) -> tuple:
    """What names ``row`` across runs: its kind and key without the status and expect it was judged by."""
    return (row.kind, *sorted((k, v) for k, v in row.key.items() if k not in ("status", "expected")))


def _details(summary: RunSummary) -> dict[tuple, tuple[str, list[Failure]]]:
    """Row identity -> (detail, failures) of every step of ``summary``, and the detail of every comparison."""
    out: dict[tuple, tuple[str, list[Failure]]] = {}
    for s in summary.steps:
        out[("step", ("config", s.config), ("platform", s.platform), ("step", s.step))] = (s.detail, s.failures)
    for c in summary.comparisons:
        key = {"platform": c.platform, "group": c.group, "model": c.model, "prompt": c.prompt,
               "reference": c.reference, "candidate": c.candidate}
        out[("comparison", *sorted(key.items()))] = (getattr(c, "detail", "") or "", [])
    return out


def row_text(row: Row, detail: str) -> str:
    """A row's verdict in the run's words (harness.record.verdict: a failing row's why names its check and
    measure, as the run's headline does); a row that did not fail gets its step's detail after it."""
    text = row.verdict.text()
    return text if row.verdict.fails or not detail else f"{text} — {detail}"


def failing_targets(summary: RunSummary) -> list[Target]:
    """Every failing row of ``summary`` as a target, in the order the run recorded them; a failing step whose
    failures name items of their own (:func:`failure_item`) gives one target per item instead."""
    details = _details(summary)
    out: list[Target] = []
    for row in judge(summary.steps, summary.comparisons):
        if not row.verdict.fails:
            continue
        _, failures = details.get(_identity(row), ("", []))
        items = list(dict.fromkeys(i for f in failures if (i := failure_item(f))))
        if items:
            out += [Target(f"{row.name}: {i}", row, i) for i in items]
        else:
            out.append(Target(row.name, row))
    return out


def suite_tests(targets: Sequence[Target]) -> list[str]:
    """The tests of upstream's suite that ``targets`` bisect (their items, in order, each once), where every target
    on the suite's step (``upstream-tests``) is one of its tests; empty (the whole suite) where none is on that step
    or one is the step as a whole (a suite that could not run)."""
    on_suite = [t for t in targets if t.row.kind == "step" and t.row.key.get("step") == RunLayout.UPSTREAM_STEP]
    if not on_suite or any(not t.item for t in on_suite):
        return []
    return list(dict.fromkeys(t.item for t in on_suite))


def pick(targets: Sequence[Target], check: str | None) -> list[Target]:
    """``targets`` (``check`` None) or the one whose id is ``check``, or the targets of the row named ``check``;
    raises LookupError listing the ids when none matches."""
    if check is None:
        return list(targets)
    chosen = [t for t in targets if t.id == check] or [t for t in targets if t.row.name == check]
    if not chosen:
        listed = "; ".join(t.id for t in targets) or "none"
        raise LookupError(f"--check {check!r} names no failing row of the run (its failing rows: {listed})")
    return chosen


def failing_rows(run: str | None, results_dir: Path, check: str | None) -> tuple[Path, RunSummary, list[Target]]:
    """The run ``run`` names (None: the newest under ``results_dir``; harness.triage.run_choice.resolve_run), its
    summary and the failing rows to bisect (:func:`pick` by ``check``).  Raises InputError (exit 2) for a run that
    cannot be found, has no failing row, or a ``check`` naming none of them."""
    from ..record.summary import read_run
    from ..triage.run_choice import resolve_run
    run_dir = resolve_run(run or "latest", results_dir)
    summary = read_run(run_dir)
    targets = failing_targets(summary)
    if not targets:
        raise InputError(f"run {run_dir.name} has no failing row: nothing to bisect")
    try:
        return run_dir, summary, pick(targets, check)
    except LookupError as exc:
        raise InputError(str(exc)) from None


def judge_at(target: Target, summary: RunSummary) -> Judged:
    """``target`` at a point whose run is ``summary``, judged by the verdict that run recorded (module doc)."""
    details = _details(summary)
    ident = _identity(target.row)
    row = next((r for r in judge(summary.steps, summary.comparisons) if _identity(r) == ident), None)
    if row is None:
        return Judged(UNDECIDED, "not recorded at this point")
    detail, failures = details.get(ident, ("", []))
    if target.is_speed and row.key["status"] == STEP_ERROR:
        return Judged(UNDECIDED, f"the rule could not decide — {detail}")
    if row.verdict.fails and failures and all(f.kind == "blocked" for f in failures):
        return Judged(UNDECIDED, f"a build it needs did not pass at this point — {detail}")
    if target.item and row.verdict.fails:
        mine = [f for f in failures if failure_item(f) == target.item]
        if not mine:
            return Judged(GOOD, f"{target.item}: not among the failures — {row_text(row, detail)}")
        found = mine[0].message or mine[0].text()
        return Judged(BAD, row.verdict.text() if found in row.verdict.why else f"{FAILS}: {mine[0].text()}")
    outcome = BAD if row.verdict.fails else GOOD if row.verdict.passes else UNDECIDED
    return Judged(outcome, row_text(row, detail))


@dataclass
class Seen:
    """One target's verdicts at the points judged so far, each point judged once: ``point_at(k)`` runs point k (or
    returns the one run before) and gives its :class:`harness.bisect.points.Point`, or a string saying why nothing
    ran there (a commit the series does not apply on), which is undecided, as ``git bisect skip`` has it.  ``label(k)``
    names point k in the progress lines ``say`` prints; ``verdicts`` may be given judged points (the bisected run)."""

    target: Target
    point_at: Callable[[int], Point | str]
    say: Callable[[str], None]
    label: Callable[[int], str] = lambda k: f"k={k}"
    verdicts: dict[int, PointVerdict] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)

    def outcome(self, k: int) -> str:
        """Point ``k``'s outcome for the target (good, bad or undecided), judged now or before."""
        if k not in self.verdicts:
            point = self.point_at(k)
            if isinstance(point, str):
                self.verdicts[k] = PointVerdict(k, UNDECIDED, point)
            else:
                self.used.add(k)
                judged = judge_at(self.target, point.summary)
                self.verdicts[k] = PointVerdict(k, judged.outcome, judged.text, str(point.run_dir))
            self.say(f"bisect: {self.target.id}: {self.label(k)}: {self.verdicts[k].outcome} — {self.verdicts[k].text}")
        return self.verdicts[k].outcome

    def cost(self, runs: Mapping[int, Point]) -> tuple[int, int, float]:
        """(builds made, builds reused, seconds) of the points this target used, from ``runs`` (k -> point)."""
        return (sum(runs[k].made for k in self.used), sum(runs[k].reused for k in self.used),
                round(sum(runs[k].seconds for k in self.used), 1))
