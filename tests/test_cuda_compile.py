"""The compile step of a CUDA platform without a GPU (harness/stages/building/cuda_compile.py).

Fast tests cover the toolkit layout from the PyPI wheels, the libcuda stub, the
series' changed files, the include scan and the skip reason.  Slow ones build
small CMake projects (the plan, a compile error's signature, a CUDA library and
a program linked against the wheels and the stub) and plant faults into a fresh
fork tree, compiling the real ggml-cuda.cu with nvcc from PyPI: the step must
fail with a compile-error signature naming file and line, and pass again
without the plant.
"""

import json
import subprocess
from pathlib import Path

import pytest

from harness.stages.building import cuda_compile
from harness.stages.building.build import ccache_env, find_tool
from harness.matrix.config import load_matrix
from harness.stages.building.cuda_compile import (Plan, ToolkitMissing, assemble_toolkit, changed_files, compile_tree,
                                  driver_functions, include_closure, plan, wheel_versions)
from harness.pipeline import Options, open_context
from harness.stages.building.compile_stage import compile_options, compile_variant
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.triage.signatures import classify_step

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "linux-x86_64-cuda"


def _toolkit_or_skip(work: Path):
    try:
        return assemble_toolkit(work)
    except ToolkitMissing as exc:
        pytest.skip(str(exc))


def test_a_missing_wheel_is_named(monkeypatch):
    real = cuda_compile.importlib.metadata.version

    def version(name):
        if name == "nvidia-cublas":
            raise cuda_compile.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(cuda_compile.importlib.metadata, "version", version)
    with pytest.raises(ToolkitMissing, match=r"needs the PyPI package nvidia-cublas \(pip install"):
        wheel_versions()


def test_the_compile_step_is_skipped_naming_the_missing_package(tmp_path, monkeypatch):
    def missing(_work):
        raise ToolkitMissing("needs the PyPI package nvidia-cuda-nvcc (pip install -r requirements.txt)")

    monkeypatch.setattr("harness.stages.building.compile_stage.assemble_toolkit", missing)
    matrix = load_matrix(ROOT / "matrix.yaml")
    run = Run(tmp_path, "r")
    ctx = open_context(matrix, run, Options(work_dir=tmp_path / "work", patches_dir=ROOT / "patches"), say=lambda _: None)
    assert compile_variant(ctx, matrix.platform(PLATFORM), "fork") is None
    step = run.step(PLATFORM, "fork", "compile")
    assert step.status == "skipped" and "nvidia-cuda-nvcc" in step.detail


def test_toolkit_layout_from_the_wheels(tmp_path):
    tk = _toolkit_or_skip(tmp_path)
    assert tk.version.startswith("13.0.")
    for rel in ("bin/nvcc", "bin/nvcc.profile", "nvvm/bin/cicc", "include/cublas_v2.h", "include/cuda_runtime.h",
                "include/cccl/cub/cub.cuh", "lib64/libcudart.so", "lib64/libcublas.so", "lib64/libcublasLt.so",
                "lib64/stubs/libcuda.so", "lib64/stubs/libcuda.so.1"):
        assert (tk.root / rel).exists(), rel
    nm = subprocess.run(["nm", "-D", "--defined-only", str(tk.root / "lib64/stubs/libcuda.so")],
                        capture_output=True, text=True, check=True).stdout
    assert " cuInit" in nm and " cuMemCreate" in nm and " cuMemAlloc_v2" in nm
    soname = subprocess.run(["objdump", "-p", str(tk.root / "lib64/stubs/libcuda.so")],
                            capture_output=True, text=True, check=True).stdout
    assert "libcuda.so.1" in soname
    assert assemble_toolkit(tmp_path) == tk  # reused, not rebuilt


