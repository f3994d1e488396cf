"""The engine's page-locked probe is the GPU kind's declaration (harness.kinds.shape.EngineProbe): the kind names the
header, the runtime's name, ggml's backend option and the runtime's CMake package and targets; the engine's
targets.cmake and engine.cpp name no backend.

A configure of a small project named ``llama.cpp`` (the two targets the engine links, and llama.h) with the
engine injected as the harness injects it shows what each kind's options make of the engine target: no probe
without one (the CPU kind), none where the backend's option is off, the header, the runtime's name and the
runtime's library where it is on.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from harness.kinds.cpu import CPU
from harness.kinds.nvidia import NVIDIA
from harness.kinds.shape import EngineProbe
from harness.stages.building.engine_target import ENGINE_SOURCE_DIR, engine_cmake_options, engine_source_digest

PROJECT = """cmake_minimum_required(VERSION 3.19)
project(llama.cpp CXX)
add_library(llama-common INTERFACE)
add_library(llama INTERFACE)
"""

#: A runtime package for the probe of a test kind: ``find_package(FakeRt)`` defines the imported target FakeRt::rt.
PACKAGE = """add_library(FakeRt::rt INTERFACE IMPORTED)
set_target_properties(FakeRt::rt PROPERTIES INTERFACE_COMPILE_DEFINITIONS FAKE_RT_LINKED)
"""


def test_the_cpu_kind_adds_no_probe_and_the_nvidia_kind_names_its_header_and_runtime():
    inject = {"CMAKE_PROJECT_llama.cpp_INCLUDE": (ENGINE_SOURCE_DIR / "inject.cmake").as_posix()}
    assert engine_cmake_options(CPU) == inject
    options = engine_cmake_options(NVIDIA)
    header = Path(options.pop("HARNESS_ENGINE_PROBE_HEADER"))
    assert options == {**inject, "HARNESS_ENGINE_PROBE_DRIVER": "cuda",
                       "HARNESS_ENGINE_PROBE_BACKEND_OPTION": "GGML_CUDA",
                       "HARNESS_ENGINE_PROBE_PACKAGE": "CUDAToolkit", "HARNESS_ENGINE_PROBE_LIBRARY": "CUDA::cudart",
                       "HARNESS_ENGINE_PROBE_STATIC_LIBRARY": "CUDA::cudart_static"}
    assert header.parent.name == "kinds" and "harness_probe_page_locked" in header.read_text()
    # the header is part of the engine's source for the kind's build keys, and only for that kind's
    assert engine_source_digest(CPU) != engine_source_digest(NVIDIA)
    for source in ENGINE_SOURCE_DIR.iterdir():  # the engine's code names no backend; its comments may, as examples
        code = re.sub(r"//.*" if source.suffix == ".cpp" else r"#.*", "", source.read_text())
        assert "cuda" not in code.lower(), source.name


def test_a_probe_header_edit_changes_the_kinds_engine_digest(tmp_path):
    header = tmp_path / "probe.h"
    header.write_text("// one\n")
    kind = replace(NVIDIA, engine_probe=EngineProbe(str(header), "fake", "GGML_FAKE", "FakeRt", "FakeRt::rt",
                                                    "FakeRt::rt"))
    before = engine_source_digest(kind)
    header.write_text("// two\n")
    assert engine_source_digest(kind) != before


def test_a_probe_driver_name_the_engine_could_not_write_into_json_is_refused():
    with pytest.raises(ValueError, match="not a lower-case identifier"):
        EngineProbe("probe.h", 'cu"da', "GGML_CUDA", "CUDAToolkit", "CUDA::cudart", "CUDA::cudart_static")


def _engine_command(tmp_path: Path, options: dict[str, str]) -> str:
    """The engine's compile command of a configure of :data:`PROJECT` with ``options``."""
    src, build = tmp_path / "src", tmp_path / "build"
    (src / "include").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(PROJECT)
    (src / "include" / "llama.h").write_text("int llama_process(void);\n")
    (tmp_path / "FakeRtConfig.cmake").write_text(PACKAGE)
    argv = [shutil.which("cmake") or "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", f"-DFakeRt_DIR={tmp_path}",
            *[f"-D{k}={v}" for k, v in options.items()]]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    commands = json.loads((build / "compile_commands.json").read_text())
    return next(c["command"] for c in commands if c["file"].endswith("engine.cpp"))


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("c++")), reason="needs ninja and a C++ compiler")
@pytest.mark.parametrize("backend", ["ON", "OFF", None])
def test_the_engine_target_gets_the_probe_of_its_kind_where_the_backend_is_on(tmp_path, backend):
    header = tmp_path / "fake_probe.h"
    header.write_text("static long long harness_probe_page_locked(const char *, size_t n, size_t) { return n; }\n")
    kind = replace(NVIDIA, engine_probe=EngineProbe(str(header), "fake", "GGML_FAKE", "FakeRt", "FakeRt::rt",
                                                    "FakeRt::rt"))
    options = engine_cmake_options(kind if backend is not None else CPU)
    if backend is not None:
        options["GGML_FAKE"] = backend
    command = _engine_command(tmp_path, options)
    if backend == "ON":
        assert f'-DHARNESS_ENGINE_PROBE_HEADER=\\"{header.as_posix()}\\"' in command
        assert '-DHARNESS_ENGINE_PROBE_DRIVER=\\"fake\\"' in command
        assert "-DFAKE_RT_LINKED" in command  # the runtime's imported target is linked
    else:
        assert "HARNESS_ENGINE_PROBE" not in command and "FAKE_RT_LINKED" not in command
