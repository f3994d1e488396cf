"""The engine program (harness.stages.outputs.engine) as a target of every llama.cpp build of the harness: its
name, where its source lives, the CMake options that add it to a configure, and the digest of its source that
build keys hold.  The builds (builds.py, compile_stage.py) read it here; the comparisons start the program.
"""

from __future__ import annotations

from pathlib import Path

from ...common.fs import sha256_files

#: The CMake target and binary name of the engine program.
ENGINE_TARGET = "llama-harness-engine"

#: The directory holding the engine's source, targets.cmake and inject.cmake.
ENGINE_SOURCE_DIR = Path(__file__).resolve().parent.parent / "outputs" / "engine"


def engine_cmake_options() -> dict[str, str]:
    """CMake cache options that add the engine target to a llama.cpp configure.

    ``CMAKE_PROJECT_llama.cpp_INCLUDE`` makes CMake include ``inject.cmake`` at the
    end of llama.cpp's top-level ``project()`` call; that file defers including
    ``targets.cmake`` to the end of the top-level CMakeLists.txt (CMake ≥ 3.19),
    where ``llama-common`` and ``llama`` exist.
    """
    return {"CMAKE_PROJECT_llama.cpp_INCLUDE": (ENGINE_SOURCE_DIR / "inject.cmake").as_posix()}


def engine_source_digest() -> str:
    """sha256 over the engine's source files (name and bytes), for build keys: a changed engine rebuilds."""
    return sha256_files(p for p in sorted(ENGINE_SOURCE_DIR.iterdir()) if p.is_file())
