"""A tiny stand-in for upstream llama.cpp that the whole harness can build, test and compare in seconds.

The repository holds a CMake project with the targets the harness asks for:
``llama-completion`` and ``llama-tokenize`` (C launchers that exec Python
scripts of the tree, so their behaviour is easy to read) and a ctest test
``test-fake``.  A custom build step (``slow_step.py``) generates a header the
completion program includes; it sleeps when ``FAKE_BUILD_SLEEP_S`` is set, so
a build can be caught mid-way.  Every fake program appends its pid to
``$FAKE_PIDS`` when that is set, so a test can check that none outlived the
harness.  ``FAKE_GEN_SLEEP_S`` makes each generation sleep (only those whose prompt
contains ``FAKE_SLOW_WORD`` when that is set); one whose prompt contains
``FAKE_CRASH_WORD`` exits 3 (``FAKE_FORK_CRASH_WORD``: only the fork's); ``FAKE_IGNORE_TERM`` makes every fake program ignore SIGTERM; ``FAKE_BIG_MB``
makes it write that many MiB to stderr (only a program whose arguments hold ``FAKE_BIG_WORD`` when that is set).  The engine and the completion program log one
model buffer as llama does (``CPU_Mapped``, or ``CPU`` with ``--load-mode none`` or when
``FAKE_LOSE_MMAP`` is set).  ``llama-completion ARGS --help`` parses ARGS as llama.cpp's parser does
on a CPU build: an unknown option is refused with its ``error:`` line, ``-ngl`` is taken with a warning
that it is ignored.

:func:`make_fake_project` writes the repository, a one-patch series and a
matrix naming the repository as a ``local`` source, and a tiny GGUF model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from harness.stages.building.patches import export_series
from test_triage import FAKE_TOKENIZE

CMAKELISTS = """cmake_minimum_required(VERSION 3.14)
project(fake C)
enable_testing()
set(FAKE_PYTHON "python3" CACHE STRING "Python that runs the fake programs")
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/gen.h
    COMMAND ${FAKE_PYTHON} ${CMAKE_SOURCE_DIR}/slow_step.py ${CMAKE_BINARY_DIR}/gen.h
    DEPENDS ${CMAKE_SOURCE_DIR}/slow_step.py)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
foreach(prog completion tokenize harness-engine)
    add_executable(llama-${prog} launcher.c ${CMAKE_BINARY_DIR}/gen.h)
    target_include_directories(llama-${prog} PRIVATE ${CMAKE_BINARY_DIR})
    target_compile_definitions(llama-${prog} PRIVATE FAKE_PY="${FAKE_PYTHON}"
        FAKE_SCRIPT="${CMAKE_SOURCE_DIR}/fake_${prog}.py")
endforeach()
add_executable(test-fake launcher.c ${CMAKE_BINARY_DIR}/gen.h)
target_include_directories(test-fake PRIVATE ${CMAKE_BINARY_DIR})
target_compile_definitions(test-fake PRIVATE FAKE_PY="${FAKE_PYTHON}" FAKE_SCRIPT="${CMAKE_SOURCE_DIR}/fake_test.py")
add_test(NAME test-fake COMMAND test-fake)
set_tests_properties(test-fake PROPERTIES LABELS main)
# upstream's way of naming a test after its input: the target is test-fake
add_test(NAME test-fake-vocab COMMAND $<TARGET_FILE:test-fake> vocab)
set_tests_properties(test-fake-vocab PROPERTIES LABELS main)
add_test(NAME test-fake-net COMMAND $<TARGET_FILE:test-fake> net)
set_tests_properties(test-fake-net PROPERTIES LABELS main)
"""

LAUNCHER_C = r"""#include <stdio.h>
#include <unistd.h>
#include "gen.h"
int main(int argc, char ** argv) {
    char * args[64];
    int n = 0;
    args[n++] = FAKE_PY;
    args[n++] = FAKE_SCRIPT;
    for (int i = 1; i < argc && n < 63; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(FAKE_PY, args);
    perror("execv");
    return 127;
}
"""

COMMON_PY = """import os, signal, sys, time
if os.environ.get("FAKE_IGNORE_TERM"):  # a program stuck past SIGTERM (and so past its parent-death signal)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
def note_pid():
    if os.environ.get("FAKE_PIDS"):
        with open(os.environ["FAKE_PIDS"], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
"""

SLOW_STEP_PY = COMMON_PY + """note_pid()
time.sleep(float(os.environ.get("FAKE_BUILD_SLEEP_S") or 0))
open(sys.argv[1], "w").write("#define FAKE_GENERATED 1\\n")
"""

HOOKS_PY = """def generation_hooks(prompt, model):
    if os.environ.get("FAKE_CRASH_WORD") and os.environ["FAKE_CRASH_WORD"] in prompt:
        sys.stderr.write("error: planted crash\\n")
        sys.stderr.flush()
        os._exit(3)
    fork_word = os.environ.get("FAKE_FORK_CRASH_WORD")  # a crash the fork's patch plants: upstream's build runs
    if fork_word and fork_word in prompt and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "FORK.md")):
        sys.stderr.write("error: planted crash of the fork\\n")
        sys.stderr.flush()
        os._exit(3)
    slow = os.environ.get("FAKE_SLOW_WORD")
    if slow is None or slow in prompt or slow in model:
        if os.environ.get("FAKE_SLOW_MARK") and os.environ.get("FAKE_GEN_SLEEP_S"):
            open(os.environ["FAKE_SLOW_MARK"], "a").close()
        time.sleep(float(os.environ.get("FAKE_GEN_SLEEP_S") or 0))


