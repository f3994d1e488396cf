"""A passed compile step is reused only while its tree, options, plan and tools are what they were."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.record.cache import ResultCache
from harness.stages.building.compile_cache import compile_reusing, step_identity
from harness.stages.building.cuda_compile import CompileResult, Plan


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def _tree(tmp: Path) -> Path:
    tree = tmp / "tree"
    tree.mkdir()
    _git(tree, "init", "-q")
    (tree / "ggml-cuda.cu").write_text("int f() { return 1; }\n")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return tree


def _step(store, tmp, tree, run_id, status="passed", options=None):
    logs = tmp / run_id
    logs.mkdir()
    calls = []

    def run():
        calls.append(1)
        (logs / "build.log").write_text(f"compiled in {run_id}\n")
        (logs / "patches.log").write_text("not the step's\n")
        return CompileResult(status, 3.0, Plan({"ggml-cuda.cu": "M"}, {"a.o": ["ggml-cuda.cu"]}, ["t"]),
                             ["t"], {}, "compiled 1 unit", {"build": logs / "build.log"})

    identity = step_identity(tree, tmp / "build", tmp, options or {"CMAKE_CUDA_FLAGS": "-fdevice-syntax-only"},
                             {"ggml-cuda.cu": "M"}, ["t"], None, "true", "true", "true", {})
    result, reused = compile_reusing(store, run_id, identity, run, logs)
    return result, reused, bool(calls), logs


def test_the_same_tree_and_options_reuse_and_any_change_compiles(tmp_path):
    store = ResultCache(tmp_path / "cache")
    tree = _tree(tmp_path)
    _, reused, ran, _ = _step(store, tmp_path, tree, "r1")
    assert ran and not reused
    result, reused, ran, logs = _step(store, tmp_path, tree, "r2")
    assert not ran and reused == "r1" and result.status == "passed"
    assert result.plan == Plan({"ggml-cuda.cu": "M"}, {"a.o": ["ggml-cuda.cu"]}, ["t"])
    assert (logs / "build.log").read_text() == "compiled in r1\n" and not (logs / "patches.log").exists()
    assert result.detail.startswith("reused from run r1")
    # an option
    assert _step(store, tmp_path, tree, "r3", options={"CMAKE_CUDA_FLAGS": ""})[2]
    # an uncommitted edit: the tree is not what any commit says, so the step runs
    (tree / "ggml-cuda.cu").write_text("int f() { return 2; }\n")
    assert _step(store, tmp_path, tree, "r4")[2]
    # committed: another tree id
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "y")
    assert _step(store, tmp_path, tree, "r5")[2]
    assert not _step(store, tmp_path, tree, "r6")[2]


def test_a_failed_compile_is_never_reused(tmp_path):
    store = ResultCache(tmp_path / "cache")
    tree = _tree(tmp_path)
    _step(store, tmp_path, tree, "r1", status="failed")
    assert _step(store, tmp_path, tree, "r2")[2]


def test_the_engine_and_its_probe_are_in_the_identity_and_the_checkouts_path_is_not(tmp_path, monkeypatch):
    """The step links the engine (engine_target.engine_cmake_options): an edit of its source or of the GPU kind's
    probe header compiles again, while the same options written by the harness of another checkout are the same
    step."""
    from harness.kinds.nvidia import NVIDIA
    from harness.stages.building import compile_cache
    from harness.stages.building.engine_target import engine_cmake_options, engine_source_digest
    tree = _tree(tmp_path)
    here_dir = compile_cache.HARNESS_DIR

    def identity(engine: str, harness: Path) -> dict | None:
        monkeypatch.setattr(compile_cache, "HARNESS_DIR", harness)
        options = {k: v.replace(here_dir.as_posix(), harness.as_posix()) for k, v in engine_cmake_options(NVIDIA).items()}
        return step_identity(tree, tmp_path / "build", tmp_path, options, {}, ["llama-harness-engine"], None,
                             "true", "true", "true", {}, engine)
    here = identity(engine_source_digest(NVIDIA), here_dir)
    assert here is not None and here["options"]["HARNESS_ENGINE_PROBE_HEADER"] == "<harness>/kinds/nvidia_probe.h"
    assert identity(engine_source_digest(NVIDIA), tmp_path / "clone" / "harness") == here
    assert identity("another engine", here_dir) != here
