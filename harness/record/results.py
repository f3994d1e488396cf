"""Stage 6: the run record, the one contract between the stages and the analysis tools.

Everything a run knows is declared here once:

* :class:`RunLayout`: every path of a run directory (the stages write there, signatures,
  triage and report read there; nothing else builds a results path by hand)::

    results/<run-id>/
        run.json                      run id, command line, times, platforms
        summary.json  summary.md      every step and every comparison
        signatures.json  report.html  written after the stages (harness.analysis.signatures, harness.analysis.report)
        forecast.json  forecast.md    an upstream forecast's patches, stages and verdict (harness.analysis.forecast)
        <platform>/
            environment.json          OS, compilers, CUDA, GPU, RAM, base commit, patches
            build-base/ build-fork/   configure.log, build.log (+ .rc files), patches.log, error.log
            tests/ tests-<tool>/      ctest.log, junit.xml, tests.json (tests-<tool>: under compute-sanitizer)
            models/<model>.json       path and summary of each model used
            tokenize/                 llama-tokenize runs of the comparisons
            speed/                    bench.json (tok/s samples, rule verdicts, machine), <rule>.log, engine stderr
            <config>/                 config.json, gen/<model>/<prompt>.r<k>.{stdout,stderr,cmd}, compare.json,
                                      expectations.json and .log (harness.stages.checks.expectations),
                                      reloads.json and .log (harness.stages.checks.reloads)
    results/latest -> <run-id>
    results/junit/                    JUnit XML of the latest comparisons (a stable path for CI)

* the statuses of steps and comparisons and the run's verdicts (:data:`STEP`,
  :data:`COMPARISON`, :data:`VERDICT`), each with what it means and whether it is a failure,
  as LLVM lit declares its result codes.  A new status is one line in one of those tuples;
  the summary, the report, triage and signatures take it from there;
* :class:`Failure`: the structured facts of why a step failed (model, prompt, status,
  signal, error line, the patch that did not apply, the build that blocked the step),
  written where the failure happens.  Readers use these fields; a step's ``detail`` is for
  people only.

No run overwrites another: run ids are UTC timestamps plus a random suffix and
the directory is created exclusively.  The summary is rewritten after every
step, so a run that dies keeps everything it collected.

Longer than 400 lines: the record's contract is read as one: the layout, the statuses, the step and
comparison records and their failure facts are what summary.json holds, and the summary's writer and readers
use all of them; the records of one stage each are modules of their own (bench.py, probe.py,
expectations.py, junit.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from ..common.errors import InputError
from ..common.fs import describe, writable_dir, write_text_whole
from ..common.locks import RunLock
from .review import review_lines
from .run_id import new_run_id
from .verdict import (ICONS, RowVerdict, comparison_verdict, count_text, failing_names, failures_first, judge,
                      step_verdict, tolerated_near_tie)
# the statuses are declared in harness.record.statuses; the record's readers import them from here too
from .statuses import (
    Status as Status, StatusSet as StatusSet, STEP as STEP, COMPARISON as COMPARISON, VERDICT as VERDICT,
    KILLED as KILLED, PATCH as PATCH, VERDICT_EXIT_CODES as VERDICT_EXIT_CODES, STEP_STATUSES as STEP_STATUSES,
    COMPARISON_STATUSES as COMPARISON_STATUSES, STEP_PASSED as STEP_PASSED, STEP_FAILED as STEP_FAILED,
    STEP_ERROR as STEP_ERROR, STEP_SKIPPED as STEP_SKIPPED, STEP_INTERRUPTED as STEP_INTERRUPTED,
    STEP_INCOMPLETE as STEP_INCOMPLETE,
    IDENTICAL as IDENTICAL, DIVERGED as DIVERGED, CRASHED as CRASHED, TIMEOUT as TIMEOUT,
    UNSUPPORTED_UPSTREAM as UNSUPPORTED_UPSTREAM, GENERATION_FAILURES as GENERATION_FAILURES)

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
    "generation": "a generation run ended abnormally: model, prompt, repeat, status, signal, error_line, log",
    "model": "a model could not be assembled, generated or verified: model, message",
    "blocked": "the step could not run because a build it needs did not pass: build (the variant)",
    "patch": "a patch of the series did not apply: patch (its file name), message",
    "compare": "a comparison could not be made (e.g. tokenizing failed): model, prompt, message",
    "exception": "the step stopped with an error: message (exception type and text)",
    "expectation": "a configuration did not do what it must (harness.stages.checks.expectations): model, status (the rule: "
                   "placement, weights, pinned, warnings), message (what was found), log (the record it was read from)",
}


@dataclass
class Failure:
    """One structured fact of why a step failed or could not run; see :data:`FAILURE_KINDS`.

    ``repeat`` counts runs of one generation from 1; ``signal`` is a name such as SIGSEGV;
    ``log`` is relative to the run directory.  Unused fields stay empty.
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
TESTS_FILES = {"log": "ctest.log", "junit": "junit.xml", "run": "tests.json", "sanitizer": "sanitizer.json",
               "gpu_facts": "gpu-facts.json"}


