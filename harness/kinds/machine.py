"""Facts of the machine the harness runs on, read from the OS and each platform kind's tools: the CPU model,
the RAM, the versions of a tool, the compilers CMake detected for a build, and the fingerprint that makes two
runs' speeds comparable.  harness.record.environment records them in each platform's environment.json."""

from __future__ import annotations

import os
import platform as pyplatform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping

from .registry import GPUS, machine_devices


def first_line(argv: list[str]) -> str | None:
    """The first line a tool prints for ``argv`` (its stdout, else its stderr), None when it is not on PATH,
    cannot start, prints nothing or runs past 30 s."""
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


def machine_fingerprint(env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What makes speeds of two runs comparable: CPU model and core count, the GPUs (name and driver),
    how many are visible, the versions of each GPU kind's driver and toolkit (``cuda_driver``, ``cuda_toolkit``:
    harness.kinds.shape.GpuKind.version_keys).

    ``env`` is an environment.json record (harness.record.environment.collect); without it the facts are read from
    this machine.  Two runs' tok/s are compared only when these dicts are equal
    (harness.triage.triage); anything else, RAM or the OS patch level, is left out.
    """
    if env is None:
        gpus, visible, versions = machine_devices()
        env = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "visible_gpus": visible, **versions}
    keys = [key for k in GPUS.values() if k.has_device for key in k.version_keys()]
    return {"cpu": env.get("cpu"), "cpu_count": env.get("cpu_count"),
            "gpus": [[g.get("name"), g.get("driver")] for g in env.get("gpus") or [] if isinstance(g, dict)],
            "visible_gpus": env.get("visible_gpus"), **{key: env.get(key) for key in sorted(keys)}}
