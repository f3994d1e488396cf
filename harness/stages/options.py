"""The command-line options every stage reads (harness.args and harness.cli fill them in)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Options:
    """Command-line options shared by the stages.

    ``platforms``: names given with --platform (empty: every platform, those
    this machine cannot run reported as skipped).  ``cmake_defines``: extra
    ``-D`` options passed through to CMake.  ``cuda_arch``: overrides the
    architectures read from nvidia-smi.  ``jobs``: jobs at once, every build and compile step together
    (:meth:`harness.stages.building.builds.Builds.job_budget`; None: the cores this process may use).
    ``sanitize``: a compute-sanitizer tool to run the native tests under.
    ``models``/``groups``: restrict comparisons.  ``n_predict``/``repeats``:
    override the matrix's generation settings (tokens, runs per config).  ``bench``: run the speed
    stage after the comparisons (harness.stages.speed.speed); ``bench_repeats``: its rounds per rule;
    ``bench_warmup``: its untimed rounds before them (None: the matrix's).
    ``no_cache``: regenerate every generation, rerun every native test and measure every speed pair
    instead of taking them from the result cache (docs/cache.md).  ``lanes``: generations at once on a
    CPU platform (None: :func:`harness.stages.outputs.greedy.lanes_for` decides).  ``upstream_tests``: the test
    command also runs upstream's own suite on base and fork (harness.stages.native_tests.upstream_suite).
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
    upstream_tests: bool = False
