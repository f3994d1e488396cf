"""The statuses of a run's records, declared once: what a step (:data:`STEP`), a greedy comparison
(:data:`COMPARISON`), a whole run (:data:`VERDICT`) and a patch of a forecast (:data:`PATCH`) may be, each with
its outcome (success, failure or neutral), icon and meaning, as LLVM lit declares its result codes.  A new
status is one line in one of those tuples; the records (harness.record.records), the row verdicts
(harness.record.verdict), the summary, the report, triage and signatures take it from there.  Code that sets or
decides by a status uses its named constant here (``IDENTICAL``, ``DIVERGED``, ``STEP_PASSED``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASSED


# --------------------------------------------------------------------------- statuses


@dataclass(frozen=True)
class Status:
    """One status value: ``name``, its ``outcome`` (success, failure or neutral: did not run or
    says nothing about the fork), the ``icon`` of summaries and ``meaning`` in words; ``unproven``: a
    neutral status that leaves the run incomplete (a step cut short, or one that could not read what it
    checks), where ``skipped`` does not."""

    name: str
    outcome: str
    icon: str
    meaning: str
    unproven: bool = False
    #: The plain mark the console puts before a step that ended in this status (harness.common.console); a
    #: status without one is shown with a bullet.
    mark: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in ("success", "failure", "neutral"):
            raise ValueError(f"status {self.name}: outcome {self.outcome!r} is not success, failure or neutral")
        if self.unproven and self.outcome != "neutral":
            raise ValueError(f"status {self.name}: only a neutral status can leave a run unproven")

    @property
    def failure(self) -> bool:
        """True when this status makes the run fail."""
        return self.outcome == "failure"

    @property
    def success(self) -> bool:
        """True when this status says the thing checked is good."""
        return self.outcome == "success"


class StatusSet:
    """The declared statuses of one kind of record, looked up by name."""

    def __init__(self, kind: str, statuses: Iterable[Status]):
        self.kind = kind
        self.by_name = {s.name: s for s in statuses}

    @property
    def names(self) -> tuple[str, ...]:
        """Every status name, in declaration order."""
        return tuple(self.by_name)

    @property
    def failures(self) -> frozenset[str]:
        """Names of the statuses that are failures."""
        return frozenset(n for n, s in self.by_name.items() if s.failure)

    @property
    def successes(self) -> frozenset[str]:
        """Names of the statuses that are successes."""
        return frozenset(n for n, s in self.by_name.items() if s.success)

    @property
    def alarming(self) -> frozenset[str]:
        """Names of the statuses a reader must look at: the failures and the statuses that leave a run
        unproven.  The console names such a step's log and writes an error annotation for it."""
        return self.failures | self.unproven

    @property
    def unproven(self) -> frozenset[str]:
        """Names of the statuses that leave a run incomplete (:attr:`Status.unproven`)."""
        return frozenset(n for n, s in self.by_name.items() if s.unproven)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __getitem__(self, name: str) -> Status:
        return self.by_name[name]

    def check(self, name: str) -> str:
        """``name`` when it is declared; raises ValueError listing the declared names otherwise."""
        if name not in self.by_name:
            raise ValueError(f"{self.kind} status {name!r} not in {self.names}")
        return name

    def is_failure(self, name: str) -> bool:
        """True when ``name`` is a declared failure status (unknown names are not)."""
        return name in self.by_name and self.by_name[name].failure

    def icon(self, name: str) -> str:
        """``<icon> <name>`` for summaries; the bare name for an undeclared one."""
        s = self.by_name.get(name)
        return f"{s.icon} {name}" if s else name


#: Statuses of a step (build, test, generate ...) of one platform and configuration.
STEP = StatusSet("step", (
    Status("passed", "success", "✅", "the step ran and everything it checks passed", mark="✔"),
    Status("failed", "failure", "❌", "the step ran and found a problem in the code (build, test, generation)",
           mark="✘"),
    Status("error", "failure", "💥", "the step could not run: a broken input, a failed build it needs, a tool missing",
           mark="✘"),
    Status("skipped", "neutral", "⏭️", "the step did not run on this machine (the reason is in the detail)", mark="–"),
    Status("interrupted", "neutral", "⏹️", "the step was running when the run was stopped (a signal, an exception, "
                                          "a full disk); the run is incomplete", unproven=True, mark="■"),
    Status("incomplete", "neutral", "⚠️", "the step ran, but a record it checks is missing or cannot be read "
                                         "(harness.stages.checks.expectations); nothing failed, and nothing is proven: "
                                         "the run is incomplete", unproven=True, mark="⚠"),
))

#: Statuses of one greedy comparison (one prompt, one candidate against its reference).
COMPARISON = StatusSet("comparison", (
    Status("identical", "success", "✅", "every repeat of both sides generated the same tokens"),
    Status("diverged", "failure", "❌", "the candidate's tokens differ; first_divergence says where"),
    Status("crashed", "failure", "💥", "a generation of either side ended abnormally"),
    Status("timeout", "failure", "⏱️", "a generation of either side ran past its time limit"),
    Status("unsupported-upstream", "neutral", "➖", "upstream's build in the same mode fails the same way as the "
                                                   "fork (harness.stages.outputs.upstream_support): a limit of upstream, not a "
                                                   "fork failure"),
))

