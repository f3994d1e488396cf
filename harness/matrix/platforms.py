"""A platform of the matrix against this machine: what it needs to be built and run here.

A platform's kind is its ``os``, ``arch`` and ``gpu`` in matrix.yaml (values the schema
``matrix.schema.json`` lists), each declared once in harness.kinds.  This module says what a platform
needs of the host, asking its kinds: the same OS or a ``cross`` section (harness.stages.building.cross),
the same architecture, its GPU kind's device to run and its build tool to build, enough host RAM;
and what differs on it (executable suffix).  The pipeline skips a
platform with the reason :func:`cannot_build` or :func:`cannot_run` gives.
"""

from __future__ import annotations

from typing import Callable

from ..kinds.registry import cross_host, gpu_of, host_arch, host_os, on_host_os, os_of
from ..kinds.machine import ram_bytes
from .config import CrossSpec, Platform
from .host_tools import debian_packages as cross_packages
from .host_tools import missing_build_tools, missing_run_tools

__all__ = ["host_arch", "host_os"]  # this machine's OS and architecture in matrix terms (harness.kinds.registry)


def compiles_instead(p: Platform) -> bool:
    """True when GPU platform ``p`` is compiled here instead of built and run: it has
    ``compile_only`` options, this host has its OS and architecture, and none of its kind's devices."""
    kind = gpu_of(p)
    return (bool(p.compile_only_cmake) and kind.has_device and on_host_os(p) and p.arch == host_arch()
            and not kind.visible())


def cross_built(p: Platform) -> bool:
    """True when this host builds ``p`` with its cross toolchain and runs it through its emulator.

    That is a platform of another OS with a ``cross`` section, on a host whose OS kind cross-builds (Linux).
    """
    return not on_host_os(p) and p.cross is not None and cross_host()


def executable_suffix(p: Platform) -> str:
    """File name suffix of ``p``'s executables (its OS kind's: ``.exe`` on Windows, else empty)."""
    return os_of(p).executable_suffix


def _other_os(p: Platform, missing_tools: Callable[[CrossSpec], str | None]) -> str | None:
    """Why this host cannot handle ``p`` of another OS, or None (also for a platform of this OS).

    A platform of another OS is handled here only through its ``cross`` section on a Linux host,
    and only when ``missing_tools(p.cross)`` (harness.matrix.host_tools: the build or the run tools)
    names no missing Debian package.
    """
    if on_host_os(p):
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
    kind = gpu_of(p)
    if kind.has_device and not kind.visible():
        return f"needs {kind.device}; {kind.visible_probe} reports none on this machine"
    ram = ram_bytes()
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
    if os_of(p).cross_host or p.cross is None:
        return ()
    return cross_packages(p.cross, run=step not in BUILD_STEPS)


def cannot_build(p: Platform) -> str | None:
    """Why this machine cannot even build platform ``p``, or None (a GPU build needs its kind's build tool,
    nvcc for CUDA, not a GPU)."""
    why = _other_os(p, missing_build_tools)
    if why:
        return why
    tool = gpu_of(p).build_tool
    if tool is not None and not tool.find():
        where = [f"${v}" for v in tool.env] + [f"{n} on PATH" for n in tool.programs] + list(tool.paths)
        return f"needs {tool.what} ({', '.join(where)}) to build"
    return None
