"""Unity groups of the units the series does not touch (harness/stages/building/unity.py).

Fast tests check the rule on small sources: the names a unit defines at file
scope, the headers without an include guard that it brings in, explicit
specialisations of templates declared elsewhere, which units may share a group
(one target, one language, the same flags), and which units of a build's
compile_commands.json are candidates.  Slow ones compile a small CUDA library through the compile
step: units that do not clash are compiled as one unity source, and a group
the rule let through that fails to compile is dissolved, its units compiled
alone, and the step passes.
"""

import json
from pathlib import Path

import pytest

from harness.stages.building.build import find_tool
from harness.stages.building.cuda_compile import ToolkitMissing, assemble_toolkit, compile_tree, grouping
from harness.stages.building.unity import (GROUP_SIZE, Member, family, file_scope_names, specialises_foreign_template,
                                  unguarded_headers, unity_groups, unity_object, write_groups_file)


def _write_tree(root: Path, files: dict[str, str]) -> None:
    """Write each relative path of ``files`` under ``root`` with its text."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


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
    _write_tree(tmp_path, files)
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
    _write_tree(tmp_path, sources)
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


@pytest.mark.parametrize("text, foreign", [
    # upstream's own forms: a member of a class declared in a header, a function template declared in one
    ("template <> common_json common_json::get<common_json>() const {\n    return *this;\n}\n", True),
    ("template<>\nvoid global_from_json(context & ctx, const common_json & j) {\n}\n", True),
    # specialisations of templates the unit declares itself
    ("template <int n> struct pow2 { static constexpr int value = 2*pow2<n-1>::value; };\n"
     "template <>      struct pow2<0> { static constexpr int value = 1; };\n", False),
    ("template <typename T>\nstatic __device__ float t2f32(T val) {\n    return (float) val;\n}\n"
     "template <>\n__device__ float __forceinline__ t2f32<half>(half val) {\n    return __half2float(val);\n}\n", False),
    ("template void k_acc<float>(const float *);\nstatic int x;\n", False),  # an instantiation is no specialisation
])
def test_specialisations_of_templates_declared_elsewhere_are_found(text, foreign):
    assert specialises_foreign_template(text) is foreign


def test_groups_keep_languages_and_flags_apart_and_leave_foreign_specialisations_alone(tmp_path):
    sources = {"a.c": "static int fa(void) { return 1; }\n", "b.c": "static int fb(void) { return 2; }\n",
               "c.cpp": "static int fc() { return 3; }\n", "d.cpp": "static int fd() { return 4; }\n",
               "e.cpp": "static int fe() { return 5; }\n",
               "s.cpp": "template <> int json::get<int>() const {\n    return 0;\n}\n",
               "t.cpp": "static int ft() { return 6; }\n", "notes.txt": ""}
    _write_tree(tmp_path, sources)
    flags = {"e.cpp": "g++ -O0 -DONE_OF_ITS_OWN"}
    members = [Member(str(tmp_path / rel), "t", rel + ".o", flags.get(rel, "g++ -O0")) for rel in sources]
    groups = {name: sorted(Path(m.source).name for m in ms) for name, ms in unity_groups(members, {}).items()}
    assert sorted(groups.values()) == [["a.c", "b.c"], ["c.cpp", "d.cpp", "t.cpp"]]
    assert {ms[0].language for ms in unity_groups(members, {}).values()} == {"C", "CXX"}


def test_grouping_leaves_out_generated_units_and_targets_upstream_builds_as_unity(tmp_path):
    tree, build = tmp_path / "tree", tmp_path / "build"
    (tree / "lib").mkdir(parents=True)
    (build / "common").mkdir(parents=True)
    for name in ("a.cpp", "b.cpp", "c.cpp", "m1.cpp", "m2.cpp"):
        (tree / "lib" / name).write_text(f"static int f_{name[:-4]}() {{ return 0; }}\n")
    (build / "common" / "build-info.cpp").write_text("int build_number = 1;\n")

    def entry(src: Path, obj: str) -> dict:
        return {"directory": str(build), "file": str(src), "output": obj,
                "command": f"/usr/bin/ccache /usr/bin/c++ -O0 -MD -MT {obj} -MF {obj}.d -o {obj} -c {src}"}
    commands = [entry(tree / "lib" / n, f"lib/CMakeFiles/k.dir/{n}.o") for n in ("a.cpp", "b.cpp", "c.cpp")]
    commands.append(entry(build / "common" / "build-info.cpp", "lib/CMakeFiles/k.dir/build-info.cpp.o"))
    commands += [entry(tree / "lib" / n, f"lib/CMakeFiles/m.dir/{n}.o") for n in ("m1.cpp", "m2.cpp")]
    commands.append({"directory": str(build), "file": str(build / "lib/CMakeFiles/m.dir/Unity/unity_0_cxx.cxx"),
                     "output": "lib/CMakeFiles/m.dir/Unity/unity_0_cxx.cxx.o",
                     "command": "/usr/bin/c++ -O0 -c unity_0_cxx.cxx -o lib/CMakeFiles/m.dir/Unity/unity_0_cxx.cxx.o"})
    (build / "compile_commands.json").write_text(json.dumps(commands))
    groups = grouping(build, tree, ["lib/CMakeFiles/k.dir/c.cpp.o"])
    assert {name: [Path(m.source).name for m in ms] for name, ms in groups.items()} == {"k-1": ["a.cpp", "b.cpp"]}
    # the launcher, object, dependency file and source are not part of the flags
    assert groups["k-1"][0].flags == groups["k-1"][1].flags == "/usr/bin/c++ -O0"


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
    assert unity_object("common/CMakeFiles/llama-common.dir/Unity/unity_llama-common-3_cxx.cxx.o") == "llama-common-3"
    assert unity_object("ggml/src/CMakeFiles/ggml-base.dir/Unity/unity_ggml-base-1_c.c.o") == "ggml-base-1"
    assert unity_object("ggml/src/CMakeFiles/ggml-base.dir/Unity/unity_ggml-base-1_c.cxx.o") is None


def _cuda_project(root: Path, extra_b: str) -> None:
    """A ``ggml`` project (the step's CMake hook follows ggml's project()) with a CUDA library of
    three units, a C++ library of two and a program linking both; ``extra_b`` is added to b.cu."""
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "a.cu").write_text('extern "C" int fa(void) { return 1; }\nstatic int counter;\n'
                                       "__global__ void ka(float * x) { x[0] = counter; }\n")
    (root / "lib" / "b.cu").write_text('extern "C" int fb(void) { return 2; }\n' + extra_b)
    (root / "lib" / "c.cu").write_text('extern "C" int fc(void) { return 3; }\n')
    (root / "lib" / "x.cpp").write_text('#include <string>\nstatic std::string name_x() { return "x"; }\n'
                                        'int hx() { return (int) name_x().size(); }\n')
    (root / "lib" / "y.cpp").write_text('#include <string>\nstatic std::string name_y() { return "yy"; }\n'
                                        'int hy() { return (int) name_y().size(); }\n')
    (root / "lib" / "CMakeLists.txt").write_text("add_library(k SHARED a.cu b.cu c.cu)\nadd_library(h STATIC x.cpp y.cpp)\n")
    (root / "app.cpp").write_text('extern "C" int fa(void);\nint hx();\nint hy();\n'
                                  "int main() { return fa() + hx() + hy() - 4; }\n")
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.31)\nproject(ggml CXX CUDA)\nadd_subdirectory(lib)\n"
        "add_executable(app app.cpp)\ntarget_link_libraries(app k h)\n")


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
    # the C++ units are grouped too, in a unity source of their own language
    assert (tmp_path / "build" / "lib" / "CMakeFiles" / "h.dir" / "Unity" / "unity_h-1_cxx.cxx.o").is_file()
    if grouped:
        assert record["unity_groups"] == {"h-1": ["lib/x.cpp", "lib/y.cpp"], "k-1": ["lib/a.cu", "lib/b.cu", "lib/c.cu"]}
        assert record["unity_groups_dissolved"] == [] and unity.is_file()
        assert "5 other units (3 CUDA) compiled in 2 unity groups" in result.detail
        assert not (logs / "build-grouped.log").exists()
    else:
        assert record["unity_groups"] == {"h-1": ["lib/x.cpp", "lib/y.cpp"]}
        assert record["unity_groups_dissolved"] == ["k-1"]
        assert "counter" in (logs / "build-grouped.log").read_text()
        assert (tmp_path / "build" / "lib" / "CMakeFiles" / "k.dir" / "b.cu.o").is_file()