def test_toolkit_layout_is_one_path_per_wheel_versions_and_follows_moved_wheels(tmp_path, monkeypatch):
    tk = _toolkit_or_skip(tmp_path)
    real = (tk.root / "wheels").resolve()
    assert (tk.root / "bin" / "nvcc").resolve() == real / "bin" / "nvcc"
    # another virtual environment with the same wheel versions: the layout's one link is re-pointed
    moved = tmp_path / "other-venv" / "cu13"
    moved.mkdir(parents=True)
    for name in ("bin", "include", "nvvm", "lib"):
        (moved / name).symlink_to(real / name)
    with monkeypatch.context() as m:
        m.setattr(cuda_compile, "wheel_root", lambda: moved)
        again = assemble_toolkit(tmp_path)
    assert again.root == tk.root and (tk.root / "wheels").resolve() == moved.resolve()
    assert (tk.root / "include" / "cuda_runtime.h").is_file()
    assert assemble_toolkit(tmp_path).root == tk.root and (tk.root / "wheels").resolve() == real


def test_driver_functions_take_the_header_renames(tmp_path):
    header = tmp_path / "cuda.h"
    header.write_text("typedef int CUresult;\n#define CUDAAPI\n#define cuMemAlloc cuMemAlloc_v2\n"
                      "CUresult CUDAAPI cuInit(unsigned int flags);\nCUresult CUDAAPI cuMemAlloc(void **p, int n);\n"
                      "typedef CUresult (CUDAAPI *PFN_cuInit)(unsigned int);\n")
    assert driver_functions(header, "cc") == ["cuInit", "cuMemAlloc_v2"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


def test_changed_files_of_the_series(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    for name in ("kept.c", "edited.h", "gone.c"):
        (repo / name).write_text(name)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "edited.h").write_text("changed")
    (repo / "gone.c").unlink()
    (repo / "sub").mkdir()
    (repo / "sub" / "new file.cu").write_text("new")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "series")
    assert changed_files(repo, base) == {"edited.h": "M", "gone.c": "D", "sub/new file.cu": "A"}


def test_include_closure_follows_includes_and_prefers_the_file_beside(tmp_path):
    for sub in ("inc", "other", "src"):
        (tmp_path / sub).mkdir()
    files = {
        "inc/changed.h": "int x;\n",
        "inc/wrap.h": '#pragma once\n#include "changed.h"\n',
        "a.cpp": '#include <wrap.h>\n',
        "src/b.cpp": '#include "inc/changed.h"\n',  # found through an include directory
        "other/changed.h": "int y;\n",
        "other/c.cpp": '#include "changed.h"\n',  # the file beside it, not the changed one
        "d.cpp": "#include <vector>\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    every = [tmp_path / rel for rel in files]
    reach = include_closure(every, [tmp_path / "inc/changed.h"])
    changed = str(tmp_path / "inc/changed.h")
    assert {Path(p).relative_to(tmp_path).as_posix() for p in reach} == {"inc/changed.h", "inc/wrap.h", "a.cpp",
                                                                                "src/b.cpp"}
    assert all(v == changed for v in reach.values())


def _build_tools_or_skip() -> tuple[str, str]:
    cmake, ninja = find_tool("cmake"), find_tool("ninja")
    if not (cmake and ninja):
        pytest.skip("cmake and ninja from requirements.txt are needed")
    return cmake, ninja


def _cmake_project(root: Path) -> None:
    (root / "inc").mkdir(parents=True)
    (root / "inc" / "api.h").write_text("int api(void);\n")
    (root / "inc" / "unused.h").write_text("#error never included\n")
    (root / "a.c").write_text('#include "api.h"\nint api(void) { return 1; }\n')
    (root / "b.c").write_text('#if 0\n#include "unused.h"\n#endif\nint b(void) { return 2; }\n')
    (root / "c.c").write_text("int c(void) { return 3; }\n")
    (root / "tool.c").write_text('#include "api.h"\nint main(void) { return api() - 1; }\n')
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(p C)\n"
        "add_library(core STATIC a.c b.c c.c)\ntarget_include_directories(core PUBLIC inc)\n"
        "add_executable(tool tool.c)\ntarget_link_libraries(tool core)\n"
        "add_executable(other c.c)\n")


