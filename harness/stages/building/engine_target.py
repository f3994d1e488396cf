"""The engine program (harness.stages.outputs.engine) as a target of every llama.cpp build of the harness: its
name, where its source lives, the CMake options that add it to a configure, and the digest of its source that
build keys hold.  The builds (builds.py, compile_stage.py) read it here; the comparisons start the program.
"""

from __future__ import annotations

from pathlib import Path

from ...common.fs import sha256_files
from ...kinds.shape import GpuKind

#: The CMake target and binary name of the engine program.
ENGINE_TARGET = "llama-harness-engine"

#: The directory holding the engine's source, targets.cmake and inject.cmake.
ENGINE_SOURCE_DIR = Path(__file__).resolve().parent.parent / "outputs" / "engine"


def engine_cmake_options(kind: GpuKind) -> dict[str, str]:
    """CMake cache options that add the engine target to a llama.cpp configure of a platform of GPU kind ``kind``.

    ``CMAKE_PROJECT_llama.cpp_INCLUDE`` makes CMake include ``inject.cmake`` at the
    end of llama.cpp's top-level ``project()`` call; that file defers including
    ``targets.cmake`` to the end of the top-level CMakeLists.txt (CMake ≥ 3.19),
    where ``llama-common`` and ``llama`` exist.  A kind with an engine probe
    (harness.kinds.shape.GpuKind.engine_probe) adds the ``HARNESS_ENGINE_PROBE_*`` variables that
    targets.cmake reads: how the engine asks the kind's runtime which host bytes are page-locked.
    """
    opts = {"CMAKE_PROJECT_llama.cpp_INCLUDE": (ENGINE_SOURCE_DIR / "inject.cmake").as_posix()}
    if kind.engine_probe is not None:
        opts.update(kind.engine_probe.cmake_options())
    return opts


def engine_source_digest(kind: GpuKind) -> str:
    """sha256 over the engine's source files (name and bytes) and the probe header of GPU kind ``kind`` (where it
    has one), for build keys: a changed engine or probe rebuilds."""
    files = [p for p in sorted(ENGINE_SOURCE_DIR.iterdir()) if p.is_file()]
    if kind.engine_probe is not None:
        files.append(kind.engine_probe.header_path)
    return sha256_files(files)
