"""Native test results reused per ctest label (harness.stages.native_tests.test_cache, docs/cache.md).

A two-test CMake project (labels ``main`` and ``fork``) is built with the pinned CMake and Ninja, and
its tests run through the real ctest; each test appends to a log, so which tests ran is observed.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.record.cache import ResultCache
from harness.stages.building.build import find_tool
from harness.stages.native_tests.test_cache import run_tests_reusing

pytestmark = pytest.mark.slow  # builds a CMake project

CMAKELISTS = """
cmake_minimum_required(VERSION 3.16)
project(t C)
enable_testing()
foreach(name t-main t-fork)
  add_executable(${name} ${name}.c)
  add_test(NAME ${name} COMMAND ${name})
endforeach()
set_tests_properties(t-main PROPERTIES LABELS main ENVIRONMENT "RAN_LOG=${CMAKE_BINARY_DIR}/ran.log")
set_tests_properties(t-fork PROPERTIES LABELS fork ENVIRONMENT "RAN_LOG=${CMAKE_BINARY_DIR}/ran.log")
"""

SOURCE = """
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    FILE *f = fopen(getenv("RAN_LOG"), "a");
    fprintf(f, "%s\\n", NAME);
    fclose(f);
    return RESULT;
}
"""


def _build(src: Path, build: Path, results: dict[str, int]) -> None:
    for name, rc in results.items():
        (src / f"{name}.c").write_text(f'#define NAME "{name}"\n#define RESULT {rc}\n' + SOURCE)
    subprocess.run([find_tool("cmake") or "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
                    f"-DCMAKE_MAKE_PROGRAM={find_tool('ninja') or 'ninja'}"], check=True, capture_output=True)
    subprocess.run([find_tool("cmake") or "cmake", "--build", str(build)], check=True, capture_output=True)


@pytest.fixture
def project(tmp_path):
    if not shutil.which("cc"):
        pytest.skip("needs a C compiler (cc)")
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    build = tmp_path / "build"
    _build(src, build, {"t-main": 0, "t-fork": 0})
    return src, build


def _run(build: Path, store: ResultCache, run_id: str, out: Path):
    (build / "ran.log").unlink(missing_ok=True)
    tr, reuse = run_tests_reusing(store, run_id, build, ["main", "fork"], ["t-main", "t-fork"], out)
    ran = (build / "ran.log").read_text().split() if (build / "ran.log").exists() else []
    return tr, reuse, sorted(ran)


def test_a_label_with_identical_binaries_is_reused_and_a_changed_one_runs(project, tmp_path):
    src, build = project
    store = ResultCache(tmp_path / "cache")
    tr, reuse, ran = _run(build, store, "run-1", tmp_path / "r1")
    assert tr.status == "passed" and ran == ["t-fork", "t-main"] and not reuse.labels
    tr, reuse, ran = _run(build, store, "run-2", tmp_path / "r2")
    assert ran == [] and reuse.labels == {"main": "run-1", "fork": "run-1"}
    assert tr.status == "passed" and all(c.message == "reused from run run-1" for c in tr.cases)
    cases = {tc.get("name"): tc for tc in ET.parse(tmp_path / "r2" / "junit.xml").getroot().iter("testcase")}
    assert {n: tc.find("properties/property[@name='cached']").get("value") for n, tc in cases.items()} == {
        "t-main": "run-1", "t-fork": "run-1"}
    assert "label main: reused from run run-1" in (tmp_path / "r2" / "ctest.log").read_text()
    # a code change in the fork's test: only its label runs, the other is reused
    (src / "t-fork.c").write_text((src / "t-fork.c").read_text().replace("fclose(f);", 'fclose(f); if (getenv("T_UNSET")) puts("changed");'))
    subprocess.run([find_tool("cmake") or "cmake", "--build", str(build)], check=True, capture_output=True)
    tr, reuse, ran = _run(build, store, "run-3", tmp_path / "r3")
    assert ran == ["t-fork"] and reuse.labels == {"main": "run-1"}
    assert {c.name: c.message for c in tr.cases} == {"t-fork": "", "t-main": "reused from run run-1"}
    # --no-cache reruns everything
    store.read = False
    tr, reuse, ran = _run(build, store, "run-4", tmp_path / "r4")
    assert ran == ["t-fork", "t-main"] and not reuse.labels


def test_a_failed_label_is_never_reused_and_an_env_change_misses(project, tmp_path):
    src, build = project
    _build(src, build, {"t-main": 0, "t-fork": 1})
    store = ResultCache(tmp_path / "cache")
    tr, _, _ = _run(build, store, "run-1", tmp_path / "r1")
    assert tr.status == "failed"
    tr, reuse, ran = _run(build, store, "run-2", tmp_path / "r2")
    assert ran == ["t-fork"] and reuse.labels == {"main": "run-1"} and tr.status == "failed"
    tr, reuse, ran = run_tests_reusing(store, "run-3", build, ["main"], ["t-main"], tmp_path / "r3",
                                       env={"WINEDEBUG": "-all"})[0], None, None
    assert not any(c.message.startswith("reused") for c in tr.cases)
