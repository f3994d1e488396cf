"""The one shape of a stage, and the context every stage runs in.

A stage (:class:`Stage`) declares, once:

* ``name``: what it is called (the console and the docs name it);
* ``command``: the command-line stage it belongs to (:data:`COMMANDS`: ``build``, ``test``,
  ``compare-outputs``), and ``role``: the folder under ``harness/stages/`` it lives in (:data:`ROLES`);
* ``reads``: what it takes from the run (:data:`READS`), and ``writes``: what it adds (:data:`WRITES`);
* ``steps``: the step names it records (a name ending in ``:`` or ``-`` is a prefix: ``speed:`` for
  ``speed:<group>:<metric>``, ``test-`` for ``test-<tool>``), and ``statuses``: the step statuses it
  may give them (harness.record.results.STEP); ``interrupted`` is the run loop's, never declared;
* ``run``: a function of the :class:`Context` that does its work and returns the steps it decided
  (the run loop records each and says it in one line); steps found deep in its work (a build that a
  comparison asks for) it records through ``ctx.run`` as they finish, so an interrupt keeps them;
* ``beside``: it runs in a thread of its own beside the stages after it in its command, which waits
  for it before the command ends (the CUDA compile step beside the builds).

The stages of a run, in order, are harness.stages.table.STAGES; harness.pipeline runs those of each
command in that order and handles interrupts for all of them alike.  A stage imports only
harness.matrix, harness.record, harness.common and other stages (tests/test_imports.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..common.console import Console
from ..matrix.config import Matrix, Platform
from ..matrix.model_sources.registry import ModelStore
from ..matrix.platforms import cannot_build, cannot_run, compiles_instead
from ..record.cache import ResultCache, max_bytes_from_env
from ..record.progress import InProgress
from ..record.results import STEP_STATUSES, Run, StepRecord
from .build.build import BuildResult
from .build.builds import Builds
from .build.cross import Emulator
from .build.source import BaseTree, cache_dir
from .options import Options
from .outputs.greedy import Hooks
from .outputs.sessions import Sessions

#: The command-line stages, in the order a run takes them.
COMMANDS = ("build", "test", "compare-outputs")

#: The folders of harness/stages/, in the order of the run: each stage lives in one.
ROLES = ("build", "tests", "outputs", "checks", "speed")

#: What a stage may read from the run: the loaded ``matrix``; the base ``source`` tree and the patch
#: series; the ``builds`` (harness.stages.build.builds.Builds, built on first use); the ``models``
#: (harness.matrix.model_sources.registry.ModelStore, made on first use); the ``records`` the run holds so far (its
#: steps, comparisons and files).
READS = ("matrix", "source", "builds", "models", "records")

#: What a stage may add to the run: ``builds`` (build and compile directories), ``steps`` (step
#: records), ``comparisons`` (comparison records), ``files`` (files under the run's directory).
WRITES = ("builds", "steps", "comparisons", "files")


@dataclass(frozen=True)
class Stage:
    """One stage of a run (see the module docstring).  Raises ValueError when a declared name is outside its
    vocabulary (:data:`COMMANDS`, :data:`ROLES`, :data:`READS`, :data:`WRITES`, the step statuses)."""

    name: str
    command: str
    role: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    steps: tuple[str, ...]
    statuses: tuple[str, ...]
    run: Callable[["Context"], Iterable[StepRecord] | None]
    beside: bool = False
    #: the option of harness.stages.options.Options that asks for the stage ("" : its command alone does); a
    #: stage not asked for is not listed as to run, so a run stopped early never reads it as "not run"
    asked_by: str = ""

    def __post_init__(self) -> None:
        checks = (("command", (self.command,), COMMANDS), ("role", (self.role,), ROLES),
                  ("reads", self.reads, READS), ("writes", self.writes, WRITES),
                  ("statuses", self.statuses, tuple(s for s in STEP_STATUSES if s != "interrupted")))
        for what, names, known in checks:
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"stage {self.name}: {what} {', '.join(map(repr, unknown))} not in {known}")
        if not self.steps:
            raise ValueError(f"stage {self.name}: declares no step")
        if self.asked_by and self.asked_by not in {f.name for f in fields(Options)}:
            raise ValueError(f"stage {self.name}: asked_by {self.asked_by!r} is not an option of Options")

    def asked(self, opts: Options) -> bool:
        """Whether ``opts`` (harness.stages.options.Options) ask for this stage when its command runs."""
        return not self.asked_by or bool(getattr(opts, self.asked_by))

    def records(self, step: str) -> bool:
        """Whether ``step`` is one of the step names this stage declares (a declared name ending in ``:`` or ``-``
        is a prefix)."""
        return any(step.startswith(s) if s.endswith((":", "-")) else step == s for s in self.steps)


@dataclass
class Context:
    """What every stage gets: the ``matrix``, the ``run`` (its layout and records), the ``opts``, the
    ``console`` and ``say`` (one line of progress), ``progress`` (the steps in progress, for interrupts),
    ``results_cache`` (docs/cache.md), ``builds``, ``models``, ``sessions`` (how a configuration's
    programs start) and ``generated``: platform -> the configurations that generated there in this
    process, in the order of their generate steps (written by the comparisons, read by the checks).

    Made by :meth:`open`; :meth:`close` gives up what it holds.
    """

    matrix: Matrix
    run: Run
    opts: Options
    console: Console
    say: Callable[[str], None]
    progress: InProgress
    results_cache: ResultCache
    builds: Builds
    models: ModelStore
    sessions: Sessions
    generated: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def open(cls, matrix: Matrix, run: Run, opts: Options, say: Callable[[str], None] | None = None,
             console: Console | None = None, bases: Mapping[str, BaseTree] | None = None) -> Context:
        """The context of a run of ``matrix`` recorded in ``run`` with ``opts``; ``say`` defaults to the console's,
        ``bases``: variant -> its base tree where the caller gives one (harness.stages.build.builds.Builds)."""
        console = console or Console()
        say = say or console.say
        cache = cache_dir()
        progress = InProgress(run)
        results_cache = ResultCache(cache / "results", max_bytes_from_env(), read=not opts.no_cache)
        builds = Builds(matrix, run, opts, console, say, progress, cache, bases)
        models = ModelStore(matrix.models, cache, lambda: builds.base().path, matrix.path, builds.quantize_tool)
        sessions = Sessions(matrix, run, builds, progress, results_cache, console)
        return cls(matrix, run, opts, console, say, progress, results_cache, builds, models, sessions)

    def close(self) -> None:
        """The run is over: give up the build holds and the job budget (harness.stages.build.builds.Builds.close)."""
        self.builds.close()

    def doing(self, platform: str, config: str, step: str) -> AbstractContextManager[None]:
        """Mark (platform, config, step) as in progress for the block (harness.record.progress.InProgress)."""
        return self.progress.doing(platform, config, step)

    def build_variant(self, p: Platform, variant: str) -> BuildResult:
        """``variant`` of ``p``, built once per process (harness.stages.build.builds.Builds.build_variant)."""
        return self.builds.build_variant(p, variant)

    def emulator(self, p: Platform) -> Emulator | None:
        """The emulator that runs ``p``'s programs, None for a native platform; RuntimeError when it is missing."""
        return self.builds.emulator(p)

    def model_path(self, name: str) -> Path:
        """Path of model ``name``, assembled, generated or derived on first use (harness.matrix.model_sources.registry.ModelStore)."""
        return self.models.path(name)

    def hooks(self, p: Platform) -> Hooks:
        """How ``p``'s configurations start their programs (harness.stages.outputs.sessions.Sessions.hooks)."""
        return self.sessions.hooks(p)

    def selected(self) -> list[str]:
        """The names of the platforms ``--platform`` names, else of every platform of the matrix."""
        return self.opts.platforms or list(self.matrix.platforms)

    def platforms(self, for_step: str) -> list[Platform]:
        """Platforms that ``for_step`` (build/test/compare-outputs) runs on; others are recorded as skipped.

        Without --platform every platform of the matrix is considered and those
        this machine cannot run are skipped with the reason.  A platform named
        with --platform is built if the toolchain is there, and its tests and
        comparisons are skipped with the reason if the hardware is not.
        Raises MatrixError for an unknown platform name.
        """
        chosen = []
        for name in self.selected():
            p = self.matrix.platform(name)
            compiled = for_step == "build" and compiles_instead(p)
            why = cannot_build(p) if (for_step == "build" and self.opts.platforms) else cannot_run(p)
            if compiled:
                why = f"{cannot_run(p)}; compiled instead (step compile)"
            if why:
                self.run.skipped_platforms[name] = why
                self.run.record_step(StepRecord(name, "-", for_step, "skipped", detail=why))
                if self.opts.platforms and not compiled:
                    self.run.mark_incomplete(f"{name}: {for_step} skipped: {why}")
                self.say(f"[{name}] {for_step}: skipped: {why}")
                continue
            chosen.append(p)
        return chosen
