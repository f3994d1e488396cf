"""CMake + Ninja builds of a tiny project: keyed builds, no-op reruns, failures recorded with their first error."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from harness.stages.building.build import BuildRequest, build, find_tool

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja")),
                                 reason="cmake and ninja come from requirements.txt")]

CMAKE = """cmake_minimum_required(VERSION 3.16)
project(tiny C)
add_executable(hello hello.c)
set_target_properties(hello PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""


def project(tmp_path: Path, source: str = 'int main(void) { return 0; }\n') -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "CMakeLists.txt").write_text(CMAKE)
    (src / "hello.c").write_text(source)
    return src


def request(src: Path, tmp_path: Path, **options: str) -> BuildRequest:
    return BuildRequest("test-platform", "fork", src, tmp_path / "build", {"CMAKE_BUILD_TYPE": "Release", **options},
                        ("hello",), {"base": "0" * 40, "series": "abc"})


def test_second_build_with_nothing_changed_is_a_no_op(tmp_path):
    src = project(tmp_path)
    first = build(request(src, tmp_path), tmp_path / "logs1")
    assert first.status == "passed" and not first.up_to_date, first.detail
    assert (first.bin_dir / "hello").exists()
    assert (tmp_path / "logs1" / "configure.rc").read_text().strip() == "0"
    mtime = (first.bin_dir / "hello").stat().st_mtime_ns
    second = build(request(src, tmp_path), tmp_path / "logs2")
    assert second.status == "passed" and second.up_to_date and second.key == first.key
    assert not (tmp_path / "logs2" / "configure.log").exists()
    assert (second.bin_dir / "hello").stat().st_mtime_ns == mtime


def test_key_covers_options_and_series(tmp_path):
    src = project(tmp_path)
    base = request(src, tmp_path)
    assert base.key() == request(src, tmp_path).key()
    assert base.key() != request(src, tmp_path, GGML_NATIVE="OFF").key()
    other_series = BuildRequest(base.platform, base.variant, src, base.build_dir, base.cmake_options, base.targets,
                                {"base": "0" * 40, "series": "abd"})
    assert base.key() != other_series.key()
    first = build(base, tmp_path / "l1")
    changed = build(request(src, tmp_path, SOMETHING="1"), tmp_path / "l2")
    assert first.status == changed.status == "passed" and not changed.up_to_date


def test_compile_error_is_recorded_with_its_first_error_line(tmp_path):
    src = project(tmp_path, "int main(void) { return undeclared_thing; }\n")
    result = build(request(src, tmp_path), tmp_path / "logs")
    assert result.status == "failed"
    assert result.detail.startswith("build failed: ") and "hello.c" in result.detail and "error" in result.detail
    assert (tmp_path / "logs" / "build.rc").read_text().strip() != "0"


def test_configure_error_is_recorded(tmp_path):
    src = project(tmp_path)
    (src / "CMakeLists.txt").write_text(CMAKE + "message(FATAL_ERROR \"no such toolkit\")\n")
    result = build(request(src, tmp_path), tmp_path / "logs")
    assert result.status == "failed" and result.detail.startswith("configure failed: ")
    assert "CMake Error" in result.detail
    assert not (tmp_path / "logs" / "build.log").exists()


def test_the_pinned_tools_beside_this_python_win_over_path(tmp_path, monkeypatch):
    """A system CMake on PATH (Debian 12's 3.25) must not replace the pinned one, which the compile
    step's CUDA unity groups need (3.31); a tool the environment lacks still comes from PATH."""
    pinned = Path(sys.executable).parent / "cmake"
    if not pinned.is_file():
        pytest.skip("this Python's environment has no cmake from requirements.txt")
    for name in ("cmake", "only-on-path"):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert find_tool("cmake") == str(pinned)
    assert find_tool("only-on-path") == str(tmp_path / "only-on-path")


# --------------------------------------------------------------------------- unoptimised_targets

SPLIT = {"CMakeLists.txt": """cmake_minimum_required(VERSION 3.19)
project(llama.cpp CXX)
add_subdirectory(ggml)
add_library(llama-common STATIC common.cpp)
add_executable(tool tool.cpp)
target_link_libraries(tool PRIVATE llama-common ggml-base)
""", "ggml/CMakeLists.txt": "project(ggml CXX)\nadd_library(ggml-base STATIC ggml.cpp)\n",
    "common.cpp": "int common_f() { return 1; }\n", "ggml/ggml.cpp": "int ggml_f() { return 2; }\n",
    "tool.cpp": "int common_f(); int ggml_f(); int main() { return common_f() + ggml_f() - 3; }\n"}


