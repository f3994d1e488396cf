"""The host tools a platform of another OS needs here, and the Debian packages that bring them.

A platform with a ``cross`` section in matrix.yaml is built with the cross compiler it names and run
under the emulator it names (a key of harness.kinds.registry.EMULATORS, each declared with its OS
kind); harness.matrix.platforms names what is missing in its skip reasons, harness.tools.ci_matrix
installs the packages, and harness.stages.building.cross prepares the emulator.
"""

from __future__ import annotations

import shutil

from ..kinds.registry import EMULATORS
from .config import CrossSpec


def find_program(name: str) -> str | None:
    """Absolute path of program ``name`` on PATH, or None."""
    return shutil.which(name)


def find_emulator_program(kind: str) -> str | None:
    """Path of the emulator program of ``kind`` (a key of harness.kinds.registry.EMULATORS), or None when it is
    not installed."""
    return EMULATORS[kind].find(find_program)


def missing_build_tools(cross: CrossSpec) -> str | None:
    """Why the cross build of a platform cannot run here (the compiler's Debian package), or None."""
    if not cross.toolchain.is_file():
        return f"cross toolchain file {cross.toolchain} does not exist"
    if find_program(cross.compiler) is None:
        return (f"needs the cross compiler {cross.compiler} "
                f"(Debian package {cross.compiler_debian}); it is not on PATH")
    return None


def missing_run_tools(cross: CrossSpec) -> str | None:
    """Why the executables of a cross-built platform cannot run here (a Debian package), or None."""
    why = missing_build_tools(cross)
    if why:
        return why
    if find_emulator_program(cross.emulator) is None:
        spec = EMULATORS[cross.emulator]
        return (f"needs the emulator {cross.emulator} (Debian package {spec.debian}); "
                f"none of {', '.join(spec.programs + spec.paths)} was found")
    return None


def debian_packages(cross: CrossSpec, run: bool) -> tuple[str, ...]:
    """The Debian packages a Linux host needs to build a cross platform, and to run it where ``run``.

    Building needs the compiler's package (``cross.compiler.debian`` in matrix.yaml), running also
    the emulator's (harness.kinds.registry.EMULATORS): the same packages :func:`missing_build_tools` and
    :func:`missing_run_tools` name when their programs are absent.
    """
    return (cross.compiler_debian, EMULATORS[cross.emulator].debian) if run else (cross.compiler_debian,)
