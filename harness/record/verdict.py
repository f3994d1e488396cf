"""One verdict per row: whether a step or a greedy comparison passes, fails or was not run, and why.

Every view of a run (summary.md, report.html, the console, JUnit, the GitHub Actions annotations, ``--json``)
shows the verdict decided here and works nothing out again.  The rules come from two declarations:

* a step's status declares its outcome (harness.common.statuses.STEP): a success passes, a failure fails, a
  neutral status (skipped, interrupted, incomplete) was not run;
* a comparison's status is judged against its group's ``expect`` (matrix.yaml, recorded as the comparison's
  ``expected``): ``identical`` (the default) passes a success status and fails a failure status;
  ``diverged`` (a numerics control) passes only ``diverged``, so ``identical`` fails it; ``near-tie`` (builds
  of other compilers or OSes) passes ``identical`` and a divergence at a near tie whose configurations agree
  with themselves and whose mean KL divergence is within ``kl_mean_max``; ``informational`` records a
  divergence without judging it and fails only a crash or a time limit.  A neutral status
  (``unsupported-upstream``) is not run, unless the group expects a divergence it did not give.

A failing row says why in words a maintainer reads in a headline: a step its check and the measure its stage
recorded (:func:`step_verdict`: ``fork expectations: mapped: 223 MiB of private page copies``,
``fork speed:base-vs-fork:tg: 0.53x, p 0.004``), a comparison what it found against what its group expects
(``identical; the group expects diverged``).  A headline names a crashed or timed-out comparison before the
steps its generation made fail (:func:`failing_names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

from ..common.statuses import COMPARISON, DIVERGED, GENERATION_FAILURES, IDENTICAL, STEP

#: The verdicts of one row, in the order views list rows (failures first).
FAILS, NOT_RUN, PASSES = "fails", "not run", "passes"
ROW_VERDICTS = (FAILS, NOT_RUN, PASSES)

#: The icon of each verdict, for the Markdown and the console.
ICONS = {FAILS: "❌", NOT_RUN: "⏭️", PASSES: "✅"}

#: Failing rows a headline names before it says "and N more".
HEADLINE_NAMES = 3

#: A group's ``expect`` values besides the comparison statuses it may name (harness.matrix.config).
NEAR_TIE, INFORMATIONAL = "near-tie", "informational"


class FactLike(Protocol):
    """What a verdict reads of a step's failure fact (harness.record.records.Failure)."""

    def measure(self) -> str: ...


class StepLike(Protocol):
    """What a verdict reads of a step record (harness.record.records.StepRecord)."""

    platform: str
    config: str
    step: str
    status: str
    detail: str
    failures: Sequence[FactLike]


class ComparisonLike(Protocol):
    """What a verdict reads of a comparison record (harness.record.records.ComparisonRecord)."""

    platform: str
    group: str
    model: str
    prompt: str
    reference: str
    candidate: str
    status: str
    expected: str
    first_divergence: dict | None
    kl: dict | None
    kl_mean_max: float | None
    nondeterministic: list[str]


@dataclass(frozen=True)
class RowVerdict:
    """The verdict of one row: ``verdict`` one of :data:`ROW_VERDICTS`; ``why`` in words (for a failing row what
    was found against what was expected, e.g. ``identical; the group expects diverged``)."""

    verdict: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in ROW_VERDICTS:
            raise ValueError(f"row verdict {self.verdict!r} not in {ROW_VERDICTS}")

    @property
    def fails(self) -> bool:
        """True when the row fails the run."""
        return self.verdict == FAILS

    @property
    def passes(self) -> bool:
        """True when the row passed."""
        return self.verdict == PASSES

    def text(self) -> str:
        """``fails: <why>``, ``passes`` or ``not run: <why>`` for a table cell or a console line."""
        return f"{self.verdict}: {self.why}" if self.why and not self.passes else self.verdict


