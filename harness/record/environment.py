"""Facts about the machine a platform ran on (probed by harness.kinds.machine), recorded in each platform's
environment.json (:func:`collect`) and read back typed (:func:`read_environment`)."""

from __future__ import annotations

import os
import platform as pyplatform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..kinds.machine import cmake_cache_compilers, cpu_model, first_line, ram_bytes
from ..kinds.registry import machine_devices
from .gpu import pin_environment
from .json_files import read_record_json
from .records import RecordError


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
        "cmake": first_line(["cmake", "--version"]),
        "ninja": first_line(["ninja", "--version"]),
        "ccache": first_line(["ccache", "--version"]),
        "cc": first_line(["cc", "--version"]),
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
        # the fields read by name, each a text or a count: their types are the record's (Any: one mapping for both)
        texts: dict[str, Any] = {k: None if data.get(k) is None else str(data[k]) for k in _TEXTS}
        counts: dict[str, Any] = {k: None if data.get(k) is None else int(data[k]) for k in _COUNTS}
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