#: The files of a compile step's log directory (:meth:`RunLayout.compile_logs`) beside its configure and build
#: logs: the step's record (the plan, the unity groups, the targets linked, the times;
#: harness.stages.building.cuda_compile.compile_tree, which writes it into any directory) and the CUDA toolkit the
#: step used (harness.stages.building.compile_stage).
COMPILE_FILES = {"record": "compile.json", "toolkit": "toolkit.json"}


#: The logs of a build step's log directory (:meth:`RunLayout.build_logs`, :meth:`RunLayout.compile_logs`), by
#: what they hold: the configure and build commands' output (each with a ``.rc`` file beside it holding the exit
#: code), the patch series' application (harness.stages.building.source) and the error of a build that could not
#: run.  The builds write them into any directory (a bisect's and a forecast's too), so they are named here once.
BUILD_FILES = {"configure": "configure.log", "build": "build.log", "patches": "patches.log", "error": "error.log"}


#: The records of one model load beside its stderr under ``gen/<model>/`` (a generation ``<prompt>.r<k>`` or the
#: engine's load ``engine``; :meth:`RunLayout.load_file`), by what they hold: its command line as JSON, the
#: buffers llama logged (harness.record.gpu.buffer_placement) and the pin-ladder lines (harness.record.gpu
#: .parse_ladder_lines); read by harness.record.loads.
LOAD_FILES = {"cmd": ".cmd", "placement": ".placement.json", "pin_ladder": ".pin-ladder.json"}


