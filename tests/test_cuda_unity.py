"""Unity groups of the CUDA units the series does not touch (harness/cuda_unity.py).

Fast tests check the rule on small sources: the names a unit defines at file
scope, the headers without an include guard that it brings in, which units may
share a group.  Slow ones compile a small CUDA library through the compile
step: units that do not clash are compiled as one unity source, and a group
the rule let through that fails to compile is dissolved, its units compiled
alone, and the step passes.
"""

import json
from pathlib import Path

import pytest

from harness.stages.build import find_tool
from harness.stages.cuda_compile import ToolkitMissing, assemble_toolkit, compile_tree
from harness.stages.cuda_unity import (GROUP_SIZE, Member, family, file_scope_names, unguarded_headers, unity_groups,
                                unity_object, write_groups_file)


def test_file_scope_names_take_definitions_not_declarations_or_instantiations():
    text = ("#include \"common.cuh\"\n#define BLOCK 256\n"
            "struct conv_params {\n    int n;\n};\n"
            "template <typename T>\nstatic __global__ void __launch_bounds__(256, 1) k_acc(const T * x) {\n}\n"
            "static __constant__ float table[4] = {1, 2, 3, 4};\n"
            "using idx_t = int;\n"
            "void ggml_cuda_op_acc(ggml_backend_cuda_context & ctx, ggml_tensor * dst);\n"
            "DECL_MMQ_CASE(GGML_TYPE_Q4_0);\n"
            "template void k_acc<float>(const float *);\n"
            "namespace {\n}\n"
            "static int next_power_of_2(\n        int x) {\n    return x;\n}\n")
    assert file_scope_names(text) == {"BLOCK", "conv_params", "k_acc", "table", "idx_t", "next_power_of_2"}


def test_unguarded_headers_follow_only_chains_without_guards(tmp_path):
    (tmp_path / "inc").mkdir()
    files = {
        "inc/guarded.cuh": "#pragma once\n#include \"code.cuh\"\n",
        "inc/ifndef.cuh": "#ifndef IFNDEF_CUH\n#define IFNDEF_CUH\nstatic int f() { return 1; }\n#endif\n",
        "inc/code.cuh": "static int g() { return 2; }\n",
        "inc/decl.cuh": "#define N 4\nvoid h(int);\n",
        "inc/chain.cuh": "#include \"code.cuh\"\n",
        "a.cu": "#include \"guarded.cuh\"\n#include \"ifndef.cuh\"\n#include \"decl.cuh\"\n#include <vector>\n",
        "b.cu": "#include \"chain.cuh\"\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    inc = [str(tmp_path / "inc")]
    assert unguarded_headers(str(tmp_path / "a.cu"), inc) == set()  # code.cuh only behind a guard
    assert unguarded_headers(str(tmp_path / "b.cu"), inc) == {str(tmp_path / "inc/code.cuh")}


def test_groups_split_clashing_units_and_put_families_first(tmp_path):
    (tmp_path / "template-instances").mkdir()
    (tmp_path / "defs.cuh").write_text("static int shared_helper() { return 0; }\n")
    (tmp_path / "fattn-x.cuh").write_text("static int fattn_kernel() { return 0; }\n")
    sources = {
        "a.cu": "static int helper_a() { return 1; }\n",
        "b.cu": "static int helper_a() { return 2; }\n",  # clashes with a.cu
        "c.cu": '#include "defs.cuh"\n',
        "d.cu": '#include "defs.cuh"\n',  # the same unguarded header as c.cu
        "template-instances/fattn-x-instance-1.cu": '#include "../fattn-x.cuh"\nDECL_FATTN_CASE(1);\n',
        "template-instances/fattn-x-instance-2.cu": '#include "../fattn-x.cuh"\nDECL_FATTN_CASE(2);\n',
        "template-instances/mmq-instance-q4_0.cu": "DECL_MMQ_CASE(GGML_TYPE_Q4_0);\n",
        "template-instances/mmq-instance-q8_0.cu": "DECL_MMQ_CASE(GGML_TYPE_Q8_0);\n",
    }
    for rel, text in sources.items():
        (tmp_path / rel).write_text(text)
    members = [Member(str(tmp_path / rel), "t", rel + ".o") for rel in sources]
    groups = {name: [Path(m.source).relative_to(tmp_path).as_posix() for m in ms]
              for name, ms in unity_groups(members, {"t": [str(tmp_path)]}).items()}
    assert groups == {"t-1": ["template-instances/fattn-x-instance-1.cu", "template-instances/mmq-instance-q4_0.cu",
                              "template-instances/mmq-instance-q8_0.cu", "a.cu", "c.cu"],
                      "t-2": ["template-instances/fattn-x-instance-2.cu", "b.cu", "d.cu"]}
    assert family(str(tmp_path / "template-instances/mmq-instance-q4_0.cu")) == "mmq"
    assert family(str(tmp_path / "mmq-instance-q4_0.cu")) == ""  # not under template-instances


def test_groups_hold_at_most_group_size_units(tmp_path):
    members = []
    for i in range(GROUP_SIZE * 2 + 1):
        path = tmp_path / f"u{i:02d}.cu"
        path.write_text(f"static int f{i}() {{ return {i}; }}\n")
        members.append(Member(str(path), "t", path.name + ".o"))
    sizes = sorted(len(ms) for ms in unity_groups(members, {}).values())
    assert sizes == [GROUP_SIZE, GROUP_SIZE]  # the 17th unit alone compiles without a group


def test_groups_file_and_unity_object_names(tmp_path):
    groups = {"ggml-cuda-1": [Member("/t/a.cu", "ggml-cuda", "a.o"), Member("/t/b.cu", "ggml-cuda", "b.o")]}
    write_groups_file(tmp_path / "g.cmake", groups)
    text = (tmp_path / "g.cmake").read_text()
    assert 'set_target_properties("ggml-cuda" PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)' in text
    assert ('set_source_files_properties("/t/a.cu" "/t/b.cu" TARGET_DIRECTORY "ggml-cuda" '
            'PROPERTIES UNITY_GROUP "ggml-cuda-1")') in text
    with pytest.raises(ValueError, match="cannot be grouped"):
        write_groups_file(tmp_path / "bad.cmake", {"g": [Member("/t/a$b.cu", "t", "o"), Member("/t/c.cu", "t", "o")]})
    assert unity_object("ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/Unity/unity_ggml-cuda-1_cu.cu.o") == "ggml-cuda-1"
    assert unity_object("ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/acc.cu.o") is None


def _cuda_project(root: Path, extra_b: str) -> None:
    """A ``ggml`` project (the step's CMake hook follows ggml's project()) with a CUDA library of
    three units and a program linking it; ``extra_b`` is added to b.cu."""
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "a.cu").write_text('extern "C" int fa(void) { return 1; }\nstatic int counter;\n'
                                       "__global__ void ka(float * x) { x[0] = counter; }\n")
    (root / "lib" / "b.cu").write_text('extern "C" int fb(void) { return 2; }\n' + extra_b)
    (root / "lib" / "c.cu").write_text('extern "C" int fc(void) { return 3; }\n')
    (root / "lib" / "CMakeLists.txt").write_text("add_library(k SHARED a.cu b.cu c.cu)\n")
    (root / "app.cpp").write_text('extern "C" int fa(void);\nint main() { return fa() - 1; }\n')
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.31)\nproject(ggml CXX CUDA)\nadd_subdirectory(lib)\n"
        "add_executable(app app.cpp)\ntarget_link_libraries(app k)\n")