def log_buffers(args):
    # llama's load log: one line per model buffer, CPU_Mapped when the model is memory-mapped
    # (FAKE_LOSE_MMAP plants a silent loss of mmap)
    mapped = "none" not in args and not os.environ.get("FAKE_LOSE_MMAP")
    sys.stderr.write("load_tensors: %12s model buffer size =     0.00 MiB\\n" % ("CPU_Mapped" if mapped else "CPU"))
    sys.stderr.flush()


def fill_stderr():
    if os.environ.get("FAKE_BIG_WORD", "") not in " ".join(sys.argv):
        return
    for _ in range(int(os.environ.get("FAKE_BIG_MB") or 0)):
        try:
            sys.stderr.buffer.write(b"x" * (1 << 20))
            sys.stderr.flush()
        except OSError:
            break
"""

FAKE_COMPLETION_PY = COMMON_PY + HOOKS_PY + """note_pid()
args = sys.argv[1:]
if "--help" in args:
    # as llama.cpp's parser: every argument handled before the usage; an unknown one refused, and a GPU
    # option taken but ignored by a build without GPU offload (common/arg.cpp)
    for arg in args:
        if arg.startswith("-") and arg not in ("--help", "--load-mode", "-ub", "-fa", "-ngl"):
            sys.stderr.write("error: invalid argument: " + arg + "\\n")
            sys.exit(1)
    if "-ngl" in args:
        sys.stderr.write("warning: no usable GPU found, --gpu-layers option will be ignored\\n")
    sys.stdout.write("usage: llama-completion [options]\\n")
    sys.exit(0)
prompt = open(args[args.index("-f") + 1], encoding="utf-8").read()
log_buffers(args)
generation_hooks(prompt, args[args.index("-m") + 1])
sys.stdout.write("hello\\n\\n")
sys.stdout.flush()
fill_stderr()
"""

#: the tokenizer of the triage tests' fake builds, without its "#!{python}" line (the launcher runs it)
FAKE_TOKENIZE_PY = FAKE_TOKENIZE.split("\n", 1)[1]

#: the engine protocol of tests/fake_engine.py, with the hooks above before each generation
FAKE_ENGINE_PY = COMMON_PY + HOOKS_PY + """note_pid()
sys.path.insert(0, @TESTS@)
import fake_engine
args = sys.argv[1:]
model = args[args.index("-m") + 1]
log_buffers(args)
fake_engine.ready()
for line in sys.stdin:
    parts = line.rstrip("\\r\\n").split("\\t")
    if parts[0] == "generate":
        generation_hooks(bytes.fromhex(parts[1]).decode("utf-8", "replace"), model)
        fill_stderr()
    if not fake_engine.handle(parts):
        break
"""

FAKE_TEST_PY = COMMON_PY + """note_pid()
time.sleep(float(os.environ.get("FAKE_TEST_SLEEP_S") or 0))
if "net" in sys.argv[1:]:
    print("cannot make GET request")
    sys.exit(1)
fork = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "FORK.md"))
if "vocab" in sys.argv[1:] and fork and os.environ.get("FAKE_BREAK_FORK_VOCAB"):
    print("main : failed test:    '3333333'")
    sys.exit(1)
print("test-fake: 3 checks passed")
"""

MATRIX = """schema_version: 1
base:
  commit: {commit}
  sources:
    - kind: local
      path: {repo}
defaults:
  generation: {{n_predict: 4, repeats: 1, seed: 1, ctx_size: 64, timeout_s: {timeout}}}
upstream_tests:
  label: main
  needs:
    test-fake-net: {{needs: network, reason: "asks a server"}}
