"""Every platform kind, once: matrix.yaml's ``hardware.gpu`` values (:data:`GPUS`) and ``os`` values
(:data:`OSES`), the emulators a ``cross`` section may name (:data:`EMULATORS`), and what a platform's kind
says against this machine.  The keys are matrix.schema.json's enums (tests/test_kinds.py holds them equal).

Only this package compares a platform's ``gpu`` or ``os`` with a value (tests/test_imports.py).
"""

from __future__ import annotations

import platform as pyplatform
import sys
from typing import Protocol

from .cpu import CPU
from .linux import LINUX
from .nvidia import NVIDIA
from .shape import GpuKind, HostTool, OsKind
from .windows import WINDOWS, WINE

GPUS: dict[str, GpuKind] = {k.name: k for k in (CPU, NVIDIA)}
OSES: dict[str, OsKind] = {k.name: k for k in (LINUX, WINDOWS)}
EMULATORS: dict[str, HostTool] = {"wine": WINE}


class PlatformLike(Protocol):
    """What the kinds read of a platform (harness.matrix.config.Platform), read-only as a frozen dataclass's
    fields are."""

    @property
    def name(self) -> str: ...
    @property
    def os(self) -> str: ...
    @property
    def arch(self) -> str: ...
    @property
    def gpu(self) -> str: ...


class GroupLike(Protocol):
    """What :func:`group_fits` reads of a comparison group (harness.matrix.config.Group)."""

    @property
    def min_gpus(self) -> int: ...


class UnknownKind(KeyError):
    """A platform names a kind no module of harness.kinds declares."""


def gpu_of(p: PlatformLike) -> GpuKind:
    """The GPU kind of platform ``p`` (its ``hardware.gpu``); raises UnknownKind naming the platform and the
    value when no kind of :data:`GPUS` declares it."""
    try:
        return GPUS[p.gpu]
    except KeyError:
        raise UnknownKind(f"platform {p.name}: hardware.gpu {p.gpu!r} is declared by no module of harness/kinds "
                          f"(declared: {', '.join(GPUS)})") from None


def os_of(p: PlatformLike) -> OsKind:
    """The OS kind of platform ``p``; raises UnknownKind naming the platform and the value when none declares it."""
    try:
        return OSES[p.os]
    except KeyError:
        raise UnknownKind(f"platform {p.name}: os {p.os!r} is declared by no module of harness/kinds "
                          f"(declared: {', '.join(OSES)})") from None


def host_os() -> str:
    """This machine's OS in matrix terms: the kind of :data:`OSES` whose ``sys_platform`` starts
    ``sys.platform`` (linux, windows), others as ``sys.platform``."""
    return next((k.name for k in OSES.values() if sys.platform.startswith(k.sys_platform)), sys.platform)


def host_arch() -> str:
    """This machine's architecture in matrix terms: x86_64 or aarch64 (others as platform.machine())."""
    return pyplatform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")


def on_host_os(p: PlatformLike, host: str | None = None) -> bool:
    """True when platform ``p`` is of the OS ``host`` (default: this machine's, :func:`host_os`)."""
    return p.os == (host_os() if host is None else host)


def cross_host(host: str | None = None) -> bool:
    """True when a host of OS ``host`` (default: this machine's) cross-builds platforms of other OSes."""
    kind = OSES.get(host_os() if host is None else host)
    return kind is not None and kind.cross_host


def group_fits(p: PlatformLike, group: GroupLike, seen: int | None = None) -> str | None:
    """Why comparison group ``group`` cannot run on platform ``p`` for want of devices, or None when it fits.

    A kind without a device fits every group (``min_gpus`` is about GPUs); a kind with one needs
    ``group.min_gpus`` of them visible (:attr:`GpuKind.visible`; ``seen``: that count already read, to ask
    the machine once for several groups).
    """
    kind = gpu_of(p)
    if not kind.has_device:
        return None
    seen = kind.visible() if seen is None else seen
    if group.min_gpus <= seen:
        return None
    where = kind.visibility()
    return f"needs {group.min_gpus} {kind.devices}; {seen} visible here" + (f" ({where})" if where else "")


def machine_devices() -> tuple[list[dict[str, str]], int, dict[str, str | None]]:
    """What this machine's devices are, asked of every GPU kind of :data:`GPUS`: (the devices their tools list,
    {name, driver, ...} each; how many a program started from here sees; the versions of each kind with a
    device's driver and toolkit by :meth:`GpuKind.version_keys`: ``cuda_driver``, ``cuda_toolkit``)."""
    devices = [d for k in GPUS.values() for d in k.inventory()]
    visible = sum(k.visible() for k in GPUS.values())
    versions: dict[str, str | None] = {}
    for k in GPUS.values():
        if k.has_device:
            driver, toolkit = k.version_keys()
            versions[toolkit], versions[driver] = k.toolkit_version(), k.driver_version()
    return devices, visible, versions


def backend_of(var: str) -> GpuKind | None:
    """The GPU kind whose backend alone reads environment variable ``var`` (:meth:`GpuKind.reads`), or None."""
    return next((k for k in GPUS.values() if k.reads(var)), None)


def recorded_env(var: str) -> bool:
    """True when environment variable ``var`` is one a GPU kind declares (the run record lists those set)."""
    return any(k.records(var) for k in GPUS.values())


def runner_os(labels: tuple[str, ...] | list[str], default: str = "linux") -> OsKind:
    """The OS of a CI runner from its labels: the first kind of :data:`OSES` other than ``default`` that a
    label names (:meth:`OsKind.labels_it`), else ``default``'s (GitHub's hosted runner labels)."""
    for kind in OSES.values():
        if kind.name != default and any(kind.labels_it(lab) for lab in labels):
            return kind
    return OSES[default]