@pytest.mark.slow
def test_plan_selects_units_that_include_changed_files_and_links_added_targets(tmp_path):
    cmake, ninja = _build_tools_or_skip()
    tree, build_dir = tmp_path / "tree", tmp_path / "build"
    _cmake_project(tree)
    changed = {"inc/unused.h": "M", "tool.c": "A"}
    result = compile_tree(tree, build_dir, {"CMAKE_BUILD_TYPE": "Release"}, changed, ["core", "missing-target"],
                          tmp_path / "logs", cmake=cmake, ninja=ninja, jobs=2)
    assert result.status == "passed", result.detail
    # b.c names unused.h (switched off by #if 0): compiled on the include scan's word, then moved out by ninja's log
    record = json.loads((tmp_path / "logs" / "compile.json").read_text())
    assert record["compiled_not_affected"] == ["CMakeFiles/core.dir/b.c.o"]
    assert result.plan.units == {"CMakeFiles/tool.dir/tool.c.o": ["tool.c"]}
    assert result.plan.link == ["core", "tool"] and result.linked == ["core", "tool"]
    assert not (build_dir / "other").exists()
    # a second plan reads ninja's dependency log instead of the include scan
    again = plan(tree, build_dir, {"inc/api.h": "M"}, [], ninja)
    assert again.scanned == 1  # only other's c.c.o was never built
    assert again.units == {"CMakeFiles/core.dir/a.c.o": ["inc/api.h"], "CMakeFiles/tool.dir/tool.c.o": ["inc/api.h"]}
    base = plan(tree, build_dir, {}, ["core", "tool"], ninja, like=Plan({}, {"CMakeFiles/core.dir/a.c.o": ["x"],
                                                                           "gone.o": ["y"]}))
    assert base.units == {"CMakeFiles/core.dir/a.c.o": ["x"]} and base.link == ["core", "tool"]


@pytest.mark.slow
def test_a_compile_error_fails_the_step_with_its_file_and_line(tmp_path):
    cmake, ninja = _build_tools_or_skip()
    tree = tmp_path / "tree"
    _cmake_project(tree)
    (tree / "a.c").write_text('#include "api.h"\nint api(void) { return undeclared_thing; }\n')
    run_dir = tmp_path / "run"
    logs = run_dir / PLATFORM / "compile-fork"
    result = compile_tree(tree, tmp_path / "build", {}, {"a.c": "M"}, ["tool"], logs,
                          cmake=cmake, ninja=ninja, jobs=2)
    assert result.status == "failed"
    assert "a.c:2" in result.detail and "undeclared_thing" in result.detail
    assert result.not_linked == {"tool": "an object or library it needs failed to compile"}
    assert (logs / "build.rc").read_text().strip() != "0"
    sig = classify_step(run_dir, StepRecord.from_json({"platform": PLATFORM, "config": "fork", "step": "compile", "status": "failed",
                                  "detail": result.detail}))
    assert sig.kind == "compile_error"
    assert "a.c:2" in sig.summary and "undeclared_thing" in sig.key


