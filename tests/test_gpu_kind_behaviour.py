"""What a GPU kind declares of its own behaviour (harness.kinds.shape.GpuKind), asked by the stages instead of
spelled there: the CMake variable of its device architectures and how they are detected, its sanitizer's command
lines, and the host buffer type of its page-locked memory.  The fake AMD kind of tests/test_kinds.py, declared in
the test alone, gets each of them from its declaration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.kinds import registry
from harness.kinds.cpu import CPU
from harness.kinds.nvidia import NVIDIA
from harness.stages.building.builds import cmake_options
from test_kinds import ROCM, _fake_kind, rocm  # noqa: F401  (the fixture)


def _hip(arch: str | None):
    """The fake kind with its architecture variable, what its tool detects here (``arch``) and a sanitizer."""
    return replace(_fake_kind(1 if arch else 0), arch_cmake="AMDGPU_TARGETS", architectures=lambda: arch,
                   sanitizer="rocm-sanitizer-of-no-machine",
                   sanitizer_args={"test": ("--exit-code", "1"), "generation": ("--exit-code", "1", "--trace")})


def _platform(matrix, monkeypatch, arch: str | None):
    monkeypatch.setitem(registry.GPUS, "rocm", _hip(arch))
    p = matrix.platform(ROCM)
    return replace(p, cmake={**p.cmake, "AMDGPU_TARGETS": "auto"})


def test_the_architectures_are_the_kinds_variable_detected_by_the_kinds_tool(rocm, monkeypatch):  # noqa: F811
    matrix = rocm(visible=1)
    p = _platform(matrix, monkeypatch, "gfx90a")
    assert cmake_options(p, "base")["AMDGPU_TARGETS"] == "gfx90a"
    assert cmake_options(p, "base", cuda_arch="gfx942")["AMDGPU_TARGETS"] == "gfx942"  # --gpu-arch wins
    assert "CMAKE_CUDA_ARCHITECTURES" not in cmake_options(p, "base", cuda_arch="gfx942")


def test_auto_without_a_device_names_the_kinds_tool_and_the_option(rocm, monkeypatch):  # noqa: F811
    p = _platform(rocm(visible=0), monkeypatch, None)
    with pytest.raises(RuntimeError, match=r"AMDGPU_TARGETS is 'auto' but rocm-smi reports no GPU; pass --gpu-arch"):
        cmake_options(p, "base")


def test_the_sanitizers_command_lines_are_the_kinds():
    assert NVIDIA.sanitizer_argv("memcheck", "test") == \
        ("compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", "--require-cuda-init", "no")
    assert NVIDIA.sanitizer_argv("racecheck", "generation") == \
        ("compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "1", "--show-backtrace", "yes")
    assert _hip("gfx90a").sanitizer_argv("memcheck", "test") == \
        ("rocm-sanitizer-of-no-machine", "--tool", "memcheck", "--exit-code", "1")
    with pytest.raises(ValueError, match="GPU kind none: no sanitizer"):
        CPU.sanitizer_argv("memcheck", "test")


def test_the_page_locked_host_buffer_type_is_the_kinds():
    assert NVIDIA.pinned_host_type == "CUDA_Host"
    assert _hip("gfx90a").pinned_host_type == "ROCm_Host"
    assert CPU.pinned_host_type is None
