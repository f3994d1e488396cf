"""The builds of a run: each platform's base and fork, built once per process and held for reading until the run ends.

:class:`Builds` is what every stage asks for a build (``build_variant``), for the base tree and the
patch series, for the emulator that runs a platform's programs and for the one job budget of all
builds.  A build is recorded as a ``build`` step where it is first built or found up to date, which
may be in a later stage than ``build`` (the models' quantize tool, a comparison's build).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from ...common.console import Console
from ...common.errors import EnvironmentProblem
from ...common.fs import sha256_files
from ...common.jobserver import JobBudget, available_cores
from ...common.locks import BuildLock, Rank, exclusive
from ...matrix.config import Matrix, Platform
from ...matrix.models import QUANTIZE_TARGET, ModelError, QuantizeTool
from ...kinds.registry import gpu_of
from ...matrix.platforms import cross_built, executable_suffix
from ...record import environment
from ...record.progress import InProgress
from ...record.json_files import write_json
from ...record.layout import BUILD_FILES
from ...record.records import Failure, StepRecord
from ...record.run import Run
from ..options import Options
from .engine_target import ENGINE_TARGET, engine_cmake_options, engine_source_digest
from .build import (BuildRequest, BuildResult, build, ccache_env, compiler_launcher_options, _run_step,
                    find_tool, is_up_to_date, up_to_date_result)
from ...matrix.host_tools import find_emulator_program
from .cross import Emulator, emulator_for
from .cuda_headers import SetupError, find_cuda_headers
from .patches import Patch, PatchApplyError, prepare_series_tree, read_series, series_digest, series_env_summary, \
    series_label
from .quantize_tool import no_quantize_platform, quantize_platform, tool_from_build
from .source import BaseTree, obtain_base, prepare_tree, raise_storage_problem, tree_state
from ...common.statuses import STEP_ERROR, STEP_PASSED


#: The CMake code that compiles a platform's ``unoptimised_targets`` at -O0, included at the end of ggml's project().
UNOPTIMISED_HOOK = Path(__file__).resolve().parent / "unoptimised.cmake"


def cmake_options(p: Platform, variant: str, patches: Sequence[Patch] = (), cuda_arch: str | None = None,
                  defines: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CMake cache options of platform ``p``'s ``variant`` build.

    The matrix's options, the compiler launcher (ccache), the harness's engine target
    (harness.stages.building.engine_target.engine_cmake_options), a RUNPATH relative to the binaries
    (CMAKE_BUILD_RPATH_USE_ORIGIN), the platform's ``unoptimised_targets`` at -O0 (:data:`UNOPTIMISED_HOOK`),
    the GPU kind's architecture variable (harness.kinds.shape.GpuKind.arch_cmake: ``cuda_arch``, else the
    kind's :attr:`~harness.kinds.shape.GpuKind.architectures` where the matrix says ``auto``), the cross toolchain and
    emulator of a cross-built platform, LLAMA_FORK_SERIES naming ``patches`` for the fork (and on a
    platform without GPU the CUDA headers for test-cuda-pin-ladder-host), then ``defines`` (-D
    overrides) last.  Raises
    RuntimeError when the architectures are ``auto`` and no GPU and no ``cuda_arch`` is given.
    """
    opts = dict(p.cmake)
    gpu = gpu_of(p)
    if gpu.arch_cmake and opts.get(gpu.arch_cmake) == "auto":
        arch = cuda_arch or gpu.architectures()
        if not arch:
            raise RuntimeError(f"{p.name}: {gpu.arch_cmake} is 'auto' but {gpu.visible_probe} reports no GPU; "
                               "pass --gpu-arch (e.g. 90)")
        opts[gpu.arch_cmake] = arch
    elif cuda_arch and gpu.arch_cmake:
        opts[gpu.arch_cmake] = cuda_arch
    opts.update(compiler_launcher_options(gpu.device_language))
    opts.update(engine_cmake_options(gpu))
    # the build tree's RUNPATH relative to the binaries ($ORIGIN), not the build directory's path: the same code
    # built in another checkout is the same bytes, and the result cache knows it (docs/cache.md)
    opts["CMAKE_BUILD_RPATH_USE_ORIGIN"] = "ON"
    if p.unoptimised_targets:
        opts["CMAKE_PROJECT_ggml_INCLUDE"] = UNOPTIMISED_HOOK.as_posix()
        opts["HARNESS_UNOPTIMISED_TARGETS"] = ";".join(p.unoptimised_targets)
    if cross_built(p):
        assert p.cross is not None
        opts["CMAKE_TOOLCHAIN_FILE"] = str(p.cross.toolchain)
        emulator = find_emulator_program(p.cross.emulator)
        if emulator:  # ctest runs the test executables through it (a CMake list: its argv)
            opts["CMAKE_CROSSCOMPILING_EMULATOR"] = emulator
    if variant == "fork":
        opts["LLAMA_FORK_SERIES"] = series_label(list(patches))
        if gpu_of(p).stub_runtime_headers:
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
    with the directory for its logs (to take the hold again, :meth:`Builds._build_and_hold`)."""

    lock: BuildLock
    req: BuildRequest
    logs: Path


class Builds:
    """The builds of one run: ``matrix``, ``run`` (where build steps are recorded), ``opts``, ``console`` and
    ``say`` (progress), ``progress`` (the steps in progress), ``cache`` (the harness cache directory,
    harness.stages.building.source.cache_dir) and ``bases``: variant -> its base tree where the caller gives one
    (an upstream forecast: "base" the other upstream, "old-base" the pinned one); other variants than base
    and fork are built unpatched from theirs."""

    def __init__(self, matrix: Matrix, run: Run, opts: Options, console: Console, say: Callable[[str], None],
                 progress: InProgress, cache: Path, bases: Mapping[str, BaseTree] | None = None):
        self.matrix, self.run, self.opts, self.console, self.say = matrix, run, opts, console, say
        self.progress, self.cache, self.bases = progress, cache, dict(bases or {})
        self.built: dict[tuple[str, str], BuildResult] = {}  # (platform, variant) -> this process's build
        self.commits: dict[str, str] = {}  # variant -> the commit its source tree was made from (environment.json)
        self._base: BaseTree | None = None
        self._patches: list[Patch] | None = None
        self._inputs = threading.Lock()  # the base and the series are read once, whichever thread asks first
        self._held: list[BuildHold] = []  # read holds on the builds this run uses, in the lock order
        self._emulators: dict[str, Emulator | Exception | None] = {}
        self._budget: JobBudget | None = None  # every build's job slots (harness.common.jobserver), made once
        self._budget_made = threading.Lock()

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

    # ----- inputs ----------------------------------------------------------------------------
    def base(self) -> BaseTree:
        """The verified base tree (obtained once per process, by the first thread that asks; one that fails
        raises to each caller, which records it)."""
        with self._inputs:
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
        with self._inputs:
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
        if (p.name, variant) in self.built:
            return self.built[(p.name, variant)]
        logs = self.run.layout.build_logs(p.name, variant)
        with self.progress.doing(p.name, variant, "build", recheck=True), \
                self.console.step(f"[{p.name}] build {variant}", watch=logs / BUILD_FILES["build"]) as shown:
            result = self._build_variant(p, variant)
            log = result.logs.get("build") or result.logs.get("configure") or (logs / BUILD_FILES["error"])
            shown.finish(result.status, result.detail, log if result.status != STEP_PASSED else "")
            return result

    def prepare_source(self, base: BaseTree, work: Path, variant: str, logs: Path) -> Path:
        """The source tree of ``variant`` under ``work``, made ready under its lock: the fork with the series applied
        (its log ``logs/patches.log``; PatchApplyError for a patch that does not apply), another variant from its
        base tree.  Returns the tree's path."""
        with exclusive(work / variant / "llama.cpp", f"the {variant} source tree", Rank.SOURCE, self.say):
            if variant == "fork":
                tree = prepare_series_tree(base, work, "fork", self.patches(), log=logs / BUILD_FILES["patches"])
                self.commits[variant] = tree_state(tree)[0]  # the series applied: the fork tree's HEAD
                return tree
            self.commits[variant] = self.bases.get(variant, base).commit  # upstream's commit, as pinned
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
        with self._holds_given_up_from(req.build_dir):
            return self._hold(req, logs)

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
            if built.status != STEP_PASSED:
                return built
        assert built is not None
        built.status, built.detail = STEP_ERROR, (f"{req.build_dir} was rebuilt with other options by another "
                                               "harness process three times in a row")
        return built

    def build_more(self, p: Platform, variant: str, targets: Sequence[str], log: Path) -> tuple[int, float]:
        """Build ``targets`` in the build directory of ``variant`` of ``p``, which :meth:`build_variant` built and
        this run holds, beside what that build declares (upstream's suite asks its own ctest which targets it
        needs: harness.stages.native_tests.upstream_suite); its stamp and key are left as they are, and ninja decides
        what is out of date.

        The directory's lock is taken for writing (the holds that sort at or after it given up first and taken
        again after, as :meth:`_build_and_hold` does), the command runs in the run's job budget with ccache based
        at the work directory that holds the build directory (the real one, where the run's work directory links
        to another's: the paths its configure wrote are below that one), its output in ``log`` (its exit code
        beside it).  Returns (exit code, seconds);
        (0, 0.0) for no target.  Raises KeyError when the build was not made by this process."""
        if not targets:
            return 0, 0.0
        built = self.built[(p.name, variant)]
        with self._holds_given_up_from(built.build_dir), BuildLock(built.build_dir).write(self.say):
            budget = self.job_budget()
            argv = [find_tool("cmake") or "cmake", "--build", str(built.build_dir),
                    *budget.jobs_option(self.opts.jobs), "--target", *targets]
            return _run_step(argv, log, ccache_env(built.build_dir.resolve().parents[1]), budget)

    @contextmanager
    def _holds_given_up_from(self, build_dir: Path) -> Iterator[None]:
        """Give up the read holds that sort at or after ``build_dir``'s lock for the body, then take them again in
        order (:meth:`_take_again`): the lock order of :meth:`_build_and_hold`."""
        key = BuildLock(build_dir).key
        later = [h for h in self._held if h.lock.key >= key]
        for h in later:
            self._held.remove(h)
            h.lock.release()
        try:
            yield
        finally:
            for h in sorted(later, key=lambda h: h.lock.key):
                self._take_again(h)

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
            source = self.prepare_source(base, work, variant, logs)
            if variant == "fork":
                key_parts = {"base": base.commit, "series": series_digest(self.patches()),
                             "engine": engine_source_digest(gpu_of(p))}
            else:
                key_parts = {"base": self.bases.get(variant, base).commit, "engine": engine_source_digest(gpu_of(p))}
            if p.unoptimised_targets:  # the hook's bytes: an edit of it rebuilds
                key_parts["unoptimised"] = sha256_files([UNOPTIMISED_HOOK])
            targets = (*p.targets, ENGINE_TARGET) + (p.test_targets if variant == "fork" else ())
            req = BuildRequest(p.name, variant, source, work / variant / f"build-{p.name}",
                               self.cmake_options(p, variant), tuple(targets), key_parts, self.opts.jobs,
                               env=ccache_env(work), exe_suffix=executable_suffix(p))
            result = self._build_and_hold(req, logs)
            if result.status != STEP_PASSED:
                raise_storage_problem(None, self.opts.work_dir)  # a build a full disk broke is not the fork's
        except EnvironmentProblem:
            raise  # the machine's, not the fork's: the run stops, exit 2 (harness.pipeline)
        except Exception as exc:  # a broken input must not stop other platforms: record it
            raise_storage_problem(exc, self.opts.work_dir)
            result = BuildResult(p.name, variant, STEP_ERROR, "", Path(), time.monotonic() - start, False,
                                 detail=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, PatchApplyError):
                failures.append(Failure("patch", patch=exc.patch, message=str(exc)))
            else:
                failures.append(Failure("exception", message=result.detail))
            logs.mkdir(parents=True, exist_ok=True)
            (logs / BUILD_FILES["error"]).write_text(result.detail + "\n")
        self._record_build(p.name, variant, result, logs, failures)
        return result

    def _record_build(self, platform: str, variant: str, result: BuildResult, logs: Path,
                      failures: Sequence[Failure] = ()) -> None:
        """Keep ``result`` as the build of ``platform``/``variant`` and record its ``build`` step, unless it is an
        up-to-date check of a build this run already recorded as passed."""
        self.built[(platform, variant)] = result
        earlier = self.run.step(platform, variant, "build")
        if result.up_to_date and earlier is not None and earlier.status == STEP_PASSED:
            # a later stage of the same run found the build up to date: keep the record of the real build
            return
        log = result.logs.get("build") or result.logs.get("configure") or (logs / BUILD_FILES["error"])
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
        dirs = {v: b.build_dir for (pn, v), b in self.built.items() if pn == p.name and b.status == STEP_PASSED}
        self.run.platform_dir(p.name)
        write_json(self.run.layout.environment_json(p.name),
                   environment.collect(commit, source, patches, dirs, dict(self.commits)))

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

    def quantize_tool(self) -> QuantizeTool:
        """The llama-quantize that derives the matrix's quantized models: the base build of the host's CPU platform
        (harness.stages.building.quantize_tool), built first when this run has not built it; ModelError naming the build
        when it failed."""
        p = quantize_platform(self.matrix.platforms.values())
        if p is None:
            raise no_quantize_platform()
        built = self.build_variant(p, "base")
        if built.status != STEP_PASSED:
            raise ModelError(f"{QUANTIZE_TARGET}: the base build of {p.name} {built.status}: {built.detail}")
        return tool_from_build(p, built.bin_dir)