#: Verdicts of a whole run (:meth:`Run.overall`); only ``passed`` is a success.
VERDICT = StatusSet("verdict", (
    Status("passed", "success", "✅", "something ran and nothing failed"),
    Status("failed", "failure", "❌", "a step failed or errored, or a comparison is a failure"),
    Status("incomplete", "failure", "⚠️", "nothing failed, but something asked for did not run"),
    Status("skipped", "neutral", "⏭️", "nothing ran at all"),
    Status("in-progress", "neutral", "⏳", "the command is still running: no verdict yet; a run whose harness process "
                                          "died before its command ended reads incomplete (interrupted: killed)"),
))

#: How a run whose harness process died mid-way (SIGKILL, a crash, the machine stopped) is named, in the
#: headline of its verdict and in its ``incomplete`` reasons (:func:`settle_dead_progress`).
KILLED = "interrupted: killed"

#: Outcomes of applying one patch of the series onto another upstream commit (harness.upstream.forecast).
PATCH = StatusSet("patch", (
    Status("clean", "success", "✅", "git apply takes the patch as it is (offsets allowed, no fuzz)"),
    Status("3-way", "success", "🔀", "the patch does not apply as it is; git am -3 merges it through the blobs it "
                                    "names (its hunks moved or their context changed upstream)"),
    Status("already-upstream", "neutral", "➖", "the new base already holds the patch's changes: it reverses "
                                               "cleanly, or git am -3 finds nothing left to change"),
    Status("conflict", "failure", "❌", "git am -3 leaves conflicts: the patch is left out and the files and hunks "
                                       "are recorded with the upstream lines they met"),
))

#: The exit code of each verdict (harness.common.errors).
VERDICT_EXIT_CODES = {"passed": EXIT_PASSED, "failed": EXIT_FAILED, "incomplete": EXIT_INCOMPLETE,
                      "skipped": EXIT_INCOMPLETE, "in-progress": EXIT_INCOMPLETE}

#: The status names, for code that only needs to check membership.
STEP_STATUSES = STEP.names
COMPARISON_STATUSES = COMPARISON.names

#: The statuses code sets or decides by, named once here (each checked against its declaration above); no
#: other module spells a step, comparison, verdict or patch status (tests/test_status_names.py).
STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED, STEP_INTERRUPTED, STEP_INCOMPLETE = (
    STEP.check(n) for n in ("passed", "failed", "error", "skipped", "interrupted", "incomplete"))
VERDICT_PASSED, VERDICT_FAILED, VERDICT_INCOMPLETE, VERDICT_SKIPPED, VERDICT_IN_PROGRESS = (
    VERDICT.check(n) for n in ("passed", "failed", "incomplete", "skipped", "in-progress"))
IDENTICAL, DIVERGED, CRASHED, TIMEOUT, UNSUPPORTED_UPSTREAM = (
    COMPARISON.check(n) for n in ("identical", "diverged", "crashed", "timeout", "unsupported-upstream"))
PATCH_CLEAN, PATCH_3WAY, PATCH_ALREADY_UPSTREAM, PATCH_CONFLICT = (
    PATCH.check(n) for n in ("clean", "3-way", "already-upstream", "conflict"))

#: The comparison statuses of a generation that ended abnormally (a crash, a time limit), in the order a
#: comparison reports them when both happened (harness.stages.outputs.compare.compare_runs); also the
#: ``kind`` of an engine's error (harness.stages.outputs.engine.EngineError).
GENERATION_FAILURES = (CRASHED, TIMEOUT)

#: What a run is, as its run.json records it (``kind``, harness.record.run.Run): the fork on its own series (the
#: ``patches/`` beside its matrix file), a forecast onto another upstream commit (harness.upstream.forecast), a
#: roll's verifying run (harness.upstream.roll_pin), one point of a bisect, or another series (``--patches-dir``
#: elsewhere: a planted fault, an experiment).  Only ``fork`` runs are the fork's history: the rule-history
#: figure, triage's previous run and the report's Changes choose by kind (harness.triage.run_choice).
RUN_KINDS = {
    "fork": "the fork on its own series (the patches/ beside its matrix file)",
    "forecast": "a forecast: the series onto another upstream commit (nox -s forecast)",
    "roll": "a roll's verifying run on the new upstream pin (nox -s roll)",
    "bisect": "one point of a bisect: part of the series, or the series on another upstream commit",
    "series": "another patch series (--patches-dir other than the patches/ beside the matrix file)",
}
RUN_FORK, RUN_FORECAST, RUN_ROLL, RUN_BISECT, RUN_SERIES = RUN_KINDS


def check_run_kind(kind: str) -> str:
    """``kind`` when it is one of :data:`RUN_KINDS`; raises ValueError listing them otherwise."""
    if kind not in RUN_KINDS:
        raise ValueError(f"run kind {kind!r} not in {tuple(RUN_KINDS)}")
    return kind