@pytest.mark.slow
def test_a_target_ninja_left_out_of_date_fails_the_step_naming_it(tmp_path):
    """Ninja exits 0, yet a link target is still out of date afterwards: the step did not do its work."""
    cmake, ninja = _build_tools_or_skip()
    tree = tmp_path / "tree"
    _cmake_project(tree)
    with open(tree / "CMakeLists.txt", "a") as fh:  # a rule that says it writes never.h and does not
        fh.write("add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/never.h COMMAND ${CMAKE_COMMAND} -E true)\n"
                 "target_sources(tool PRIVATE ${CMAKE_BINARY_DIR}/never.h)\n")
    logs = tmp_path / "logs"
    result = compile_tree(tree, tmp_path / "build", {}, {"tool.c": "M"}, ["core", "tool"], logs,
                          cmake=cmake, ninja=ninja, jobs=2)
    assert (logs / "build.rc").read_text().strip() == "0"
    assert result.status == "failed", result.detail
    assert result.linked == ["core"]
    assert list(result.not_linked) == ["tool"] and "never.h" in result.not_linked["tool"], result.not_linked
    assert result.detail.startswith("not linked: tool (nothing failed, yet ninja still has work for it: "), result.detail
    assert json.loads((logs / "compile.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_a_cuda_library_and_a_program_using_it_link_against_the_wheels_and_the_stub(tmp_path):
    """The way ggml-cuda links (cudart, cuBLAS, the driver) and a program links it, in small."""
    cmake, ninja = _build_tools_or_skip()
    toolkit = _toolkit_or_skip(tmp_path / "work")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "k.cu").write_text(
        "#include <cublas_v2.h>\n#include <cuda.h>\n__global__ void kern(float * x) { x[0] = 1.0f; }\n"
        'extern "C" int k(void) { cublasHandle_t h; cuInit(0); kern<<<1, 1>>>(nullptr);\n'
        "  return (int) cublasCreate(&h) + (int) cudaDeviceSynchronize(); }\n")
    (tree / "app.cpp").write_text('extern "C" int k(void);\nint main() { return k(); }\n')
    (tree / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(p CXX CUDA)\nfind_package(CUDAToolkit REQUIRED)\n"
        "add_library(k SHARED k.cu)\ntarget_link_libraries(k PRIVATE CUDA::cudart CUDA::cublas CUDA::cuda_driver)\n"
        "add_executable(app app.cpp)\ntarget_link_libraries(app k)\n")
    options = {**toolkit.cmake_options(), "CMAKE_CUDA_ARCHITECTURES": "90-virtual",
               "CMAKE_CUDA_FLAGS": "-fdevice-syntax-only"}
    result = compile_tree(tree, tmp_path / "build", options, {"k.cu": "A", "app.cpp": "A"}, [], tmp_path / "logs",
                          cmake=cmake, ninja=ninja, jobs=2)
    assert result.status == "passed", result.detail + (tmp_path / "logs" / "build.log").read_text()[-3000:]
    assert result.linked == ["app", "k"] and not result.not_linked
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "build" / "libk.so")], capture_output=True, text=True,
                            check=True).stdout
    assert "libcuda.so.1" in needed and "libcublas.so.13" in needed


# --------------------------------------------------------------------------- real builds (slow)

@pytest.fixture(scope="module")
def fork_tree(tmp_path_factory, cuda_compile_shared):
    """A fresh fork tree of the series, laid out like ``.harness`` (``<work>/fork/llama.cpp``, the compile directory
    ``<work>/fork/compile-linux-x86_64-cuda``), the toolkit the main job uses (the harness cache's) and the compile
    step's options, and the files the series changes: a plant compiled with those as the changed files gets the
    shared compile step's unity groups (:func:`cuda_compile_shared`), each found in ccache, and compiles only the
    units its fault touches."""
    from harness.stages.building.patches import prepare_series_tree, read_series
    from harness.stages.building.source import cache_dir, obtain_base
    work = tmp_path_factory.mktemp("work")
    toolkit = _toolkit_or_skip(cache_dir())
    matrix = load_matrix(ROOT / "matrix.yaml")
    base = obtain_base(matrix)
    tree = prepare_series_tree(base, work, "fork", read_series(ROOT / "patches"))
    ctx = open_context(matrix, Run(work, "unused", create=False), Options(work_dir=work, patches_dir=ROOT / "patches"))
    options = {**compile_options(ctx, matrix.platform(PLATFORM), "fork"), **toolkit.cmake_options()}
    return work, tree, options, changed_files(tree, base.git_rev)


