"""Tests for harness.tools.windows_check: the patched tree compiles for Windows (MinGW-w64) and Linux,
and a broken guard, a Windows-only call outside its guard, a missing include or a warning in the
Windows branch fails the right target with an error line that names the file.

The patched tree comes from ``$HARNESS_FORK_TREE`` when set, else from applying ``patches/``
onto the base when the series holds the pin ladder patch; the compile tests are skipped with the
reason when there is neither, or when the cross compiler or the CUDA headers are missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools.windows_check import (
    CHECKED_FILES,
    MINGW_PACKAGE,
    SetupError,
    find_cuda_headers,
    find_host_gxx,
    find_mingw,
    first_error_line,
    main,
)

ROOT = Path(__file__).resolve().parents[1]
LADDER = "ggml/src/ggml-cuda/pin-ladder.cuh"
TEST_SOURCE = "tests/test-cuda-pin-ladder.cpp"

#: The Windows branch of the pageable reserve/release pair in pin-ladder.cuh.
WIN_RESERVE_GUARD = "#ifdef _WIN32\nstatic void * ggml_cuda_pageable_reserve(size_t size) {\n"
WIN_RESERVE_CALL = "    return VirtualAlloc(NULL, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);\n"


def _tree_from_series(into: Path) -> Path | None:
    """The base plus ``patches/`` in ``into``, when the series has a patch adding pin-ladder.cuh."""
    from harness.matrix.config import load_matrix
    from harness.stages.building.patches import apply_series, read_series
    from harness.stages.building.source import git, obtain_base
    if not (ROOT / "patches" / "series").is_file():
        return None
    patches = read_series(ROOT / "patches")
    if not any(LADDER in p.path.read_text(encoding="utf-8", errors="replace") for p in patches):
        return None
    base = obtain_base(load_matrix(ROOT / "matrix.yaml"))
    tree = into / "llama.cpp"
    git(["clone", "--quiet", "--no-checkout", str(base.path), str(tree)])
    apply_series(tree, base.git_rev, patches)
    return tree


@pytest.fixture(scope="module")
def toolchain():
    """Skip unless the cross compiler, the host g++ and the CUDA headers are all there."""
    try:
        find_mingw()
        find_host_gxx()
        find_cuda_headers()
    except SetupError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def patched_tree(toolchain, tmp_path_factory) -> Path:
    """A tree with the pin ladder patch: $HARNESS_FORK_TREE, else one built from patches/."""
    explicit = os.environ.get("HARNESS_FORK_TREE")
    if explicit:
        tree = Path(explicit)
        if not (tree / LADDER).is_file():
            pytest.fail(f"HARNESS_FORK_TREE={explicit} has no {LADDER}")
        return tree
    tree = _tree_from_series(tmp_path_factory.mktemp("fork"))
    if tree is None:
        pytest.skip(f"no patched tree: set HARNESS_FORK_TREE, or export the pin ladder patch ({LADDER}) "
                    "into patches/")
    return tree


@pytest.fixture
def tree_copy(patched_tree, tmp_path) -> Path:
    """A copy of what the check reads from the patched tree (ggml/ and the checked files), to break."""
    copy = tmp_path / "tree"
    shutil.copytree(patched_tree / "ggml", copy / "ggml",
                    ignore=shutil.ignore_patterns("*.cu", "*.c", "*.comp", "*.metal", "*.wgsl", "*.glsl"))
    for checked in CHECKED_FILES:
        dest = copy / checked.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(patched_tree / checked.path, dest)
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: expected {old!r} once; the header changed, update the test"
    path.write_text(text.replace(old, new))


def _run(tree: Path, tmp_path: Path, capsys, *extra: str) -> tuple[int, dict[str, str], str]:
    """Run the check on ``tree``; return the exit status, the summary line of each target and all output."""
    rc = main(["--tree", str(tree), "--log-dir", str(tmp_path / "logs"), *extra])
    out, err = capsys.readouterr()
    lines = {}
    for line in out.splitlines():
        m = re.match(r"^(windows-x86_64|linux-x86_64) \(([^)]*)\): (.*)$", line)
        if m:
            lines[m.group(1)] = m.group(3)
    return rc, lines, out + err


def test_patched_tree_compiles_for_windows_and_linux(patched_tree, tmp_path, capsys):
    rc, lines, out = _run(patched_tree, tmp_path, capsys)
    assert rc == 0, out
    assert lines == {"windows-x86_64": "ok", "linux-x86_64": "ok"}, out
    assert re.search(r"^windows-x86_64 \(mingw-w64 g\+\+ \d+\): ok$", out, re.M), out
    logs = tmp_path / "logs"
    for target in ("windows-x86_64", "linux-x86_64"):
        for checked in CHECKED_FILES:
            log = (logs / f"{target}--{checked.path.replace('/', '_')}.log").read_text()
            assert "-fsyntax-only" in log and "-Werror" in log
            assert "# exit status 0" in log
    tu = (logs / f"{LADDER.replace('/', '_')}.cpp").read_text()
    assert tu == f'#include "{(patched_tree / LADDER).resolve()}"\n'


def test_posix_branch_taken_on_windows_fails_the_windows_target(tree_copy, tmp_path, capsys):
    # the guard of the reserve/release pair is off, so Windows compiles the mmap branch without <sys/mman.h>
    _edit(tree_copy / LADDER, WIN_RESERVE_GUARD, WIN_RESERVE_GUARD.replace("#ifdef _WIN32", "#if defined(_WIN32) && 0"))
    rc, lines, out = _run(tree_copy, tmp_path, capsys, "--only", LADDER)
    assert rc == 1, out
    assert lines["linux-x86_64"] == "ok", out
    assert lines["windows-x86_64"].startswith(f"FAILED: {LADDER}:"), out
    assert re.search(r"\b(mmap|munmap|PROT_\w+|MAP_\w+)\b", lines["windows-x86_64"]), out


def test_virtualalloc_outside_its_guard_fails_the_linux_target(tree_copy, tmp_path, capsys):
    # a second reserve function after the #endif calls VirtualAlloc on every system
    header = tree_copy / LADDER
    text = header.read_text()
    endif = text.index("#endif // _WIN32", text.index(WIN_RESERVE_GUARD))
    header.write_text(text[:endif] + "#endif // _WIN32\n\nstatic void * ggml_cuda_pageable_reserve_any(size_t size) {\n"
                      + WIN_RESERVE_CALL + "}\n" + text[endif + len("#endif // _WIN32\n"):])
    rc, lines, out = _run(tree_copy, tmp_path, capsys, "--only", LADDER)
    assert rc == 1, out
    assert lines["windows-x86_64"] == "ok", out
    assert lines["linux-x86_64"].startswith(f"FAILED: {LADDER}:"), out
    assert re.search(r"\b(VirtualAlloc|MEM_\w+|PAGE_READWRITE)\b", lines["linux-x86_64"]), out


def test_missing_include_fails_both_targets(tree_copy, tmp_path, capsys):
    _edit(tree_copy / LADDER, "#include <mutex>\n", "")
    rc, lines, out = _run(tree_copy, tmp_path, capsys, "--only", LADDER)
    assert rc == 1, out
    for target in ("windows-x86_64", "linux-x86_64"):
        assert lines[target].startswith(f"FAILED: {LADDER}:"), out
        assert "mutex" in lines[target], out


def test_warning_in_the_windows_branch_fails_the_windows_target(tree_copy, tmp_path, capsys):
    # VirtualFree takes no size: without GGML_UNUSED the parameter is unused, on Windows only
    _edit(tree_copy / LADDER, "    GGML_UNUSED(size);\n    return VirtualFree(", "    return VirtualFree(")
    rc, lines, out = _run(tree_copy, tmp_path, capsys, "--only", LADDER)
    assert rc == 1, out
    assert lines["linux-x86_64"] == "ok", out
    assert lines["windows-x86_64"].startswith(f"FAILED: {LADDER}:"), out
    assert "unused-parameter" in lines["windows-x86_64"], out


def test_windows_only_call_in_the_test_source_is_checked(tree_copy, tmp_path, capsys):
    # _putenv_s exists only in the Windows C runtime
    _edit(tree_copy / TEST_SOURCE, "    setenv(name, str.c_str(), 1);\n", "    _putenv_s(name, str.c_str());\n")
    rc, lines, out = _run(tree_copy, tmp_path, capsys, "--only", TEST_SOURCE)
    assert rc == 1, out
    assert lines["windows-x86_64"] == "ok", out
    assert lines["linux-x86_64"].startswith(f"FAILED: {TEST_SOURCE}:"), out
    assert "_putenv_s" in lines["linux-x86_64"], out


def test_missing_cross_compiler_exits_2_naming_the_debian_package(tmp_path, capsys):
    for checked in CHECKED_FILES:
        (tmp_path / checked.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / checked.path).write_text("")
    rc = main(["--tree", str(tmp_path), "--mingw-cxx", str(tmp_path / "no-such-mingw-g++")])
    _, err = capsys.readouterr()
    assert rc == 2
    assert MINGW_PACKAGE in err and "no-such-mingw-g++" in err


def test_tree_without_the_checked_files_exits_2_naming_them(tmp_path, capsys):
    rc = main(["--tree", str(tmp_path)])
    _, err = capsys.readouterr()
    assert rc == 2
    assert LADDER in err and TEST_SOURCE in err


def test_first_error_line_skips_notes_and_warnings_and_shortens_tree_paths(tmp_path):
    tree = tmp_path / "tree"
    output = (f"In file included from {tmp_path}/logs/x.cpp:1:\n"
              f"{tree}/ggml/a.h:3:5: warning: unused variable 'x' [-Wunused-variable]\n"
              f"{tree}/ggml/a.h:9:12: error: 'mmap' was not declared in this scope\n"
              f"{tree}/ggml/a.h:10:1: error: second\n")
    assert first_error_line(output, tree) == "ggml/a.h:9:12: error: 'mmap' was not declared in this scope"
    assert first_error_line("cc1plus: all warnings being treated as errors\n", tree) is None


def test_cuda_include_without_crt_headers_is_refused(tmp_path):
    (tmp_path / "cuda_runtime_api.h").write_text("")
    with pytest.raises(SetupError, match=r"crt/host_defines\.h"):
        find_cuda_headers(tmp_path)


def test_harness_cli_dispatches_check_windows(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "check-windows", "--tree", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert LADDER in proc.stderr