@dataclass(frozen=True)
class Row:
    """A judged row of a run: ``kind`` ``step`` or ``comparison``, its ``name`` for people (what a headline
    lists), its ``verdict`` and ``key``, the fields that identify it in summary.json."""

    kind: str
    name: str
    verdict: RowVerdict
    key: Mapping[str, str]

    def to_json(self) -> dict[str, str]:
        """The row for ``--json``: its identity, name, verdict and why."""
        return {"kind": self.kind, **self.key, "name": self.name, "verdict": self.verdict.verdict,
                "why": self.verdict.why}

    def headline(self) -> str:
        """The row in a headline: a failing step as its platform and why (the why names the check:
        ``linux-x86_64-cpu fork expectations: mapped: …``), any other row as ``<name> (<why>)``."""
        if self.kind == "step" and self.verdict.fails:
            return f"{self.key['platform']} {self.verdict.why}"
        return f"{self.name} ({self.verdict.why})" if self.verdict.why else self.name

    @property
    def generation_failed(self) -> bool:
        """True for a comparison that crashed or ran past its time limit (the steps of its generation fail
        with it)."""
        return self.kind == "comparison" and self.key.get("status") in GENERATION_FAILURES


def step_check(step: StepLike) -> str:
    """The check a step is, without its platform: ``<config> <step>`` (the config left out where it is ``-``)."""
    return " ".join(x for x in (step.config if step.config != "-" else "", step.step) if x)


def step_measure(step: StepLike) -> str:
    """What a failing step found, from what its stage recorded: the measure of its first failure fact
    (harness.record.records.Failure.measure) and how many more there are (`` (and 2 more)``); without facts the
    first line of its detail, else its status."""
    facts = list(dict.fromkeys(f.measure() for f in step.failures))
    if facts:
        return facts[0] + (f" (and {len(facts) - 1} more)" if len(facts) > 1 else "")
    lines = step.detail.strip().splitlines()
    return lines[0] if lines else step.status


def step_verdict(step: StepLike) -> RowVerdict:
    """The verdict of ``step`` from its status's declared outcome: ``passes`` (success); ``fails`` (failure), why:
    its check and measure, ``<config> <step>: <measure>`` (:func:`step_check`, :func:`step_measure`, e.g.
    ``fork generate: llama-completion SIGABRT on umlaut-newline``); ``not run`` (neutral), why: the status.
    Raises KeyError for an undeclared status."""
    outcome = STEP[step.status].outcome
    if outcome == "success":
        return RowVerdict(PASSES)
    if outcome == "failure":
        return RowVerdict(FAILS, f"{step_check(step)}: {step_measure(step)}")
    return RowVerdict(NOT_RUN, step.status)


def tolerated_near_tie(c: ComparisonLike) -> bool:
    """True for a divergence that a ``near-tie`` group accepts: the first divergent token is a near tie
    (``first_divergence.near_tie``), no side is nondeterministic, and the mean KL divergence (nats) is known and
    at most ``kl_mean_max``."""
    fd = c.first_divergence or {}
    kl = c.kl or {}
    kl_ok = kl.get("mean") is not None and (c.kl_mean_max is None or kl["mean"] <= c.kl_mean_max)
    return bool(fd.get("near_tie")) and not c.nondeterministic and kl_ok


def _why_not_near_tie(c: ComparisonLike) -> str:
    """Why a divergence is not one a ``near-tie`` group accepts, in words."""
    fd, kl = c.first_divergence or {}, c.kl or {}
    if not fd.get("near_tie"):
        return "a hard divergence"
    if c.nondeterministic:
        return f"nondeterministic: {', '.join(c.nondeterministic)}"
    if kl.get("mean") is None:
        return "no KL divergence measured"
    return f"KL mean {kl['mean']:.3g} > {c.kl_mean_max:g} nats"


