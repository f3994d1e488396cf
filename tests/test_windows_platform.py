"""windows-x86_64-cpu: cross-built with MinGW-w64, run under Wine; cross-platform groups; Windows checkouts."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from harness.kinds.shape import HostTool
from harness.matrix import host_tools
from harness.stages.building import cross
from harness.stages.outputs.compare import GenerationSpec, from_text_mode, run_generation
from harness.matrix.config import MatrixError, load_matrix
from harness.matrix.platforms import cannot_build, cannot_run, cross_built, executable_suffix

ROOT = Path(__file__).resolve().parents[1]
MATRIX_PATH = ROOT / "matrix.yaml"


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(MATRIX_PATH)


def write_matrix(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(MATRIX_PATH.read_text(encoding="utf-8"))
    edit(doc)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


# ----- matrix ---------------------------------------------------------------------------------

def test_the_windows_platform_and_the_cross_os_group_are_typed(matrix):
    p = matrix.platforms["windows-x86_64-cpu"]
    assert p.os == "windows" and p.gpu == "none" and p.cross is not None
    assert p.cross.toolchain == ROOT / "harness" / "toolchains" / "mingw-w64-x86_64.cmake"
    assert p.cross.toolchain.is_file()
    assert p.cross.compiler == "x86_64-w64-mingw32-g++-posix"
    assert p.cross.compiler_debian == "g++-mingw-w64-x86-64-posix" and p.cross.emulator == "wine"
    assert "cross-os" in p.groups and "base-vs-fork" in p.groups
    g = matrix.groups["cross-os"]
    assert g.reference == "fork" and g.candidates == ("fork",) and g.reference_platform == "linux-x86_64-cpu"
    # the same models and prompts as the comparisons on Linux
    assert set(g.models) == set(matrix.groups["base-vs-fork"].models)
    assert g.prompts == tuple(matrix.prompts)
    assert matrix.groups["base-vs-fork"].reference_platform is None
    assert executable_suffix(p) == ".exe" and executable_suffix(matrix.platforms["linux-x86_64-cpu"]) == ""


def test_a_reference_platform_must_exist(tmp_path):
    path = write_matrix(tmp_path, lambda d: d["groups"]["cross-os"].update(reference_platform="linux-arm64-cpu"))
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    [problem] = err.value.problems
    assert "groups.cross-os.reference_platform: unknown platform 'linux-arm64-cpu'" in problem
    assert problem.startswith(f"{path}:")


def test_a_group_cannot_take_its_reference_from_the_platform_running_it(tmp_path):
    path = write_matrix(tmp_path, lambda d: d["groups"]["cross-os"].update(reference_platform="windows-x86_64-cpu"))
    with pytest.raises(MatrixError, match=r"platforms\.windows-x86_64-cpu\.groups\[1\]: group 'cross-os' takes "
                                          r"its reference from platform 'windows-x86_64-cpu' itself"):
        load_matrix(path)


def test_reference_as_candidate_needs_another_platform(tmp_path):
    path = write_matrix(tmp_path, lambda d: d["groups"]["cross-os"].pop("reference_platform"))
    with pytest.raises(MatrixError, match=r"the reference 'fork' cannot also be a candidate"):
        load_matrix(path)


def test_the_cross_section_is_checked_by_the_schema(tmp_path):
    path = write_matrix(tmp_path, lambda d: d["platforms"]["windows-x86_64-cpu"]["cross"].update(emulator="qemu"))
    with pytest.raises(MatrixError, match=r"platforms\.windows-x86_64-cpu\.cross\.emulator: 'qemu' is not one of"):
        load_matrix(path)


# ----- can this host run it ---------------------------------------------------------------------

def test_missing_cross_tools_name_their_debian_packages(matrix, monkeypatch):
    p = matrix.platforms["windows-x86_64-cpu"]
    monkeypatch.setattr(host_tools, "find_program", lambda name: None)
    why = cannot_run(p)
    assert why == ("needs the cross compiler x86_64-w64-mingw32-g++-posix (Debian package "
                   "g++-mingw-w64-x86-64-posix); it is not on PATH")
    assert cannot_build(p) == why


def test_a_missing_emulator_skips_running_but_not_building(matrix, monkeypatch):
    p = matrix.platforms["windows-x86_64-cpu"]
    monkeypatch.setattr(host_tools, "find_program", lambda name: f"/usr/bin/{name}" if "mingw" in name else None)
    monkeypatch.setattr(host_tools, "EMULATORS", {"wine": HostTool("wine", ("wine64", "wine"), "wine64",
                                                                    ("/nonexistent/wine64",))})
    assert cannot_build(p) is None
    why = cannot_run(p)
    assert why is not None and why.startswith("needs the emulator wine (Debian package wine64)")
    assert cross_built(p)


def test_windows_platforms_without_a_cross_section_still_need_windows(matrix):
    assert cannot_run(matrix.platforms["windows-x86_64-cuda"]) == "needs a windows host; this is linux"
    assert not cross_built(matrix.platforms["windows-x86_64-cuda"])


# ----- the emulator as an argv prefix -------------------------------------------------------------

def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def test_generation_runs_through_the_launcher_with_its_environment(tmp_path):
    # a stand-in emulator: records its argv and environment, then runs the rest of its argv
    emulator = write_script(tmp_path, "emulator", """
        import json, os, subprocess, sys
        with open(os.environ["RECORD"], "w") as fh:
            json.dump({"argv": sys.argv[1:], "prefix": os.environ.get("WINEPREFIX")}, fh)
        sys.exit(subprocess.run(sys.argv[1:]).returncode)
    """)
    # a program with a Windows C runtime's text-mode stdout: every \\n written comes out as \\r\\n
    binary = write_script(tmp_path, "llama-completion.exe", """
        import sys
        sys.stdout.buffer.write("Zeile eins\\r\\nZeile zwei\\n\\n".replace("\\n", "\\r\\n").encode())
    """)
    record = tmp_path / "record.json"
    spec = GenerationSpec(binary=binary, model=Path("/m.gguf"), prompt="p", launcher=(str(emulator),),
                          launcher_env={"WINEPREFIX": str(tmp_path / "pfx"), "RECORD": str(record)},
                          env={"GGML_X": "1"}, crlf_stdout=True)
    res = run_generation(spec, tmp_path / "logs" / "r1")
    assert res.status == "ok", res
    seen = json.loads(record.read_text())
    assert seen["argv"][0] == str(binary) and seen["prefix"] == str(tmp_path / "pfx")
    assert res.argv[:2] == [str(emulator), str(binary)]
    # the generated "\r\n" survives; only the runtime's own translation is undone
    assert res.text == b"Zeile eins\r\nZeile zwei"
    cmd = json.loads((tmp_path / "logs" / "r1.cmd").read_text())
    assert cmd["argv"] == res.argv and cmd["env"] == {"GGML_X": "1"}
    assert cmd["launcher_env"]["WINEPREFIX"] == str(tmp_path / "pfx")


def test_text_mode_is_undone_exactly():
    for written in (b"a\nb", b"a\r\nb", b"\r\r\n", b"x\n\n\n", b"no newline", b"\r"):
        stored = written.replace(b"\n", b"\r\n")
        assert from_text_mode(stored) == written


# ----- Wine itself ----------------------------------------------------------------------------------

needs_cross = pytest.mark.skipif(
    host_tools.find_program("x86_64-w64-mingw32-g++-posix") is None or host_tools.find_emulator_program("wine") is None,
    reason="needs Debian packages g++-mingw-w64-x86-64-posix and wine64")


@pytest.mark.slow  # a Wine prefix made and programs run under it: 20-30 s each (docs/ci.md#where-the-suites-time-goes)
@needs_cross
def test_a_mingw_program_runs_under_the_prepared_wine(tmp_path):
    src = tmp_path / "hello.cpp"
    src.write_text('#include <cstdio>\n#include <thread>\n'
                   'int main(int argc, char ** argv) { std::thread t([] { std::puts("thread"); }); t.join();\n'
                   '  std::printf("%d %s\\n", argc, argv[1]); return 7; }\n')
    exe = tmp_path / "hello.exe"
    subprocess.run(["x86_64-w64-mingw32-g++-posix", "-O1", str(src), "-o", str(exe),
                    "-static"], check=True)
    program = host_tools.find_emulator_program("wine")
    assert program is not None
    emulator = cross.prepare_wine(program, tmp_path / "wine-prefix")
    assert (tmp_path / "wine-prefix" / "system.reg").is_file()
    # argv reaches the program through the ANSI code page (as on Windows): the harness passes only
    # paths there and every prompt through a file
    proc = subprocess.run(emulator.wrap([str(exe), "arg-1"]), env={**os.environ, **emulator.env},
                          capture_output=True, timeout=300)
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert proc.stdout == b"thread\r\n2 arg-1\r\n"  # the C runtime's text mode
    # prepared once: a second call reuses the prefix
    assert cross.prepare_wine(program, tmp_path / "wine-prefix") == emulator


def _recorder(path: Path, record: Path, status: int) -> str:
    """A program that appends its WINEPREFIX and arguments to ``record`` and exits with ``status``."""
    path.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    f"open({str(record)!r}, 'a').write(os.environ['WINEPREFIX'] + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n"
                    f"sys.exit({status})\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("status, warmed", [(0, True), (2, False)], ids=["server-started", "server-running"])
def test_ready_starts_the_server_and_warms_it_up_only_when_it_was_not_running(tmp_path, status, warmed):
    record = tmp_path / "calls"
    server = _recorder(tmp_path / "wineserver", record, status)
    wine = _recorder(tmp_path / "wine64", record, 0)
    emulator = cross.Emulator("wine", (wine,), {"WINEPREFIX": "/p"}, (server, f"-p{cross.WINESERVER_PERSIST_S}"),
                              ("cmd", "/c", "exit"))
    emulator.ready()
    assert record.read_text() == "/p -p60\n" + ("/p cmd /c exit\n" if warmed else "")
    cross.Emulator("wine", (wine,), {"WINEPREFIX": "/p"}).ready()  # nothing to keep alive: nothing runs
    cross.Emulator("wine", (wine,), {}, (str(tmp_path / "missing"),), ("x",)).ready()  # a server that cannot start
    assert record.read_text() == "/p -p60\n" + ("/p cmd /c exit\n" if warmed else "")


@pytest.mark.slow  # a Wine prefix made and programs run under it: 20-30 s each (docs/ci.md#where-the-suites-time-goes)
@needs_cross
def test_the_wineserver_outlives_the_programs_it_served(tmp_path):
    # Debian's wrapper starts wineserver with -p0: it exits with its last client, and a program starting
    # at that moment fails ("wine client error:0: recvmsg: Connection reset by peer")
    program = host_tools.find_emulator_program("wine")
    emulator = cross.prepare_wine(program, tmp_path / "wine-prefix")
    assert emulator.keep_alive[-1] == f"-p{cross.WINESERVER_PERSIST_S}"
    env = {**os.environ, **emulator.env}
    try:
        for _ in range(2):
            # output read to its end: Wine's own processes, which live as long as the server, must not
            # hold these pipes (they would until the server exits, 60 s later)
            proc = subprocess.run(emulator.wrap(["cmd", "/c", "exit 3"]), env=env, capture_output=True, timeout=30)
            assert proc.returncode == 3, proc.stderr[-2000:]
        time.sleep(3)  # the program and Wine's own services have exited
        # a second server for the prefix refuses to start (status 2) while the first still runs
        again = subprocess.run(list(emulator.keep_alive), env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        assert again.returncode == 2
    finally:
        subprocess.run([emulator.keep_alive[0], "-k"], env=env, capture_output=True, timeout=30)


@pytest.mark.slow  # a Wine prefix made and programs run under it: 20-30 s each (docs/ci.md#where-the-suites-time-goes)
@needs_cross
def test_openmp_programs_find_the_mingw_runtime_dll(tmp_path):
    # ggml's CPU backend links the import library CMake's FindOpenMP names (libgomp.dll.a), so even a
    # -static executable needs libgomp-1.dll at run time
    src = tmp_path / "omp.c"
    src.write_text('#include <omp.h>\n#include <stdio.h>\nint main(void) { int n = 0;\n'
                   '#pragma omp parallel reduction(+:n)\n  n += 1;\n  printf("%d\\n", n > 0); return 0; }\n')
    exe = tmp_path / "omp.exe"
    dll_dirs = cross.runtime_dll_dirs("x86_64-w64-mingw32-g++-posix")
    assert any((d / "libgomp-1.dll").is_file() for d in dll_dirs)
    assert any((d / "libwinpthread-1.dll").is_file() for d in dll_dirs)
    dll_dir = next(d for d in dll_dirs if (d / "libgomp-1.dll").is_file())
    subprocess.run(["x86_64-w64-mingw32-gcc-posix", "-fopenmp", str(src), "-o", str(exe), "-static",
                    str(dll_dir / "libgomp.dll.a")], check=True)
    program = host_tools.find_emulator_program("wine")
    without = cross.prepare_wine(program, tmp_path / "pfx")
    proc = subprocess.run(without.wrap([str(exe)]), env={**os.environ, **without.env}, capture_output=True,
                          timeout=300)
    assert proc.returncode != 0  # the DLL is not found without WINEPATH
    with_dll = cross.prepare_wine(program, tmp_path / "pfx", dll_dirs)
    assert with_dll.env["WINEPATH"] == ";".join(map(str, dll_dirs))
    proc = subprocess.run(with_dll.wrap([str(exe)]), env={**os.environ, **with_dll.env}, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout == b"1\r\n", proc.stderr[-2000:]


# ----- Windows checkouts ----------------------------------------------------------------------------

def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_an_autocrlf_clone_keeps_the_patch_series_byte_exact(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = git("rev-parse", "HEAD", cwd=ROOT).strip()
    clone = tmp_path / "clone"
    subprocess.run(["git", "-c", "core.autocrlf=true", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)],
                   check=True)
    git("config", "core.autocrlf", "true", cwd=clone)
    git("checkout", "--quiet", head, cwd=clone)
    names = [n for n in git("ls-files", "patches", cwd=clone).splitlines()]
    assert "patches/series" in names and len(names) >= 4
    for name in names:
        blob = subprocess.run(["git", "cat-file", "blob", f"{head}:{name}"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        assert (clone / name).read_bytes() == blob, f"{name} was converted on checkout"
    # a script run by bash keeps LF as well
    assert b"\r\n" not in (clone / ".ci" / "run").read_bytes()

    # the control: without the attribute, autocrlf turns the series into CRLF
    (clone / ".git" / "info").mkdir(exist_ok=True)
    (clone / ".git" / "info" / "attributes").write_text("/patches/** text\n")
    for name in names:
        (clone / name).unlink()
    git("checkout", "--quiet", "--", "patches", cwd=clone)
    assert b"\r\n" in (clone / "patches" / "series").read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_patches_check_passes_in_an_autocrlf_clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "-c", "core.autocrlf=true", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    proc = subprocess.run([sys.executable, "-m", "harness", "patches", "check"], cwd=clone, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "patches/ is up to date" in proc.stdout
