"""A platform of the matrix against this machine: what it needs to be built and run here.

A platform's kind is its ``os``, ``arch`` and ``gpu`` in matrix.yaml (values the schema
``matrix.schema.json`` lists).  This module says what each kind needs of the host: the same OS
or a ``cross`` section (harness.stages.build.cross), the same architecture, an NVIDIA GPU or only nvcc
to build, enough host RAM; and what differs on it (executable suffix).  The pipeline skips a
platform with the reason :func:`cannot_build` or :func:`cannot_run` gives.
"""

from __future__ import annotations

import os
import platform as pyplatform
import shutil
import sys
from pathlib import Path
from typing import Callable

from ..record import environment
from ..stages.build import cross
from ..stages.build.cross import missing_build_tools, missing_run_tools
from .config import CrossSpec, Platform


def host_os() -> str:
    """This machine's OS in matrix terms: linux or windows (others as sys.platform)."""
    return "windows" if sys.platform.startswith("win") else ("linux" if sys.platform.startswith("linux") else sys.platform)


def host_arch() -> str:
    """This machine's architecture in matrix terms: x86_64 or aarch64 (others as platform.machine())."""
    return pyplatform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")


def compiles_instead(p: Platform) -> bool:
    """True when CUDA platform ``p`` is compiled here instead of built and run: it has
    ``compile_only`` options, this host has its OS and architecture, and no NVIDIA GPU."""
    return (bool(p.compile_only_cmake) and p.gpu == "nvidia" and p.os == host_os() and p.arch == host_arch()
            and not environment.nvidia_gpus())


def cross_built(p: Platform) -> bool:
    """True when this host builds ``p`` with its cross toolchain and runs it through its emulator.

    That is a platform of another OS with a ``cross`` section, on a Linux host.
    """
    return p.os != host_os() and p.cross is not None and host_os() == "linux"


def executable_suffix(p: Platform) -> str:
    """File name suffix of ``p``'s executables: ``.exe`` on Windows, else empty."""
    return ".exe" if p.os == "windows" else ""


def _other_os(p: Platform, missing_tools: Callable[[CrossSpec], str | None]) -> str | None:
    """Why this host cannot handle ``p`` of another OS, or None (also for a platform of this OS).

    A platform of another OS is handled here only through its ``cross`` section on a Linux host,
    and only when ``missing_tools(p.cross)`` (harness.stages.build.cross: the build or the run tools)
    names no missing Debian package.
    """
    if p.os == host_os():
        return None
    if not cross_built(p):
        return f"needs a {p.os} host; this is {host_os()}"
    assert p.cross is not None
    return missing_tools(p.cross)


def cannot_run(p: Platform) -> str | None:
    """Why this machine cannot run platform ``p`` (build and tests), or None when it can.

    A platform of another OS runs here only through its ``cross`` section, when
    the cross compiler and the emulator are installed; otherwise the reason
    names the missing Debian package.
    """
    why = _other_os(p, missing_run_tools)
    if why:
        return why
    machine = host_arch()
    if machine != p.arch:
        return f"needs {p.arch}; this is {machine}"
    if p.gpu == "nvidia" and not environment.nvidia_gpus():
        return "needs an NVIDIA GPU; nvidia-smi reports none on this machine"
    ram = environment.ram_bytes()
    if p.min_host_ram_gib and ram is not None and ram < p.min_host_ram_gib * 2**30:
        return f"needs {p.min_host_ram_gib} GiB of host RAM; this machine has {ram / 2**30:.1f} GiB"
    return None


#: Steps (nox sessions of ``ci.steps``) that only build a platform; the other steps run its executables.
BUILD_STEPS = frozenset({"build"})


def debian_packages(p: Platform, step: str) -> tuple[str, ...]:
    """The Debian packages a Linux host needs for step ``step`` (a nox session: build, test,
    compare-outputs) of platform ``p``, the packages :func:`cannot_build` and :func:`cannot_run`
    name when they are missing: for a platform of another OS with a ``cross`` section, its cross
    compiler's and, for a step that runs executables, its emulator's; else none.
    """
    if p.os == "linux" or p.cross is None:
        return ()
    return cross.debian_packages(p.cross, run=step not in BUILD_STEPS)


def find_nvcc() -> str | None:
    """The CUDA compiler CMake would find: $CUDACXX, nvcc on PATH, or /usr/local/cuda/bin/nvcc; None if absent."""
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


def cannot_build(p: Platform) -> str | None:
    """Why this machine cannot even build platform ``p``, or None (a CUDA build needs nvcc, not a GPU)."""
    why = _other_os(p, missing_build_tools)
    if why:
        return why
    if p.gpu == "nvidia" and not find_nvcc():
        return "needs the CUDA toolkit (nvcc on PATH, $CUDACXX or /usr/local/cuda/bin/nvcc) to build"
    return None