@dataclass(frozen=True)
class RunLayout:
    """Every path of the run directory ``dir`` (see the module docstring); creates nothing.

    ``results_root(dir)`` is the directory holding the runs.
    """

    dir: Path

    #: The summary's file name, for code that finds runs by it (:func:`harness.record.summary.run_dirs_under`).
    SUMMARY_NAME: ClassVar[str] = "summary.json"

    @property
    def run_json(self) -> Path:
        """``run.json``: id, start time, command lines."""
        return self.dir / "run.json"

    @property
    def summary_json(self) -> Path:
        """``summary.json``: every step and comparison record."""
        return self.dir / self.SUMMARY_NAME

    @property
    def summary_md(self) -> Path:
        """``summary.md``: the same as Markdown tables."""
        return self.dir / "summary.md"

    @property
    def signatures_json(self) -> Path:
        """``signatures.json``: harness.analysis.signatures.classify_run's output."""
        return self.dir / "signatures.json"

    @property
    def report_html(self) -> Path:
        """``report.html``: harness.analysis.report's page."""
        return self.dir / "report.html"

    def platform(self, platform: str) -> Path:
        """``<platform>/``."""
        return self.dir / platform

    def environment_json(self, platform: str) -> Path:
        """``<platform>/environment.json``."""
        return self.platform(platform) / "environment.json"

    def build_logs(self, platform: str, variant: str) -> Path:
        """``<platform>/build-<variant>/``: configure.log, build.log, .rc files, patches.log, error.log."""
        return self.platform(platform) / f"build-{variant}"

    def compile_logs(self, platform: str, variant: str) -> Path:
        """``<platform>/compile-<variant>/``: the compile step of a CUDA platform without a GPU
        (harness.stages.building.cuda_compile): configure.log, build.log, .rc files and :data:`COMPILE_FILES`."""
        return self.platform(platform) / f"compile-{variant}"

    def compile_file(self, platform: str, variant: str, name: str) -> Path:
        """The file ``name`` (a key of :data:`COMPILE_FILES`) of the compile step's log directory of ``variant``."""
        return self.compile_logs(platform, variant) / COMPILE_FILES[name]

    @staticmethod
    def test_step(tool: str | None = None) -> str:
        """The step name of the native tests: ``test``, or ``test-<tool>`` under compute-sanitizer."""
        return f"test-{tool}" if tool else "test"

    @staticmethod
    def is_test_step(step: str) -> bool:
        """True for ``test`` and ``test-<tool>``."""
        return step == "test" or step.startswith("test-")

    def tests(self, platform: str, step: str = "test") -> Path:
        """``<platform>/tests/`` for step ``test``, ``<platform>/tests-<tool>/`` for ``test-<tool>``; its files are
        named by :data:`TESTS_FILES`."""
        return self.platform(platform) / ("tests" + step[len("test"):])

    def tests_file(self, platform: str, step: str, name: str) -> Path:
        """The file ``name`` (a key of :data:`TESTS_FILES`) of the native-test directory of ``step``."""
        return self.tests(platform, step) / TESTS_FILES[name]

    def placement_json(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/placement.json``: model -> where the buffers of the config's first generation
        landed (from its stderr, harness.record.gpu.buffer_placement)."""
        return self.config(platform, config) / "placement.json"

    def compare_timing_json(self, platform: str) -> Path:
        """``<platform>/compare-timing.json``: where the comparisons' time went (harness.stages.outputs.greedy)."""
        return self.platform(platform) / "compare-timing.json"

    def config(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/``."""
        return self.platform(platform) / config

    def config_json(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/config.json``."""
        return self.config(platform, config) / "config.json"

    def expectations_json(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/expectations.json``: the expectations check's record (harness.record.expectations)."""
        return self.config(platform, config) / "expectations.json"

    def expectations_log(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/expectations.log``: the same check's findings as lines, and its status."""
        return self.config(platform, config) / "expectations.log"

    def reloads_json(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/reloads.json``: the reloads check's findings per model (harness.stages.checks.reloads,
        read by harness.record.reloads.read_reload_check)."""
        return self.config(platform, config) / "reloads.json"

    def reloads_log(self, platform: str, config: str) -> Path:
        """``<platform>/<config>/reloads.log``: the same check's findings as lines, and its status."""
        return self.config(platform, config) / "reloads.log"

    def gen_dir(self, platform: str, config: str, model: str | None = None) -> Path:
        """``<platform>/<config>/gen/`` (``.../gen/<model>/`` with ``model``)."""
        d = self.config(platform, config) / "gen"
        return d / model if model else d

    def generation(self, platform: str, config: str, model: str, prompt: str, repeat: int) -> Path:
        """The path prefix of one generation run: ``.../gen/<model>/<prompt>.r<repeat>``; add
        ``.stdout``, ``.stderr``, ``.cmd``, ``.pin-ladder.json`` or ``.placement.json``."""
        return self.gen_dir(platform, config, model) / f"{prompt}.r{repeat}"

    def load_file(self, platform: str, config: str, model: str, stem: str, name: str) -> Path:
        """The record ``name`` (a key of :data:`LOAD_FILES`) of the load ``stem`` (``engine``, ``<prompt>.r<k>``)
        of ``model``: ``.../gen/<model>/<stem><suffix>``."""
        return self.gen_dir(platform, config, model) / (stem + LOAD_FILES[name])

    @staticmethod
    def beside(prefix: Path, name: str) -> Path:
        """The record ``name`` (a key of :data:`LOAD_FILES`) of the load whose path prefix is ``prefix``
        (:meth:`generation`'s, or ``gen/<model>/engine``)."""
        return prefix.with_name(prefix.name + LOAD_FILES[name])

    def all_load_files(self, name: str) -> Iterator[tuple[str, str, str, str, Path]]:
        """Every record ``name`` (a key of :data:`LOAD_FILES`) of the run, the engine's loads included:
        (platform, config, model, stem, path), sorted by path."""
        return self._gen_files("*", LOAD_FILES[name])

    def _gen_files(self, stems: str, suffix: str) -> Iterator[tuple[str, str, str, str, Path]]:
        """The files ``<stems><suffix>`` (a glob) under every ``<platform>/<config>/gen/<model>/``:
        (platform, config, model, stem, path), sorted by path."""
        for path in sorted(self.dir.glob(f"*/*/gen/*/{stems}{suffix}")):
            yield (path.parents[3].name, path.parents[2].name, path.parent.name, path.name[:-len(suffix)], path)

    def generation_files(self, platform: str, config: str, suffix: str, model: str | None = None,
                         prompt: str | None = None) -> list[Path]:
        """Existing generation files of one configuration with ``suffix`` (e.g. ``.stderr``), sorted;
        only ``model`` and/or ``prompt`` when given."""
        d = self.gen_dir(platform, config)
        if not d.is_dir():
            return []
        return sorted(d.glob(f"{model or '*'}/{prompt or '*'}.r*{suffix}"))

    def load_logs(self, platform: str, config: str) -> list[tuple[str, str, Path]]:
        """Every stderr of a process of one configuration that loaded a model, sorted: (model, stem, path)
        for ``gen/<model>/engine.stderr`` (stem ``engine``) and ``gen/<model>/<prompt>.r<k>.stderr``;
        their parsed records are ``<stem>.placement.json`` and ``<stem>.pin-ladder.json`` beside them."""
        d = self.gen_dir(platform, config)
        if not d.is_dir():
            return []
        return [(path.parent.name, path.name[:-len(".stderr")], path) for path in sorted(d.glob("*/*.stderr"))]

    def all_generation_files(self, suffix: str) -> Iterator[tuple[str, str, str, str, Path]]:
        """Every generation file of the run with ``suffix``: (platform, config, model, stem, path),
        sorted; ``stem`` is ``<prompt>.r<k>``."""
        return self._gen_files("*.r*", suffix)

    @property
    def forecast_json(self) -> Path:
        """``forecast.json``: an upstream forecast's patches, stages and verdict (harness.analysis.forecast)."""
        return self.dir / "forecast.json"

    @property
    def forecast_md(self) -> Path:
        """``forecast.md``: the same for people."""
        return self.dir / "forecast.md"

    def speed(self, platform: str) -> Path:
        """``<platform>/speed/``: the speed stage's bench.json, one log per speed rule and the engines' stderr
        (harness.stages.speed.speed)."""
        return self.platform(platform) / "speed"

    def bench_json(self, platform: str) -> Path:
        """``<platform>/speed/bench.json``: the speed stage's record (harness.record.bench)."""
        return self.speed(platform) / "bench.json"

    def compare_json(self, platform: str, config: str) -> Path:
        """``<platform>/<candidate>/compare.json``: the full comparison records of a candidate."""
        return self.config(platform, config) / "compare.json"

    def model_json(self, platform: str, model: str) -> Path:
        """``<platform>/models/<model>.json``."""
        return self.platform(platform) / "models" / f"{model}.json"

    def tokenize_dir(self, platform: str) -> Path:
        """``<platform>/tokenize/``."""
        return self.platform(platform) / "tokenize"

    def relative(self, path: Path) -> str:
        """``path`` relative to the run directory when it is inside it, else as given."""
        return str(path.relative_to(self.dir)) if path.is_relative_to(self.dir) else str(path)


def junit_dir(results_root: Path) -> Path:
    """``<results>/junit/``: JUnit XML at a path that does not change from run to run."""
    return results_root / "junit"


def read_record_json(path: Path, missing: str) -> Any:
    """The parsed JSON of the run file at ``path``, for the typed readers of harness.record.  Raises
    FileNotFoundError naming the file followed by ``missing`` (why a run may have none) when there is none, and
    :class:`RecordError` naming it when it cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {missing}") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: cannot be read as JSON ({exc})", f"cannot be read ({exc})") from None


def read_summary(run_dir: Path) -> dict:
    """The parsed summary.json of ``run_dir``.

    Raises FileNotFoundError (naming the file) when there is none and :class:`RecordError`
    when it is not JSON or was written by a newer record format than :data:`RECORD_VERSION`.
    """
    path = RunLayout(run_dir).summary_json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no summary.json; is {run_dir} a results run directory?") from None
    except ValueError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a summary object")
    version = data.get("record_version", 1)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise RecordError(f"{path}: record format {version!r} is newer than this harness reads ({RECORD_VERSION}); "
                          "update the harness")
    try:
        return settle_dead_progress(data, run_dir)
    except (TypeError, ValueError, KeyError) as exc:
        raise RecordError(f"{path}: its in_progress record cannot be read ({exc})") from None


def progress_alive(progress: Mapping[str, Any], run_dir: Path) -> bool:
    """Whether the harness process that wrote ``progress`` (a summary's ``in_progress``) still runs the run
    ``run_dir``: it is this process, or it is the run's live owner (``.owner``, harness.common.locks.RunLock).
    A pid of the record that is dead, or that no longer owns the run, is a process that died mid-way."""
    pid = progress.get("pid")
    return pid == os.getpid() or (pid is not None and RunLock.live_owner(run_dir) == pid)


def settle_dead_progress(data: dict, run_dir: Path) -> dict:
    """``data`` (a parsed summary.json of ``run_dir``) as it reads once its harness process is known to be dead.

    A summary whose ``in_progress`` names a process that no longer runs the run
    (:func:`progress_alive`) was left by a harness killed mid-way (SIGKILL, a crash, the machine
    stopped): its steps in progress become ``interrupted``, its command and the stages it had not
    reached are listed in ``incomplete`` as :data:`KILLED`, ``in_progress`` is dropped and the
    verdict is computed again (``failed`` when a failure was recorded before, else ``incomplete``).
    Any other summary is returned as it is.  Raises KeyError, TypeError or ValueError for a
    malformed ``in_progress``.
    """
    progress = data.get("in_progress")
    if not progress or progress_alive(progress, run_dir):
        return data
    why = f"{KILLED} (harness process {progress['pid']} ended before its command did)"
    steps = [StepRecord.from_json(s) for s in data.get("configurations", [])]
    by_key = {(s.platform, s.config, s.step): i for i, s in enumerate(steps)}
    incomplete = list(data.get("incomplete", []))
    for platform, config, step, recheck in progress.get("doing", []):
        steps_at = by_key.get((platform, config, step))
        if recheck and steps_at is not None and steps[steps_at].status == "passed":
            continue  # a build found up to date again: its record stands (harness.record.progress.Doing)
        record = StepRecord(platform, config, step, "interrupted", 0.0, f"{why}; did not finish")
        if steps_at is None:
            steps.append(record)
        else:
            steps[steps_at] = record
        incomplete.append(f"{platform}: {step} {config}: {KILLED}; did not finish")
    incomplete.append(f"{progress.get('command', '?')}: {why}; did not finish")
    incomplete += [f"{stage}: not run ({KILLED})" for stage in progress.get("to_run", [])]
    comparisons = [ComparisonRecord.from_json(c) for c in data.get("comparisons", [])]
    failed = any(STEP.is_failure(s.status) for s in steps) or any(c.failed() for c in comparisons)
    out = {k: v for k, v in data.items() if k != "in_progress"}
    out.update(configurations=[judged_json(s) for s in steps], incomplete=incomplete, interrupted="killed",
               overall="failed" if failed else "incomplete")
    return out


def load_records(run_dir: Path) -> tuple[list[StepRecord], list[ComparisonRecord], dict]:
    """The step and comparison records of ``run_dir`` (any record format) and the raw summary.

    Raises what :func:`read_summary` raises, and RecordError naming the file for an entry
    with an undeclared status.
    """
    data = read_summary(run_dir)
    try:
        steps = [StepRecord.from_json(s) for s in data.get("configurations", [])]
        comparisons = [ComparisonRecord.from_json(c) for c in data.get("comparisons", [])]
    except ValueError as exc:
        raise RecordError(f"{RunLayout(run_dir).summary_json}: {exc}") from None
    return steps, comparisons, data


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    return obj


def judged_json(record: StepRecord | ComparisonRecord) -> dict:
    """A step or comparison record as summary.json holds it: its fields, and beside its status its ``verdict``
    (passes, fails, not run) and ``why`` (harness.record.verdict), for readers of the JSON; this harness's
    readers judge the record again from its status and drop the two keys."""
    v = record.verdict()
    return {**_jsonable(record), "verdict": v.verdict, "why": v.why}


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` (dataclasses, paths and bytes allowed) as indented UTF-8 JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(_jsonable(data), indent=2, ensure_ascii=False) + "\n")


#: A run id: a plain name (a folder of the results directory, never a path), as new_run_id makes them.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: Names of the results directory that are not runs.
RESERVED_RUN_IDS = frozenset({"latest", "junit", "LATEST"})


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is a plain name (:data:`RUN_ID`, not ``..`` and not one of :data:`RESERVED_RUN_IDS`);
    raises InputError naming it otherwise (``--run-id ../../x`` would write outside the results directory)."""
    if not RUN_ID.fullmatch(run_id) or ".." in run_id or run_id in RESERVED_RUN_IDS:
        raise InputError(f"run id {run_id!r} (--run-id or HARNESS_RUN_ID) is not a plain name: use letters, digits, "
                         "'.', '_' and '-' (no '/' and no '..'), not 'latest' or 'junit'; it names a folder of the "
                         "results directory")
    return run_id


#: Space a run holds back while it runs (``<run>/.reserve``, removed by Run.close): when the disk
#: fills up, giving it up lets the summary still be written (a summary of 16 comparisons is ~20 KiB).
RESERVE_BYTES = 256 * 1024
RESERVE_NAME = ".reserve"


class Run:
    """An open results directory; records steps and comparisons and keeps the summary current."""

    def __init__(self, root: Path, run_id: str, *, create: bool = True, argv: Iterable[str] = ()):
        self.root = root
        self.id = run_id
        self.dir = root / run_id
        self.layout = RunLayout(self.dir)
        self.steps: list[StepRecord] = []
        self.comparisons: list[ComparisonRecord] = []
        self.skipped_platforms: dict[str, str] = {}
        self.incomplete: list[str] = []
        self.cache: dict[str, dict[str, int]] = {}  # result cache events per kind (harness.record.cache.EVENTS)
        self.progress: dict[str, Any] | None = None  # while a command runs: see begin()
        self.interrupted = ""  # "killed": a harness process died while it ran the run (settle_dead_progress)
        self.commands: list[str] = []  # the stage commands begun in this run, by any of its processes (begin)
        self._lock: RunLock | None = None
        self._records = threading.RLock()  # steps, comparisons and the summary files, from any thread
        now = datetime.now(timezone.utc).isoformat()
        if create:
            writable_dir(root, "results directory")
        if create and not self.dir.exists():
            self.dir.mkdir(parents=True, exist_ok=False)
            self._own()
            write_json(self.layout.run_json, {"run_id": run_id, "started": now,
                                               "commands": [{"argv": list(argv), "started": now}]})
            self._point_latest()
        elif self.dir.exists():
            if create:
                self._own()
            if self.layout.summary_json.exists():
                self._load()
            if create and self.layout.run_json.exists():
                # a later stage continues the run (HARNESS_RUN_ID or --run-id): record its command too
                info = json.loads(self.layout.run_json.read_text(encoding="utf-8"))
                info.setdefault("commands", []).append({"argv": list(argv), "started": now})
                write_json(self.layout.run_json, info)

    def _own(self) -> None:
        """Hold the run directory for this process (harness.common.locks.RunLock; raises RunInUse when taken)
        and set RESERVE_BYTES aside in it, for the summary of a run that fills the disk."""
        self._lock = RunLock(self.dir)
        self._lock.acquire()
        reserve = self.dir / RESERVE_NAME
        with open(reserve, "wb") as fh:
            fh.write(bytes(RESERVE_BYTES))

    def close(self) -> None:
        """Give the run directory and its reserve up (a later process may continue the run)."""
        (self.dir / RESERVE_NAME).unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @classmethod
    def open(cls, root: Path, run_id: str | None = None, argv: Iterable[str] = ()) -> "Run":
        """Open run ``run_id`` under ``root`` (continuing it if it exists) or start a new one.

        Several stages of one invocation (``nox -s build test compare-outputs``)
        share a run through the HARNESS_RUN_ID environment variable, one
        process after the other: a run held by a live process is refused
        (RunInUse).  Raises EnvironmentProblem when ``root`` cannot hold runs, InputError for a run id
        that is not a plain name (:func:`check_run_id`).
        """
        run_id = run_id or os.environ.get("HARNESS_RUN_ID") or new_run_id()
        check_run_id(run_id)
        return cls(root, run_id, argv=argv)

    def _point_latest(self) -> None:
        link = self.root / "latest"
        tmp = self.root / f".latest-{self.id}"
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(self.id, target_is_directory=True)
            tmp.replace(link)
        except OSError:
            (self.root / "LATEST").write_text(self.id + "\n")

    def _load(self) -> None:
        self.steps, self.comparisons, data = load_records(self.dir)
        self.skipped_platforms = dict(data.get("skipped_platforms", {}))
        self.incomplete = list(data.get("incomplete", []))
        self.cache = {k: dict(v) for k, v in (data.get("cache") or {}).items()}
        self.interrupted = str(data.get("interrupted") or "")
        self.commands = [str(c) for c in data.get("commands") or []]
        self.progress = data.get("in_progress")

    def count_cache(self, stats: Mapping[str, Mapping[str, int]]) -> None:
        """Add one process's result cache counts (kind -> event -> n, harness.record.cache) to the run's."""
        for kind, events in stats.items():
            mine = self.cache.setdefault(kind, {})
            for event, n in events.items():
                mine[event] = mine.get(event, 0) + n

    def platform_dir(self, platform: str) -> Path:
        """``results/<run-id>/<platform>/`` (created)."""
        path = self.layout.platform(platform)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record_step(self, step: StepRecord) -> None:
        """Add or replace (same platform, config, step) a step record and rewrite the summary."""
        key = (step.platform, step.config, step.step)
        with self._records:
            for i, s in enumerate(self.steps):
                if (s.platform, s.config, s.step) == key:
                    self.steps[i] = step  # keep the table's order stable
                    break
            else:
                self.steps.append(step)
            self.write_summary()

    def step(self, platform: str, config: str, step: str) -> StepRecord | None:
        """The recorded step (platform, config, step), or None."""
        for s in self.steps:
            if (s.platform, s.config, s.step) == (platform, config, step):
                return s
        return None

    def record_comparisons(self, records: Iterable[ComparisonRecord]) -> None:
        """Add comparison records (replacing same platform/group/model/prompt/candidate) and rewrite the summary."""
        new = list(records)
        keys = {(r.platform, r.group, r.model, r.prompt, r.candidate) for r in new}
        with self._records:
            self.comparisons = [c for c in self.comparisons
                                if (c.platform, c.group, c.model, c.prompt, c.candidate) not in keys] + new
            self.write_summary()

    def mark_incomplete(self, reason: str) -> None:
        """Record that something the user asked for did not run (e.g. an explicitly selected platform was skipped)."""
        with self._records:
            if reason not in self.incomplete:
                self.incomplete.append(reason)
            self.write_summary()

    def overall(self) -> str:
        """The run's verdict.

        ``in-progress`` while a command runs (:meth:`begin` to :meth:`end`: no verdict yet); then, from the
        outcomes the statuses declare (:data:`STEP`, :data:`COMPARISON`): ``failed`` when a step has a failure
        status or a comparison fails (:meth:`ComparisonRecord.failed`, by its group's ``expect``); else
        ``incomplete`` when something explicitly asked for did not run, or a step has an unproven status
        (interrupted, or could not read what it checks); else ``skipped`` when no step has a success status and
        there is no comparison; else ``passed``.  Only ``passed`` is a success.
        """
        if self.progress is not None:
            return "in-progress"
        if any(STEP.is_failure(s.status) for s in self.steps) or any(c.failed() for c in self.comparisons):
            return "failed"
        if self.incomplete or any(s.status in STEP.unproven for s in self.steps):
            return "incomplete"
        if not any(s.status in STEP.successes for s in self.steps) and not self.comparisons:
            return "skipped"
        return "passed"

    def notes(self) -> list[str]:
        """What the verdict does not cover, in words: killed, the stages still to run, platforms skipped."""
        n = len(self.skipped_platforms)
        notes = [KILLED] if self.interrupted == "killed" else []
        if self.progress is not None:
            notes.append("to run: " + ", ".join(self.progress["to_run"]) if self.progress["to_run"]
                         else "its last stages running")
        if n:
            notes.append(f"{n} platform{'s' if n != 1 else ''} skipped")
        return notes

    def summary_view(self) -> SummaryView:
        """What summary.md shows of this run now (:func:`render_markdown`)."""
        return SummaryView(self.id, self.overall(), self.notes(), list(self.steps), list(self.comparisons),
                           list(self.incomplete), dict(self.skipped_platforms), dict(self.cache), self.layout)

    def headline(self) -> str:
        """The verdict with what it does not cover and what failed, e.g. ``failed (2 platforms skipped): p fork
        build (failed)`` (:meth:`SummaryView.headline`)."""
        return self.summary_view().headline()

    def begin(self, command: str, to_run: Iterable[str], token: str) -> None:
        """Record that this process runs ``command`` (e.g. ``build test``): the verdict is ``in-progress``
        until :meth:`end`, with the stages ``to_run`` (names, in order; :meth:`stage_started` takes each off)
        and the steps in progress (:meth:`doing`).  ``token``: what every child of the run carries in its
        environment (harness.common.proc.HOLDS_ENV), for a later run to end what a killed one left."""
        with self._records:
            self.commands += [c for c in command.split() if c not in self.commands]
            self.progress = {"pid": os.getpid(), "command": command, "to_run": list(to_run), "doing": [],
                             "token": token, "started": datetime.now(timezone.utc).isoformat()}
            self.write_summary()

    def stage_started(self, stage: str) -> None:
        """Take ``stage`` off the stages still to run of :meth:`begin` and rewrite the summary."""
        with self._records:
            if self.progress is not None and stage in self.progress["to_run"]:
                self.progress["to_run"].remove(stage)
                self.write_summary()

    def doing(self, steps: Iterable[tuple[str, str, str, bool]]) -> None:
        """Record the steps in progress, (platform, config, step, recheck) each (harness.record.progress.Doing):
        a run killed mid-way has them read as ``interrupted`` (:func:`settle_dead_progress`)."""
        with self._records:
            if self.progress is not None:
                self.progress["doing"] = [list(d) for d in steps]
                self.write_summary()

    def end(self) -> None:
        """The command ended (done, stopped or refused): drop the in-progress record, so the verdict is
        computed from the records; the caller writes the summary."""
        with self._records:
            self.progress = None

    def _write_summary_files(self) -> None:
        write_json(self.layout.summary_json, {
            "run_id": self.id, "record_version": RECORD_VERSION, "updated": datetime.now(timezone.utc).isoformat(),
            "overall": self.overall(), "commands": self.commands,
            "configurations": [judged_json(s) for s in self.steps],
            "comparisons": [judged_json(c) for c in self.comparisons],
            "skipped_platforms": self.skipped_platforms, "incomplete": self.incomplete, "cache": self.cache,
            **({"in_progress": self.progress} if self.progress is not None else {}),
            **({"interrupted": self.interrupted} if self.interrupted else {})})
        write_text_whole(self.layout.summary_md, render_markdown(self.summary_view()))

    def write_summary(self) -> None:
        """Write summary.json and summary.md for everything recorded so far, each replaced whole.

        When the disk is full the first time, the run's reserve (RESERVE_BYTES) is
        given up so that both files can still be written, saying the run is
        incomplete because the file system is full; the OSError (naming the file
        that could not be written) is then raised.  Raises OSError otherwise.
        """
        try:
            with self._records:
                self._write_summary_files()
        except OSError as exc:
            reserve = self.dir / RESERVE_NAME
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not reserve.exists():
                raise
            reserve.unlink()
            self.incomplete.append(f"stopped: the file system holding {self.dir} is full ({describe(exc)})")
            self._write_summary_files()
            raise


#: Lines of a detail a summary table cell shows, each whole (an error line cut in the middle loses what it says);
#: the rest is counted and stays in summary.json and the logs.
CELL_LINES = 6
#: Longest text a summary table cell shows (a detail of one enormous line); the full text stays in summary.json.
CELL_MAX = 2000


def _cell(text: str) -> str:
    """``text`` for one Markdown table cell: its first :data:`CELL_LINES` lines whole (whitespace collapsed, ``|``
    escaped), then how many lines more; cut at :data:`CELL_MAX` characters only where one line is that long."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    shown = " ".join(lines[:CELL_LINES])
    if len(shown) > CELL_MAX:
        shown = shown[:CELL_MAX - 1] + "…"
    elif len(lines) > CELL_LINES:
        shown += f" … ({len(lines) - CELL_LINES} more lines in summary.json)"
    return shown.replace("|", "\\|")


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


#: What the result cache's kinds count, for people.
CACHE_KINDS = {"generation": "generation sessions", "tests": "ctest labels", "compile": "compile steps",
               "speed": "speed pairs"}


def shown_as_reused(step: str) -> bool:
    """Whether ``step`` taken from the result cache is shown as ``reused`` (test and compile steps: their
    checks did not run again) rather than with its status and ``cached`` (generate steps, whose records
    are rebuilt from the stored streams)."""
    return RunLayout.is_test_step(step) or step == "compile"


def describe_cache(counts: Mapping[str, Mapping[str, int]]) -> str:
    """Result cache counts in one line: ``12 of 14 generation sessions from the cache, 2 of 2 ctest labels
    reused; 1 corrupt entry regenerated``."""
    parts, corrupt = [], 0
    for kind, events in counts.items():
        hits, misses = events.get("hits", 0), events.get("misses", 0)
        verb = "from the cache" if kind in ("generation", "speed") else "reused"
        parts.append(f"{hits} of {hits + misses} {CACHE_KINDS.get(kind, kind)} {verb}")
        corrupt += events.get("corrupt", 0)
    text = ", ".join(parts)
    return text + (f"; {corrupt} corrupt entr{'y' if corrupt == 1 else 'ies'} regenerated" if corrupt else "")


def describe_cached(cached: Mapping[str, str]) -> str:
    """Where a comparison's cached sides came from: ``cached: <run-id>`` when from one run, else per side."""
    runs = set(cached.values())
    if len(runs) == 1:
        return f"cached: {next(iter(runs))} ({', '.join(cached)})"
    return "cached: " + ", ".join(f"{side} from {run}" for side, run in cached.items())


def step_status_text(s: StepRecord) -> str:
    """A step's status for people: its icon and name, or ``reused (run …)`` for a test step taken from the
    result cache (never shown as newly passed), ``passed, cached (run …)`` for restored generations."""
    if s.cached and shown_as_reused(s.step):
        return f"♻️ reused (run {s.cached})"
    if s.cached:
        return f"{STEP.icon(s.status)}, cached (run {s.cached})"
    return STEP.icon(s.status)


@dataclass(frozen=True)
class SummaryView:
    """What summary.md is rendered from, the same for a run being recorded (:meth:`Run.summary_view`) and for a
    run read back from its summary.json (harness.record.summary.write_summary_md): ``run_id``, ``overall`` (one
    of :data:`VERDICT`), ``notes`` (what the verdict does not cover: killed, platforms skipped, stages to run),
    the records, and ``layout`` (the run directory's files, read for the table per configuration)."""

    run_id: str
    overall: str
    notes: list[str]
    steps: list[StepRecord]
    comparisons: list[ComparisonRecord]
    incomplete: list[str]
    skipped_platforms: dict[str, str]
    cache: dict[str, dict[str, int]]
    layout: RunLayout

    def headline(self) -> str:
        """The verdict, what it does not cover and what failed (harness.record.verdict.failing_names), e.g.
        ``failed (1 platform skipped): p fork build (failed)``."""
        names = failing_names(judge(self.steps, self.comparisons))
        return (self.overall + (f" ({'; '.join(self.notes)})" if self.notes else "")
                + (f": {names}" if names else ""))


def _verdict_cell(v: RowVerdict) -> str:
    """A row's verdict in a summary.md cell: its icon, the verdict and why (also why a row passes, e.g. an
    expected divergence)."""
    return f"{ICONS[v.verdict]} {v.verdict}" + (f": {v.why}" if v.why else "")


def render_markdown(view: SummaryView) -> str:
    """summary.md of ``view``: the headline (the verdict and the first failing rows by name), the rows counted
    by verdict, a steps table and a comparisons table (failing rows first, each row with its verdict from
    harness.record.verdict) and the table per configuration a reviewer reads (harness.record.review)."""
    rows = judge(view.steps, view.comparisons)
    lines = [f"# Run {view.run_id}: {VERDICT[view.overall].icon if view.overall in VERDICT else ''} "
             f"{_cell(view.headline())}", "",
             f"Steps: {count_text(rows, 'step')} · comparisons: {count_text(rows, 'comparison')}", ""]
    if view.incomplete:
        lines += ["Did not run although asked for:", ""] + [f"- {_cell(r)}" for r in view.incomplete] + [""]
    if view.skipped_platforms:
        lines += ["| platform | skipped because |", "|---|---|"]
        lines += [f"| {p} | {_cell(r)} |" for p, r in sorted(view.skipped_platforms.items())]
        lines.append("")
    if view.cache:
        lines += [f"Result cache (docs/cache.md): {describe_cache(view.cache)}", ""]
    if view.steps:
        verdicts = [s.verdict() for s in view.steps]
        lines += ["## Steps", "", "| platform | config | step | status | verdict | time | detail |",
                  "|---|---|---|---|---|---:|---|"]
        for s, v in failures_first(list(zip(view.steps, verdicts)), verdicts):
            lines.append(f"| {s.platform} | {s.config} | {s.step} | {step_status_text(s)} | {_verdict_cell(v)} "
                         f"| {s.seconds:.1f} s | {_cell(s.detail)} |")
        lines.append("")
    if view.comparisons:
        counts: dict[str, int] = {}
        for c in view.comparisons:
            counts[c.status] = counts.get(c.status, 0) + 1
        verdicts = [c.verdict() for c in view.comparisons]
        lines += ["## Greedy comparisons", "",
                  "Outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), "",
                  "| platform | group | model | prompt | reference | candidate | status | verdict "
                  "| first divergent token | KL mean / max (nats) | top-1 agree |",
                  "|---|---|---|---|---|---|---|---|---|---:|---:|"]
        for c, v in failures_first(list(zip(view.comparisons, verdicts)), verdicts):
            div = c.difference()
            if c.nondeterministic:
                div += f" (nondeterministic: {', '.join(c.nondeterministic)})"
            if c.cached:
                div += f" ({describe_cached(c.cached)})"
            kl = c.kl or {}
            kl_cell = f"{kl['mean']:.3g} / {kl['max']:.3g}" if kl else "–"
            if kl and c.kl_mean_max is not None and kl["mean"] > c.kl_mean_max:
                kl_cell += f" > {c.kl_mean_max:g}"
            agree = f"{kl['top1_agreement']:.1%}" if kl else "–"
            lines.append(f"| {c.platform} | {c.group} | {c.model} | {c.prompt} | {c.reference} | {c.candidate} "
                         f"| {c.status} | {_verdict_cell(v)} | {_cell(div)} | {kl_cell} | {agree} |")
        lines.append("")
    lines += review_lines(view.layout, view.steps, view.comparisons)
    return "\n".join(lines)