platforms:
  linux-x86_64-cpu:
    os: linux
    arch: x86_64
    hardware: {{gpu: none}}
    cmake: {{CMAKE_BUILD_TYPE: Release, FAKE_PYTHON: "{python}"}}
    targets: [llama-completion, llama-tokenize]
    test_targets: [test-fake]
    test_labels: [main]
    upstream_tests: true
    groups: [base-vs-fork]
models:
  tiny:
    kind: file
    path: {model}
prompts:
  - id: one
    text: "one two three"
  - id: two
    text: "four five six"
  - id: three
    text: "seven eight"
  - id: four
    text: "nine ten"
configs:
  base: {{build: base}}
  fork: {{build: fork}}
groups:
  base-vs-fork:
    models: [tiny]
    reference: base
    candidates: [fork]
"""


@dataclass
class FakeProject:
    """Paths of a fake project: ``root`` (tmp dir), ``repo``, ``matrix`` file, ``patches`` dir,
    ``work`` dir, ``results`` dir and ``model`` (a small GGUF)."""

    root: Path
    repo: Path
    matrix: Path
    patches: Path
    work: Path
    results: Path
    model: Path

    def argv(self, *stages: str, extra: tuple[str, ...] = ()) -> list[str]:
        """``python -m harness STAGES --matrix ... --platform linux-x86_64-cpu -j 1 --no-cache`` for this project.

        ``--no-cache``: these tests watch generations and tests run (hang, crash, get interrupted); the
        result cache would serve a rerun of the same project (its own tests: tests/test_result_cache.py).
        """
        return [sys.executable, "-m", "harness", *stages, "--matrix", str(self.matrix), "--patches-dir",
                str(self.patches), "--work-dir", str(self.work), "--results-dir", str(self.results),
                "--platform", "linux-x86_64-cpu", "-j", "1", "--no-cache", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a harness process: the venv's tools first, this project's cache."""
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["HARNESS_CACHE_DIR"] = str(self.root / "cache")
        env.pop("HARNESS_RUN_ID", None)
        env.pop("CMAKE_GENERATOR", None)
        env["CCACHE_DISABLE"] = "1"
        env.update(extra)
        return env


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00"}
    return subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=repo, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def write_tiny_gguf(path: Path) -> Path:
    """A valid GGUF of a few hundred bytes: architecture ``llama`` and one F32 tensor of 16 values."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_fake_project(root: Path, *, timeout_s: float = 60) -> FakeProject:
    """Write the fake upstream repository, its one-patch series, a tiny model and a matrix under ``root``."""
    repo = root / "upstream"
    repo.mkdir(parents=True)
    files = {"CMakeLists.txt": CMAKELISTS, "launcher.c": LAUNCHER_C, "slow_step.py": SLOW_STEP_PY,
             "fake_completion.py": FAKE_COMPLETION_PY, "fake_tokenize.py": FAKE_TOKENIZE_PY,
             "fake_harness-engine.py": FAKE_ENGINE_PY.replace("@TESTS@", repr(str(Path(__file__).resolve().parent))),
             "fake_test.py": FAKE_TEST_PY}
    for name, text in files.items():
        (repo / name).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fake upstream")
    commit = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "fork")
    (repo / "FORK.md").write_text("the fork's notes\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "Add the fork's notes\n\nThe fork documents itself.")
    patches = root / "patches"
    export_series(repo, commit, patches)
    _git(repo, "checkout", "-q", "main")
    model = write_tiny_gguf(root / "tiny.gguf")
    matrix = root / "matrix.yaml"
    matrix.write_text(MATRIX.format(commit=commit, repo=repo, python=sys.executable, model=model,
                                    timeout=timeout_s))
    return FakeProject(root, repo, matrix, patches, root / "work", root / "results", model)


def pids_alive(pid_file: Path) -> list[int]:
    """The pids listed in ``pid_file`` that still exist (zombies count as gone)."""
    alive = []
    if not pid_file.exists():
        return alive
    for line in pid_file.read_text().split():
        pid = int(line)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


# --------------------------------------------------------------------------- upstream drift

API_H = "#define FAKE_API_VALUE 1\n"
NOTES = "".join(f"line {i}\n" for i in range(1, 31))
OTHER = "".join(f"other {i}\n" for i in range(1, 21))


def _lines(text: str, changes: dict[int, str], prepend: str = "") -> str:
    """``text`` with 1-based line numbers replaced by ``changes`` and ``prepend`` put before it."""
    lines = text.splitlines(keepends=True)
    for number, new in changes.items():
        lines[number - 1] = new + "\n"
    return prepend + "".join(lines)


#: The drift series, in order: (subject, {path: content after the patch}), each on top of the one before.
DRIFT_SERIES = (
    ("Mark line 5 of the notes", "notes.txt", {5: "line 5 (fork)"}),
    ("Mark line 20 of the notes", "notes.txt", {20: "line 20 (fork)"}),
    ("Mark the third other line", "other.txt", {3: "other 3 (fork)"}),
    ("Mark the fifteenth other line", "other.txt", {15: "other 15 (fork)"}),
)


@dataclass
class DriftProject:
    """A fake project whose pinned base ``old`` carries a five-patch series, and two later upstream commits
    with planted drift: ``drift`` (patch 1's hunk moved and its context changed: 3-way; patch 2's line
    rewritten: conflict in notes.txt; patch 3 upstreamed verbatim; patch 4 untouched, so it applies after
    patch 2 conflicts; FAKE_API_VALUE renamed FAKE_API_LEVEL in api.h, which patch 5 uses in launcher.c:
    a compile error) and ``output`` (every patch applies; upstream's programs print ``howdy`` instead of
    ``hello``: an output change of upstream alone)."""

    project: FakeProject
    old: str
    drift: str
    output: str


def make_drift_project(root: Path) -> DriftProject:
    """Write :func:`make_fake_project`'s tree plus notes.txt, other.txt and api.h, the drift series in
    ``root/patches`` and the two drifted upstream commits (branches ``drift`` and ``output``)."""
    project = make_fake_project(root)
    repo = project.repo
    first = _git(repo, "rev-parse", "main")
    _git(repo, "checkout", "-q", "main")
    (repo / "notes.txt").write_text(NOTES)
    (repo / "other.txt").write_text(OTHER)
    (repo / "api.h").write_text(API_H)
    launcher = (repo / "launcher.c").read_text().replace('#include "gen.h"\n', '#include "gen.h"\n#include "api.h"\n')
    (repo / "launcher.c").write_text(launcher)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fake upstream: notes, other lines and an API header")
    old = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-B", "fork")
    texts = {"notes.txt": NOTES, "other.txt": OTHER}
    for subject, path, change in DRIFT_SERIES:
        texts[path] = _lines(texts[path], change)
        (repo / path).write_text(texts[path])
        _git(repo, "commit", "-q", "-am", f"{subject}\n\nThe fork marks the lines it owns.")
    (repo / "launcher.c").write_text(launcher.replace("    int n = 0;\n", "    int n = FAKE_API_VALUE - 1;\n"))
    _git(repo, "commit", "-q", "-am", "Start the argument count at the API value\n\nThe fork counts from the API.")
    export_series(repo, old, project.patches)
    _git(repo, "checkout", "-q", "-B", "drift", old)
    # patch 1's hunk moves down 5 lines and a line of its context changes; patch 2's line is rewritten
    (repo / "notes.txt").write_text(_lines(NOTES, {3: "line 3 (upstream)", 20: "line 20 (upstream rewrite)"},
                                           prepend="".join(f"new {i}\n" for i in range(1, 6))))
    (repo / "other.txt").write_text(_lines(OTHER, {3: "other 3 (fork)"}))  # patch 3, verbatim
    _git(repo, "commit", "-q", "-am", "upstream: reword the notes, take the fork's third line")
    (repo / "api.h").write_text(API_H.replace("FAKE_API_VALUE", "FAKE_API_LEVEL"))
    _git(repo, "commit", "-q", "-am", "upstream: rename FAKE_API_VALUE to FAKE_API_LEVEL")
    drift = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-B", "output", old)
    for name in ("fake_completion.py", "fake_harness-engine.py"):
        text = (repo / name).read_text().replace('sys.stdout.write("hello', 'sys.stdout.write("howdy')
        (repo / name).write_text(text.replace("import fake_engine\n", 'import fake_engine\nfake_engine.TOKEN = (3, b"howdy")\n'))
    _git(repo, "commit", "-q", "-am", "upstream: greet with howdy")
    output = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    project.matrix.write_text(project.matrix.read_text().replace(f"commit: {first}", f"commit: {old}"))
    return DriftProject(project, old, drift, output)


def guards_of(pid: int) -> list[int]:
    """The guards (harness.common.guard) that harness process ``pid`` started: its children running guard.py."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"guard.py" in cmdline:
            found.append(int(entry.name))
    return found


def kill_with_its_guard(harness: subprocess.Popen) -> None:
    """SIGKILL the harness process ``harness`` and its guard first: what is left when nothing of the harness can
    act (the OOM killer, ``kill -9 -1``), for the next run to end (harness.record.leftovers)."""
    for guard in guards_of(harness.pid):
        os.kill(guard, 9)
    harness.kill()