def _compile_with(fork_tree, tmp_path, rel: str, after: str | None, planted: str | None, link: tuple[str, ...] = ()):
    """Compile the units that include ``rel`` with ``planted`` inserted after the first line holding ``after``,
    and link the targets ``link``."""
    work, tree, options, series_changed = fork_tree
    path = tree / rel
    original = path.read_bytes()
    line_no = None
    try:
        if planted is not None:
            lines = original.decode().split("\n")
            index = next(i for i, line in enumerate(lines) if after in line)
            lines.insert(index + 1, planted)
            line_no = index + 2
            path.write_text("\n".join(lines))
        run_dir = tmp_path / "run"
        logs = run_dir / PLATFORM / "compile-fork"
        changed = {**series_changed, rel: series_changed.get(rel, "M")}
        result = compile_tree(tree, work / "fork" / f"compile-{PLATFORM}", options, changed, list(link), logs,
                              cmake=find_tool("cmake"), ninja=find_tool("ninja"), jobs=2, env=ccache_env(work))
        step = StepRecord(PLATFORM, "fork", "compile", result.status, detail=result.detail)
        return result, classify_step(run_dir, step), line_no
    finally:
        path.write_bytes(original)


PLANTS = [
    pytest.param("ggml/src/ggml-cuda/ggml-cuda.cu", '#include "ggml-cuda/pin-ladder.cuh"',
                 "static void * ggml_cuda_planted_reserve(size_t n) { return VirtualAlloc(nullptr, n, MEM_RESERVE, "
                 "PAGE_NOACCESS); }", id="windows-symbol-outside-_WIN32-in-ggml-cuda.cu"),
    pytest.param("ggml/src/ggml-cuda/pin-ladder.cuh", '#include "ggml-cuda.h"',
                 'static const size_t ggml_cuda_pin_planted_limit = "not a size";', id="type-error-in-pin-ladder.cuh"),
]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("rel, after, planted", PLANTS)
def test_a_planted_fault_fails_the_compile_step_and_its_removal_passes(fork_tree, tmp_path, rel, after, planted):
    result, sig, line_no = _compile_with(fork_tree, tmp_path / "planted", rel, after, planted)
    assert result.status == "failed", result.detail
    assert "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o" in result.plan.units
    assert sig is not None and sig.kind == "compile_error", sig
    assert f"{rel}:{line_no}" in sig.summary, sig.summary
    clean, clean_sig, _ = _compile_with(fork_tree, tmp_path / "clean", rel, after, None)
    assert clean.status == "passed", clean.detail
    assert clean_sig is None
    assert set(clean.plan.units) == set(result.plan.units)  # the same units, planted and clean


@pytest.mark.slow
@pytest.mark.network
def test_a_planted_undefined_symbol_fails_the_link_of_every_program_that_loads_the_library(fork_tree, tmp_path):
    """A call to a function nothing defines: ggml-cuda.cu compiles and libggml-cuda.so links (a shared library may
    leave symbols to others); the program that names the library on its link line (test-cuda-pin-ladder) fails
    naming the symbol, and so does the step.  test-moe-pin-layers, which reaches libggml-cuda.so only through
    libllama and libggml, links: ld checks the undefined symbols of the libraries it is given."""
    planted = ('extern "C" size_t ggml_cuda_planted_undefined(size_t n);\n'
               'size_t ggml_cuda_planted_caller(size_t n) { return ggml_cuda_planted_undefined(n); }')
    programs = ("test-cuda-pin-ladder", "test-moe-pin-layers")
    result, sig, _ = _compile_with(fork_tree, tmp_path / "planted", "ggml/src/ggml-cuda/ggml-cuda.cu",
                                   '#include "ggml-cuda/pin-ladder.cuh"', planted, programs)
    assert result.status == "failed", result.detail
    assert sig is not None and sig.kind == "link_error" and "ggml_cuda_planted_undefined" in sig.summary, sig
    assert result.not_linked == {"test-cuda-pin-ladder": "its link failed"}, result.not_linked
    clean, clean_sig, _ = _compile_with(fork_tree, tmp_path / "clean", "ggml/src/ggml-cuda/ggml-cuda.cu",
                                        '#include "ggml-cuda/pin-ladder.cuh"', None, programs)
    assert clean.status == "passed" and clean_sig is None, clean.detail
    assert sorted(clean.linked) == sorted(programs)