@pytest.mark.slow
@pytest.mark.parametrize("extra_b, grouped", [
    pytest.param("", True, id="no-clash-grouped"),
    # a static variable declared in both without an initialiser: the name scan does not see it,
    # the compiler does; the group is dissolved and the units compile alone
    pytest.param("static int counter;\n", False, id="clash-missed-by-the-scan-dissolved"),
])
def test_units_not_selected_compile_as_unity_sources(tmp_path, extra_b, grouped):
    cmake, ninja = find_tool("cmake"), find_tool("ninja")
    if not (cmake and ninja):
        pytest.skip("cmake and ninja from requirements.txt are needed")
    try:
        toolkit = assemble_toolkit(tmp_path / "cache")
    except ToolkitMissing as exc:
        pytest.skip(str(exc))
    tree = tmp_path / "tree"
    _cuda_project(tree, extra_b)
    options = {**toolkit.cmake_options(), "CMAKE_CUDA_ARCHITECTURES": "90-virtual",
               "CMAKE_CUDA_FLAGS": "-fdevice-syntax-only", "CMAKE_UNITY_BUILD_RELOCATABLE": "ON"}
    logs = tmp_path / "logs"
    result = compile_tree(tree, tmp_path / "build", options, {"app.cpp": "A"}, [], logs,
                          cmake=cmake, ninja=ninja, jobs=2)
    assert result.status == "passed", result.detail + (logs / "build.log").read_text()[-3000:]
    assert result.linked == ["app"]
    record = json.loads((logs / "compile.json").read_text())
    assert record["units"] == {"CMakeFiles/app.dir/app.cpp.o": ["app.cpp"]}
    unity = tmp_path / "build" / "lib" / "CMakeFiles" / "k.dir" / "Unity" / "unity_k-1_cu.cu.o"
    if grouped:
        assert record["unity_groups"] == {"k-1": ["lib/a.cu", "lib/b.cu", "lib/c.cu"]}
        assert record["unity_groups_dissolved"] == [] and unity.is_file()
        assert "3 other CUDA units compiled in 1 unity groups" in result.detail
        assert not (logs / "build-grouped.log").exists()
    else:
        assert record["unity_groups"] == {} and record["unity_groups_dissolved"] == ["k-1"]
        assert "counter" in (logs / "build-grouped.log").read_text()
        assert (tmp_path / "build" / "lib" / "CMakeFiles" / "k.dir" / "b.cu.o").is_file()