def comparison_verdict(c: ComparisonLike) -> RowVerdict:
    """The verdict of comparison ``c``: its status judged against its group's ``expect`` (the module's rules).
    Raises KeyError for an undeclared status."""
    status, expected = c.status, c.expected
    outcome = COMPARISON[status].outcome
    if expected == INFORMATIONAL:
        if status == DIVERGED:
            return RowVerdict(PASSES, "diverged; the group records divergences without judging them")
        if outcome == "failure":
            return RowVerdict(FAILS, f"{status}; the group records divergences, and fails on a {status}")
    elif expected == NEAR_TIE:
        if status == DIVERGED:
            if tolerated_near_tie(c):
                return RowVerdict(PASSES, "diverged at a near tie, as the group allows")
            return RowVerdict(FAILS, f"diverged ({_why_not_near_tie(c)}); the group accepts only a near tie")
        if outcome == "failure":
            return RowVerdict(FAILS, f"{status}; the group expects identical or a near tie")
    elif expected != IDENTICAL:  # a control group: only its expected status passes
        if status == expected:
            return RowVerdict(PASSES, f"{status}, as the group expects")
        return RowVerdict(FAILS, f"{status}; the group expects {expected}")
    elif outcome == "failure":
        return RowVerdict(FAILS, f"{status}; the group expects identical")
    if outcome == "success":
        return RowVerdict(PASSES)
    return RowVerdict(NOT_RUN, f"{status}: {COMPARISON[status].meaning}")


def step_name(s: StepLike) -> str:
    """A step for people: ``<platform> <config> <step>`` (the config left out where it is ``-``)."""
    return " ".join(x for x in (s.platform, s.config if s.config != "-" else "", s.step) if x)


def comparison_name(c: ComparisonLike) -> str:
    """A comparison for people: ``<platform> <group> <model>/<prompt>: <candidate> vs <reference>``."""
    return f"{c.platform} {c.group} {c.model}/{c.prompt}: {c.candidate} vs {c.reference}"


def judge(steps: Iterable[StepLike], comparisons: Iterable[ComparisonLike]) -> list[Row]:
    """Every row of a run, judged: the steps, then the comparisons, each in the order recorded."""
    rows = [Row("step", step_name(s), step_verdict(s),
                {"platform": s.platform, "config": s.config, "step": s.step, "status": s.status}) for s in steps]
    rows += [Row("comparison", comparison_name(c), comparison_verdict(c),
                 {"platform": c.platform, "group": c.group, "model": c.model, "prompt": c.prompt,
                  "reference": c.reference, "candidate": c.candidate, "status": c.status, "expected": c.expected})
             for c in comparisons]
    return rows


def failures_first(items: Sequence, verdicts: Sequence[RowVerdict]) -> list:
    """``items`` reordered as views list them: failing rows first, then the others, each in recorded order;
    ``verdicts[i]`` is the verdict of ``items[i]``."""
    order = sorted(range(len(items)), key=lambda i: (not verdicts[i].fails, i))
    return [items[i] for i in order]


def failing_names(rows: Sequence[Row], limit: int = HEADLINE_NAMES) -> str:
    """What failed, for a headline: the first ``limit`` failing rows (:meth:`Row.headline`) joined by ``; ``,
    then ``and N more``; "" when no row fails.  A crashed or timed-out comparison comes first, before the
    steps its generation made fail; the other rows in recorded order."""
    failing = sorted((r for r in rows if r.verdict.fails), key=lambda r: not r.generation_failed)
    text = "; ".join(r.headline() for r in failing[:limit])
    if len(failing) > limit:
        text += f" and {len(failing) - limit} more"
    return text


def count_text(rows: Sequence[Row], kind: str) -> str:
    """The rows of ``kind`` counted by verdict, failures first: ``1 fails, 7 pass``; ``none`` without rows."""
    counts = {v: sum(r.kind == kind and r.verdict.verdict == v for r in rows) for v in ROW_VERDICTS}
    words = {FAILS: "fail" if counts[FAILS] != 1 else "fails", NOT_RUN: "not run",
             PASSES: "pass" if counts[PASSES] != 1 else "passes"}
    return ", ".join(f"{n} {words[v]}" for v, n in counts.items() if n) or "none"
