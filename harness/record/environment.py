"""Facts about the machine a platform ran on, recorded in each platform's environment.json (:func:`collect`) and
read back typed (:func:`read_environment`)."""

from __future__ import annotations

import os
import platform as pyplatform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..kinds.registry import GPUS, machine_devices
from .gpu import pin_environment
from .json_files import read_record_json
from .records import RecordError


def _first_line(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if not exe:
        return None
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0].strip() if text else None


def ram_bytes() -> int | None:
    """Total host RAM in bytes (from /proc/meminfo or os.sysconf); None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux, else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def cmake_cache_compilers(build_dir: Path) -> dict[str, str]:
    """Compiler ids and versions CMake detected for a build dir (from CMakeFiles/*/CMake*Compiler.cmake)."""
    out: dict[str, str] = {}
    for lang in ("C", "CXX", "CUDA"):
        for f in build_dir.glob(f"CMakeFiles/*/CMake{lang}Compiler.cmake"):
            text = f.read_text(errors="replace")
            cid = re.search(rf'set\(CMAKE_{lang}_COMPILER_ID "([^"]*)"\)', text)
            ver = re.search(rf'set\(CMAKE_{lang}_COMPILER_VERSION "([^"]*)"\)', text)
            path = re.search(rf'set\(CMAKE_{lang}_COMPILER "([^"]*)"\)', text)
            if cid:
                out[lang] = f"{cid.group(1)} {ver.group(1) if ver else '?'} ({path.group(1) if path else '?'})"
    return out


def collect(base_commit: str, base_source: str, patches: list[dict[str, str]],
            build_dirs: dict[str, Path] | None = None, build_commits: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything environment.json records for one platform run.

    ``patches`` is [{name, sha256}] of the applied series; ``build_dirs`` maps
    variant -> build dir, whose detected compilers are included; ``build_commits`` maps variant -> the
    commit its source tree was made from (upstream's pinned commit for base, the fork tree's HEAD for the
    fork), known also for a build found up to date, which configures nothing.
    """
    gpus, visible, versions = machine_devices()
    env: dict[str, Any] = {
        "os": pyplatform.platform(),
        "machine": pyplatform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "ram_bytes": ram_bytes(),
        "python": sys.version.split()[0],
        "cmake": _first_line(["cmake", "--version"]),
        "ninja": _first_line(["ninja", "--version"]),
        "ccache": _first_line(["ccache", "--version"]),
        "cc": _first_line(["cc", "--version"]),
        **versions,  # each GPU kind's driver and toolkit (cuda_toolkit, cuda_driver: harness.kinds)
        "gpus": gpus,
        "visible_gpus": visible,
        # inherited by every generation: an inherited GGML_CUDA_NO_PINNED changes every CUDA result
        "pin_environment": pin_environment(),
        "base_commit": base_commit,
        "base_source": base_source,
        "patches": patches,
        "build_commits": dict(build_commits or {}),
    }
    for variant, d in (build_dirs or {}).items():
        env[f"compilers_{variant}"] = cmake_cache_compilers(d)
    return env


def machine_fingerprint(env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What makes speeds of two runs comparable: CPU model and core count, the GPUs (name and driver),
    how many are visible, the versions of each GPU kind's driver and toolkit (``cuda_driver``, ``cuda_toolkit``:
    harness.kinds.shape.GpuKind.version_keys).

    ``env`` is an environment.json record (:func:`collect`); without it the facts are read from
    this machine.  Two runs' tok/s are compared only when these dicts are equal
    (harness.analysis.triage); anything else, RAM or the OS patch level, is left out.
    """
    if env is None:
        gpus, visible, versions = machine_devices()
        env = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "visible_gpus": visible, **versions}
    keys = [key for k in GPUS.values() if k.has_device for key in k.version_keys()]
    return {"cpu": env.get("cpu"), "cpu_count": env.get("cpu_count"),
            "gpus": [[g.get("name"), g.get("driver")] for g in env.get("gpus") or [] if isinstance(g, dict)],
            "visible_gpus": env.get("visible_gpus"), **{key: env.get(key) for key in sorted(keys)}}


@dataclass(frozen=True)
class EnvironmentRecord:
    """A platform's environment.json as :func:`collect` writes it: the machine (``os``, ``machine``, ``cpu``,
    ``cpu_count``, ``ram_bytes`` in bytes), the tools' first lines (``python``, ``cmake``, ``ninja``, ``ccache``,
    ``cc``), CUDA (``cuda_toolkit``, ``cuda_driver``), the ``gpus`` ({name, driver, ...} each) and how many are
    ``visible_gpus``, the ``pin_environment``, the ``base_commit`` and ``base_source``, the ``patches`` applied
    ({name, sha256} each; None where not recorded), the compilers CMake found per build variant
    (``compilers``: variant -> language -> compiler) and the commit each variant's source tree was made from
    (``build_commits``: variant -> full commit id).  Facts not recorded are None (or empty)."""

    os: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    ram_bytes: int | None = None
    python: str | None = None
    cmake: str | None = None
    ninja: str | None = None
    ccache: str | None = None
    cc: str | None = None
    cuda_toolkit: str | None = None
    cuda_driver: str | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()
    visible_gpus: int | None = None
    pin_environment: Mapping[str, str] = field(default_factory=dict)
    base_commit: str = ""
    base_source: str = ""
    patches: tuple[Mapping[str, str], ...] | None = None
    compilers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    build_commits: Mapping[str, str] = field(default_factory=dict)


#: The text facts of :class:`EnvironmentRecord`, None where not recorded.
_TEXTS = ("os", "machine", "cpu", "python", "cmake", "ninja", "ccache", "cc", "cuda_toolkit", "cuda_driver")
_COUNTS = ("cpu_count", "ram_bytes", "visible_gpus")


def read_environment(path: Path) -> EnvironmentRecord:
    """The environment record at ``path`` (harness.record.layout.RunLayout.environment_json).  Raises
    FileNotFoundError naming the file when there is none (the platform recorded none), harness.record.records
    .RecordError naming it when it is not JSON or not of the shape of :class:`EnvironmentRecord` (a GPU or a
    patch that is not an object, a count that is not a number included)."""
    data = read_record_json(path, "no environment.json; the platform did not build here")
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        texts = {k: None if data.get(k) is None else str(data[k]) for k in _TEXTS}
        counts = {k: None if data.get(k) is None else int(data[k]) for k in _COUNTS}
        gpus = tuple(dict(g) for g in data.get("gpus") or [])
        patches = data.get("patches")
        return EnvironmentRecord(
            **texts, **counts, gpus=gpus,
            pin_environment={str(k): str(v) for k, v in (data.get("pin_environment") or {}).items()},
            base_commit=str(data.get("base_commit") or ""), base_source=str(data.get("base_source") or ""),
            patches=None if patches is None else tuple(dict(x) for x in patches),
            compilers={k[len("compilers_"):]: {str(lang): str(c) for lang, c in v.items()}
                       for k, v in data.items() if k.startswith("compilers_")},
            build_commits={str(k): str(v) for k, v in (data.get("build_commits") or {}).items()})
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not an environment record ({exc})") from None
