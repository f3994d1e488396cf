"""The records of a run's summary.json: a step's (:class:`StepRecord`) and a comparison's
(:class:`ComparisonRecord`), each judged by harness.record.verdict, and :class:`Failure`: the structured facts of
why a step failed (model, prompt, status, signal, error line, the patch that did not apply, the build that blocked
the step), written where the failure happens.  Readers use these fields; a step's ``detail`` is for people only.
:class:`RecordError` is the error of a run file this harness cannot read.  The statuses the records take are
declared in harness.common.statuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..common.errors import InputError
from .verdict import RowVerdict, comparison_verdict, step_verdict, tolerated_near_tie
from ..common.statuses import STEP, COMPARISON, IDENTICAL

#: Version of summary.json's record format.  1: steps without ``failures`` (facts only in
#: ``detail``); 2: steps with ``failures``.  A run written by a newer harness is refused.
RECORD_VERSION = 2


class RecordError(InputError, ValueError):
    """A run file this harness cannot read: not JSON, not of its record's shape, or a summary.json written by a
    newer record format.  The message names the file; ``reason`` says what is wrong without naming it (the
    message where the raiser gave none), for records that name the file their own way."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message

    @classmethod
    def at(cls, path: Path, reason: str) -> "RecordError":
        """The error of the file at ``path``: the message ``<path>: <reason>``, the ``reason`` alone beside it."""
        return cls(f"{path}: {reason}", reason)


# --------------------------------------------------------------------------- failure facts

#: Kinds of :class:`Failure` and the fields each one fills.
FAILURE_KINDS = {
    "generation": "a generation run ended abnormally: model, prompt, repeat, status, signal, error_line, log, program "
                  "(llama-completion or the engine)",
    "model": "a model could not be assembled, generated or verified: model, message",
    "blocked": "the step could not run because a build it needs did not pass: build (the variant)",
    "patch": "a patch of the series did not apply: patch (its file name), message",
    "compare": "a comparison could not be made (e.g. tokenizing failed): model, prompt, message",
    "exception": "the step stopped with an error: message (exception type and text)",
    "upstream-test": "a test of upstream's suite fails on the fork and not on base (harness.stages.native_tests.upstream_suite): "
                     "message (the test and its failure), log (the fork's ctest.log)",
    "expectation": "a configuration did not do what it must (harness.stages.checks.expectations): model, status (the rule: "
                   "placement, weights, pinned, warnings), message (what was found), log (the record it was read from)",
    "speed": "a speed rule found a slowdown (harness.stages.speed.speed): model, message (the measure: the ratio of "
             "the medians and the Mann-Whitney U test's p, e.g. 0.53x, p 0.004)",
}


