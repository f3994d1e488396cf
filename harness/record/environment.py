"""Facts about the machine a platform ran on, recorded in each platform's environment.json."""

from __future__ import annotations

import os
import platform as pyplatform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from ..kinds import nvidia
from .gpu import pin_environment


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


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, as nvidia-smi prints it in its banner (e.g. "13.0")."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run([smi], capture_output=True, text=True)
    m = re.search(r"CUDA Version:\s*([\d.]+)", proc.stdout)
    return m.group(1) if m else None


def nvcc_version() -> str | None:
    """The CUDA toolkit release from ``nvcc --version`` (e.g. "13.0, V13.0.48"); None without nvcc."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"release\s+([^\n]+)", proc.stdout)
    return m.group(1).strip() if m else None


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
            build_dirs: dict[str, Path] | None = None) -> dict[str, Any]:
    """Everything environment.json records for one platform run.

    ``patches`` is [{name, sha256}] of the applied series; ``build_dirs`` maps
    variant -> build dir, whose detected compilers are included.
    """
    gpus = nvidia.nvidia_gpus()
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
        "cuda_toolkit": nvcc_version(),
        "cuda_driver": cuda_driver_version(),
        "gpus": gpus,
        "visible_gpus": nvidia.visible_gpu_count(gpus),
        # inherited by every generation: an inherited GGML_CUDA_NO_PINNED changes every CUDA result
        "pin_environment": pin_environment(),
        "base_commit": base_commit,
        "base_source": base_source,
        "patches": patches,
    }
    for variant, d in (build_dirs or {}).items():
        env[f"compilers_{variant}"] = cmake_cache_compilers(d)
    return env


def machine_fingerprint(env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What makes speeds of two runs comparable: CPU model and core count, the GPUs (name and driver),
    how many are visible, the CUDA driver and toolkit versions.

    ``env`` is an environment.json record (:func:`collect`); without it the facts are read from
    this machine.  Two runs' tok/s are compared only when these dicts are equal
    (harness.analysis.triage); anything else, RAM or the OS patch level, is left out.
    """
    if env is None:
        gpus = nvidia.nvidia_gpus()
        env = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "visible_gpus": nvidia.visible_gpu_count(gpus),
               "cuda_driver": cuda_driver_version(), "cuda_toolkit": nvcc_version()}
    return {"cpu": env.get("cpu"), "cpu_count": env.get("cpu_count"),
            "gpus": [[g.get("name"), g.get("driver")] for g in env.get("gpus") or [] if isinstance(g, dict)],
            "visible_gpus": env.get("visible_gpus"), "cuda_driver": env.get("cuda_driver"),
            "cuda_toolkit": env.get("cuda_toolkit")}
