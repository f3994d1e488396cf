"""The global lock order (harness.common.locks.Rank, then by path): a thread never waits for a lock before one
it holds, and a thread a holder may wait for takes only later locks, the compile thread's beside the builds.
Two real runs asking for the same builds in opposite orders: tests/test_interrupts.py."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.common.locks import BuildLock, LockOrderError, Rank, exclusive, joined_by_holder_of, plain
from harness.stages.building.cuda_compile import ToolkitMissing, assemble_toolkit

ROOT = Path(__file__).resolve().parents[1]


def test_build_locks_are_taken_by_path_and_a_lock_before_a_held_one_is_refused_before_any_wait(tmp_path):
    def lock(variant: str) -> BuildLock:  # one object per hold: a released read hold closes its lock
        return BuildLock(tmp_path / variant / "build-x")

    held = lock("base")
    held.read()
    with lock("fork").write():  # after base: fine
        pass
    held.release()
    held = lock("fork")
    held.read()
    try:
        with pytest.raises(LockOrderError, match=r"build lock .*base/build-x\.lock asked for while holding build "
                                                 r"lock .*fork/build-x\.lock"):
            with lock("base").write():
                pass
        with pytest.raises(LockOrderError):  # the same lock again: it would wait for itself
            with lock("fork").write():
                pass
    finally:
        held.release()
    with lock("base").write():  # nothing held any more: nothing is refused, the refused attempts left no record
        pass


def test_ranks_come_before_paths_and_the_cache_comes_last(tmp_path):
    build = BuildLock(tmp_path / "z" / "build-x")
    build.read()
    try:
        with exclusive(tmp_path / "a" / "llama.cpp", "the source tree", Rank.SOURCE), \
                plain(tmp_path / "evict.lock", Rank.CACHE_EVICT), plain(tmp_path / "e" / "k.lock", Rank.CACHE_ENTRY):
            pass
        with plain(tmp_path / "e" / "k.lock", Rank.CACHE_ENTRY):
            with pytest.raises(LockOrderError, match="source lock"):
                with exclusive(tmp_path / "a" / "llama.cpp", "the source tree", Rank.SOURCE):
                    pass
    finally:
        build.release()


def test_a_thread_the_holder_of_builds_may_wait_for_takes_no_build_lock(tmp_path):
    def compile_thread() -> str:
        with exclusive(tmp_path / "fork" / "compile-x", "the compile directory", Rank.COMPILE), \
                plain(tmp_path / "e" / "k.lock", Rank.CACHE_ENTRY):
            pass
        try:
            BuildLock(tmp_path / "a" / "build-x").read()
        except LockOrderError as exc:
            return str(exc)
        return "taken"

    with ThreadPoolExecutor(1, initializer=joined_by_holder_of, initargs=(Rank.BUILD,)) as pool:
        said = pool.submit(compile_thread).result()
    assert "asked for by a thread that a holder of build locks may wait for" in said
    held = BuildLock(tmp_path / "b" / "build-x")
    held.read()

    def other_thread() -> str:
        with BuildLock(tmp_path / "a" / "build-x").write():  # before b: another thread's holds do not count
            return "built"

    try:
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(other_thread).result() == "built"
    finally:
        held.release()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("cc"), reason="the fake project on Linux")
def test_the_compile_thread_keeps_the_order_beside_the_builds(tmp_path):
    # the build stage of the fake project's CPU platform and a compile-only copy of it: the compile thread
    # (toolkit, source trees, compile directories, the result cache) runs while the main thread holds builds
    try:
        assemble_toolkit(tmp_path / "cache")
    except ToolkitMissing as exc:
        pytest.skip(str(exc))
    project = make_fake_project(tmp_path)
    text = project.matrix.read_text()
    platform = text[text.index("  linux-x86_64-cpu:\n"):text.index("models:\n")]
    compiled = (platform.replace("linux-x86_64-cpu:", "compiled-cuda:").replace("{gpu: none}", "{gpu: nvidia}")
                + "    compile_only:\n      cmake: {CMAKE_BUILD_TYPE: Release}\n")
    project.matrix.write_text(text.replace("models:\n", compiled + "models:\n", 1))
    argv = project.argv("build", extra=("--platform", "compiled-cuda"))
    done = subprocess.run(argv, cwd=ROOT, env=project.env(FAKE_BUILD_SLEEP_S="2"), capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "[compiled-cuda] compile fork: passed" in out and "[compiled-cuda] compile base: passed" in out, out
    assert "LockOrderError" not in out


def test_a_wait_names_whether_a_step_of_this_run_or_another_process_holds_the_lock(tmp_path):
    """The message of a wait for an exclusive lock says who holds it: another step of this run (e.g. the CUDA
    compile preparing the fork tree while the CPU build waits) by its console title, never by a thread's name,
    or another harness process by the lock file."""
    import threading

    from harness.common.console import Console

    target = tmp_path / "fork" / "llama.cpp"
    said: list[str] = []
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Console(io.StringIO(), interactive=False, heartbeat_s=0).step("[linux-x86_64-cuda] compile fork"), \
                exclusive(target, "the fork source tree", Rank.SOURCE):
            taken.set()
            release.wait(10)

    holder = threading.Thread(target=hold, name="compile_0")
    holder.start()
    assert taken.wait(10)
    threading.Timer(0.5, release.set).start()
    with Console(io.StringIO(), interactive=False, heartbeat_s=0).step("[linux-x86_64-cpu] build fork"), \
            exclusive(target, "the fork source tree", Rank.SOURCE, say=said.append):
        pass
    holder.join(10)
    assert said == ["[linux-x86_64-cpu] build fork: waiting for the fork source tree: another step of this run "
                    "([linux-x86_64-cuda] compile fork) is using it"]  # the step that waits, then the one it waits for

    code = ("import sys, time\nfrom pathlib import Path\nfrom harness.common.locks import Rank, exclusive\n"
            "with exclusive(Path(sys.argv[1]), 'x', Rank.SOURCE):\n    print('held', flush=True)\n    time.sleep(1.5)\n")
    other = subprocess.Popen([sys.executable, "-c", code, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdout.readline().strip() == "held"
    said.clear()
    with exclusive(target, "the fork source tree", Rank.SOURCE, say=said.append):
        pass
    other.wait(10)
    assert said == [f"waiting for the fork source tree: another harness process holds {target}.lock"]