@dataclass
class Failure:
    """One structured fact of why a step failed or could not run; see :data:`FAILURE_KINDS`.

    ``repeat`` counts runs of one generation from 1; ``signal`` is a name such as SIGSEGV;
    ``log`` is relative to the run directory; ``program`` the program that ran (``llama-completion``,
    ``llama-harness-engine``).  Unused fields stay empty.
    """

    kind: str
    model: str = ""
    prompt: str = ""
    repeat: int = 0
    status: str = ""
    signal: str = ""
    error_line: str = ""
    patch: str = ""
    build: str = ""
    message: str = ""
    log: str = ""
    program: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {self.kind!r} not in {tuple(FAILURE_KINDS)}")

    def text(self) -> str:
        """The fact in one line for a step's ``detail``."""
        if self.kind == "generation":
            return " ".join(x for x in (f"{self.model}/{self.prompt}: {self.status}", self.signal, self.error_line) if x)
        if self.kind == "model":
            return f"error: model {self.model}: {self.message}"
        if self.kind == "blocked":
            return f"error: build {self.build} did not pass"
        if self.kind == "patch":
            return f"patch {self.patch} does not apply: {self.message.splitlines()[0] if self.message else ''}".rstrip(": ")
        if self.kind == "compare":
            return f"compare {self.model}/{self.prompt}: {self.message}"
        if self.kind == "expectation":
            return f"{self.status}: {self.model}: {self.message}"
        return self.message

    def measure(self) -> str:
        """What was found, for a verdict's why (harness.record.verdict.step_verdict), from the fact's own fields:
        ``llama-completion SIGABRT on umlaut-newline`` (a generation), ``mapped: 223 MiB of private page copies``
        (an expectation: its rule and what was found), ``0.53x, p 0.004`` (a speed rule), ``patch X does not
        apply``, ``build fork did not pass``; the first line of the message otherwise."""
        if self.kind == "generation":
            what = self.signal or self.status
            if self.program:
                return f"{self.program} {what} on {self.prompt}"
            return f"{self.status}{f' {self.signal}' if self.signal else ''} on {self.model}/{self.prompt}"
        if self.kind == "expectation":
            return f"{self.status}: {self.message}"
        if self.kind == "patch":
            return f"patch {self.patch} does not apply"
        if self.kind in ("model", "blocked", "compare"):
            return self.text()
        return self.message.splitlines()[0] if self.message else self.kind

    @classmethod
    def from_json(cls, data: dict) -> "Failure":
        """A Failure from its summary.json form (unknown keys, from newer harnesses, are dropped)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


#: How record format 1 wrote failure facts into a step's detail (see legacy_failures).
_LEGACY_GENERATION = re.compile(r"^(?P<model>[^/\s:]+)/(?P<prompt>[^:\s]+): (?P<status>crashed|timeout)"
                                r"(?: (?P<signal>SIG[A-Z0-9]+|signal \d+))?(?: +(?P<line>.*))?$")
_LEGACY_BLOCKED = (re.compile(r"build (?P<v>[\w, -]+?) did not pass"), re.compile(r"^(?P<v>\w+) build (?:failed|error)"))
_LEGACY_MODEL = re.compile(r"^error: model (?P<model>[^:\s]+): (?P<message>.*)$", re.S)


def legacy_failures(step: str, detail: str) -> list[Failure]:
    """The failure facts of a record-format-1 step, recovered from its ``detail`` text.

    Format 1 joined generation problems with ``"; "`` (``model/prompt: status [signal]
    [error line]``, cut at 500 characters), wrote ``error: build X did not pass`` for a
    blocked step and ``X build failed: ...`` for a test step skipped after a failed build.
    Parts it cannot read become ``exception`` facts holding the text.  Used only for
    entries that have no ``failures`` key.
    """
    out: list[Failure] = []
    if not detail:
        return out
    for m in _LEGACY_BLOCKED:
        found = m.search(detail)
        if found:
            return [Failure("blocked", build=v.strip()) for v in found.group("v").split(",") if v.strip()]
    if step != "generate":
        return out
    for part in (p.strip() for p in detail.split("; ")):
        if not part or part == "all generations ran":
            continue
        g = _LEGACY_GENERATION.match(part)
        mo = _LEGACY_MODEL.match(part)
        if g:
            out.append(Failure("generation", model=g.group("model"), prompt=g.group("prompt"),
                               status=g.group("status"), signal=g.group("signal") or "", error_line=g.group("line") or ""))
        elif mo:
            out.append(Failure("model", model=mo.group("model"), message=mo.group("message")))
        else:
            out.append(Failure("exception", message=part))
    return out


# --------------------------------------------------------------------------- records


@dataclass
class StepRecord:
    """One step of one configuration: ``status`` is one of :data:`STEP`.

    ``seconds`` is wall time; ``detail`` is a line for people (never parsed); ``log`` is the
    step's main log relative to the run directory; ``failures`` are the structured facts of
    a failed, errored or blocked step (empty when it passed); ``up_to_date`` is True for a
    build that found nothing to do (its time says nothing about the build).  ``cached`` names the
    run(s) whose results the step took from the result cache (docs/cache.md): a test step whose
    labels were all reused, a compile step reused, a generate step whose sessions were restored
    ("" when it ran).
    """

    platform: str
    config: str
    step: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    log: str = ""
    failures: list[Failure] = field(default_factory=list)
    up_to_date: bool = False
    cached: str = ""

    def __post_init__(self) -> None:
        STEP.check(self.status)
        self.failures = [f if isinstance(f, Failure) else Failure.from_json(f) for f in self.failures]

    @classmethod
    def from_json(cls, data: dict) -> "StepRecord":
        """A StepRecord from a summary.json ``configurations`` entry of any record format.

        An entry without ``failures`` (format 1) gets them from :func:`legacy_failures`.
        Raises ValueError for a status not declared in :data:`STEP` or missing identity keys.
        """
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "failures" not in data:
            values["failures"] = legacy_failures(str(data.get("step", "")), str(data.get("detail") or ""))
        if "up_to_date" not in data:  # format 1 said so only in the detail
            values["up_to_date"] = str(data.get("detail") or "").startswith("up to date")
        try:
            return cls(**values)
        except TypeError as exc:
            raise ValueError(f"step record {data!r}: {exc}") from None

    def verdict(self) -> RowVerdict:
        """Whether this step passes, fails or was not run: its status's declared outcome
        (harness.record.verdict.step_verdict)."""
        return step_verdict(self)

    def blocked_by(self) -> list[str]:
        """The build variants whose failure kept this step from running."""
        return [f.build for f in self.failures if f.kind == "blocked"]


@dataclass
class ComparisonRecord:
    """One prompt of one comparison group: ``status`` is one of :data:`COMPARISON`.

    ``first_divergence`` is None or {index, reference, candidate, near_tie, near_tie_margin}
    where index counts generated tokens from 0 and each side is None (that side reached
    n_predict there) or {id, piece, piece_hex, eog, margin, top} (margin and logits in nats).
    ``kl`` is None or {positions, mean, max, max_at, top1_agreement}: KL(reference || candidate)
    teacher-forced on the reference's tokens.  ``text_check`` is None or {status
    (identical/differs/incomplete), first_differing_byte, reference_bytes, candidate_bytes}
    for the llama-completion texts.  ``kl_mean_max`` is the group's KL threshold (nats).
    ``expected`` is the group's expected status: ``identical``; ``diverged`` for a control
    group whose candidate changes numerics on purpose (only a divergence passes); ``near-tie``
    for builds of different compilers or OSes (identical, or diverged at a near tie with the
    KL divergence within its threshold, passes).  :meth:`verdict` decides (harness.record.verdict).
    ``cached`` maps each side (the reference's label, the candidate's config) whose generations came from the
    result cache to the run that generated them (docs/cache.md); empty when both sides generated in this run.
    """

    platform: str
    group: str
    model: str
    prompt: str
    reference: str
    candidate: str
    status: str
    first_divergence: dict | None = None
    detail: str = ""
    nondeterministic: list[str] = field(default_factory=list)
    kl: dict | None = None
    text_check: dict | None = None
    kl_mean_max: float | None = None
    expected: str = IDENTICAL
    cached: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        COMPARISON.check(self.status)

    @classmethod
    def from_json(cls, data: dict) -> "ComparisonRecord":
        """A ComparisonRecord from a summary.json ``comparisons`` entry (unknown keys dropped)."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ValueError(f"comparison record {data!r}: {exc}") from None

    def difference(self) -> str:
        """What differs, for people: the first divergent token (``describe_divergence_record``) and a
        llama-completion byte difference, else the detail of a comparison that is not a success, else ''."""
        text = describe_divergence_record(self.first_divergence) if self.first_divergence else ""
        if not text and not COMPARISON[self.status].success:
            text = self.detail
        tc = self.text_check or {}
        if tc.get("status") == "differs":
            text += f"; llama-completion texts differ at byte {tc.get('first_differing_byte')}"
        return text

    def verdict(self) -> RowVerdict:
        """Whether this comparison passes, fails or was not run, and why: its status judged against its group's
        ``expected`` (harness.record.verdict.comparison_verdict, the one place that decides)."""
        return comparison_verdict(self)

    def failed(self) -> bool:
        """True when this comparison fails the run (:meth:`verdict`)."""
        return self.verdict().fails

    def tolerated_near_tie(self) -> bool:
        """True for a divergence that a ``near-tie`` group accepts (harness.record.verdict.tolerated_near_tie)."""
        return tolerated_near_tie(self)

    def key(self) -> tuple[str, str, str, str, str, str]:
        """(platform, group, model, prompt, reference, candidate): what identifies it across runs."""
        return (self.platform, self.group, self.model, self.prompt, self.reference, self.candidate)


# --------------------------------------------------------------------------- layout

#: The files of a native-test directory (:meth:`RunLayout.tests`), by what they hold: ctest's log, the JUnit
#: XML, the typed test run (harness.stages.native_tests.native_tests.TestRun), the sanitizer's summary and the GPU
#: facts the tests logged (harness.record.gpu).  The native tests write them into any directory (a bisect's
#: too), so they are named here once for every writer and reader.


def describe_divergence_record(d: dict) -> str:
    """A first_divergence record in one line: index, near tie or hard, both sides' pieces and margins."""
    def side(t: dict | None) -> str:
        if t is None:
            return "end of output"
        what = "end of generation" if t.get("eog") else repr(t.get("piece"))
        margin = f", margin {t['margin']:.3g}" if isinstance(t.get("margin"), (int, float)) else ""
        return f"{what} (id {t.get('id')}{margin})"
    kind = "" if "near_tie" not in d else (" (near tie)" if d["near_tie"] else " (hard)")
    return f"#{d.get('index')}{kind}: {side(d.get('reference'))} vs {side(d.get('candidate'))}"
