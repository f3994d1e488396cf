"""The one shape of a stage, and the context every stage runs in.

A stage (:class:`Stage`) declares, once:

* ``name``: what it is called (the console and the docs name it);
* ``command``: the command-line stage it belongs to (:data:`COMMANDS`: ``build``, ``test``,
  ``compare-outputs``), and ``role``: the folder under ``harness/stages/`` it lives in (:data:`ROLES`);
* ``reads``: what it takes from the run (:data:`READS`), and ``writes``: what it adds (:data:`WRITES`);
* ``steps``: the steps it records, each a :class:`StepSpec`: its name (a name ending in ``:`` or ``-`` is
  a prefix: ``speed:`` for ``speed:<group>:<metric>``, ``test-`` for ``test-<tool>``), the statuses it
  may end in (the named constants of harness.common.statuses.STEP; ``interrupted`` is the run loop's,
  never declared) and what its failure is read from (:data:`EVIDENCE`, or the stage's own function that
  signs it, :attr:`StepSpec.signs`: the signatures, the logs a report shows and review ask the step's
  declaration, harness.stages.table.step_spec); the run loop
  holds what a stage records to them (harness.stages.table.undeclared);
* ``run``: a function of the :class:`Context` that does its work and returns nothing: every stage records
  each step in ``ctx.run`` as it finishes (``ctx.run.record_step``), so an interrupt keeps it, and shows its
  work as console steps (``ctx.console.step``: a start line, progress, an end line with the status, detail and
  time).  The loop cannot be the one recorder: a step may be decided deep in another stage's work (the build
  a comparison asks for, harness.stages.building.builds.Builds.build_variant);
* ``beside``: it runs in a thread of its own beside the stages after it in its command, which waits
  for it before the command ends (the CUDA compile step beside the builds).

The stages of a run, in order, are harness.stages.table.STAGES; harness.pipeline runs those of each
command in that order and handles interrupts for all of them alike.  A stage imports only
harness.kinds, harness.matrix, harness.record, harness.common, this frame and the stage rooms of its own or
an earlier floor (:data:`ROLES`); this frame imports no stage room: what it holds of the builds and the
sessions are interfaces (:class:`RunBuilds`, :class:`RunSessions`) (tests/test_imports.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..common.console import Console
from ..common.jobserver import JobBudget
from ..matrix.config import Matrix, Platform
from ..matrix.model_sources.registry import ModelStore
from ..matrix.platforms import cannot_build, cannot_run, compiles_instead
from ..matrix.selection import Selection
from ..record.cache import ResultCache
from ..record.progress import InProgress
from ..record.records import StepRecord
from ..record.run import Run
from ..common.statuses import STEP_INTERRUPTED, STEP_SKIPPED, STEP_STATUSES
from .command_names import STAGE_COMMANDS
from .options import Options

#: The command-line stages, in the order a run takes them (declared in harness.stages.command_names).
COMMANDS = tuple(STAGE_COMMANDS)

#: The folders of harness/stages/, in the order of the run: each stage lives in one.
ROLES = ("building", "native_tests", "outputs", "checks", "speed")

#: What a stage may read from the run: the loaded ``matrix``; the base ``source`` tree and the patch
#: series; the ``builds`` (harness.stages.building.builds.Builds, built on first use); the ``models``
#: (harness.matrix.model_sources.registry.ModelStore, made on first use); the ``records`` the run holds so far (its
#: steps, comparisons and files).
READS = ("matrix", "source", "builds", "models", "records")

#: What a stage may add to the run: ``builds`` (build and compile directories), ``steps`` (step
#: records), ``comparisons`` (comparison records), ``files`` (files under the run's directory).
WRITES = ("builds", "steps", "comparisons", "files")


#: What a failed step is read from, the ``evidence`` of a :class:`StepSpec`: harness.triage.signatures makes
#: a failed step's signature and finds the logs that show why by it, never by the step's name.
EVIDENCE = {
    "build-logs": "configure.log, build.log, their .rc files and error.log of the step's build directory, and "
                  "the patch that did not apply",
    "compile-logs": "the same files of the step's compile directory (a platform compiled, not run)",
    "test-logs": "tests.json, junit.xml, ctest.log and the failed tests' logs of the step's tests directory",
    "upstream-suite": "pairs.json of the platform's upstream-tests directory (the tests that pass on base and fail "
                      "on the fork) and the fork's ctest log",
    "generations": "the step's failure facts and the .stderr and .cmd files of the generations they name",
    "sanitizer-log": "the compute-sanitizer log the step names (its ``log``)",
    "expectations": "the findings of the configuration's expectations.json",
    "reloads": "the findings of the configuration's reloads.json",
    "speed-rule": "the rule's record in the platform's bench.json",
    "detail": "the step's failure facts and detail alone",
}

#: The evidence of a step whose stage signs its failures itself (:attr:`StepSpec.signs`): what it is read from is
#: the stage's own business, and harness.triage.signatures only calls the stage's function.
OWN_EVIDENCE = "own"


@dataclass(frozen=True)
class FailureSign:
    """What a stage's own reader (:attr:`StepSpec.signs`) reads of a failed step: the signature's ``kind`` (one of
    harness.triage.text_rules.KINDS), its ``key`` (stable across runs and machines: no addresses, times or
    absolute paths), a one-line ``summary`` for people and the ``evidence`` lines it was read from, as logged.
    harness.triage.signatures makes it a Signature (clipped like every other)."""

    kind: str
    key: str
    summary: str
    evidence: tuple[str, ...] = ()


#: A stage's own reader of a failed step (:attr:`StepSpec.signs`): (run directory, the step record) -> its
#: :class:`FailureSign`, or None to sign it from its failure facts and detail.
Signs = Callable[[Path, StepRecord], FailureSign | None]

#: The statuses a stage may declare: every step status but the run loop's ``interrupted``.
DECLARABLE = tuple(s for s in STEP_STATUSES if s != STEP_INTERRUPTED)


@dataclass(frozen=True)
class StepSpec:
    """One step a stage records: its ``name`` (ending in ``:`` or ``-``: a prefix), the ``statuses`` it may end
    in (named constants of harness.common.statuses), its ``evidence`` (:data:`EVIDENCE`; :data:`OWN_EVIDENCE` for a
    step that ``signs`` its failures itself) and whether it is ``timed``: its seconds measure the work itself (a
    build, a test run), so triage compares them across runs.  Raises ValueError for a status or evidence outside
    its vocabulary, or an evidence kind declared beside a reader of its own."""

    name: str
    statuses: tuple[str, ...]
    evidence: str = "detail"
    timed: bool = False
    #: the stage's own reader of a failed step of this name (:data:`Signs`); given, the step's ``evidence`` is
    #: :data:`OWN_EVIDENCE` and harness.triage.signatures needs no reader of its own for it
    signs: Signs | None = None

    def __post_init__(self) -> None:
        unknown = [s for s in self.statuses if s not in DECLARABLE]
        if unknown or not self.statuses:
            raise ValueError(f"step {self.name}: statuses {', '.join(map(repr, unknown))} not in {DECLARABLE}")
        if self.signs is not None:
            if self.evidence not in ("detail", OWN_EVIDENCE):
                raise ValueError(f"step {self.name}: evidence {self.evidence!r} and a reader of its own (signs): "
                                 f"declare one of them")
            object.__setattr__(self, "evidence", OWN_EVIDENCE)
        elif self.evidence not in EVIDENCE:
            raise ValueError(f"step {self.name}: evidence {self.evidence!r} not in {tuple(EVIDENCE)}")

    def matches(self, step: str) -> bool:
        """Whether step name ``step`` is this one (or of this prefix)."""
        return step.startswith(self.name) if self.name.endswith((":", "-")) else step == self.name


@dataclass(frozen=True)
class Stage:
    """One stage of a run (see the module docstring).  ``steps``: a :class:`StepSpec` each; a bare name stands for
    a step that may end in any of ``statuses`` and whose failure is read from its detail.  Raises ValueError when
    a declared name is outside its vocabulary (:data:`COMMANDS`, :data:`ROLES`, :data:`READS`, :data:`WRITES`,
    the step statuses, :data:`EVIDENCE`)."""

    name: str
    command: str
    role: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    steps: tuple[StepSpec, ...]
    run: Callable[["Context"], None]
    beside: bool = False
    statuses: tuple[str, ...] = ()
    #: the option of harness.stages.options.Options that asks for the stage ("" : its command alone does); a
    #: stage not asked for is not listed as to run, so a run stopped early never reads it as "not run"
    asked_by: str = ""

    def __post_init__(self) -> None:
        checks = (("command", (self.command,), COMMANDS), ("role", (self.role,), ROLES),
                  ("reads", self.reads, READS), ("writes", self.writes, WRITES),
                  ("statuses", self.statuses, DECLARABLE))
        for what, names, known in checks:
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"stage {self.name}: {what} {', '.join(map(repr, unknown))} not in {known}")
        if not self.steps:
            raise ValueError(f"stage {self.name}: declares no step")
        specs = tuple(s if isinstance(s, StepSpec) else StepSpec(s, self.statuses) for s in self.steps)
        object.__setattr__(self, "steps", specs)
        object.__setattr__(self, "statuses", tuple(dict.fromkeys(st for s in specs for st in s.statuses)))
        if self.asked_by and self.asked_by not in {f.name for f in fields(Options)}:
            raise ValueError(f"stage {self.name}: asked_by {self.asked_by!r} is not an option of Options")

    @property
    def step_names(self) -> tuple[str, ...]:
        """The names of its steps, in declaration order."""
        return tuple(s.name for s in self.steps)

    def spec(self, step: str) -> StepSpec | None:
        """The declaration of step name ``step`` (:meth:`StepSpec.matches`), None when it declares none."""
        return next((s for s in self.steps if s.matches(step)), None)

    def asked(self, opts: Options) -> bool:
        """Whether ``opts`` (harness.stages.options.Options) ask for this stage when its command runs."""
        return not self.asked_by or bool(getattr(opts, self.asked_by))

    def records(self, step: str) -> bool:
        """Whether ``step`` is one of the step names this stage declares (a declared name ending in ``:`` or ``-``
        is a prefix)."""
        return self.spec(step) is not None

    def declares(self, step: str, status: str) -> bool:
        """Whether this stage may record step ``step`` with ``status`` (``interrupted``, the run loop's, always)."""
        spec = self.spec(step)
        return spec is not None and (status in spec.statuses or status == STEP_INTERRUPTED)


class RunBuilds(Protocol):
    """What the stages ask of a run's builds through the context: harness.stages.building.builds.Builds, made by
    harness.pipeline.open_context (the frame names no stage room: the build room implements this)."""

    cache: Path
    bases: dict[str, Any]  # Any: a room's type; the frame imports no room

    def base(self) -> Any:  # Any: a room's type; the frame imports no room
        """The base tree (harness.stages.building.source.BaseTree), obtained on first use."""

    def patches(self) -> list[Any]:  # Any: a room's type; the frame imports no room
        """The patch series (harness.stages.building.patches.Patch each)."""

    def variants_for(self, p: Platform) -> list[str]:
        """The variants ``p`` builds."""

    def build_variant(self, p: Platform, variant: str) -> Any:  # Any: a room's type; the frame imports no room
        """``variant`` of ``p``, built once per process (harness.stages.building.build.BuildResult)."""

    def build_more(self, p: Platform, variant: str, targets: Sequence[str], log: Path) -> tuple[int, float]:
        """Build ``targets`` in the build directory of ``variant`` of ``p`` beside what that build declares: (ninja's
        exit status, seconds)."""

    def prepare_source(self, base: Any, work: Path, variant: str, logs: Path) -> Path:  # Any: a room's type; the frame imports no room
        """The source tree of ``variant`` under ``work``, patched where the variant is."""

    def write_environment(self, p: Platform) -> None:
        """Write ``p``'s environment.json."""

    def emulator(self, p: Platform) -> Any:  # Any: a room's type; the frame imports no room
        """The emulator that runs ``p``'s programs (harness.stages.building.cross.Emulator), None for a native one."""

    def job_budget(self) -> JobBudget:
        """The run's one job budget (harness.common.jobserver.JobBudget)."""

    def close(self) -> None:
        """Give up the build holds and the job budget."""


class RunSessions(Protocol):
    """How the stages start a configuration's programs through the context: harness.stages.outputs.sessions
    .Sessions, made by harness.pipeline.open_context (the outputs room implements this)."""

    shown: Any  # Any: a room's type; the frame imports no room
    placements: dict[str, dict[str, dict[str, dict]]]

    def hooks(self, p: Platform) -> Any:  # Any: a room's type; the frame imports no room
        """How ``p``'s configurations start their programs (harness.stages.outputs.greedy.Hooks)."""

    def session_cache(self) -> Any:  # Any: a room's type; the frame imports no room
        """The result cache's store of generation sessions (harness.stages.outputs.generation_cache.SessionCache)."""


@dataclass
class Context:
    """What every stage gets: the ``matrix``, the ``run`` (its layout and records), the ``opts``, the
    ``console`` and ``say`` (one line of progress), ``progress`` (the steps in progress, for interrupts),
    ``results_cache`` (docs/cache.md), ``builds``, ``models``, ``sessions`` (how a configuration's
    programs start), ``selection``: the platforms, groups, models and prompts the command line selects
    (harness.matrix.selection.Selection: every stage reads them there, never ``opts``) and ``generated``:
    platform -> the configurations that generated there in this process, in the order of their generate
    steps (written by the comparisons, read by the checks).

    Made by harness.pipeline.open_context, which knows the rooms that implement ``builds`` (:class:`RunBuilds`)
    and ``sessions`` (:class:`RunSessions`); :meth:`close` gives up what it holds.
    """

    matrix: Matrix
    run: Run
    opts: Options
    console: Console
    say: Callable[[str], None]
    progress: InProgress
    results_cache: ResultCache
    builds: RunBuilds
    models: ModelStore
    sessions: RunSessions
    selection: Selection
    generated: dict[str, list[str]] = field(default_factory=dict)

    def close(self) -> None:
        """The run is over: give up the build holds and the job budget (harness.stages.building.builds.Builds.close)."""
        self.builds.close()

    def doing(self, platform: str, config: str, step: str) -> AbstractContextManager[None]:
        """Mark (platform, config, step) as in progress for the block (harness.record.progress.InProgress)."""
        return self.progress.doing(platform, config, step)

    def build_variant(self, p: Platform, variant: str) -> Any:  # Any: a room's type; the frame imports no room
        """``variant`` of ``p``, built once per process (harness.stages.building.builds.Builds.build_variant)."""
        return self.builds.build_variant(p, variant)

    def emulator(self, p: Platform) -> Any:  # Any: a room's type; the frame imports no room
        """The emulator that runs ``p``'s programs, None for a native platform; RuntimeError when it is missing."""
        return self.builds.emulator(p)

    def model_path(self, name: str) -> Path:
        """Path of model ``name``, assembled, generated or derived on first use (harness.matrix.model_sources.registry.ModelStore)."""
        return self.models.path(name)

    def hooks(self, p: Platform) -> Any:  # Any: a room's type; the frame imports no room
        """How ``p``'s configurations start their programs (harness.stages.outputs.sessions.Sessions.hooks)."""
        return self.sessions.hooks(p)

    def platforms(self, for_step: str) -> list[Platform]:
        """Platforms that ``for_step`` (build/test/compare-outputs) runs on; others are recorded as skipped.

        Without --platform every platform of the matrix is considered and those
        this machine cannot run are skipped with the reason.  A platform named
        with --platform is built if the toolchain is there, and its tests and
        comparisons are skipped with the reason if the hardware is not.
        Raises MatrixError for an unknown platform name.
        """
        chosen = []
        for name in self.selection.platform_names():
            p = self.matrix.platform(name)
            compiled = for_step == "build" and compiles_instead(p)
            why = cannot_build(p) if (for_step == "build" and self.selection.names_platforms()) else cannot_run(p)
            if compiled:
                why = f"{cannot_run(p)}; compiled instead (step compile)"
            if why:
                self.run.skipped_platforms[name] = why
                self.run.record_step(StepRecord(name, "-", for_step, STEP_SKIPPED, detail=why))
                if self.selection.names_platforms() and not compiled:
                    self.run.mark_incomplete(f"{name}: {for_step} skipped: {why}")
                self.say(f"[{name}] {for_step}: skipped: {why}")
                continue
            chosen.append(p)
        return chosen
