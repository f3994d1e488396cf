"""The one shape of a platform kind: what a GPU kind (matrix.yaml's ``hardware.gpu``) and an OS
(``os``) are, declared once in a module of their own (harness.kinds.cpu, .nvidia, .linux,
.windows) and listed in one registry (harness.kinds.registry).

A stage never compares a platform's ``gpu`` or ``os`` with a string (tests/test_imports.py); it asks
the kind's record: does it have a device, how many are visible, what it needs to build, which
environment variables its backend reads and what they do, where the expert weights land per load
mode, how its generations share the machine, what its executables are called and how they write
lines.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping

#: Where a MoE model's expert tensors are loaded, the load modes of :attr:`GpuKind.expert_homes`:
#: ``device``: offloaded to the GPU (no ``--cpu-moe``); ``host-mmap``: kept in host memory, the
#: model memory-mapped; ``host``: kept in host memory, read into the backend's host buffer (mmap
#: off); ``host-unpinned``: the same with the backend's pinned host memory turned off.
LOAD_MODES = ("device", "host-mmap", "host", "host-unpinned")

#: The directory of the kinds' modules and of the engine probe headers they name (:attr:`EngineProbe.header`).
KINDS_DIR = Path(__file__).resolve().parent

#: What a backend's pinning variables do, the keys of :attr:`GpuKind.pin_vars` (the expectation and reload
#: rules read a configuration's environment through them): ``no-pinned``: set at all, the host buffer type
#: hands out pageable memory; ``pin-layers``: a positive N keeps only the experts of layers 0..N-1 pinned;
#: ``sim-total-max-mb``: a simulated cap on the bytes pinned (MiB); ``sim-sticky``: a simulated refusal of
#: every pin after the first.
PIN_ROLES = ("no-pinned", "pin-layers", "sim-total-max-mb", "sim-sticky")


@dataclass(frozen=True)
class HostTool:
    """A program this machine needs: the names tried on PATH, then fixed paths, and the Debian package
    that brings it (what a skip reason names)."""

    what: str
    programs: tuple[str, ...]
    debian: str
    paths: tuple[str, ...] = ()
    #: environment variables that name the program, tried before PATH (``CUDACXX`` for nvcc)
    env: tuple[str, ...] = ()

    def find(self, which: Callable[[str], str | None] = shutil.which) -> str | None:
        """The program's path on this machine: the first of ``env`` set to an existing file, of ``programs``
        that ``which`` finds (on PATH), of ``paths`` that is executable; None when none is there."""
        for var in self.env:
            value = os.environ.get(var)
            if value and os.path.exists(value):
                return value
        for name in self.programs:
            found = which(name)
            if found:
                return found
        for path in self.paths:
            if os.access(path, os.X_OK):
                return path
        return None


@dataclass(frozen=True)
class EnvVar:
    """An environment variable the backend reads, and what it means for placement and pinning.

    ``presence``: any value counts, the empty one included (the fork and upstream test the variable
    with getenv() != NULL), else its value is parsed; ``effect``: ``placement``, ``pinning``,
    ``visibility`` (which devices a program sees) or ``simulation`` (a simulated limit of the
    fork's pin ladder, for tests); a name ending in ``_`` is a prefix of a family of variables.
    """

    name: str
    effect: Literal["placement", "pinning", "visibility", "simulation"]
    meaning: str
    presence: bool = False

    def matches(self, var: str) -> bool:
        """True when ``var`` is this variable, or of this family where ``name`` ends in ``_``."""
        return var.startswith(self.name) if self.name.endswith("_") else var == self.name


@dataclass(frozen=True)
class EngineProbe:
    """How the harness's engine (harness/stages/outputs/engine: its ``probe`` and ``reload`` requests) asks a GPU
    kind's runtime which host bytes are page-locked.  Passed to the engine's CMake as cache variables
    (:meth:`cmake_options`), read by its targets.cmake; nothing of the engine names a backend.

    ``header``: a C++ header, its file name under harness/kinds/ (:data:`KINDS_DIR`; or an absolute path),
    that defines ``long long harness_probe_page_locked(const char * p, size_t n, size_t step)``: the bytes of
    ``[p, p + n)`` the runtime reports page-locked, asked every ``step`` bytes, each answer standing for the
    bytes up to the next one.  ``driver``: the name the probe record gives the runtime (its ``driver`` key: ``cuda``), a
    lower-case identifier.  ``backend_option``: ggml's CMake option of the backend (``GGML_CUDA``): only a build
    that sets it gets the probe.  ``package``: the CMake package that finds the runtime (``CUDAToolkit``);
    ``library``, ``static_library``: its imported targets the engine links, the second where the build sets
    ``GGML_STATIC`` (the flavour the backend itself links).
    """

    header: str
    driver: str
    backend_option: str
    package: str
    library: str
    static_library: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.driver):
            raise ValueError(f"engine probe {self.header}: driver {self.driver!r} is not a lower-case identifier "
                             "(the engine writes it into JSON as it is)")

    @property
    def header_path(self) -> Path:
        """The header's path (under :data:`KINDS_DIR`)."""
        return KINDS_DIR / self.header

    def cmake_options(self) -> dict[str, str]:
        """The CMake cache variables the engine's targets.cmake reads: ``HARNESS_ENGINE_PROBE_HEADER`` (the
        header's absolute path, forward slashes), ``..._DRIVER``, ``..._BACKEND_OPTION``, ``..._PACKAGE``,
        ``..._LIBRARY``, ``..._STATIC_LIBRARY``."""
        return {"HARNESS_ENGINE_PROBE_HEADER": self.header_path.as_posix(),
                "HARNESS_ENGINE_PROBE_DRIVER": self.driver,
                "HARNESS_ENGINE_PROBE_BACKEND_OPTION": self.backend_option,
                "HARNESS_ENGINE_PROBE_PACKAGE": self.package,
                "HARNESS_ENGINE_PROBE_LIBRARY": self.library,
                "HARNESS_ENGINE_PROBE_STATIC_LIBRARY": self.static_library}


@dataclass(frozen=True)
class GpuKind:
    """A GPU kind of matrix.yaml (``hardware.gpu``), declared once.

    ``backend``: ggml's backend its builds run (``CPU``, ``CUDA``); ``described``: a platform of this
    kind in a sentence ("a platform without a GPU").
    ``device``: what a platform of this kind needs to run, as a skip reason names it ("an NVIDIA GPU");
    None for a kind without a device (``none``); ``devices``: several of them ("NVIDIA GPUs").  ``visible``: how many of its devices a program
    started from here sees (0 for no device), as ``visible_probe`` (the tool asked) reports.  ``build_tool``: the compiler a build needs beside the
    host's (nvcc), None for none.  ``env``: the variables the backend reads (:class:`EnvVar`), and
    ``backend_env``: a pattern of every variable only this backend reads (a configuration setting
    one on a platform of another kind is refused, harness.stages.building.preflight).
    ``expert_homes``: load mode (:data:`LOAD_MODES`) -> the buffer type the expert tensors land in,
    as a placement rule writes it (harness.stages.checks.expectation_rules); a mode left out does
    not happen on this kind.  ``lanes``: how its generations share the machine: ``per-core``, one
    process per core (a CPU platform), or ``one`` process at a time (a GPU's memory, pinned host
    memory and bus are shared by every process).  ``arch_cmake``: the CMake variable of the
    device architectures ``--gpu-arch`` sets, None for none; ``architectures``: those of the devices here, as
    that variable takes them, asked of the kind's tool where the matrix says ``auto`` (None: no device here).
    ``device_language``: the CMake language of its device code (``CUDA``), whose compiler gets ccache as its
    launcher as C and C++ do (harness.stages.building.build.compiler_launcher_options); None for none.
    ``engine_probe``: how the engine asks its runtime which host bytes are page-locked (:class:`EngineProbe`;
    None: its builds' probe reports no page-locked count, as on the CPU).
    ``sanitizer_args``: the arguments the :attr:`sanitizer` takes after ``--tool TOOL`` for a native test
    (``test``) and for a generation (``generation``), in :meth:`sanitizer_argv`.  ``stub_runtime_headers``: a fork
    build of this kind compiles the pin ladder's host test against the CUDA runtime's headers from
    PyPI (a kind without a CUDA runtime of its own).

    What of this machine its results depend on (the result cache's machine identity, environment.json):
    ``inventory``: its devices here as its tool lists them ({name, driver, memory, ...} each; [] for none);
    ``driver_version`` and ``toolkit_version``: the versions of its driver and of its compiler, recorded
    as ``<backend>_driver`` and ``<backend>_toolkit`` (:meth:`version_keys`: ``cuda_driver``); and
    ``runtime_libraries``: the runtime libraries a build links, found from its ``CMakeCache.txt`` (the
    path given, or None).  ``pin_vars``: role (:data:`PIN_ROLES`) -> the variable of :attr:`env` that plays it
    (none for a kind that pins nothing).
    """

    name: str
    backend: str
    described: str
    device: str | None
    devices: str | None
    visible: Callable[[], int]
    expert_homes: Mapping[str, str]
    lanes: Literal["per-core", "one"]
    build_tool: HostTool | None = None
    env: tuple[EnvVar, ...] = ()
    backend_env: re.Pattern[str] | None = None
    arch_cmake: str | None = None
    stub_runtime_headers: bool = False
    visible_probe: str = ""
    #: the program that checks its device code's memory accesses under ``--sanitize`` (None: no such checker)
    sanitizer: str | None = None
    sanitizer_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    architectures: Callable[[], str | None] = lambda: None
    inventory: Callable[[], list[dict[str, str]]] = lambda: []
    driver_version: Callable[[], str | None] = lambda: None
    toolkit_version: Callable[[], str | None] = lambda: None
    runtime_libraries: Callable[[Path | None], list[Path]] = lambda cmake_cache: []
    pin_vars: Mapping[str, str] = field(default_factory=dict)
    engine_probe: EngineProbe | None = None
    device_language: str | None = None

    def __post_init__(self) -> None:
        unknown = [r for r in self.pin_vars if r not in PIN_ROLES]
        if unknown or not all(any(e.matches(v) for e in self.env) for v in self.pin_vars.values()):
            raise ValueError(f"GPU kind {self.name}: pin_vars {dict(self.pin_vars)} name a role outside {PIN_ROLES} "
                             f"or a variable outside its env")

    @property
    def has_device(self) -> bool:
        """True for a kind whose programs run on a device (a GPU), False for a CPU-only kind."""
        return self.device is not None

    @property
    def pinned_host_type(self) -> str | None:
        """The buffer type of the backend's page-locked host memory (``CUDA_Host``), where the experts of a load
        with mmap off land (:attr:`expert_homes` ``host``); None for a kind without one.  A simulated cap on the
        bytes pinned is a floor on this type's buffers (harness.stages.checks.expectation_probe.cap_floor_bytes)."""
        return self.expert_homes.get("host") if self.has_device else None

    def sanitizer_argv(self, tool: str, use: Literal["test", "generation"]) -> tuple[str, ...]:
        """The command prefix that runs a native test (``use`` ``test``) or a generation (``generation``) under
        :attr:`sanitizer` with ``tool`` (``memcheck``...); raises ValueError for a kind without a sanitizer."""
        if self.sanitizer is None:
            raise ValueError(f"GPU kind {self.name}: no sanitizer")
        return (self.sanitizer, "--tool", tool, *self.sanitizer_args.get(use, ()))

    def version_keys(self) -> tuple[str, str]:
        """The keys its driver's and toolkit's versions are recorded under: ``<backend>_driver``,
        ``<backend>_toolkit`` (``cuda_driver``, ``cuda_toolkit``)."""
        return f"{self.backend.lower()}_driver", f"{self.backend.lower()}_toolkit"

    def visibility(self) -> str:
        """The variables that choose the devices a program sees, as set here: ``VAR=value`` (``unset``), joined."""
        return ", ".join(f"{e.name}={os.environ.get(e.name, 'unset')}" for e in self.env if e.effect == "visibility")

    def reads(self, var: str) -> bool:
        """True when ``var`` is an environment variable only this kind's backend reads (:attr:`backend_env`)."""
        return bool(self.backend_env and self.backend_env.match(var))

    def records(self, var: str) -> bool:
        """True when ``var`` is one of :attr:`env` (a run's environment records it: harness.record.gpu)."""
        return any(e.matches(var) for e in self.env)


@dataclass(frozen=True)
class OsKind:
    """An OS of matrix.yaml (``os``), declared once.

    ``executable_suffix``: the file name suffix of its executables; ``crlf_stdout``: its C runtime
    writes ``\\r\\n`` for ``\\n`` on standard output in text mode (llama-tokenize's and
    llama-completion's output read back byte for byte); ``sys_platform``: the prefix of Python's
    ``sys.platform`` on a host of this OS; ``runner_label``: a CI runner label that names this OS
    (``windows`` or ``windows-*``); ``cross_host``: builds of another OS cross-compile on a host of
    this OS only where True (the toolchain files and emulators are Linux's); ``shell``: the CI job's
    shell on a runner of this OS; ``max_path``: the longest path, in characters, its file APIs take without
    long path support (None: no limit a layout reaches).
    """

    name: str
    executable_suffix: str
    crlf_stdout: bool
    sys_platform: str
    runner_label: str
    shell: str
    cross_host: bool = False
    max_path: int | None = None

    def executable(self, name: str) -> str:
        """``name`` with this OS's executable suffix."""
        return name + self.executable_suffix

    def labels_it(self, label: str) -> bool:
        """True when CI runner label ``label`` names this OS (``windows``, ``windows-2022``)."""
        return label == self.runner_label or label.startswith(self.runner_label + "-")
