"""Every path of a run directory (:class:`RunLayout`): the stages write there, signatures, triage and report
read there; nothing else builds a results path by hand::

    results/<run-id>/
        run.json                      run id, command line, times, platforms
        summary.json  summary.md      every step and every comparison
        signatures.json  report.html  written after the stages (harness.triage.signatures, harness.views.report)
        forecast.json  forecast.md    an upstream forecast's patches, stages and verdict (harness.upstream.forecast)
        junit/                        JUnit XML of the comparisons, checks, speed rules and upstream's suite per platform
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
    results/junit/                    a copy of the latest run's junit/ (a stable path for CI)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterator


TESTS_FILES = {"log": "ctest.log", "junit": "junit.xml", "run": "tests.json", "sanitizer": "sanitizer.json",
               "gpu_facts": "gpu-facts.json"}


#: The files of upstream's suite (:meth:`RunLayout.upstream_tests`): the pair record of the platform's directory
#: (harness.record.upstream_tests) and test-backend-ops' perf mode (harness.stages.native_tests.backend_ops); in
#: each variant's directory beside :data:`TESTS_FILES`, the log of the build of the suite's test targets and
#: test-backend-ops' SQL output.
UPSTREAM_FILES = {"pairs": "pairs.json", "build": "build-tests.log", "sql": "backend-ops.sql",
                  "perf": "backend-ops-perf.json"}


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
        """``signatures.json``: harness.triage.signatures.classify_run's output."""
        return self.dir / "signatures.json"

    @property
    def junit_dir(self) -> Path:
        """``junit/``: the run's JUnit XML, one file per kind and platform (harness.record.junit)."""
        return self.dir / "junit"

    @property
    def report_html(self) -> Path:
        """``report.html``: harness.views.report's page."""
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

    #: The step of upstream's suite, base and fork side by side (harness.stages.native_tests.upstream_suite).
    UPSTREAM_STEP = "upstream-tests"

    def upstream_tests(self, platform: str, variant: str | None = None) -> Path:
        """``<platform>/upstream-tests/`` (its pair record, :data:`UPSTREAM_FILES`), or a variant's directory below
        it (``base/``, ``fork/``, ``backend-ops-<mode>-<variant>/``), whose files are named by :data:`TESTS_FILES`."""
        here = self.platform(platform) / self.UPSTREAM_STEP
        return here / variant if variant else here

    def upstream_file(self, platform: str, name: str, variant: str | None = None) -> Path:
        """The file ``name`` (a key of :data:`UPSTREAM_FILES`, else of :data:`TESTS_FILES`) of upstream's suite: of
        the platform's directory, or of ``variant``'s."""
        return self.upstream_tests(platform, variant) / (UPSTREAM_FILES.get(name) or TESTS_FILES[name])

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
        """``forecast.json``: an upstream forecast's patches, stages and verdict (harness.upstream.forecast)."""
        return self.dir / "forecast.json"

    @property
    def forecast_md(self) -> Path:
        """``forecast.md``: the same for people."""
        return self.dir / "forecast.md"

    @property
    def bisect_json(self) -> Path:
        """``bisect.json``: per failing row of the run, its first bad patch, the last good point, the verdict at both
        and the cost (harness.bisect)."""
        return self.dir / "bisect.json"

    @property
    def bisect_md(self) -> Path:
        """``bisect.md``: the same for people."""
        return self.dir / "bisect.md"

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