def _configure_split(tmp_path: Path, targets: str) -> tuple[int, str, dict[str, list[str]]]:
    import json
    import subprocess
    from harness.stages.building.builds import UNOPTIMISED_HOOK
    src, out = tmp_path / "src", tmp_path / "build"
    for rel, text in SPLIT.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    proc = subprocess.run([find_tool("cmake"), "-S", str(src), "-B", str(out), "-G", "Ninja",
                           "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                           f"-DCMAKE_PROJECT_ggml_INCLUDE={UNOPTIMISED_HOOK.as_posix()}",
                           f"-DHARNESS_UNOPTIMISED_TARGETS={targets}"], capture_output=True, text=True)
    flags = {}
    if proc.returncode == 0:
        for e in json.loads((out / "compile_commands.json").read_text()):
            flags[Path(e["file"]).name] = [a for a in (e.get("arguments") or e["command"].split()) if a.startswith("-O")]
    return proc.returncode, proc.stdout + proc.stderr, flags


def test_unoptimised_targets_compile_at_O0_after_the_build_type_s_flags_and_the_rest_as_before(tmp_path):
    rc, log, flags = _configure_split(tmp_path, "llama-common")
    assert rc == 0, log
    assert flags["common.cpp"][-1] == "-O0" and flags["common.cpp"][0] == "-O3"  # the last -O wins
    assert "-O0" not in flags["ggml.cpp"] and "-O0" not in flags["tool.cpp"]


def test_an_unoptimised_target_the_tree_does_not_define_stops_the_configure_naming_it(tmp_path):
    rc, log, _ = _configure_split(tmp_path, "llama-common;cpp-httplib")
    assert rc != 0 and "unoptimised_targets names cpp-httplib" in log


def test_linux_cpu_compiles_upstream_s_common_code_unoptimised_and_the_other_platforms_do_not():
    from harness.matrix.config import load_matrix
    from harness.stages.building.builds import UNOPTIMISED_HOOK, cmake_options
    m = load_matrix(Path(__file__).resolve().parents[1] / "matrix.yaml")
    opts = cmake_options(m.platforms["linux-x86_64-cpu"], "base")
    assert opts["HARNESS_UNOPTIMISED_TARGETS"] == "llama-common;cpp-httplib"
    assert opts["CMAKE_PROJECT_ggml_INCLUDE"] == UNOPTIMISED_HOOK.as_posix()
    # the Windows build links common statically into each program: unoptimised, every relink took 2 min
    for name, arch in (("windows-x86_64-cpu", None), ("linux-x86_64-cuda", "90")):
        opts = cmake_options(m.platforms[name], "fork", cuda_arch=arch)
        assert "HARNESS_UNOPTIMISED_TARGETS" not in opts and "CMAKE_PROJECT_ggml_INCLUDE" not in opts


def test_targets_added_to_a_build_of_a_linked_work_directory_are_compiled_with_ccache_based_where_it_was_configured(
        tmp_path, monkeypatch):
    """A run whose work directory links its ``base`` to another's (the suite's planted forks, tests/conftest.py)
    builds upstream's test targets in that build with ccache based at the work directory that holds it: the
    paths its configure wrote are below that one, and only there do they become the relative paths the fork's
    objects were cached under."""
    from harness.stages.building import builds as builds_mod
    from harness.stages.building.build import BuildResult
    from harness.stages.options import Options
    shared = tmp_path / "shared"
    (shared / "base" / "build-p").mkdir(parents=True)
    mine = tmp_path / "mine"
    (mine / "fork" / "build-p").mkdir(parents=True)
    (mine / "base").symlink_to(shared / "base", target_is_directory=True)
    seen = {}

    def run_step(argv, log, env=None, budget=None):
        seen[argv[2]] = env
        return 0, 0.0

    monkeypatch.setattr(builds_mod, "_run_step", run_step)
    b = builds_mod.Builds(None, None, Options(work_dir=mine, jobs=1), None, lambda _: None, None, tmp_path / "cache")
    try:
        for variant in ("base", "fork"):
            b.built[("p", variant)] = BuildResult("p", variant, "passed", "k", mine / variant / "build-p", 0.0, True)
            assert b.build_more(_platform("p"), variant, ["t"], tmp_path / f"{variant}.log") == (0, 0.0)
    finally:
        b.close()
    assert seen[str(mine / "base" / "build-p")]["CCACHE_BASEDIR"] == str(shared.resolve())
    assert seen[str(mine / "fork" / "build-p")]["CCACHE_BASEDIR"] == str(mine.resolve())


def _platform(name: str):
    """A stand-in for a matrix platform: build_more reads only its name."""
    from types import SimpleNamespace
    return SimpleNamespace(name=name)
