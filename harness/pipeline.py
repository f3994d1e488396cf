"""The stages wired together: build, test and compare-outputs for selected platforms.

Data flows one way: matrix -> base tree -> fork tree -> builds -> native tests
-> models -> greedy comparisons -> results.  Each stage records its steps in
the run's summary as soon as they finish; a failure in one platform or
configuration is recorded and the others still run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from .record import environment, gpu

from .common import proc
from .stages.build.cross import Emulator, emulator_for, find_emulator_program
from .stages.build.build import (BuildRequest, BuildResult, build, ccache_env, compiler_launcher_options,
                    cuda_architectures_from_nvidia_smi, find_tool, is_up_to_date, up_to_date_result)
from .stages.build.cuda_compile import CompileResult, Plan, ToolkitMissing, assemble_toolkit, changed_files, compile_tree
from .stages.checks.checks import CheckContext, run_checks
from .stages.checks.registered_checks import CHECKS, STEP_NAMES as CHECK_STEPS
from .stages.outputs.compare import GenerationSpec, TokenizeError, prompt_token_ids, to_json
from .stages.build.preflight import configs_on, one_line, option_refusal
from .matrix.fit import (PlannedGeneration, Vocabulary, refuse_unfit, selected_generations, selected_groups,
                          vocabulary_of)
from .common.errors import HarnessError, InputError
from .matrix.config import Generation, Matrix, Platform
from .matrix.platforms import cannot_build, cannot_run, compiles_instead, cross_built, executable_suffix
from .common.console import Console, Step
from .stages.outputs.engine import ENGINE_TARGET, engine_argv, engine_cmake_options, engine_source_digest
from .stages.outputs.greedy import GreedyRunner, Hooks, Job, JobResult, Side, available_cores, lanes_for
from .matrix.models import QUANTIZE_TARGET, ModelError, ModelStore, QuantizeTool, model_summary
from .stages.tests.native_tests import run_ctest
from .stages.speed.speed import stage_speed
from .stages.outputs.generation_cache import SessionCache, side_identity
from .stages.build.quantize_tool import no_quantize_platform, quantize_platform, tool_from_build
from .stages.tests.test_cache import run_tests_reusing
from .stages.build.compile_cache import compile_reusing, step_identity
from .record.cache import DigestMemo, ResultCache, max_bytes_from_env
from .stages.build.patches import Patch, PatchApplyError, prepare_series_tree, read_series, series_digest, series_env_summary, series_label
from .record.results import VERDICT_EXIT_CODES, ComparisonRecord, Failure, Run, StepRecord, write_json
from .record.junit import write_checks_junit, write_comparisons_junit, write_speed_junit
from .common.jobserver import JobBudget
from .common.locks import BuildLock, Rank, exclusive, joined_by_holder_of
from .analysis.report import write_report
from .analysis.signatures import classify_run
from .tools.windows_check import SetupError, find_cuda_headers
from .stages.build.source import BaseTree, cache_dir, obtain_base, prepare_tree

@dataclass
class Options:
    """Command-line options shared by the stages.

    ``platforms``: names given with --platform (empty: every platform, those
    this machine cannot run reported as skipped).  ``cmake_defines``: extra
    ``-D`` options passed through to CMake.  ``cuda_arch``: overrides the
    architectures read from nvidia-smi.  ``jobs``: jobs at once, every build and compile step together
    (:meth:`Pipeline.job_budget`; None: the cores this process may use).
    ``sanitize``: a compute-sanitizer tool to run the native tests under.
    ``models``/``groups``: restrict comparisons.  ``n_predict``/``repeats``:
    override the matrix's generation settings (tokens, runs per config).  ``bench``: run the speed
    stage after the comparisons (harness.stages.speed.speed); ``bench_repeats``: its rounds per rule;
    ``bench_warmup``: its untimed rounds before them (None: the matrix's).
    ``no_cache``: regenerate every generation and rerun every native test instead of taking them
    from the result cache (docs/cache.md).  ``lanes``: generations at once on a CPU platform
    (None: :func:`harness.stages.outputs.greedy.lanes_for` decides).
    """

    platforms: list[str] = field(default_factory=list)
    cmake_defines: dict[str, str] = field(default_factory=dict)
    cuda_arch: str | None = None
    jobs: int | None = None
    sanitize: str | None = None
    models: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    n_predict: int | None = None
    repeats: int | None = None
    work_dir: Path = Path(".harness")
    patches_dir: Path = Path("patches")
    bench: bool = True
    bench_repeats: int | None = None
    bench_warmup: int | None = None
    no_cache: bool = False
    lanes: int | None = None


def cmake_options(p: Platform, variant: str, patches: Sequence[Patch] = (), cuda_arch: str | None = None,
                  defines: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CMake cache options of platform ``p``'s ``variant`` build.

    The matrix's options, the compiler launcher (ccache), the harness's engine target
    (harness.stages.outputs.engine.engine_cmake_options), a RUNPATH relative to the binaries
    (CMAKE_BUILD_RPATH_USE_ORIGIN), CMAKE_CUDA_ARCHITECTURES
    (``cuda_arch``, else from nvidia-smi where the matrix says ``auto``), the cross toolchain and
    emulator of a cross-built platform, LLAMA_FORK_SERIES naming ``patches`` for the fork (and on a
    platform without GPU the CUDA headers for test-cuda-pin-ladder-host), then ``defines`` (-D
    overrides) last.  Raises
    RuntimeError when the architectures are ``auto`` and no GPU and no ``cuda_arch`` is given.
    """
    opts = dict(p.cmake)
    if opts.get("CMAKE_CUDA_ARCHITECTURES") == "auto":
        arch = cuda_arch or cuda_architectures_from_nvidia_smi()
        if not arch:
            raise RuntimeError(f"{p.name}: CMAKE_CUDA_ARCHITECTURES is 'auto' but nvidia-smi reports no GPU; "
                               "pass --cuda-arch (e.g. 90)")
        opts["CMAKE_CUDA_ARCHITECTURES"] = arch
    elif cuda_arch and p.gpu == "nvidia":
        opts["CMAKE_CUDA_ARCHITECTURES"] = cuda_arch
    opts.update(compiler_launcher_options())
    opts.update(engine_cmake_options())
    # the build tree's RUNPATH relative to the binaries ($ORIGIN), not the build directory's path: the same code
    # built in another checkout is the same bytes, and the result cache knows it (docs/cache.md)
    opts["CMAKE_BUILD_RPATH_USE_ORIGIN"] = "ON"
    if cross_built(p):
        assert p.cross is not None
        opts["CMAKE_TOOLCHAIN_FILE"] = str(p.cross.toolchain)
        emulator = find_emulator_program(p.cross.emulator)
        if emulator:  # ctest runs the test executables through it (a CMake list: its argv)
            opts["CMAKE_CROSSCOMPILING_EMULATOR"] = emulator
    if variant == "fork":
        opts["LLAMA_FORK_SERIES"] = series_label(list(patches))
        if p.gpu == "none":
            # test-cuda-pin-ladder-host runs the ladder's host code against a stub CUDA runtime: headers only
            # (the nvidia-cuda-runtime wheel of requirements.txt); without them CMake leaves the target out
            try:
                opts["CUDA_RUNTIME_INCLUDE_DIR"] = str(find_cuda_headers().include)
            except SetupError:
                pass
    opts.update(defines or {})
    return opts


@dataclass
class BuildHold:
    """A build directory this run holds for reading until it ends: its lock and the request that built it,
    with the directory for its logs (to take the hold again, :meth:`Pipeline._build_and_hold`)."""

    lock: BuildLock
    req: BuildRequest
    logs: Path


class Pipeline:
    """Runs stages for the selected platforms and records everything in ``run``."""

    def __init__(self, matrix: Matrix, run: Run, opts: Options, say: Callable[[str], None] | None = None,
                 console: Console | None = None, bases: Mapping[str, BaseTree] | None = None):
        self.console = console or Console()
        # variant -> its base tree where the caller gives one (an upstream forecast: "base" the other upstream,
        # "old-base" the pinned one); other variants than base and fork are built unpatched from theirs
        self.bases = dict(bases or {})
        self.matrix, self.run, self.opts, self.say = matrix, run, opts, say or self.console.say
        self._shown: Step | None = None  # the console step of the comparison group running
        self.cache = cache_dir()
        self.results_cache = ResultCache(self.cache / "results", max_bytes_from_env(), read=not opts.no_cache)
        self._base: BaseTree | None = None
        self._patches: list[Patch] | None = None
        self._builds: dict[tuple[str, str], BuildResult] = {}
        self.models = ModelStore(matrix.models, self.cache, lambda: self.base().path, matrix.path, self.quantize_tool)
        self._models = self.models.known
        # platform -> config -> model -> where the buffers of the config's first generation landed
        self._placements: dict[str, dict[str, dict[str, dict]]] = {}
        # (platform, config) -> (model, prompt) of generations that upstream fails the same way
        self._unsupported: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._held: list[BuildHold] = []  # read holds on the builds this run uses, in the lock order
        self._doing: list[tuple[str, str, str, float]] = []  # steps in progress: platform, config, step, start
        self._emulators: dict[str, Emulator | Exception | None] = {}
        self._budget: JobBudget | None = None  # every build's job slots (harness.common.jobserver), made once
        self._budget_made = threading.Lock()

    @contextmanager
    def doing(self, platform: str, config: str, step: str) -> Iterator[None]:
        """Mark (platform, config, step) as in progress for the block, so an interrupt can name it.

        An exception leaving the block keeps the mark for :meth:`record_unfinished`.
        """
        entry = (platform, config, step, time.monotonic())
        self._doing.append(entry)
        yield
        self._doing.remove(entry)

    def record_unfinished(self, why: str) -> None:
        """Record every step still in progress as ``interrupted`` (``why``: e.g. "interrupted by SIGINT")."""
        for platform, config, step, started in reversed(self._doing):
            earlier = self.run.step(platform, config, step)
            if step == "build" and earlier is not None and earlier.status == "passed":
                continue  # a later stage's up-to-date check of a build this run already recorded
            self.run.record_step(StepRecord(platform, config, step, "interrupted",
                                            round(time.monotonic() - started, 1), f"{why}; did not finish"))
            self.run.mark_incomplete(f"{platform}: {step} {config}: {why}; did not finish")
        self._doing.clear()

    def release_builds(self) -> None:
        """Give up the read holds on the build directories this run used."""
        while self._held:
            self._held.pop().lock.release()

    def job_budget(self) -> JobBudget:
        """The one job budget of every build and compile step this process runs (``-j``, else the cores
        this process may use): a GNU make jobserver pool, or none where it cannot work (its
        ``why_not``); made at the first call, from any thread."""
        with self._budget_made:
            if self._budget is None:
                self._budget = JobBudget.open(self.opts.jobs, available_cores(), find_tool("ninja"))
            return self._budget

    def close(self) -> None:
        """The run is over: :meth:`release_builds`, and remove the job budget's pool."""
        self.release_builds()
        if self._budget is not None:
            self._budget.close()

    # ----- selection -------------------------------------------------------------------------
    def platforms(self, for_step: str) -> list[Platform]:
        """Platforms that ``for_step`` (build/test/compare-outputs) runs on; others are recorded as skipped.

        Without --platform every platform of the matrix is considered and those
        this machine cannot run are skipped with the reason.  A platform named
        with --platform is built if the toolchain is there, and its tests and
        comparisons are skipped with the reason if the hardware is not.
        Raises MatrixError for an unknown platform name.
        """
        names = self.opts.platforms or list(self.matrix.platforms)
        chosen = []
        for name in names:
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

    # ----- inputs ----------------------------------------------------------------------------
    def base(self) -> BaseTree:
        """The verified base tree (obtained once per process)."""
        if self._base is None and "base" in self.bases:
            self._base = self.bases["base"]
        if self._base is None:
            log: list[str] = []
            self._base = obtain_base(self.matrix, self.cache, log)
            for line in log:
                self.say(line)
        return self._base

    def patches(self) -> list[Patch]:
        """The patch series from patches/ (read once; raises PatchError for a broken series)."""
        if self._patches is None:
            self._patches = read_series(self.opts.patches_dir)
        return self._patches

    # ----- build -----------------------------------------------------------------------------
    def variants_for(self, p: Platform) -> list[str]:
        """Build variants platform ``p`` needs: fork always, base when a comparison uses it."""
        needed = {"fork"}
        for g in p.groups:
            group = self.matrix.groups[g]
            for c in (group.reference, *group.candidates):
                needed.add(self.matrix.configs[c].build)
        return sorted(needed, key=lambda v: (v != "fork", v))  # fork first: a broken series fails fast

    def cmake_options(self, p: Platform, variant: str) -> dict[str, str]:
        """The CMake cache options for ``p``/``variant`` (see :func:`cmake_options`)."""
        return cmake_options(p, variant, self.patches() if variant == "fork" else (), self.opts.cuda_arch,
                             self.opts.cmake_defines)

    def build_variant(self, p: Platform, variant: str) -> BuildResult:
        """Build ``variant`` of ``p`` once per process; records a ``build`` step for config ``variant``."""
        if (p.name, variant) in self._builds:
            return self._builds[(p.name, variant)]
        logs = self.run.layout.build_logs(p.name, variant)
        with self.doing(p.name, variant, "build"), \
                self.console.step(f"[{p.name}] build {variant}", watch=logs / "build.log") as shown:
            result = self._build_variant(p, variant)
            log = result.logs.get("build") or result.logs.get("configure") or (logs / "error.log")
            shown.finish(result.status, result.detail, log if result.status != "passed" else "")
            return result

    def _prepare_source(self, base: BaseTree, work: Path, variant: str, logs: Path) -> Path:
        with exclusive(work / variant / "llama.cpp", f"the {variant} source tree", Rank.SOURCE, self.say):
            if variant == "fork":
                return prepare_series_tree(base, work, "fork", self.patches(), log=logs / "patches.log")
            return prepare_tree(self.bases.get(variant, base), work, variant)

    def _build_and_hold(self, req: BuildRequest, logs: Path) -> BuildResult:
        """Hold ``req``'s directory for reading until the run ends (see harness.common.locks), building it first
        unless it is up to date.

        An up-to-date directory is only read-locked, so runs that use the same
        build share it; a build takes the write lock, which waits for them.
        Between the build releasing its write lock and this process taking the
        read lock, another process may have rebuilt the directory with other
        options; the build is then done again (at most 3 times).

        Build locks are taken in the global lock order (harness.common.locks.Rank, then by path): the holds
        that sort after ``req``'s are given up first and taken again after it (:meth:`_take_again`), so this
        process never waits for a build while holding one that sorts after it, and two runs that ask for
        the same builds in opposite orders cannot wait on each other for ever.
        """
        key = BuildLock(req.build_dir).key
        later = [h for h in self._held if h.lock.key >= key]
        for h in later:
            self._held.remove(h)
            h.lock.release()
        try:
            return self._hold(req, logs)
        finally:
            for h in sorted(later, key=lambda h: h.lock.key):
                self._take_again(h)

    def _hold(self, req: BuildRequest, logs: Path) -> BuildResult:
        """The read hold of :meth:`_build_and_hold`, building first where the directory is not up to date."""
        built: BuildResult | None = None
        for attempt in range(4):
            hold = BuildLock(req.build_dir)
            hold.read(self.say)
            if is_up_to_date(req):
                self._held.append(BuildHold(hold, req, logs))
                return built or up_to_date_result(req, logs)
            hold.release()
            if attempt == 3:
                break
            built = build(req, logs, self.say, self.job_budget())
            if built.status != "passed":
                return built
        assert built is not None
        built.status, built.detail = "error", (f"{req.build_dir} was rebuilt with other options by another "
                                               "harness process three times in a row")
        return built

    def _take_again(self, h: BuildHold) -> None:
        """Take the read hold of ``h`` again after it was given up for a build that sorts before it; a directory
        that another process rebuilt with other options meanwhile is built again and recorded."""
        h.lock = BuildLock(h.req.build_dir)
        h.lock.read(self.say)
        if is_up_to_date(h.req):
            self._held.append(h)
            return
        h.lock.release()
        result = self._hold(h.req, h.logs)
        self.say(f"[{h.req.platform}] build {h.req.variant}: {result.status} — built again: another harness process "
                 f"changed it while this run waited for another build ({result.detail})")
        self._record_build(h.req.platform, h.req.variant, result, h.logs)

    def _build_variant(self, p: Platform, variant: str) -> BuildResult:
        logs = self.run.layout.build_logs(p.name, variant)
        start = time.monotonic()
        failures: list[Failure] = []
        try:
            base = self.base()
            work = self.opts.work_dir.resolve()
            source = self._prepare_source(base, work, variant, logs)
            if variant == "fork":
                key_parts = {"base": base.commit, "series": series_digest(self.patches()),
                             "engine": engine_source_digest()}
            else:
                key_parts = {"base": self.bases.get(variant, base).commit, "engine": engine_source_digest()}
            targets = (*p.targets, ENGINE_TARGET) + (p.test_targets if variant == "fork" else ())
            req = BuildRequest(p.name, variant, source, work / variant / f"build-{p.name}",
                               self.cmake_options(p, variant), tuple(targets), key_parts, self.opts.jobs,
                               env=ccache_env(work), exe_suffix=executable_suffix(p))
            result = self._build_and_hold(req, logs)
        except Exception as exc:  # a broken input must not stop other platforms: record it
            result = BuildResult(p.name, variant, "error", "", Path(), time.monotonic() - start, False,
                                 detail=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, PatchApplyError):
                failures.append(Failure("patch", patch=exc.patch, message=str(exc)))
            else:
                failures.append(Failure("exception", message=result.detail))
            logs.mkdir(parents=True, exist_ok=True)
            (logs / "error.log").write_text(result.detail + "\n")
        self._record_build(p.name, variant, result, logs, failures)
        return result

    def _record_build(self, platform: str, variant: str, result: BuildResult, logs: Path,
                      failures: Sequence[Failure] = ()) -> None:
        """Keep ``result`` as the build of ``platform``/``variant`` and record its ``build`` step, unless it is an
        up-to-date check of a build this run already recorded as passed."""
        self._builds[(platform, variant)] = result
        earlier = self.run.step(platform, variant, "build")
        if result.up_to_date and earlier is not None and earlier.status == "passed":
            # a later stage of the same run found the build up to date: keep the record of the real build
            return
        log = result.logs.get("build") or result.logs.get("configure") or (logs / "error.log")
        self.run.record_step(StepRecord(platform, variant, "build", result.status, round(result.seconds, 1),
                                        result.detail, self.run.layout.relative(log), list(failures),
                                        up_to_date=result.up_to_date))

    def write_environment(self, p: Platform) -> None:
        """Write ``<platform>/environment.json`` for ``p`` from what is known so far."""
        try:
            base = self.base()
            commit, source = base.commit, base.source
        except Exception as exc:
            commit, source = self.matrix.base_commit, f"unavailable: {exc}"
        try:
            patches = series_env_summary(self.patches())
        except Exception as exc:
            patches = [{"error": str(exc)}]
        dirs = {v: b.build_dir for (pn, v), b in self._builds.items() if pn == p.name and b.status == "passed"}
        self.run.platform_dir(p.name)
        write_json(self.run.layout.environment_json(p.name),
                   environment.collect(commit, source, patches, dirs))

    def stage_build(self) -> None:
        """Build every needed variant of every selected platform; compile those :func:`compiles_instead` names.

        The compile steps run in a thread of their own beside the builds: after a code edit each is mostly
        one compiler on one changed file, so the two overlap on the cores (docs/cache.md).  Together they
        run at most :meth:`job_budget`'s slots of jobs at once.  An interrupt or an exception stops both
        (harness.common.proc.stop_and_wait) and propagates.
        """
        compiles = [p for p in (self.matrix.platform(n) for n in self.opts.platforms or list(self.matrix.platforms))
                    if compiles_instead(p)]
        for prepare in (self.base, self.patches) if compiles else ():  # once, before two threads need them
            try:
                prepare()
            except Exception:
                pass  # each step that needs it records the error itself
        # the main thread holds builds while it waits for the compile thread: that takes only later locks
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile", initializer=joined_by_holder_of,
                                  initargs=(Rank.BUILD,)) if compiles else None
        compiling = pool.submit(self._compile_platforms, compiles) if pool else None
        try:
            for p in self.platforms("build"):
                for variant in self.variants_for(p):
                    self.build_variant(p, variant)
                self.write_environment(p)
            if compiling is not None:
                compiling.result()
        except BaseException as exc:
            if compiling is not None:
                proc.stop_and_wait([compiling], getattr(exc, "signum", signal.SIGTERM))
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _compile_platforms(self, platforms: Sequence[Platform]) -> None:
        """The compile steps of ``platforms``: the fork, then the base on the fork's plan."""
        for p in platforms:
            fork = self.compile_variant(p, "fork")
            if fork is not None and fork.plan is not None and "base" in self.variants_for(p):
                self.compile_variant(p, "base", like=fork.plan)

    # ----- compile only ----------------------------------------------------------------------
    def compile_options(self, p: Platform, variant: str) -> dict[str, str]:
        """CMake options of the compile step: the platform's, its ``compile_only`` ones, ccache, the series
        label, --cuda-arch and -D overrides (the toolkit's are added by :meth:`compile_variant`)."""
        opts = {**p.cmake, **p.compile_only_cmake, **compiler_launcher_options()}
        if self.opts.cuda_arch:
            opts["CMAKE_CUDA_ARCHITECTURES"] = self.opts.cuda_arch
        if variant == "fork":
            opts["LLAMA_FORK_SERIES"] = series_label(self.patches())
        opts.update(self.opts.cmake_defines)
        return opts

    def compile_variant(self, p: Platform, variant: str, like: Plan | None = None) -> CompileResult | None:
        """Run the ``compile`` step (harness.stages.build.cuda_compile) for ``variant`` of ``p`` and record it.

        The fork compiles the units its series touches; the base (``like``: the fork's plan) the same
        units.  Returns None when the step was skipped (a CUDA wheel missing: the reason names it)
        or could not start (recorded as ``error`` with its failure fact).
        """
        with self.doing(p.name, variant, "compile"):
            return self._compile_variant(p, variant, like)

    def _compile_variant(self, p: Platform, variant: str, like: Plan | None) -> CompileResult | None:
        logs = self.run.layout.compile_logs(p.name, variant)
        start = time.monotonic()
        result: CompileResult | None = None
        failures: list[Failure] = []
        log: Path | None = None
        reused = ""  # the run a passed compile step with the same inputs was taken from (docs/cache.md)
        try:
            work = self.opts.work_dir.resolve()
            toolkit = assemble_toolkit(self.cache)
            base = self.base()
            tree = self._prepare_source(base, work, variant, logs)
            if variant == "fork":
                changed = changed_files(tree, base.git_rev)
                targets = [*p.targets, ENGINE_TARGET, *p.test_targets]
            else:
                changed = dict(like.changed) if like else {}
                targets = [*p.targets, ENGINE_TARGET]
            options = {**self.compile_options(p, variant), **toolkit.cmake_options()}
            write_json(logs / "toolkit.json", toolkit)
            build_dir = work / variant / f"compile-{p.name}"
            cmake, ninja = find_tool("cmake") or "cmake", find_tool("ninja") or "ninja"
            with exclusive(build_dir, f"the {variant} compile directory of {p.name}", Rank.COMPILE, self.say):
                identity = step_identity(tree, build_dir, work, options, changed, targets, like, cmake, ninja,
                                         str(toolkit.nvcc), ccache_env(work))
                result, reused = compile_reusing(
                    self.results_cache, self.run.id, identity, lambda: compile_tree(
                        tree, build_dir, options, changed, targets, logs, cmake=cmake, ninja=ninja,
                        jobs=self.opts.jobs or os.cpu_count() or 2, env=ccache_env(work), like=like,
                        budget=self.job_budget()), logs)
            status, detail = result.status, result.detail
            log = result.logs.get("build") or result.logs.get("configure")
        except ToolkitMissing as exc:
            status, detail = "skipped", str(exc)
        except Exception as exc:  # a broken input must not stop other platforms: record it
            status, detail = "error", f"{type(exc).__name__}: {exc}"
            if isinstance(exc, PatchApplyError):
                failures.append(Failure("patch", patch=exc.patch, message=str(exc)))
            else:
                failures.append(Failure("exception", message=detail))
            logs.mkdir(parents=True, exist_ok=True)
            log = logs / "error.log"
            log.write_text(detail + "\n")
        self.run.record_step(StepRecord(p.name, variant, "compile", status, round(time.monotonic() - start, 1),
                                        detail, self.run.layout.relative(log) if log else "", failures,
                                        cached=reused))
        self.say(f"[{p.name}] compile {variant}: {status} — {detail}")
        return result

    def emulator(self, p: Platform) -> Emulator | None:
        """The emulator that runs ``p``'s executables here (prepared once, made ready at every call:
        the callers start programs with it), None for a native platform.

        Raises RuntimeError when it is missing or its prefix cannot be made.
        """
        if p.name not in self._emulators:
            try:
                self._emulators[p.name] = emulator_for(p, self.cache) if cross_built(p) else None
            except RuntimeError as exc:
                self._emulators[p.name] = exc
        got = self._emulators[p.name]
        if isinstance(got, Exception):
            raise got
        if got is not None:
            got.ready()
        return got

    # ----- native tests ----------------------------------------------------------------------
    def stage_test(self) -> None:
        """Run the native tests (ctest, by label) of the fork build of each selected platform; a label whose
        tests, libraries and environment are byte-identical to a passed run is reused (harness.stages.tests.test_cache)."""
        for p in self.platforms("test"):
            fork = self.build_variant(p, "fork")
            if fork.status != "passed":
                self.run.record_step(StepRecord(p.name, "fork", "test", "skipped",
                                                detail=f"fork build {fork.status}: {fork.detail}",
                                                failures=[Failure("blocked", build="fork")]))
                continue
            try:
                emulator = self.emulator(p)
            except RuntimeError as exc:
                self.run.record_step(StepRecord(p.name, "fork", "test", "error", detail=str(exc),
                                                failures=[Failure("exception", message=str(exc))]))
                continue
            runs = [(self.run.layout.test_step(), ())]
            if self.opts.sanitize:
                runs.append((self.run.layout.test_step(self.opts.sanitize),
                             ("compute-sanitizer", "--tool", self.opts.sanitize, "--error-exitcode", "1", "--require-cuda-init", "no")))
            for step, wrapper in runs:
                target_dir = self.run.layout.tests(p.name, step)
                if wrapper and not shutil.which(wrapper[0]):
                    self.run.record_step(StepRecord(p.name, "fork", step, "skipped",
                                                    detail="compute-sanitizer not found"))
                    continue
                with self.doing(p.name, "fork", step), self.console.step(f"[{p.name}] {step}") as shown:
                    tr, reused = run_tests_reusing(
                        self.results_cache, self.run.id, fork.build_dir, p.test_labels, p.test_targets, target_dir,
                        wrapper=wrapper, reference_junit=self.run.layout.tests(p.name, "test") / "junit.xml",
                        env=emulator.env if emulator else None, emulator_argv=emulator.argv if emulator else (),
                        gpu=p.gpu == "nvidia")
                    all_reused = bool(reused.labels) and all(c.message.startswith("reused") for c in tr.cases)
                    shown.finish("reused" if all_reused else tr.status, tr.detail, target_dir / "ctest.log")
                detail = tr.detail
                if wrapper:
                    summary = gpu.sanitizer_summary(target_dir / "ctest.log")
                    detail += f"; {summary}" if summary else ""
                    write_json(target_dir / "sanitizer.json", {"tool": self.opts.sanitize, "summary": summary})
                facts = gpu.test_log_facts(target_dir / "ctest.log")
                if facts:
                    write_json(target_dir / "gpu-facts.json", facts)
                write_json(target_dir / "tests.json", tr)
                self.run.record_step(StepRecord(p.name, "fork", step, tr.status, round(tr.seconds, 1), detail,
                                                self.run.layout.relative(target_dir / "junit.xml"),
                                                cached=", ".join(reused.run_ids) if all_reused else ""))
            self.write_environment(p)

    # ----- models ------------------------------------------------------------------------------
    def model_path(self, name: str) -> Path:
        """Path of model ``name``, assembled, generated or derived on first use (harness.matrix.models.ModelStore)."""
        return self.models.path(name)

    def quantize_tool(self) -> QuantizeTool:
        """The llama-quantize that derives the matrix's quantized models: the base build of the host's CPU platform
        (harness.stages.build.quantize_tool), built first when this run has not built it; ModelError naming the build
        when it failed."""
        p = quantize_platform(self.matrix.platforms.values())
        if p is None:
            raise no_quantize_platform()
        built = self.build_variant(p, "base")
        if built.status != "passed":
            raise ModelError(f"{QUANTIZE_TARGET}: the base build of {p.name} {built.status}: {built.detail}")
        return tool_from_build(p, built.bin_dir)

    # ----- comparisons ----------------------------------------------------------------------
    def stage_compare(self) -> None:
        """Run every comparison group of each selected platform and record per-prompt outcomes.

        Groups needing more GPUs than are visible are skipped with the reason.
        Jobs (group x model) whose model, builds or emulator are missing are
        recorded as failures of their configurations' ``generate`` steps; the
        rest run through ``GreedyRunner`` (one engine load per configuration and
        model), each model's comparisons recorded as soon as they are decided;
        then the checks of harness.stages.checks.checks judge every configuration's records
        (the ``expectations`` step).
        Where the time went is written to ``<platform>/compare-timing.json``.
        """
        chosen = self.platforms("compare-outputs")
        self.refuse_what_cannot_run(chosen)
        for p in chosen:
            groups = [g for g in p.groups if not self.opts.groups or g in self.opts.groups]
            gen_steps: dict[str, list[Failure]] = {}
            visible = environment.visible_gpu_count() if p.gpu == "nvidia" else 0
            runnable = []
            for gname in groups:
                need = self.matrix.groups[gname].min_gpus
                if p.gpu == "nvidia" and need > visible:
                    why = (f"needs {need} NVIDIA GPUs; {visible} visible here "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
                    self.run.record_step(StepRecord(p.name, gname, "compare-outputs", "skipped", detail=why))
                    if gname in self.opts.groups:
                        self.run.mark_incomplete(f"{p.name}: group {gname} skipped: {why}")
                    self.say(f"[{p.name}] {gname}: skipped: {why}")
                    continue
                runnable.append(gname)
            runner = self.run_groups(p, runnable, gen_steps)
            if not any(c.platform == p.name for c in self.run.comparisons) and not gen_steps:
                self.run.mark_incomplete(f"{p.name}: compare-outputs selected no comparison "
                                         f"(groups {', '.join(p.groups) or 'none'}; filters: "
                                         f"{', '.join(self.opts.groups + self.opts.models) or 'none'})")
            self.record_generate_steps(p, runner, gen_steps)
            for config, per_model in self._placements.get(p.name, {}).items():
                write_json(self.run.layout.config(p.name, config) / "placement.json", per_model)
            run_checks(CheckContext(self.matrix, p, self.run, list(gen_steps)), CHECKS, self.say)
            t = runner.timing
            if t.sessions or t.completion_runs:
                write_json(self.run.layout.platform(p.name) / "compare-timing.json",
                           {**asdict(t), "pure_generation": t.pure_generation,
                            "wall_over_pure_generation": t.wall / t.pure_generation if t.pure_generation else None})
                self.say(f"[{p.name}] compare-outputs: {t.wall:.1f} s wall, {t.pure_generation:.1f} s generating, "
                         f"{t.loads:.1f} s in {t.sessions} engine load(s) ({t.probes:.1f} s probing them), "
                         f"{t.engine_scoring:.1f} s scoring, "
                         f"{t.completion_runs} llama-completion runs")
            self.write_environment(p)

    def refuse_what_cannot_run(self, platforms: Sequence[Platform]) -> None:
        """After the builds, before any generation: raise InputError (one line, harness.stages.build.preflight) for a
        prompt that does not fit its context, counted by the model's own tokenizer (harness.matrix.fit: only
        the prompts its bounds leave open), and for a configuration's arguments that the platform's build of
        llama-completion does not take.  The arguments are not checked in a forecast (``bases`` given): there
        an option the other upstream lacks is a finding, recorded as its comparisons fail."""
        names = [p.name for p in platforms]
        counted: dict[tuple[str, str], int | None] = {}

        def vocabulary(model: str) -> Vocabulary | None:
            try:
                return vocabulary_of(model_summary(self.model_path(model)))
            except Exception:  # the model step records it
                return None

        def count(gen: PlannedGeneration) -> int | None:
            if (gen.model, gen.prompt) not in counted:
                counted[(gen.model, gen.prompt)] = self._count_prompt_tokens(
                    [p for p in platforms if gen.group in p.groups], gen)
            return counted[(gen.model, gen.prompt)]

        refuse_unfit(selected_generations(self.matrix, names, self.opts.groups, self.opts.models, self.opts.n_predict),
                     vocabulary, count)
        if not self.bases:
            problems = [why for p in platforms for why in self._refused_options(p)]
            if problems:
                raise InputError(one_line(problems))

    def _count_prompt_tokens(self, platforms: Sequence[Platform], gen: PlannedGeneration) -> int | None:
        """The tokens of ``gen``'s prompt by its model's tokenizer: the llama-tokenize of the first of
        ``platforms`` whose fork build passed and has it; None when none can tell (the generation then runs)."""
        try:
            model = self.model_path(gen.model)
        except Exception:  # the model step records it
            return None
        for p in platforms:
            build = self.build_variant(p, "fork")
            binary = build.bin_dir / f"llama-tokenize{executable_suffix(p)}"
            if build.status != "passed" or not binary.is_file():
                continue
            try:
                emu = self.emulator(p)
                text = gen.text.encode("utf-8", "surrogateescape")
                return len(prompt_token_ids(
                    binary, model, text, self.opts.work_dir.resolve() / "tmp",
                    launcher=emu.argv if emu else (), launcher_env=dict(emu.env) if emu else None,
                    crlf_stdout=p.os == "windows"))
            except (RuntimeError, OSError, TokenizeError) as exc:
                self.say(f"[{p.name}] the tokens of prompt {gen.prompt} of {gen.model} could not be counted: {exc}")
        return None

    def _refused_options(self, p: Platform) -> list[str]:
        """Why ``p``'s builds of llama-completion do not take the arguments of the configurations its selected
        groups run there (harness.stages.build.preflight.option_refusal), one line per configuration refused; a group
        skipped for want of GPUs (:meth:`stage_compare`) is not checked."""
        out: list[str] = []
        checked: dict[tuple[str, tuple[str, ...]], str | None] = {}
        visible = environment.visible_gpu_count() if p.gpu == "nvidia" else 0
        for gname in selected_groups(self.matrix, p.name, self.opts.groups, self.opts.models):
            if p.gpu == "nvidia" and self.matrix.groups[gname].min_gpus > visible:
                continue
            for name in configs_on(self.matrix, p, gname):
                config = self.matrix.configs[name]
                if not config.args:
                    continue
                build = self.build_variant(p, config.build)
                if build.status != "passed":
                    continue
                key = (config.build, config.args)
                if key not in checked:
                    try:
                        emu = self.emulator(p)
                    except RuntimeError:
                        continue  # the comparisons record it
                    binary = str(build.bin_dir / f"llama-completion{executable_suffix(p)}")
                    checked[key] = option_refusal([*emu.argv, binary] if emu else [binary], config.args,
                                                  {**(dict(emu.env) if emu else {}), **config.env})
                if checked[key]:
                    out.append(f"configuration {name} of group {gname} on {p.name}: the {config.build} build's "
                               f"llama-completion does not take {' '.join(config.args)}: {checked[key]} "
                               f"({self.matrix.path}: configs.{name}.args)")
        return out

    def run_groups(self, p: Platform, groups: Sequence[str], gen_steps: dict[str, list[Failure]]) -> GreedyRunner:
        """Run comparison groups ``groups`` on ``p`` through one GreedyRunner and record their comparisons.

        Failure facts of ``p``'s configurations land in ``gen_steps``; returns the
        runner (its timing, per-side seconds and runs feed the generate steps).  On
        an interrupt or exception the generate steps cut short are recorded first.
        """
        lanes, threads = lanes_for(p.gpu, self.opts.lanes, available_cores())
        runner = GreedyRunner(self.hooks(p), {k: v.text for k, v in self.matrix.prompts.items()},
                              self.opts.work_dir.resolve() / "tmp", self.opts.n_predict, self.opts.repeats, self.say,
                              text_check=p.text_check, cache=self._session_cache(), lanes=lanes, threads=threads)
        try:
            jobs = [job for gname in groups for job in self._jobs(p, gname, gen_steps)]
            runs = {(side, j.model, prompt): max(2, self.opts.repeats or j.generation.repeats)
                    for j in jobs for side in (j.reference, *j.candidates, *j.upstream.values()) for prompt in j.prompts}
            total = sum(runs.values())  # each side runs once per model and prompt, whichever groups share it
            with self.console.step(f"[{p.name}] compare {', '.join(groups) or 'nothing'}", total=total) as shown:
                self._shown = shown
                try:
                    runner.run(jobs, lambda res: self._record_job(p, res, runner.origins))
                finally:
                    self._shown = None
                mine = [c for c in self.run.comparisons if c.platform == p.name and c.group in groups]
                counts: dict[str, int] = {}
                for c in mine:
                    counts[c.status] = counts.get(c.status, 0) + 1
                # generation failures that upstream's build shares (unsupported upstream) are not the fork's
                fork_problems = any(not (f.kind == "generation" and (side, f.model, f.prompt) in runner.unsupported)
                                    for side, facts in runner.problems.items() for f in facts)
                shown.finish("failed" if any(c.failed() for c in mine) or fork_problems else "passed",
                             ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no comparison ran")
        except BaseException as exc:
            self._merge_runner_failures(p, runner, gen_steps)
            self._record_cut_generations(p, exc, runner, gen_steps)
            raise
        self._merge_runner_failures(p, runner, gen_steps)
        return runner

    @staticmethod
    def _merge_runner_failures(p: Platform, runner: GreedyRunner, gen_steps: dict[str, list[Failure]]) -> None:
        """Move the runner's failure facts of ``p``'s sides into ``gen_steps`` (another platform's reference
        records its own steps when that platform runs)."""
        for side, problems in runner.problems.items():
            if side.platform == p.name:
                gen_steps.setdefault(side.config, []).extend(problems)
        runner.problems.clear()

    def record_generate_steps(self, p: Platform, runner: GreedyRunner, gen_steps: dict[str, list[Failure]]) -> None:
        """Record one ``generate`` step per configuration of ``gen_steps`` (config -> failure facts).

        Seconds are the runner's wall time for the configuration's sessions and
        llama-completion runs.  The step failed when a fact exists, errored when
        every fact says nothing of the configuration could run (a model or a
        build missing) and no generation of it ran, else passed.  When only part
        of it failed, the detail starts with what did run ("partly failed:
        generations succeeded (model a); failed: ...") and keeps every fact.
        Failures that upstream's build shares in that mode make the step skipped.
        """
        for config, problems in gen_steps.items():
            side = Side(p.name, config)
            seconds = runner.side_seconds.get(side, 0.0)
            ran = runner.side_runs.get(side, 0)
            ok_models = sorted(runner.side_ok.get(side, set()))
            status = "failed" if problems else "passed"
            if problems and all(f.kind in ("model", "blocked") for f in problems) and not ran:
                status = "error"  # nothing of this configuration could run
            unique = list({json.dumps(asdict(f), sort_keys=True): f for f in problems}.values())
            detail = "; ".join(dict.fromkeys(f.text() for f in unique)) or "all generations ran"
            if problems and ok_models:
                detail = (f"partly failed: generations succeeded (model{'s' if len(ok_models) > 1 else ''} "
                          f"{', '.join(ok_models)}); failed: {detail}")
            unsupported = {(m, pr) for s, m, pr in runner.unsupported if s == side}
            if problems and all(f.kind == "generation" and (f.model, f.prompt) in unsupported for f in problems):
                # every failed generation is a mode that upstream's build fails the same way: not a fork failure
                status, detail = "skipped", f"unsupported upstream: {detail}"
            origins = [r for (s, _), r in runner.origins.items() if s == side]
            if origins and not problems:
                detail = (f"{len(origins)} session(s) from the cache (run {', '.join(dict.fromkeys(origins))}); "
                          + detail)
            self.run.record_step(StepRecord(p.name, config, "generate", status, round(seconds, 1),
                                            detail=detail, failures=unique,
                                            cached=", ".join(dict.fromkeys(origins))))

    def _record_cut_generations(self, p: Platform, exc: BaseException, runner: GreedyRunner,
                                gen_steps: dict) -> None:
        """Record the generate steps of ``p`` that an interrupt or exception cut short, with what they did."""
        why = describe_abort(exc)
        for config, problems in gen_steps.items():
            ran = runner.side_runs.get(Side(p.name, config), 0)
            status = "failed" if any(f.kind not in ("model", "blocked") for f in problems) else "interrupted"
            texts = list(dict.fromkeys(f.text() for f in problems))
            detail = f"{why} after {ran} generation(s)" + "".join(f"; {t}" for t in texts)
            self.run.record_step(StepRecord(p.name, config, "generate", status, detail=detail, failures=problems))
            self.run.mark_incomplete(f"{p.name}: generate {config}: {why}; did not finish")
        # recorded here with their facts: record_unfinished must not replace them with a bare "interrupted"
        self._doing = [d for d in self._doing if not (d[0] == p.name and d[2] == "generate" and d[1] in gen_steps)]

    def _session_cache(self) -> SessionCache:
        """The result cache as the greedy runner uses it: a side's identity from its build's binaries."""
        def identity(side: Side):
            q = self.matrix.platform(side.platform)
            b = self.build_variant(q, self.matrix.configs[side.config].build)
            emu = self.emulator(q)
            sfx = executable_suffix(q)
            return side_identity(b.bin_dir, [f"{ENGINE_TARGET}{sfx}", f"llama-completion{sfx}"],
                                 emu.argv if emu else (), dict(emu.env) if emu else {}, gpu=q.gpu == "nvidia")
        return SessionCache(self.results_cache, self.run.id, identity, DigestMemo(self.results_cache.root / "digests"))

    def hooks(self, p: Platform) -> Hooks:
        """How the greedy runner and the speed stage (harness.stages.speed.speed) start the engine and llama-completion
        of a configuration (a Side), with the platform's executable suffix and emulator (Wine for
        windows-x86_64-cpu), and what they do with stderr."""
        layout = self.run.layout

        def where(side: Side) -> tuple[Platform, Path, Emulator | None]:
            q = self.matrix.platform(side.platform)
            b = self.build_variant(q, self.matrix.configs[side.config].build)
            return q, b.bin_dir, self.emulator(q)

        def out_dir(side: Side) -> Path:
            write_json(layout.config_json(side.platform, side.config), self.matrix.configs[side.config])
            return layout.config(side.platform, side.config)

        def engine(side: Side, model_path: Path, gen: Generation) -> tuple[list[str], dict[str, str]]:
            q, bin_dir, emu = where(side)
            config = self.matrix.configs[side.config]
            argv = engine_argv(bin_dir / f"{ENGINE_TARGET}{executable_suffix(q)}", model_path, gen, config.args)
            return ([*emu.argv, *argv] if emu else argv), {**(dict(emu.env) if emu else {}), **config.env}

        def completion(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
            q, bin_dir, emu = where(side)
            config = self.matrix.configs[side.config]
            return GenerationSpec(binary=bin_dir / f"llama-completion{executable_suffix(q)}", model=model_path,
                                  prompt=prompt, n_predict=gen.n_predict, seed=gen.seed, ctx_size=gen.ctx_size,
                                  threads=gen.threads, args=config.args, env=dict(config.env), timeout_s=gen.timeout_s,
                                  launcher=emu.argv if emu else (), launcher_env=dict(emu.env) if emu else {},
                                  crlf_stdout=q.os == "windows")

        def stderr(side: Side, model: str, stem: Path, text: str) -> None:
            ladder = gpu.parse_ladder_lines(text)
            if ladder:
                write_json(stem.with_name(stem.name + ".pin-ladder.json"), ladder)
            placement = gpu.buffer_placement(text)
            if placement["buffers"] or placement["routing"]:
                write_json(stem.with_name(stem.name + ".placement.json"), placement)
                self._placements.setdefault(side.platform, {}).setdefault(side.config, {}).setdefault(model, placement)

        def progress(side: Side, what: str) -> None:
            if self._shown is not None:
                self.console.advance(self._shown, 1, f"{side.config} {what}")

        return Hooks(engine=engine, completion=completion, out_dir=out_dir,
                     doing=lambda side: self.doing(side.platform, side.config, "generate"),
                     relative=layout.relative, stderr=stderr, progress=progress)

    def _upstream_of(self, reference: str, candidate: str) -> str | None:
        """The upstream configuration that runs ``candidate``'s mode: the reference when it is upstream's build
        and the candidate the fork's, else the candidate's ``upstream`` key; None when there is none."""
        ref, cand = self.matrix.configs[reference], self.matrix.configs[candidate]
        if cand.build != "fork":
            return None
        return reference if ref.build == "base" else cand.upstream

    def _jobs(self, p: Platform, gname: str, gen_steps: dict[str, list[Failure]]) -> list[Job]:
        """The runnable (group, model) jobs of group ``gname`` on ``p``; others recorded as failures in ``gen_steps``.

        The reference runs on ``group.reference_platform`` when set (a cross-platform group,
        its reference named ``<config>@<platform>``); that platform must be runnable here.
        """
        group = self.matrix.groups[gname]
        ref_p = self.matrix.platform(group.reference_platform) if group.reference_platform else p
        ref_label = group.reference if ref_p is p else f"{group.reference}@{ref_p.name}"
        why = cannot_run(ref_p) if ref_p is not p else None
        try:
            self.emulator(p)
            self.emulator(ref_p)
        except RuntimeError as exc:
            why = str(exc)
        if why:
            fact = Failure("exception", message=f"{gname}: {why}")
            for c in (ref_label, *group.candidates):
                gen_steps.setdefault(c, []).append(fact)
            self.say(f"[{p.name}] {gname}: error: {why}")
            return []
        upstream = {c: u for c in group.candidates if ref_p is p and (u := self._upstream_of(group.reference, c))}
        jobs = []
        models = [m for m in group.models if not self.opts.models or m in self.opts.models]
        for model in models:
            try:
                model_path = self.model_path(model)
                write_json(self.run.layout.model_json(p.name, model),
                           {"path": model_path, **model_summary(model_path)})
            except Exception as exc:
                fact = Failure("model", model=model, message=f"{type(exc).__name__}: {exc}")
                for c in (group.reference, *group.candidates):
                    gen_steps.setdefault(c, []).append(fact)
                self.say(f"[{p.name}] {gname}: error: {fact.text()}")
                continue
            on = {ref_p.name: ref_p, p.name: p}  # platforms hold dicts: keyed by name, not hashed
            needed = {(ref_p.name, self.matrix.configs[group.reference].build)}
            needed |= {(p.name, self.matrix.configs[c].build) for c in (*group.candidates, *upstream.values())}
            broken = sorted(v if q == p.name else f"{v}@{q}"
                            for q, v in needed if self.build_variant(on[q], v).status != "passed")
            if broken:
                for c in (ref_label, *group.candidates):
                    gen_steps.setdefault(c, []).extend(Failure("blocked", build=v) for v in broken)
                continue
            for c in (*([group.reference] if ref_p is p else []), *group.candidates, *upstream.values()):
                gen_steps.setdefault(c, [])
            jobs.append(Job(group=gname, model=model, model_path=model_path,
                            reference=Side(ref_p.name, group.reference),
                            candidates=tuple(Side(p.name, c) for c in group.candidates), prompts=group.prompts,
                            generation=group.generation, comparison=group.comparison, label=ref_label,
                            expect=group.expect, upstream={c: Side(p.name, u) for c, u in upstream.items()}))
        return jobs

    def _record_job(self, p: Platform, res: JobResult, origins: Mapping[tuple[Side, str], str]) -> None:
        """Record a job's comparisons in the summary and in each candidate's compare.json; ``origins``: the
        runs that sides restored from the result cache came from."""
        job = res.job
        records = []
        for pc in res.comparisons:
            entry = to_json(pc) | {"group": job.group, "model": job.model}
            cached = {label: origins[(side, job.model)]
                      for label, side in ((job.label, job.reference), (pc.candidate, Side(p.name, pc.candidate)))
                      if (side, job.model) in origins}
            rec = ComparisonRecord(p.name, job.group, job.model, pc.prompt_id, job.label, pc.candidate, pc.status,
                                   entry["first_divergence"], pc.detail, list(pc.nondeterministic),
                                   kl=entry["kl"], text_check=entry["text_check"],
                                   kl_mean_max=job.comparison.kl_mean_max, expected=job.expect, cached=cached)
            records.append(rec)
            self.say(f"[{p.name}] {job.group} {job.model} {pc.prompt_id}: {pc.candidate} vs {job.label}: {pc.detail}")
            cmp_path = self.run.layout.compare_json(p.name, pc.candidate)
            same = (job.group, job.model, pc.prompt_id)
            existing = json.loads(cmp_path.read_text()) if cmp_path.exists() else []
            existing = [e for e in existing if (e.get("group"), e.get("model"), e.get("prompt_id")) != same]
            write_json(cmp_path, existing + [entry])
        self.run.record_comparisons(records)  # recorded per model at once: an interrupt keeps them


def describe_abort(exc: BaseException) -> str:
    """Words for what ended a run early: "interrupted by SIGINT", "refused: <message>" for bad input found
    while it ran (harness.common.errors.HarnessError), or the exception's type and message."""
    if isinstance(exc, proc.Interrupted):
        return f"interrupted by {exc.signal_name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(exc, HarnessError):
        return f"refused: {exc}"
    return f"stopped by {type(exc).__name__}: {exc}"


#: What each stage of the command line runs, in order; compare-outputs ends with the speed stage.
STAGE_TABLE: dict[str, tuple[Callable[[Pipeline], None], ...]] = {
    "build": (Pipeline.stage_build,), "test": (Pipeline.stage_test,),
    "compare-outputs": (Pipeline.stage_compare, stage_speed)}


def run_stages(matrix: Matrix, run: Run, opts: Options, stages: Sequence[str],
               say: Callable[[str], None] | None = None, bases: Mapping[str, BaseTree] | None = None) -> int:
    """Run ``stages`` (build, test, compare-outputs) in order; return the exit code of the run's verdict
    (harness.record.results.VERDICT_EXIT_CODES: 0 passed, 1 failed, 3 incomplete or nothing ran).

    On SIGINT/SIGTERM (harness.common.proc.Interrupted) or any exception every child
    process group is terminated, the steps in progress are recorded as
    ``interrupted`` and the stages not reached as not run, the summary is
    written (``overall: incomplete`` unless something already failed) and,
    for a signal, 128 + its number is returned (130, 143); any other
    exception is raised again once the summary is written.  ``bases``: see :class:`Pipeline`.
    """
    pipe = Pipeline(matrix, run, opts, say, bases=bases)
    say = pipe.say
    try:
        for i, stage in enumerate(stages):
            try:
                for run_stage in STAGE_TABLE[stage]:
                    run_stage(pipe)
            except BaseException as exc:
                proc.terminate_all()
                why = describe_abort(exc)
                if not isinstance(exc, HarnessError):  # bad input: its one error: line comes from harness.cli
                    say(f"{why}: stopping; every child process is terminated")
                try:
                    pipe.record_unfinished(why)
                    run.mark_incomplete(f"{stage}: {why}; did not finish")
                    for later in stages[i + 1:]:
                        run.mark_incomplete(f"{later}: not run ({why})")
                    _finish(run, say, pipe.results_cache)
                except OSError as werr:  # e.g. the disk is full: what was written before stays
                    say(f"error: the summary could not be updated ({werr}); {run.dir / 'summary.json'} "
                        f"holds the run up to the last step that was written")
                if isinstance(exc, (proc.Interrupted, KeyboardInterrupt)):
                    return proc.exit_code_for(exc)
                raise
        _finish(run, say, pipe.results_cache)
    finally:
        pipe.close()
    return VERDICT_EXIT_CODES[run.overall()]


def _finish(run: Run, say: Callable[[str], None], cache: ResultCache | None = None) -> None:
    if cache is not None:
        run.count_cache(cache.stats)
        cache.stats.clear()
    run.write_summary()
    write_comparisons_junit(run)
    write_checks_junit(run, CHECK_STEPS)
    write_speed_junit(run)
    classify_run(run.dir)
    report = write_report(run.dir)
    say(f"results: {run.dir} — {run.headline()} (report: {report})")
