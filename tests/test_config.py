"""matrix.yaml validation: every error names the file, the line and the key."""

from pathlib import Path

import pytest

from harness.matrix.config import MatrixError, load_matrix

ROOT = Path(__file__).resolve().parents[1]
MATRIX = (ROOT / "matrix.yaml").read_text(encoding="utf-8")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line number of the nth line containing ``needle``."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return hits[nth - 1]


def problems(path: Path) -> list[str]:
    with pytest.raises(MatrixError) as exc:
        load_matrix(path)
    return exc.value.problems


def test_shipped_matrix_loads_with_the_three_platforms():
    m = load_matrix(ROOT / "matrix.yaml")
    assert {"linux-x86_64-cpu", "linux-x86_64-cuda", "windows-x86_64-cuda"} <= set(m.platforms)
    assert m.base_commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert [s.kind for s in m.sources][-1] == "pypi-sdist"
    assert m.generation.n_predict == 120 and m.generation.repeats == 2
    assert any("\n" in p.text and any(ord(ch) > 127 for ch in p.text) for p in m.prompts.values())
    cpu = m.platforms["linux-x86_64-cpu"]
    assert cpu.gpu == "none" and "llama-completion" in cpu.targets
    assert m.groups["base-vs-fork"].reference == "base"


def test_wrong_type_names_file_line_and_key(tmp_path):
    text = MATRIX.replace('GGML_CUDA: "OFF"', "GGML_CUDA: 1", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:{line_of(text, 'GGML_CUDA: 1')}: ")
    assert "platforms.linux-x86_64-cpu.cmake.GGML_CUDA" in msg and "string" in msg


def test_unknown_key_is_reported_at_its_own_line(tmp_path):
    text = MATRIX.replace("    hardware: {gpu: none}", "    hardware: {gpu: none}\n    colour: blue", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:{line_of(text, 'colour: blue')}: platforms.linux-x86_64-cpu.colour: unknown key")


def test_unknown_key_inside_a_kind_discriminated_entry(tmp_path):
    text = MATRIX.replace("      package: llama-cpp-python", "      package: llama-cpp-python\n      mirror: yes", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:{line_of(text, 'mirror: yes')}: base.sources[3].mirror: unknown key")


def test_unknown_source_kind(tmp_path):
    text = MATRIX.replace("    - kind: git ", "    - kind: svn ", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert "base.sources[2].kind: unknown kind 'svn'" in msg
    assert msg.startswith(f"{path}:{line_of(text, 'kind: svn')}:")


def test_short_commit_is_rejected(tmp_path):
    text = MATRIX.replace("commit: 0c1e57098bba43ac29e6e3b677cdceebdd22334f", "commit: 0c1e570", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert "base.commit" in msg and f":{line_of(text, 'commit: 0c1e570')}:" in msg


def test_dangling_references_are_all_reported(tmp_path):
    text = MATRIX.replace("candidates: [fork]", "candidates: [forrk]", 1).replace(
        "models: [gemma3-270m, moe-small, moe-small-quant]", "models: [gemma3-270m, moe-tiny, moe-small-quant]", 1)
    path = write(tmp_path, text)
    msgs = problems(path)
    assert any("groups.base-vs-fork.candidates[0]: unknown config 'forrk'" in m for m in msgs)
    assert any("groups.base-vs-fork.models[1]: unknown model 'moe-tiny'" in m for m in msgs)
    assert len(msgs) == 2


def test_duplicate_key_is_an_error(tmp_path):
    text = MATRIX.replace("  fork:\n    build: fork\n", "  fork:\n    build: fork\n    build: base\n", 1)
    path = write(tmp_path, text)
    msgs = problems(path)
    assert any("configs.fork.build: duplicate key" in m for m in msgs)


def test_yaml_syntax_error_names_the_line(tmp_path):
    text = MATRIX.replace("platforms:\n", "platforms:\n  bad: [unclosed\n", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:") and "YAML syntax error" in msg


def test_unknown_platform_name_is_a_clear_error():
    m = load_matrix(ROOT / "matrix.yaml")
    with pytest.raises(MatrixError) as exc:
        m.platform("linux-riscv-cpu")
    assert "unknown platform 'linux-riscv-cpu'" in str(exc.value)
    assert "linux-x86_64-cpu" in str(exc.value)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="matrix file not found"):
        load_matrix("/nonexistent/matrix.yaml")


def test_bad_digest_inside_a_kind_entry_names_its_line(tmp_path):
    text = MATRIX.replace("sha256: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                          "sha256: a5fd3b", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:{line_of(text, 'sha256: a5fd3b')}: models.gemma3-270m.sha256:")


def test_unknown_generator_parameter_is_reported_at_its_line(tmp_path):
    text = MATRIX.replace("params: {n_layer: 4,", "params: {n_layers: 4,", 1)
    path = write(tmp_path, text)
    [msg] = problems(path)
    assert msg.startswith(f"{path}:{line_of(text, 'n_layers: 4')}: models.moe-small.params.n_layers: "
                          "unknown generator parameter")


def test_a_yaml_boolean_or_number_where_a_string_is_required_says_quote_it(tmp_path):
    text = MATRIX.replace('GGML_NATIVE: "OFF"', "GGML_NATIVE: OFF", 1).replace('GGML_CUDA: "OFF"', "GGML_CUDA: 12", 1)
    path = write(tmp_path, text)
    msgs = problems(path)
    assert f"{path}:{line_of(text, 'GGML_NATIVE: OFF')}: platforms.linux-x86_64-cpu.cmake.GGML_NATIVE: OFF is read " \
           "as a YAML boolean, but a string is required; quote it: 'OFF'" in msgs
    assert any(m.endswith("GGML_CUDA: 12 is read as a YAML number, but a string is required; quote it: '12'")
               for m in msgs)


def test_a_tab_and_a_bad_indentation_get_the_line_and_a_plain_hint(tmp_path):
    text = MATRIX.replace("\n  linux-x86_64-cpu:", "\n\tlinux-x86_64-cpu:", 1)
    [msg] = problems(write(tmp_path, text))
    n = line_of(text, "\tlinux-x86_64-cpu:")
    assert msg.startswith(f"{tmp_path / 'matrix.yaml'}:{n}: YAML syntax error: ")
    assert "YAML indents with spaces only" in msg and f"{n:>4} | →   linux-x86_64-cpu:" in msg

    text = MATRIX.replace("\n    os: linux", "\n     os: linux", 1)
    [msg] = problems(write(tmp_path, text))
    assert "indented differently" in msg and "|      os: linux" in msg


def test_the_matrix_points_editors_at_its_schema():
    first = MATRIX.splitlines()[0]
    assert first == "# yaml-language-server: $schema=harness/matrix/matrix.schema.json"
    assert (ROOT / "harness" / "matrix" / "matrix.schema.json").is_file()


#: The x86 options ggml turns on by default when it builds for the machine it runs on with GGML_NATIVE off,
#: and off when it cross-compiles (ggml/CMakeLists.txt of the pinned base: ``option(GGML_SSE42 ...
#: ${INS_ENB})`` and the five after it, ``INS_ENB`` OFF under CMAKE_CROSSCOMPILING).
NATIVE_DEFAULT_X86 = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")


def test_a_cross_built_x86_platform_gets_the_instruction_set_of_the_native_one():
    m = load_matrix(ROOT / "matrix.yaml")
    cross = [p for p in m.platforms.values() if p.cross is not None and p.arch == "x86_64"]
    assert cross, "the matrix has a cross-built x86_64 platform (windows-x86_64-cpu)"
    for p in cross:
        assert p.cmake.get("GGML_NATIVE") == "OFF"
        # without them the MinGW build runs ggml's SSE2-only kernels, other code than the Linux build's
        missing = [o for o in NATIVE_DEFAULT_X86 if p.cmake.get(o) != "ON"]
        assert not missing, f"{p.name}: cmake options {missing} must be ON"
