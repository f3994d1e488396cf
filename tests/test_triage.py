"""Failure signatures, run triage and patch-series bisection, on synthetic result runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness import bisect
from harness.triage import run_choice, text_rules, triage
from harness.stages.building.patches import export_series
from harness.record.json_files import write_json
from harness.record.records import ComparisonRecord, Failure, StepRecord
from harness.record.layout import RunLayout
from harness.record.run import Run
from harness.record.upstream_tests import FAILED_BOTH, PASSED_BOTH, REGRESSED, SuiteRecord, TestPair
from harness.triage.signatures import classify_run, classify_step
from harness.triage.text_rules import classify_text, normalise
from harness.common.errors import InputError
from harness.triage.triage import diff_runs
from harness.triage.run_choice import previous_run, resolve_run

CPU, CUDA, WIN = "linux-x86_64-cpu", "linux-x86_64-cuda", "windows-x86_64-cuda"
GIB = 2**30

# --------------------------------------------------------------------------- synthetic logs


def cuda_crash_stderr(device: int, address: str, line: int, func: str, prefix: str) -> str:
    """llama-completion's stderr when a sticky CUDA error surfaces at cudaFuncSetAttribute."""
    return (
        "llama_model_loader: loaded meta data with 31 key-value pairs\n"
        f"ggml_cuda_host_malloc: pin ladder: requested={4 * GIB} granted={2 * GIB} segments=2 seconds=0.412\n"
        "CUDA error: an illegal memory access was encountered\n"
        f"  current device: {device}, in function {func} at {prefix}/ggml/src/ggml-cuda/ggml-cuda.cu:{line}\n"
        "  cudaFuncSetAttribute(mul_mat_q<GGML_TYPE_Q4_K, 64, false>, "
        "cudaFuncAttributeMaxDynamicSharedMemorySize, nbytes_shared)\n"
        f"{prefix}/ggml/src/ggml-cuda/ggml-cuda.cu:{line - 2000}: CUDA error\n"
        f"[New LWP {address[-5:]}]\n"
        f"{address} in __GI___wait4 () from /lib/x86_64-linux-gnu/libc.so.6\n"
        f"#1  {address} in ggml_print_backtrace ()\n"
    )


def compile_log(prefix: str, line: int) -> str:
    """A Windows nvcc build log failing in the fork's pin ladder code."""
    return (
        f"$ cmake --build {prefix}\\build\\windows-x86_64-cuda\\fork --target llama-completion\n"
        "[12/240] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.obj\n"
        "FAILED: ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.obj\n"
        f"{prefix}\\fork\\ggml\\src\\ggml-cuda\\ggml-cuda.cu({line}): error: identifier "
        "\"cudaHostRegisterReadOnlyFlag\" is undefined\n"
        f"{prefix}\\fork\\ggml\\src\\ggml-cuda\\ggml-cuda.cu({line + 40}): error: too few arguments in function call\n"
        "2 errors detected in the compilation of \"ggml-cuda.cu\".\n"
        "ninja: build stopped: subcommand failed.\n"
    )


def ladder(granted: list[int], requested: int = 4 * GIB) -> list[dict]:
    return [{"kind": "ladder", "requested": requested, "granted": g, "segments": 2, "seconds": 0.4,
             "line": f"pin ladder: requested={requested} granted={g} segments=2 seconds=0.4"} for g in granted]


def write_gen(run: Run, platform: str, config: str, model: str, prompt: str, *, stderr: str = "",
              pin: list[dict] | None = None, binary: str = "/work/.harness/build/x/fork/bin/llama-completion") -> None:
    gen = run.platform_dir(platform) / config / "gen" / model
    gen.mkdir(parents=True, exist_ok=True)
    (gen / f"{prompt}.r1.stdout").write_text("text\n\n")
    (gen / f"{prompt}.r1.stderr").write_text(stderr or "llama_model_loader: loaded\n")
    (gen / f"{prompt}.r1.cmd").write_text(json.dumps({"argv": [binary, "-m", "m.gguf"], "env": {}, "timeout_s": 300}))
    if pin is not None:
        write_json(gen / f"{prompt}.r1.pin-ladder.json", pin)


def diverged(index: int, ref: str, cand: str) -> dict:
    return {"index": index, "reference": {"id": 100 + index, "piece": ref}, "candidate": {"id": 200 + index, "piece": cand}}


def make_run(root: Path, run_id: str, *, regressed: bool, variant: int = 0, platforms=(CPU, CUDA, WIN)) -> Run:
    """A complete synthetic run.  ``regressed``: the CPU story comparison diverges, the CUDA
    cuda-pin-all generation crashes with a CUDA error, and the Windows fork build fails to
    compile.  ``variant`` changes addresses, line numbers, paths and token index, not the failures.
    """
    run = Run.open(root, run_id)
    prefix = ["/work/.harness/fork", "/home/ci/runner-7/_work/llama/.harness/fork"][variant]
    if CPU in platforms:
        run.record_step(StepRecord(CPU, "base", "build", "passed", 130.0 if regressed else 100.0, "built in 130 s"))
        run.record_step(StepRecord(CPU, "fork", "build", "passed", 95.0 if regressed else 90.0, "built in 90 s"))
        run.record_step(StepRecord(CPU, "fork", "test", "passed", 6.0 if regressed else 2.0, "5 passed, 0 skipped",
                                   f"{CPU}/tests/junit.xml"))
        for config in ("base", "fork", "fork-load-none"):
            for prompt in ("story", "code"):
                write_gen(run, CPU, config, "gemma3-270m", prompt)
            run.record_step(StepRecord(CPU, config, "generate", "passed", detail="all generations ran"))
        story = "diverged" if regressed else "identical"
        div = diverged(5 + 2 * variant, " the", " a") if regressed else None
        run.record_comparisons([
            ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "story", "base", "fork", story, div,
                             f"diverged at token {5 + 2 * variant}" if regressed else "identical"),
            ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "code", "base", "fork", "identical", None, "identical"),
            ComparisonRecord(CPU, "mmap-vs-load-mode-none", "gemma3-270m", "story", "fork", "fork-load-none",
                             "identical", None, "identical"),
        ])
    if CUDA in platforms:
        run.record_step(StepRecord(CUDA, "fork", "build", "passed", 400.0, "built in 400 s"))
        run.record_step(StepRecord(CUDA, "fork", "test", "passed", 30.0, "2 passed, 0 skipped"))
        for prompt in ("long-prefill", "story"):
            write_gen(run, CUDA, "cuda-nopin", "moe-large", prompt)
        crash = cuda_crash_stderr(device=variant, address=["0x00007f3a2b1c4d5e", "0x00007ffd00aa1234"][variant],
                                  line=[2741, 2790][variant], func=["ggml_backend_cuda_synchronize",
                                                                    "ggml_cuda_op_mul_mat"][variant], prefix=prefix)
        write_gen(run, CUDA, "cuda-pin-all", "moe-large", "long-prefill", stderr=crash if regressed else "",
                  pin=ladder([2 * GIB] if regressed else [4 * GIB]))
        write_gen(run, CUDA, "cuda-pin-all", "moe-large", "story", pin=ladder([2 * GIB] if regressed else [4 * GIB]))
        run.record_step(StepRecord(CUDA, "cuda-nopin", "generate", "passed", detail="all generations ran"))
        if regressed:
            error_line = f"{prefix}/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error"
            run.record_step(StepRecord(CUDA, "cuda-pin-all", "generate", "failed",
                                       detail=f"moe-large/long-prefill: crashed SIGABRT {error_line}",
                                       failures=[Failure("generation", model="moe-large", prompt="long-prefill",
                                                         repeat=1, status="crashed", signal="SIGABRT",
                                                         error_line=error_line)]))
        else:
            run.record_step(StepRecord(CUDA, "cuda-pin-all", "generate", "passed", detail="all generations ran"))
        run.record_comparisons([
            ComparisonRecord(CUDA, "cuda-pin-routes", "moe-large", "long-prefill", "cuda-nopin", "cuda-pin-all",
                             "crashed" if regressed else "identical", None,
                             "candidate crashed: SIGABRT: CUDA error" if regressed else "identical"),
            ComparisonRecord(CUDA, "cuda-pin-routes", "moe-large", "story", "cuda-nopin", "cuda-pin-all",
                             "identical", None, "identical"),
        ])
    if WIN in platforms:
        logs = run.platform_dir(WIN) / "build-fork"
        logs.mkdir(parents=True, exist_ok=True)
        win_prefix = ["C:\\work\\.harness", "D:\\a\\_work\\llama\\.harness"][variant]
        (logs / "configure.log").write_text(f"$ cmake -S {win_prefix}\\fork -B {win_prefix}\\build\\{WIN}\\fork\n")
        (logs / "configure.rc").write_text("0\n")
        if regressed:
            (logs / "build.log").write_text(compile_log(win_prefix, [512, 530][variant]))
            (logs / "build.rc").write_text("1\n")
            run.record_step(StepRecord(WIN, "fork", "build", "failed", 61.0,
                                       "build failed: " + compile_log(win_prefix, 512).splitlines()[3],
                                       f"{WIN}/build-fork/build.log"))
        else:
            (logs / "build.log").write_text("[240/240] Linking CXX executable bin\\llama-completion.exe\n")
            (logs / "build.rc").write_text("0\n")
            run.record_step(StepRecord(WIN, "fork", "build", "passed", 900.0, "built in 900 s",
                                       f"{WIN}/build-fork/build.log"))
        run.record_step(StepRecord(WIN, "-", "test", "skipped", detail="needs an NVIDIA GPU; nvidia-smi reports none"))
    return run


@pytest.fixture()
def runs(tmp_path):
    """Runs a (all good), b (regressed three ways), q (CPU only, good), c (b's failures, other noise)."""
    root = tmp_path / "results"
    a = make_run(root, "20260101T000000Z-aaaa", regressed=False)
    b = make_run(root, "20260102T000000Z-bbbb", regressed=True)
    q = make_run(root, "20260102T120000Z-qqqq", regressed=False, platforms=(CPU,))
    c = make_run(root, "20260103T000000Z-cccc", regressed=True, variant=1)
    return root, a, b, q, c


# --------------------------------------------------------------------------- signatures


def test_cuda_error_signature_is_error_and_api_call_not_the_call_site(runs):
    root, a, b, q, c = runs
    step = {"platform": CUDA, "config": "cuda-pin-all", "step": "generate", "status": "failed"}
    sig_b = classify_step(b.dir, b.step(CUDA, "cuda-pin-all", "generate"))
    sig_c = classify_step(c.dir, c.step(CUDA, "cuda-pin-all", "generate"))
    # a record-format-1 entry (facts only in its detail) gets the same signature
    assert classify_step(b.dir, StepRecord.from_json({**step, "detail": _detail(b, CUDA, "cuda-pin-all")})) == sig_b
    assert sig_b.kind == "cuda_error"
    assert sig_b.key == "an illegal memory access was encountered at cudaFuncSetAttribute"
    assert sig_b.key == sig_c.key  # other device, address, line, function, machine: same failure
    assert sig_b.evidence != sig_c.evidence  # ... while the evidence is what each log said
    assert "cudaFuncSetAttribute(" in sig_b.evidence


def _detail(run: Run, platform: str, config: str) -> str:
    return next(s.detail for s in run.steps if (s.platform, s.config, s.step) == (platform, config, "generate"))


def test_compile_error_signature_keeps_file_and_message_without_paths_or_lines(runs):
    root, a, b, q, c = runs
    step = {"platform": WIN, "config": "fork", "step": "build", "status": "failed", "detail": "build failed"}
    sig_b, sig_c = classify_step(b.dir, StepRecord.from_json(step)), classify_step(c.dir, StepRecord.from_json(step))
    assert sig_b.kind == "compile_error"
    assert sig_b.key == 'ggml/src/ggml-cuda/ggml-cuda.cu: error: identifier "cudaHostRegisterReadOnlyFlag" is undefined'
    assert sig_c.key == sig_b.key
    assert "ggml-cuda.cu:512" in sig_b.summary and "ggml-cuda.cu:530" in sig_c.summary
    assert classify_step(a.dir, StepRecord.from_json({**step, "status": "passed"})) is None


@pytest.mark.parametrize("log, kind, key", [
    ("/w/src/llama-model.cpp:88:5: error: 'foo' was not declared in this scope\n", "compile_error",
     "src/llama-model.cpp: error: 'foo' was not declared in this scope"),
    ("FAILED: bin/llama-completion\n/usr/bin/ld: common.o: in function `x':\n"
     "common.cpp:(.text+0x1f): undefined reference to `ggml_cuda_pin_layers(int)'\n"
     "collect2: error: ld returned 1 exit status\n", "link_error",
     "undefined reference to `ggml_cuda_pin_layers(int)' linking bin/llama-completion"),
    ("C:\\w\\fork\\src\\llama.cpp(77,3): error C2065: 'n_pinned': undeclared identifier\n", "compile_error",
     "src/llama.cpp: error C2065: 'n_pinned': undeclared identifier"),
])
def test_build_log_rules(tmp_path, log, kind, key):
    run = Run.open(tmp_path, "r1")
    logs = run.platform_dir(CPU) / "build-fork"
    logs.mkdir()
    (logs / "configure.rc").write_text("0\n")
    (logs / "build.log").write_text(f"$ cmake --build /w/build --target all\n{log}")
    (logs / "build.rc").write_text("1\n")
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CPU, "config": "fork", "step": "build", "status": "failed"}))
    assert (sig.kind, sig.key) == (kind, key)


def test_configure_error(tmp_path):
    run = Run.open(tmp_path, "r1")
    logs = run.platform_dir(CPU) / "build-base"
    logs.mkdir()
    (logs / "configure.log").write_text(
        "$ cmake -S /tmp/x/src -B /tmp/x/build -G Ninja\n-- The C compiler identification is GNU 12.2.0\n"
        "CMake Error at /tmp/x/src/ggml/src/ggml-cuda/CMakeLists.txt:40 (message):\n"
        "  CUDA Toolkit not found\n\n-- Configuring incomplete, errors occurred!\n")
    (logs / "configure.rc").write_text("1\n")
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CPU, "config": "base", "step": "build", "status": "failed"}))
    assert sig.kind == "configure_error"
    assert sig.key == "ggml/src/ggml-cuda/CMakeLists.txt (message): CUDA Toolkit not found"


def _series_repo(root: Path) -> tuple[Path, str, list]:
    """A tiny C project committed as ``main`` in ``root/repo`` and SERIES exported from a ``fork`` branch
    to ``root/patches``; returns (repo, base commit, patches) with ``main`` checked out."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for name, text in (("CMakeLists.txt", CMAKELISTS), ("test-sum.c", TEST_SUM), ("sum.h", SUM_H)):
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "tiny base")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "fork")
    for i, (subject, body, files) in enumerate(SERIES, start=1):
        for name, text in files.items():
            (repo / name).write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"{subject}\n\n{body}", date=f"2024-01-0{i + 1}T00:00:00+00:00")
    patches = export_series(repo, base, root / "patches")
    _git(repo, "checkout", "-q", "main")
    return repo, base, patches


def test_a_series_that_does_not_apply_has_a_patch_apply_signature_naming_the_patch(tmp_path):
    from harness.stages.building.patches import PatchApplyError, apply_series
    failures = []
    for n, new_line in enumerate(('"sum ok', '"summed ok')):
        # two machines, two upstream commits that both rewrite the line the last patch changes
        repo, base, patches = _series_repo(tmp_path / f"machine{n}")
        (repo / "test-sum.c").write_text(TEST_SUM.replace('"ok', new_line))
        _git(repo, "commit", "-q", "-am", f"upstream edit {n}")
        with pytest.raises(PatchApplyError) as exc:
            apply_series(repo, _git(repo, "rev-parse", "HEAD"), patches)
        failures.append((patches, f"{type(exc.value).__name__}: {exc.value}"))
    (patches0, detail0), (_, detail1) = failures
    assert detail0 != detail1  # other paths and base commits

    run = Run.open(tmp_path / "results", "r1")
    for platform, detail in ((CPU, detail0), (WIN, detail1)):
        logs = run.platform_dir(platform) / "build-fork"
        logs.mkdir(parents=True)
        (logs / "error.log").write_text(detail + "\n")  # what the pipeline writes for an exception
        run.record_step(StepRecord(platform, "fork", "build", "error", 0.0, detail))
    entries = classify_run(run.dir)
    sigs = {e["platform"]: e["signature"] for e in entries}
    name = patches0[4].name
    assert name == "name-the-test-output.patch"
    assert sigs[CPU]["kind"] == "patch_apply"
    assert sigs[CPU]["key"] == f"patch {name} does not apply" == sigs[WIN]["key"]
    assert sigs[CPU]["summary"].startswith(f"patch 5 of 5, {name} ('Name the test output'), does not apply on ")
    assert "CONFLICT (content): Merge conflict in test-sum.c" in sigs[CPU]["evidence"]
    assert "error: patch failed: test-sum.c:3" in sigs[CPU]["evidence"]

    # a step whose detail was lost is read from error.log; other build errors are not patch_apply
    step = {"platform": WIN, "config": "fork", "step": "build", "status": "error", "detail": ""}
    assert classify_step(run.dir, StepRecord.from_json(step)).key == f"patch {name} does not apply"
    other = classify_step(run.dir, StepRecord.from_json({**step, "platform": CPU,
                                                         "detail": "BuildError: ninja not found on PATH"}))
    assert other.kind == "other"


def _write_tests(run: Run, ctest_log: str, cases: list[dict], sub: str = "tests", tool: str | None = None) -> None:
    out = run.platform_dir(CUDA) / sub
    out.mkdir(parents=True, exist_ok=True)
    (out / "ctest.log").write_text(ctest_log)
    write_json(out / "tests.json", {"status": "failed", "cases": cases})
    if tool:
        write_json(out / "sanitizer.json", {"tool": tool, "summary": "compute-sanitizer: 1 run(s), 1 error(s)"})


def test_test_step_assertion_signal_and_sanitizer(tmp_path):
    run = Run.open(tmp_path, "r1")
    _write_tests(run, (
        "$ ctest --test-dir /b --output-on-failure\n"
        "    Start 1: test-moe-pin-layers\n"
        "1/2 Test #1: test-moe-pin-layers ..............***Failed    0.05 sec\n"
        "/home/u/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:1456: GGML_ASSERT(n_pinned <= n_layer) failed\n"
        "    Start 2: test-cuda-pin-ladder\n"
        "2/2 Test #2: test-cuda-pin-ladder .............***Exception: SegFault  0.12 sec\n"
        "The following tests FAILED:\n\t  1 - test-moe-pin-layers (Subprocess aborted)\n"
        "\t  2 - test-cuda-pin-ladder (SEGFAULT)\n"),
        [{"name": "test-moe-pin-layers", "status": "failed", "message": "Failed"},
         {"name": "test-cuda-pin-ladder", "status": "failed", "message": "Failed"}])
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CUDA, "config": "fork", "step": "test", "status": "failed"}))
    assert sig.kind == "test_assertion"  # ranks above the other test's SIGSEGV
    assert sig.key == "test-moe-pin-layers: GGML_ASSERT(n_pinned <= n_layer) failed in ggml/src/ggml-cuda/ggml-cuda.cu"
    assert "+1 more failing test" in sig.summary

    _write_tests(run, "", [{"name": "test-cuda-pin-ladder", "status": "failed", "message": "exit 139"}],
                 sub="tests-memcheck", tool="memcheck")
    (run.platform_dir(CUDA) / "tests-memcheck" / "test-cuda-pin-ladder.log").write_text(
        "========= COMPUTE-SANITIZER\n"
        "========= Invalid __global__ read of size 4 bytes\n"
        "=========     at k_copy_pinned(const float *, float *, int)+0x1b0 in /x/ggml/src/ggml-cuda/cpy.cu:41\n"
        "=========     by thread (255,0,0) in block (12,0,0)\n"
        "=========     Address 0x7f5e3c000400 is out of bounds\n"
        "========= ERROR SUMMARY: 1 error\n")
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CUDA, "config": "fork", "step": "test-memcheck", "status": "failed"}))
    assert sig.kind == "sanitizer_report"
    assert sig.key == ("test-cuda-pin-ladder: memcheck: Invalid __global__ read of size 4 bytes "
                       "in k_copy_pinned(const float *, float *, int)")

    (run.platform_dir(CUDA) / "tests-memcheck" / "test-cuda-pin-ladder.log").write_text("no output\n")
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CUDA, "config": "fork", "step": "test-memcheck", "status": "failed"}))
    assert (sig.kind, sig.key) == ("signal", "SIGSEGV in test-cuda-pin-ladder")  # from exit 139 = 128 + 11


@pytest.mark.parametrize("detail, stderr, kind, key", [
    ("gemma3-270m/story: crashed SIGSEGV", "llama_model_loader: loaded\n", "signal", "SIGSEGV in llama-completion"),
    ("gemma3-270m/story: crashed  exit code 139", "", "signal", "SIGSEGV in llama-completion"),
    ("gemma3-270m/story: timeout", "", "timeout", "timeout in llama-completion"),
    ("gemma3-270m/story: crashed SIGABRT /w/ggml/src/ggml.c:1500: GGML_ASSERT(n <= 4) failed",
     "/home/u/w/ggml/src/ggml.c:1500: GGML_ASSERT(n <= 4) failed\n", "test_assertion",
     "llama-completion: GGML_ASSERT(n <= 4) failed in ggml/src/ggml.c"),
    ("error: build fork did not pass", "", "other", "error: build fork did not pass"),
])
def test_generate_step_rules(tmp_path, detail, stderr, kind, key):
    run = Run.open(tmp_path, "r1")
    write_gen(run, CPU, "fork", "gemma3-270m", "story", stderr=stderr)
    sig = classify_step(run.dir, StepRecord.from_json({"platform": CPU, "config": "fork", "step": "generate", "status": "failed",
                                  "detail": detail}))
    assert (sig.kind, sig.key) == (kind, key)


def test_timeout_and_text_rules():
    assert classify_text("1/1 Test #1: test-gguf ....***Timeout 900.01 sec\n", "test-gguf").key == "timeout in test-gguf"
    assert classify_text("all good\n", "x") is None
    assert normalise("at 0x7ffd1234 /tmp/pytest-of-u/pytest-9/t0/ggml/src/ggml.c:12:4: took 3.2 s at 12:01:02") == \
        "at 0x? ggml/src/ggml.c: took <t> at <time>"
    assert text_rules.signal_from_exit(-11) == "SIGSEGV" and text_rules.signal_from_exit(134) == "SIGABRT"
    assert text_rules.signal_from_exit(1) is None


def test_classify_run_writes_signatures_json(runs):
    root, a, b, q, c = runs
    entries = classify_run(b.dir)
    stored = json.loads((b.dir / "signatures.json").read_text())
    assert stored == entries
    kinds = sorted((e["platform"], e["config"], e["step"], e["signature"]["kind"]) for e in entries)
    assert kinds == [(CPU, "fork", "compare", "output_mismatch"), (CUDA, "cuda-pin-all", "generate", "cuda_error"),
                     (WIN, "fork", "build", "compile_error")]
    assert classify_run(a.dir) == []


# --------------------------------------------------------------------------- triage


def _regression_ids(report) -> set[tuple]:
    return {(t.kind, t.platform, t.what, t.before, t.after) for t in report.regressions}


def test_triage_names_exactly_the_regressions(runs, capsys):
    root, a, b, q, c = runs
    report = diff_runs(a.dir, b.dir)
    assert _regression_ids(report) == {
        ("comparison", CPU, "base-vs-fork gemma3-270m/story: fork vs base", "identical", "diverged"),
        ("step", CUDA, "cuda-pin-all generate", "passed", "failed"),
        ("comparison", CUDA, "cuda-pin-routes moe-large/long-prefill: cuda-pin-all vs cuda-nopin", "identical",
         "crashed"),
        ("step", WIN, "fork build", "passed", "failed"),
        # fewer page-locked bytes is a regression even where no status changed (harness.triage.memory_changes)
        ("pinning", CUDA, "cuda-pin-all: pinned bytes", "8.00 GiB granted", "4.00 GiB granted"),
    }
    assert report.transitions[:5] == report.regressions  # regressions come first
    pinning = next(t for t in report.regressions if t.kind == "pinning")
    assert pinning.signature["key"] == "pinned bytes dropped: cuda-pin-all"
    assert pinning.where == {"platform": CUDA, "config": "cuda-pin-all"}
    assert pinning.detail.startswith("over 2 generation(s), ")
    assert report.fixes == [] and [t for t in report.transitions if t.category == "other"] == []
    by_what = {t.what: t for t in report.regressions}
    crash = by_what["cuda-pin-routes moe-large/long-prefill: cuda-pin-all vs cuda-nopin"]
    assert crash.signature["kind"] == "cuda_error" and crash.signature_known is False
    assert by_what["fork build"].signature["kind"] == "compile_error"
    assert [(d.change, d.after_index, d.reference_piece, d.candidate_piece) for d in report.divergences] == \
        [("new", 5, " the", " a")]
    assert sorted(s.kind for s in report.signatures_new) == ["compile_error", "cuda_error", "output_mismatch"]
    assert report.signatures_known == [] and report.signatures_gone == []
    [pin] = report.pin_changes
    assert (pin.platform, pin.config, pin.generations) == (CUDA, "cuda-pin-all", 2)
    assert (pin.before_granted, pin.after_granted) == (8 * GIB, 4 * GIB)
    # base build 100 -> 130 s is beyond max(20 %, 5 s); fork build +5 s of 90 and test +4 s are noise
    assert [(t.platform, t.config, t.step, t.before_s, t.after_s) for t in report.timing_changes] == \
        [(CPU, "base", "build", 100.0, 130.0)]

    assert triage.main([str(a.dir), str(b.dir)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSIONS (5)" in out and "FIXES (0)" in out and "verdict: 5 regression(s)" in out
    assert "[pinning] pinned bytes dropped: cuda-pin-all: 8192 MiB -> 4096 MiB granted" in out


def test_same_failures_with_other_noise_are_known_and_not_regressions(runs, capsys):
    root, a, b, q, c = runs
    report = diff_runs(b.dir, c.dir)
    assert report.regressions == [] and report.fixes == []
    assert sorted(s.kind for s in report.signatures_known) == ["compile_error", "cuda_error", "output_mismatch"]
    assert report.signatures_new == []
    assert [(d.change, d.before_index, d.after_index) for d in report.divergences] == [("moved", 5, 7)]
    assert triage.main([str(b.dir), str(c.dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "clean" and data["counts"]["regressions"] == 0
    assert data["divergences"][0]["change"] == "moved"


def test_fix_is_reported_when_going_back(runs):
    root, a, b, q, c = runs
    report = diff_runs(b.dir, a.dir)
    assert report.regressions == []
    assert {(t.platform, t.what) for t in report.fixes} == {
        (CPU, "base-vs-fork gemma3-270m/story: fork vs base"), (CUDA, "cuda-pin-all generate"),
        (CUDA, "cuda-pin-routes moe-large/long-prefill: cuda-pin-all vs cuda-nopin"), (WIN, "fork build")}
    assert sorted(s.kind for s in report.signatures_gone) == ["compile_error", "cuda_error", "output_mismatch"]


def test_gone_counts_only_signatures_of_records_the_later_run_has(runs):
    """Run q ran the CPU platform only: b's CUDA crash and Windows compile error are not compared, not gone."""
    root, a, b, q, c = runs
    report = diff_runs(b.dir, q.dir)
    assert [s.kind for s in report.signatures_gone] == ["output_mismatch"]


def test_a_run_against_itself_is_clean(runs, capsys):
    root, a, b, q, c = runs
    assert triage.main([str(b.dir), str(b.dir)]) == 0
    report = diff_runs(b.dir, b.dir)
    assert report.transitions == [] and report.divergences == [] and report.pin_changes == []
    assert report.timing_changes == [] and report.signatures_new == []
    assert "verdict: no regressions" in capsys.readouterr().out


def test_run_ids_default_pair_and_unknown_run(runs, capsys):
    root, a, b, q, c = runs
    assert resolve_run(b.id, root) == b.dir.resolve()
    assert resolve_run("latest", root) == c.dir.resolve()
    # q ran only the CPU platform, so it does not cover c's platforms; b does
    assert previous_run(c.dir, root) == b.dir.resolve()
    assert previous_run(q.dir, root) == b.dir.resolve()
    assert triage.main(["--results-dir", str(root)]) == 0  # latest (c) against b: same failures
    assert f"triage {b.id} -> {c.id}" in capsys.readouterr().out
    assert triage.main([a.id, b.id, "--results-dir", str(root)]) == 1
    capsys.readouterr()
    assert cli.main(["triage", "20990101T000000Z-zzzz", "--results-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert "unknown run '20990101T000000Z-zzzz'" in err and c.id in err
    with pytest.raises(run_choice.TriageInputError, match="no fork run before"):
        previous_run(a.dir, root)


def test_blocked_steps_name_the_failed_build(tmp_path):
    root = tmp_path / "results"
    a = Run.open(root, "r1")
    a.record_step(StepRecord(CPU, "fork", "build", "passed", 10.0))
    a.record_step(StepRecord(CPU, "fork", "generate", "passed", detail="all generations ran"))
    b = Run.open(root, "r2")
    b.record_step(StepRecord(CPU, "fork", "build", "error", 0.0, "BuildError: ninja not found on PATH"))
    b.record_step(StepRecord(CPU, "fork", "generate", "error", detail="error: build fork did not pass",
                             failures=[Failure("blocked", build="fork")]))
    report = diff_runs(a.dir, b.dir)
    blocked = {t.what: t.blocked_by for t in report.regressions}
    assert blocked == {"fork build": "", "fork generate": f"{CPU} fork build"}

    # a run of record format 1 (no failure facts, no record_version) still names the blocking build
    old = json.loads((b.dir / "summary.json").read_text())
    del old["record_version"]
    for s in old["configurations"]:
        del s["failures"]
    (b.dir / "summary.json").write_text(json.dumps(old))
    assert {t.what: t.blocked_by for t in diff_runs(a.dir, b.dir).regressions} == blocked


# --------------------------------------------------------------------------- bisect


def test_bisect_main_rejects_a_bad_range(capsys):
    assert cli.main(["bisect", "--upstream", "a...b"]) == 2
    assert "expected GOOD..BAD" in capsys.readouterr().err
    assert cli.main(["bisect", "--upstream=-a..b"]) == 2
    assert "expected GOOD..BAD" in capsys.readouterr().err


def _git(repo: Path, *args: str, date: str = "2024-01-01T00:00:00+00:00") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_AUTHOR_NAME="Ada Author", GIT_AUTHOR_EMAIL="ada@example.org",
               GIT_COMMITTER_NAME="Ada Author", GIT_COMMITTER_EMAIL="ada@example.org",
               GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


CMAKELISTS = """cmake_minimum_required(VERSION 3.14)
project(tiny C)
enable_testing()
add_executable(test-sum test-sum.c)
set_target_properties(test-sum PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_test(NAME test-sum COMMAND test-sum)
set_tests_properties(test-sum PROPERTIES LABELS "main")
"""
TEST_SUM = """#include <stdio.h>
#include "sum.h"
int main(void) {
    int got = sum(2, 3);
    if (got != 5) { printf("FAIL: sum(2, 3) = %d, expected 5\\n", got); return 1; }
    printf("ok\\n");
    return 0;
}
"""
SUM_H = "/* sum of two ints */\nstatic int sum(int a, int b) { return a + b; }\n"
#: Five patches; the third breaks sum().
SERIES = [
    ("Describe the helper", "Say what the header is for.", {"sum.h": "/* helpers */\n" + SUM_H}),
    ("Add release notes", "Users asked what changed.", {"NOTES": "first notes\n"}),
    ("Count the carry in sum", "A deliberately wrong change: it adds one.",
     {"sum.h": "/* helpers */\n/* sum of two ints */\nstatic int sum(int a, int b) { return a + b + 1; }\n"}),
    ("Extend release notes", "More notes.", {"NOTES": "first notes\nsecond notes\n"}),
    ("Name the test output", "Print which test ran.", {"test-sum.c": TEST_SUM.replace('"ok', '"test-sum ok')}),
]


#: Upstream history after the base commit, on ``main``: (subject, files).  The third of these, the
#: fourth commit counting the base, breaks sum(); a merge of a side branch comes after it.
UPSTREAM = [
    ("Add release notes", {"NOTES": "first notes\n"}),
    ("Document sum", {"sum.h": "/* sum of two ints, in C */\nstatic int sum(int a, int b) { return a + b; }\n"}),
    ("Count the carry in sum",
     {"sum.h": "/* sum of two ints, in C */\nstatic int sum(int a, int b) { return a + b + 1; }\n"}),
    ("Extend release notes", {"NOTES": "first notes\nsecond notes\n"}),
]
#: The fork's one patch: a timeout for the test, in a file upstream does not touch after the base.
FORK_PATCH = ("Give the test a timeout", "A hung test must not stall CI.",
              {"CMakeLists.txt": CMAKELISTS + "set_tests_properties(test-sum PROPERTIES TIMEOUT 60)\n"})


def _commit(repo: Path, subject: str, files: dict[str, str], day: int, body: str = "") -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", subject + (f"\n\n{body}" if body else ""), date=f"2024-02-{day:02d}T00:00:00+00:00")
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    """A tiny upstream repo (six commits on main's first-parent line, the fourth breaks test-sum,
    the fifth a merge), a one-patch series that applies on every commit, and matrices naming the
    repo as a ``local`` source (``matrix.yaml``) or only as a ``git`` URL (``matrix-git.yaml``)."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.delenv("CMAKE_GENERATOR", raising=False)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    if not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("ctest") and shutil.which("cc")):
        pytest.skip("cmake, ninja, ctest and a C compiler are needed")
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    main = [_commit(repo, "tiny base", {"CMakeLists.txt": CMAKELISTS, "test-sum.c": TEST_SUM, "sum.h": SUM_H}, 1)]
    for day, (subject, files) in enumerate(UPSTREAM[:3], start=2):
        main.append(_commit(repo, subject, files, day))
    _git(repo, "checkout", "-q", "-b", "side", main[2])
    side = _commit(repo, "Side notes", {"SIDE": "from the side branch\n"}, 5)
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "Merge branch side", "side", date="2024-02-06T00:00:00+00:00")
    main.append(_git(repo, "rev-parse", "HEAD"))
    main.append(_commit(repo, *UPSTREAM[3], 7))
    _git(repo, "checkout", "-q", "-b", "fork", main[0])
    _commit(repo, FORK_PATCH[0], FORK_PATCH[2], 8, FORK_PATCH[1])
    export_series(repo, main[0], tmp_path / "patches")
    _git(repo, "checkout", "-q", "main")
    shipped = (Path(__file__).resolve().parents[1] / "matrix.yaml").read_text(encoding="utf-8")
    assert "path: ../llama.cpp" in shipped and "url: https://github.com/ggml-org/llama.cpp.git" in shipped
    (tmp_path / "matrix.yaml").write_text(shipped.replace("path: ../llama.cpp", f"path: {repo}"))
    (tmp_path / "matrix-git.yaml").write_text(
        shipped.replace("path: ../llama.cpp", f"path: {tmp_path / 'absent'}")
        .replace("url: https://github.com/ggml-org/llama.cpp.git", f"url: {repo}"))
    return tmp_path, repo, main, side


def test_upstream_commits_follow_the_first_parent_line(upstream):
    root, repo, main, side = upstream
    commits = bisect.upstream_commits(repo, main[0][:10], "main")
    assert [c.sha for c in commits] == main  # the side branch's commit is not a candidate
    assert side not in [c.sha for c in commits]
    assert [c.subject for c in commits] == ["tiny base", "Add release notes", "Document sum",
                                            "Count the carry in sum", "Merge branch side", "Extend release notes"]
    assert bisect.first_parent(repo, main[4]) == main[3] and bisect.first_parent(repo, main[0]) is None
    # from the side branch: main's commits that it does not reach, the merge among them
    assert [c.sha for c in bisect.upstream_commits(repo, side, "main")] == [side, *main[3:]]
    with pytest.raises(InputError, match="is not an ancestor"):
        bisect.upstream_commits(repo, "main", main[0])
    with pytest.raises(InputError, match="'no-such-rev' is not a commit in"):
        bisect.upstream_commits(repo, "no-such-rev", "main")


FAKE_TOKENIZE = """#!{python}
import re, sys
for arg in sys.argv[1:]:  # llama-tokenize's options the harness uses; any other is refused as the real one does
    if arg.startswith("-") and arg not in ("-m", "-f", "--ids", "--no-bos", "--no-escape"):
        sys.exit("error: invalid argument: " + arg)
text = open(sys.argv[sys.argv.index("-f") + 1], encoding="utf-8").read()
tokens = re.findall(r" ?\\S+", text)
ids = [sum(map(ord, t)) for t in tokens]
if "--ids" in sys.argv:
    print(ids)
else:
    sys.stdout.write("".join("%6d -> '%s'\\n" % (i, t) for i, t in zip(ids, tokens)))
"""


def test_a_step_not_run_in_b_is_not_compared_and_a_regression_only_when_strict(tmp_path):
    a = make_run(tmp_path, "a", regressed=False, platforms=(CPU,))
    b = Run.open(tmp_path, "b")
    for step in a.steps:
        if (step.config, step.step) != ("fork-load-none", "generate"):
            b.record_step(step)
    b.record_comparisons([c for c in a.comparisons if c.group == "base-vs-fork"])
    report = diff_runs(a.dir, b.dir)
    assert report.regressions == []
    assert f"{CPU} fork-load-none generate (passed in A; not run in B)" in report.not_compared
    assert "NOT RUN IN b (" in triage.format_report(report)
    strict = diff_runs(a.dir, b.dir, strict=True)
    regressions = {(t.kind, t.what, t.before, t.after) for t in strict.regressions}
    assert ("step", "fork-load-none generate", "passed", "absent") in regressions
    assert strict.not_compared == []


def _cmp(status: str, div: dict | None = None, kl_mean: float | None = None, prompt: str = "story") -> ComparisonRecord:
    kl = None if kl_mean is None else {"positions": 120, "mean": kl_mean, "max": kl_mean * 4, "max_at": 3,
                                       "top1_agreement": 1.0}
    return ComparisonRecord(CPU, "ub-vs-default", "gemma3-270m", prompt, "fork", "fork-ub", status, div,
                            "", kl=kl, kl_mean_max=1e-4)


def _side(id_: int, piece: str, margin: float) -> dict:
    return {"id": id_, "piece": piece, "piece_hex": piece.encode().hex(), "eog": False, "margin": margin,
            "top": [[id_, 10.0], [id_ + 1, 10.0 - margin]]}


def test_kl_rising_above_the_threshold_is_a_regression_with_identical_tokens(tmp_path, capsys):
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([_cmp("identical", kl_mean=2e-6)])
    b.record_comparisons([_cmp("identical", kl_mean=3e-3)])
    report = diff_runs(a.dir, b.dir)
    assert [(t.kind, t.before, t.after) for t in report.regressions] == [("kl", "KL mean 2e-06", "KL mean 0.003")]
    assert "kl_mean_max 0.0001" in report.regressions[0].detail
    back = diff_runs(b.dir, a.dir)
    assert back.regressions == [] and [t.kind for t in back.fixes] == ["kl"]
    assert diff_runs(a.dir, a.dir).transitions == []


def test_a_comparison_whose_tokens_diverge_and_kl_rises_is_one_regression(tmp_path):
    """Eight comparisons gave "12 regression(s)" when four of them diverged and their KL rose too: one comparison
    is one regression, its KL rise said in its detail."""
    div = {"index": 5, "reference": _side(1, " a", 0.5), "candidate": _side(2, " b", 0.5)}
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([_cmp("identical", kl_mean=2e-6, prompt=f"p{i}") for i in range(8)])
    b.record_comparisons([_cmp("diverged", div, kl_mean=3e-3, prompt=f"p{i}") for i in range(4)]
                         + [_cmp("identical", kl_mean=2e-6, prompt=f"p{i}") for i in range(4, 8)])
    report = diff_runs(a.dir, b.dir)
    assert sorted((t.kind, t.where["prompt"]) for t in report.regressions) == [("comparison", f"p{i}") for i in range(4)]
    assert all("mean KL divergence above the group's kl_mean_max" in t.detail for t in report.regressions)
    assert "verdict: 4 regression(s)" in triage.format_report(report)
    assert report.to_json()["counts"]["regressions"] == 4


def test_near_tie_and_hard_divergences_are_reported_apart_and_moves_in_tokens(tmp_path):
    near = {"index": 9, "near_tie": True, "near_tie_margin": 0.1, "reference": _side(5, " the", 0.01),
            "candidate": _side(6, " a", 0.02)}
    hard = {"index": 3, "near_tie": False, "near_tie_margin": 0.1, "reference": _side(7, " cat", 4.0),
            "candidate": _side(9, " dog", 2.5)}
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([_cmp("diverged", dict(hard, index=12), prompt="code"), _cmp("identical")])
    b.record_comparisons([_cmp("diverged", hard, prompt="code"), _cmp("diverged", near)])
    report = diff_runs(a.dir, b.dir)
    moved = [d for d in report.divergences if d.change == "moved"]
    assert [(d.prompt, d.before_index, d.after_index, d.moved_by, d.near_tie) for d in moved] == \
        [("code", 12, 3, -9, False)]
    text = triage.format_report(report)
    hard_at = text.index("HARD DIVERGENCES, NEW OR MOVED (1)")
    near_at = text.index("NEAR-TIE DIVERGENCES, NEW OR MOVED")
    assert "moved from generated token 12 to 3 (-9 tokens, margins 4 vs 2.5)" in text[hard_at:near_at]
    assert "new, at generated token 9 (' the' vs ' a', margins 0.01 vs 0.02)" in text[near_at:]


def test_a_killed_run_b_is_incomplete_never_clean_even_with_no_regression(tmp_path, capsys):
    """Triage of a run whose harness process was killed mid-way (its summary's process is dead): nothing it
    recorded got worse, and still its verdict is ``incomplete`` and the exit code 3 (EXIT_INCOMPLETE), never clean
    with 0: what it did not reach is unknown.  The same records from a run that ended are clean."""
    root = tmp_path / "results"
    a = make_run(root, "20260101T000000Z-aaaa", regressed=False, platforms=(CPU,))
    b = Run.open(root, "20260102T000000Z-bbbb")
    b.begin("build compare-outputs", ["build", "generate", "compare"], "tok")
    b.stage_started("build")
    b.record_step(StepRecord(CPU, "fork", "build", "passed", 90.0, "built in 90 s"))
    b.close()
    raw = json.loads(b.layout.summary_json.read_text())
    child = subprocess.Popen(["true"])
    child.wait()
    raw["in_progress"]["pid"] = child.pid  # what a harness killed at this point leaves: its process is gone
    b.layout.summary_json.write_text(json.dumps(raw))
    report = diff_runs(a.dir, b.dir)
    assert report.regressions == [] and report.b_killed
    assert report.to_json()["verdict"] == "incomplete"
    assert triage.main([a.id, b.id, "--results-dir", str(root)]) == 3
    assert "verdict: incomplete, not clean" in capsys.readouterr().out
    ended = make_run(root, "20260103T000000Z-cccc", regressed=False, platforms=(CPU,))
    assert diff_runs(a.dir, ended.dir).to_json()["verdict"] == "clean"
    assert triage.main([a.id, ended.id, "--results-dir", str(root)]) == 0


# --------------------------------------------------------------------------- each change's category and its place


def test_each_change_is_a_regression_a_fix_or_neither_and_regressions_come_first_then_fixes(tmp_path):
    """A status that became a failure is a regression, a failure that became a success is a fix; any other change
    (a failure of another kind, a step skipped, a record only B has) is neither.  Regressions are listed first,
    then fixes, then the rest; within each, by platform, a step before a comparison, then by name."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    steps = {(CPU, "fork", "build"): ("failed", "passed"), (CPU, "fork", "test"): ("passed", "failed"),
             (WIN, "fork", "test"): ("passed", "skipped"), (WIN, "fork", "build"): ("failed", "error"),
             (CPU, "base", "build"): (None, "passed"), (CPU, "base", "test"): (None, "interrupted")}
    for (platform, config, step), (before, after) in steps.items():
        if before:
            a.record_step(StepRecord(platform, config, step, before))
        b.record_step(StepRecord(platform, config, step, after))
    a.record_comparisons([ComparisonRecord(CPU, "a", "m", "p", "base", "fork", "identical"),
                          ComparisonRecord(CPU, "a", "m", "q", "base", "fork", "identical")])
    b.record_comparisons([ComparisonRecord(CPU, "a", "m", "p", "base", "fork", "diverged")])
    report = diff_runs(a.dir, b.dir)
    assert [(t.category, t.platform, t.kind, t.what, t.before, t.after) for t in report.transitions] == [
        ("regression", CPU, "step", "fork test", "passed", "failed"),
        ("regression", CPU, "comparison", "a m/p: fork vs base", "identical", "diverged"),  # after the step
        ("fix", CPU, "step", "fork build", "failed", "passed"),
        ("other", CPU, "step", "base build", "absent", "passed"),
        ("other", WIN, "step", "fork build", "failed", "error"),
        ("other", WIN, "step", "fork test", "passed", "skipped")]
    # what A has and B did not run is not compared; B's interrupted step that A never had is not listed
    assert report.not_compared == [f"{CPU} a m/q: fork vs base (identical in A; not run in B)"]
    data = report.to_json()
    assert data["verdict"] == "regressed"
    assert data["counts"] == {"regressions": 2, "fixes": 1, "other_changes": 3, "speed_suspects": 0}


def test_a_diverged_comparison_s_regression_carries_its_output_mismatch_signature(runs):
    root, a, b, q, c = runs
    by_what = {t.what: t for t in diff_runs(a.dir, b.dir).regressions}
    diverged = by_what["base-vs-fork gemma3-270m/story: fork vs base"]
    assert diverged.signature["kind"] == "output_mismatch" and diverged.signature_known is False
    assert diverged.where == {"platform": CPU, "group": "base-vs-fork", "model": "gemma3-270m", "prompt": "story",
                              "reference": "base", "candidate": "fork"}
    assert diverged.detail == "diverged at token 5" and diverged.cached == ""  # run B's detail; not from a cache
    back = {t.what: t for t in diff_runs(b.dir, a.dir).fixes}["base-vs-fork gemma3-270m/story: fork vs base"]
    assert back.signature["kind"] == "output_mismatch"  # a fix names the failure that went away
    assert back.signature_known is None and back.detail == "identical"


def _failed_build(run: Run, config: str, error: str) -> None:
    """A CPU build of ``config`` that failed with compiler ``error`` in its log (what a build step leaves)."""
    logs = run.platform_dir(CPU) / f"build-{config}"
    logs.mkdir(parents=True)
    (logs / "configure.rc").write_text("0\n")
    (logs / "build.log").write_text(f"$ cmake --build /w/build --target all\n{error}\n")
    (logs / "build.rc").write_text("1\n")
    run.record_step(StepRecord(CPU, config, "build", "failed"))


def test_a_step_failing_in_both_runs_with_another_signature_is_a_change_of_neither_kind_naming_both(tmp_path):
    """Still failing, but another way: no regression and no fix, the earlier signature in the detail, the later
    one as the transition's signature, known when run A had it anywhere."""
    foo = "/w/src/llama-model.cpp:88:5: error: 'foo' was not declared in this scope"
    bar = "/w/src/llama.cpp:12:3: error: 'bar' was not declared in this scope"
    baz = "/w/src/llama.cpp:14:3: error: 'baz' was not declared in this scope"
    a, b, c = Run.open(tmp_path, "a"), Run.open(tmp_path, "b"), Run.open(tmp_path, "c")
    for run, fork_error in ((a, foo), (b, bar), (c, baz)):
        _failed_build(run, "fork", fork_error)
        _failed_build(run, "base", bar)  # the same failure in every run: no change
    sig_a, sig_b = (classify_step(r.dir, r.step(CPU, "fork", "build")) for r in (a, b))
    (t,) = diff_runs(a.dir, b.dir).transitions
    assert (t.category, t.kind, t.platform, t.what, t.before, t.after) == \
        ("other", "step", CPU, "fork build", "failed", "failed")
    assert t.where == {"platform": CPU, "config": "fork", "step": "build"}
    assert t.detail == f"signature changed from {sig_a.summary}"
    assert t.signature == {"kind": sig_b.kind, "key": sig_b.key, "summary": sig_b.summary}
    assert t.signature_known is True  # a's base build failed with it
    (new,) = diff_runs(a.dir, c.dir).transitions
    assert new.signature["key"].endswith("'baz' was not declared in this scope") and new.signature_known is False


def test_a_step_s_regression_carries_the_later_failure_and_a_fix_the_earlier_one(tmp_path):
    """A regression's signature is run B's failure, known when run A failed that way anywhere; a fix's is run A's
    failure (the one that went away), never called known.  Each names its record, B's detail (A's where B has
    none) and the run whose result the cache supplied."""
    foo = "/w/src/llama-model.cpp:88:5: error: 'foo' was not declared in this scope"
    bar = "/w/src/llama.cpp:12:3: error: 'bar' was not declared in this scope"
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    _failed_build(a, "fork", foo)
    b.record_step(StepRecord(CPU, "fork", "build", "passed", detail="built in 90 s", cached="r0"))
    a.record_step(StepRecord(CPU, "base", "build", "passed"))
    _failed_build(b, "base", foo)
    a.record_step(StepRecord(CPU, "upstream", "build", "passed"))
    _failed_build(b, "upstream", bar)
    b.record_step(StepRecord(CPU, "fork", "test", "passed", detail="5 passed"))  # only in B
    sig_foo = classify_step(a.dir, a.step(CPU, "fork", "build"))
    sig_bar = classify_step(b.dir, b.step(CPU, "upstream", "build"))
    by_what = {t.what: t for t in diff_runs(a.dir, b.dir).transitions}
    fix = by_what["fork build"]
    assert fix.category == "fix" and fix.signature == {"kind": sig_foo.kind, "key": sig_foo.key,
                                                       "summary": sig_foo.summary}
    assert fix.signature_known is None and fix.detail == "built in 90 s" and fix.cached == "cached: r0"
    assert fix.where == {"platform": CPU, "config": "fork", "step": "build"}
    known = by_what["base build"]
    assert (known.category, known.signature["key"], known.signature_known) == ("regression", sig_foo.key, True)
    new = by_what["upstream build"]
    assert (new.category, new.signature["key"], new.signature_known) == ("regression", sig_bar.key, False)
    assert new.cached == "" and by_what["fork test"].detail == "5 passed"


def test_kl_is_judged_per_comparison_and_a_mean_at_the_limit_is_not_above_it(tmp_path):
    """Each comparison with a KL limit and a mean in run B is judged on its own (one without either, or one that
    stayed on its side of the limit, stops none of the others); a mean equal to ``kl_mean_max`` is not above it."""
    limit = 1e-4
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([_cmp("identical", kl_mean=2e-6, prompt="a-no-kl"), _cmp("identical", kl_mean=2e-6, prompt="b-stays"),
                          _cmp("identical", kl_mean=2e-6, prompt="c-rises"), _cmp("identical", kl_mean=2e-6, prompt="d-to-limit"),
                          _cmp("identical", kl_mean=limit, prompt="e-from-limit"),
                          _cmp("identical", kl_mean=None, prompt="f-first-kl")])
    b.record_comparisons([_cmp("identical", kl_mean=None, prompt="a-no-kl"), _cmp("identical", kl_mean=3e-6, prompt="b-stays"),
                          _cmp("identical", kl_mean=3e-3, prompt="c-rises"), _cmp("identical", kl_mean=limit, prompt="d-to-limit"),
                          _cmp("identical", kl_mean=3e-3, prompt="e-from-limit"),
                          _cmp("identical", kl_mean=3e-3, prompt="f-first-kl")])
    regressions = diff_runs(a.dir, b.dir).regressions
    assert [(t.kind, t.where["prompt"], t.before) for t in regressions] == [
        ("kl", "c-rises", "KL mean 2e-06"), ("kl", "e-from-limit", "KL mean 0.0001"), ("kl", "f-first-kl", "absent")]
    rise = regressions[0]
    assert (rise.platform, rise.what, rise.after) == (CPU, "ub-vs-default gemma3-270m/c-rises: fork-ub vs fork",
                                                      "KL mean 0.003")
    assert rise.where == {"group": "ub-vs-default", "model": "gemma3-270m", "prompt": "c-rises",
                          "reference": "fork", "candidate": "fork-ub"}
    assert rise.detail.startswith("mean KL divergence above the group's kl_mean_max 0.0001 nats")
    fall = next(t for t in diff_runs(b.dir, a.dir).fixes if t.where["prompt"] == "c-rises")
    assert fall.detail.startswith("mean KL divergence back below the group's kl_mean_max")


def test_moved_model_buffers_are_a_regression_and_a_fix_only_where_the_expectations_went_back_to_passing(tmp_path):
    """Model buffers of a load both runs have that moved are a regression with their ``placement`` signature;
    the same move is a fix instead where the configuration's expectations step went from failed to passed.  The
    placement records are the clean H200 run's (results/evidence): cuda-pin-all's (CUDA_Host) and cuda-nopin's
    (CPU), each as cuda-pin-all's engine load."""
    clean = Path(__file__).resolve().parents[1] / "results/evidence/gpu1-20261202T142857Z/linux-x86_64-cuda"

    def run(name: str, placement_of: str, expectations: str) -> Run:
        r = Run.open(tmp_path, name)
        dest = r.layout.gen_dir(CUDA, "cuda-pin-all", "moe-large")
        dest.mkdir(parents=True)
        shutil.copy(clean / placement_of / "gen/moe-large/engine.placement.json", dest / "engine.placement.json")
        r.record_step(StepRecord(CUDA, "cuda-pin-all", "expectations", expectations))
        return r

    def moves(a: Run, b: Run) -> list:
        return [t for t in diff_runs(a.dir, b.dir).transitions if t.kind == "placement"]

    pinned, unpinned = run("a", "cuda-pin-all", "passed"), run("b", "cuda-nopin", "failed")
    (moved,) = moves(pinned, unpinned)
    assert (moved.category, moved.platform, moved.what) == ("regression", CUDA, "cuda-pin-all moe-large: placement")
    assert moved.where == {"platform": CUDA, "config": "cuda-pin-all", "model": "moe-large", "load": "engine"}
    assert moved.detail == "model buffers of load engine changed" and moved.signature["kind"] == "placement"
    (back,) = moves(unpinned, pinned)
    assert back.category == "fix" and back.signature is None
    still_failing = run("c", "cuda-pin-all", "failed")  # moved back, and its expectations still fail
    assert [t.category for t in moves(unpinned, still_failing)] == ["regression"]


def test_a_step_s_time_is_reported_only_past_its_noise_between_two_passed_runs_that_did_the_work(tmp_path):
    """A build or test step's time is reported when it changed by more than max(20 % of the earlier time, 5 s),
    both runs passed it, neither took it from the result cache or found the build up to date, and the stage
    times its work (a generate step's time is its generations', not a measure of the step)."""
    assert (triage.time_threshold(100.0), triage.time_threshold(25.0), triage.time_threshold(10.0)) == (20.0, 5.0, 5.0)
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    b.record_step(StepRecord(CPU, "a-only-in-b", "build", "passed", 300.0))  # B's records, each left out, first
    a.record_step(StepRecord(CPU, "a-failed", "build", "passed", 100.0))
    b.record_step(StepRecord(CPU, "a-failed", "build", "failed", 10.0))  # a failed step stops early
    steps = {("a-cached", "build"): (100.0, 10.0, {"cached": "r0"}),
             ("a-same", "build"): (100.0, 1.0, {"up_to_date": True}), ("a-fork", "generate"): (100.0, 300.0, {}),
             ("base", "build"): (101.7, 125.0, {}), ("fork", "build"): (100.0, 120.0, {}),  # past / at the noise
             ("fork", "test"): (10.0, 4.0, {}),  # 6 s faster: past the 5 s floor
             ("upstream", "test"): (10.0, 6.0, {}),  # 4 s: within the floor
             ("zero", "build"): (0.0, 10.0, {}), ("zero", "test"): (10.0, 0.0, {})}
    for (config, step), (before, after, how) in steps.items():
        a.record_step(StepRecord(CPU, config, step, "passed", before))
        b.record_step(StepRecord(CPU, config, step, "passed", after, **how))
    report = diff_runs(a.dir, b.dir)
    assert [(t.config, t.step, t.before_s, t.after_s, t.threshold_s) for t in report.timing_changes] == [
        ("base", "build", 101.7, 125.0, 20.3), ("fork", "test", 10.0, 4.0, 5.0), ("zero", "build", 0.0, 10.0, 5.0),
        ("zero", "test", 10.0, 0.0, 5.0)]  # the threshold in tenths of a second
    assert all(t.platform == CPU for t in report.timing_changes)


def test_a_comparison_that_crashed_on_the_reference_side_carries_the_reference_generation_s_signature(tmp_path):
    """A crashed or timed-out comparison's signature is its failed generate step's: the candidate's when it failed,
    else the reference's (here upstream's build crashed and the fork's ran)."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "identical")])
    b.record_step(StepRecord(CPU, "fork", "generate", "passed", detail="all generations ran"))
    error_line = "ggml/src/ggml.c:1: GGML_ASSERT(n_tokens > 0) failed"
    b.record_step(StepRecord(CPU, "base", "generate", "failed", detail=f"m/p: crashed SIGABRT {error_line}",
                             failures=[Failure("generation", model="m", prompt="p", repeat=1, status="crashed",
                                               signal="SIGABRT", error_line=error_line)]))
    b.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "crashed")])
    expected = classify_step(b.dir, b.step(CPU, "base", "generate"))
    (crash,) = [t for t in diff_runs(a.dir, b.dir).regressions if t.kind == "comparison"]
    assert crash.signature == {"kind": expected.kind, "key": expected.key, "summary": expected.summary}


def test_each_new_signature_names_where_it_was_seen(runs):
    """A signature of run B not in run A is listed once, with its key and every place B saw it: platform,
    configuration and step, and for a comparison its group, model and prompt."""
    root, a, b, q, c = runs
    new = diff_runs(a.dir, b.dir).signatures_new
    assert all(isinstance(s.summary, str) and s.summary for s in new)  # each says what it is in a line
    seen = {s.kind: (s.key, s.where) for s in new}
    assert seen == {
        "compile_error": ('ggml/src/ggml-cuda/ggml-cuda.cu: error: identifier "cudaHostRegisterReadOnlyFlag" is '
                          'undefined', [f"{WIN} fork build"]),
        "cuda_error": ("an illegal memory access was encountered at cudaFuncSetAttribute",
                       [f"{CUDA} cuda-pin-all generate"]),
        "output_mismatch": ("base-vs-fork/gemma3-270m/story: fork vs base",
                            [f"{CPU} fork compare base-vs-fork/gemma3-270m/story"])}


def test_the_report_names_both_runs_their_platforms_and_whether_b_is_a_itself(tmp_path):
    """The report holds both run directories, every platform either run covered, the strictness it was judged
    with, and whether B is A itself; a directory without a summary is refused naming what is missing."""
    a = make_run(tmp_path, "a", regressed=False, platforms=(CPU,))
    b = make_run(tmp_path, "b", regressed=False, platforms=(CUDA,))
    report = diff_runs(a.dir, b.dir, strict=True)
    assert (report.a_dir, report.b_dir, report.platforms) == (str(a.dir), str(b.dir), [CPU, CUDA])
    assert report.strict is True and report.same_run is False and report.b_incomplete == []
    assert diff_runs(a.dir, a.dir).same_run is True and diff_runs(a.dir, a.dir).strict is False
    (tmp_path / "empty").mkdir()
    with pytest.raises(run_choice.TriageInputError, match="summary.json"):
        diff_runs(a.dir, tmp_path / "empty")


# --------------------------------------------------------------------------- several failures, several configurations


def _crashed_generations(run: Run, config: str, stderr_of: dict[str, str]) -> None:
    """A CPU generate step of ``config`` that failed: each generation ``prompt -> stderr`` crashed (SIGABRT), one
    failure each, in that order (classify_run keeps the first's signature and the others beside it)."""
    for prompt, stderr in stderr_of.items():
        write_gen(run, CPU, config, "m", prompt, stderr=stderr)
    run.record_step(StepRecord(CPU, config, "generate", "failed", detail=f"{len(stderr_of)} generation(s) crashed",
                               failures=[Failure("generation", model="m", prompt=p, repeat=1, status="crashed",
                                                 signal="SIGABRT") for p in stderr_of]))


def test_every_failure_of_a_step_that_failed_several_ways_counts_for_new_known_and_gone_signatures(tmp_path):
    """A step that failed several ways (two generations crashed, each its own way) has one signature and the
    others beside it; triage counts every one of them: a failure run A had only among a step's others is known to
    B's regression and among the known signatures, a failure B has only among its others is new, and one gone
    from A's step that B passed is gone."""
    tokens = "llama_model_loader: loaded\nggml/src/ggml.c:1: GGML_ASSERT(n_tokens > 0) failed\n"
    experts = "llama_model_loader: loaded\nsrc/llama-model.cpp:7: GGML_ASSERT(n_expert_used > 0) failed\n"
    tokens_key = "llama-completion: GGML_ASSERT(n_tokens > 0) failed in ggml/src/ggml.c"
    experts_key = "llama-completion: GGML_ASSERT(n_expert_used > 0) failed in src/llama-model.cpp"
    cuda = cuda_crash_stderr(0, "0x00007f3a2b1c4d5e", 2741, "ggml_backend_cuda_synchronize", "/work/.harness/fork")
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    _crashed_generations(a, "fork", {"p1": cuda, "p2": tokens})  # the failed assertion only among the others
    a.record_step(StepRecord(CPU, "base", "generate", "passed"))
    b.record_step(StepRecord(CPU, "fork", "generate", "passed"))
    _crashed_generations(b, "base", {"p1": tokens, "p2": experts})  # a new assertion only among the others
    sig_a, sig_b = (classify_run(r.dir, write=False) for r in (a, b))
    assert [s["kind"] for s in (sig_a[0]["signature"], *sig_a[0]["other_signatures"])] == \
        ["cuda_error", "test_assertion"]
    assert [s["key"] for s in (sig_b[0]["signature"], *sig_b[0]["other_signatures"])] == [tokens_key, experts_key]
    report = diff_runs(a.dir, b.dir)
    (regression,) = report.regressions
    assert (regression.what, regression.signature["key"], regression.signature_known) == \
        ("base generate", tokens_key, True)
    assert [(s.key, s.where) for s in report.signatures_known] == [(tokens_key, [f"{CPU} base generate"])]
    assert [(s.key, s.where) for s in report.signatures_new] == [(experts_key, [f"{CPU} base generate"])]
    assert [(s.kind, s.where) for s in report.signatures_gone] == [("cuda_error", [f"{CPU} fork generate"])]


_HOLD_LOCK = ("import sys, time\nfrom pathlib import Path\nfrom harness.common.locks import RunLock\n"
              "RunLock(Path(sys.argv[1])).acquire()\nprint('held', flush=True)\ntime.sleep(60)\n")


def test_a_run_b_another_live_process_holds_is_still_running_first_among_its_incomplete_reasons(tmp_path):
    """While another live process holds run B's lock (a harness still writing it), B's first incomplete reason is
    ``still running (pid N)`` with that process's pid, before the reasons B's records give; once that process
    has died, the lock file it left says nothing and only B's own reasons remain."""
    a = make_run(tmp_path, "a", regressed=False, platforms=(CPU,))
    b = Run.open(tmp_path, "b")
    b.record_step(StepRecord(CPU, "fork", "build", "interrupted"))
    b.close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(b.dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        report = diff_runs(a.dir, b.dir)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert report.b_incomplete == [f"still running (pid {holder.pid})", f"{CPU}: build fork: interrupted"]
    assert diff_runs(a.dir, b.dir).b_incomplete == [f"{CPU}: build fork: interrupted"]


def test_a_test_of_upstream_s_suite_that_became_regressed_is_a_regression_of_the_triage(tmp_path):
    """triage lists each test of upstream's suite whose pair of outcomes changed class among its transitions: one
    that now passes on base and fails on the fork is a regression (with the fork's message), one that now fails
    on both is neither a regression nor a fix."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    both = [TestPair("test-a", "passed", "passed", PASSED_BOTH), TestPair("test-b", "passed", "passed", PASSED_BOTH)]
    after = [TestPair("test-a", "passed", "failed", REGRESSED, fork_message="exit 3"),
             TestPair("test-b", "failed", "failed", FAILED_BOTH, "exit 1", "exit 1")]
    for run, pairs in ((a, both), (b, after)):
        run.record_step(StepRecord(CPU, "fork", RunLayout.UPSTREAM_STEP, "passed"))
        write_json(run.layout.upstream_file(CPU, "pairs"), SuiteRecord("main", pairs))
    report = diff_runs(a.dir, b.dir)
    assert [(t.category, t.kind, t.platform, t.what, t.before, t.after, t.where, t.detail)
            for t in report.transitions] == [
        ("regression", "upstream-test", CPU, "upstream test test-a", PASSED_BOTH, REGRESSED,
         {"platform": CPU, "test": "test-a"}, "exit 3"),
        ("other", "upstream-test", CPU, "upstream test test-b", PASSED_BOTH, FAILED_BOTH,
         {"platform": CPU, "test": "test-b"}, "exit 1")]
    assert report.to_json()["verdict"] == "regressed"


def test_pinned_bytes_are_judged_per_configuration_over_the_generations_both_runs_have(tmp_path):
    """Each configuration's pinned bytes are summed over the generations both runs have (one only A or only B
    ran is left out; a configuration with none in common is not compared), and every configuration is judged:
    more granted bytes is a change and no regression, fewer is a regression whose signature names the
    configuration, the bytes and the platform."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    granted = {  # configuration -> {generation: (A's granted, B's granted)}; None: that run has no such generation
        "cuda-pin-attn": {"story": (4 * GIB, None), "code": (None, GIB)},  # no generation in common
        "cuda-pin-experts": {"story": (2 * GIB, 4 * GIB)},  # more granted
        "cuda-pin-layers": {"story": (4 * GIB, 2 * GIB), "long": (4 * GIB, 2 * GIB), "code": (GIB, None)}}
    for config, generations in granted.items():
        for prompt, sides in generations.items():
            for run, g in zip((a, b), sides):
                if g is not None:
                    write_gen(run, CUDA, config, "moe-large", prompt, pin=ladder([g]))
        for run in (a, b):
            run.record_step(StepRecord(CUDA, config, "generate", "passed"))
    report = diff_runs(a.dir, b.dir)
    assert report.pin_changes == [
        triage.PinChange(CUDA, "cuda-pin-experts", 1, 4 * GIB, 4 * GIB, 2 * GIB, 4 * GIB, 1, 1),
        triage.PinChange(CUDA, "cuda-pin-layers", 2, 8 * GIB, 8 * GIB, 8 * GIB, 4 * GIB, 2, 2)]
    (drop,) = report.regressions
    assert (drop.kind, drop.what, drop.before, drop.after) == \
        ("pinning", "cuda-pin-layers: pinned bytes", "8.00 GiB granted", "4.00 GiB granted")
    assert drop.signature == {"kind": "pinning", "key": "pinned bytes dropped: cuda-pin-layers",
                              "summary": "pinned bytes dropped: cuda-pin-layers: 8192 MiB -> 4096 MiB granted of "
                                         f"8192 MiB requested ({CUDA})"}


def test_a_comparison_whose_verdict_turned_to_fails_is_a_regression_though_its_status_is_the_same(tmp_path, capsys):
    """A run is judged by each row's verdict, not its bare status: a divergence its group expected (passes) that the
    next run's group no longer expects (fails) is a regression, and the reverse a fix; both name the verdicts.  A
    divergence passing in both runs is no change."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "diverged", expected="diverged"),
                          ComparisonRecord(CPU, "g", "m", "q", "base", "fork", "diverged"),
                          ComparisonRecord(CPU, "g", "m", "r", "base", "fork", "diverged", expected="diverged")])
    b.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "diverged"),
                          ComparisonRecord(CPU, "g", "m", "q", "base", "fork", "diverged", expected="diverged"),
                          ComparisonRecord(CPU, "g", "m", "r", "base", "fork", "diverged", expected="diverged")])
    report = diff_runs(a.dir, b.dir)
    assert [(t.category, t.what, t.before, t.after) for t in report.transitions] == [
        ("regression", "g m/p: fork vs base", "diverged (passes)",
         "diverged (fails: diverged; the group expects identical)"),
        ("fix", "g m/q: fork vs base", "diverged (fails: diverged; the group expects identical)",
         "diverged (passes)")]
    assert report.to_json()["verdict"] == "regressed"
    assert cli.main(["triage", str(a.dir), str(b.dir)]) == 1
    assert "REGRESSIONS (1)" in capsys.readouterr().out


def test_the_report_states_b_s_own_verdict_and_lists_the_regressions_before_what_b_did_not_run(tmp_path):
    """A run B that failed says so at the top even with no regression against A (what failed there failed in A
    too); the regressions come before the records of A that a narrower B did not run."""
    a, b = Run.open(tmp_path, "a"), Run.open(tmp_path, "b")
    a.record_step(StepRecord(CPU, "fork", "build", "failed"))
    a.record_step(StepRecord(WIN, "fork", "build", "passed"))
    a.record_step(StepRecord(CPU, "fork", "test", "passed"))
    b.record_step(StepRecord(CPU, "fork", "build", "failed"))
    b.record_step(StepRecord(CPU, "fork", "test", "failed"))
    a.write_summary()
    b.write_summary()
    report = diff_runs(a.dir, b.dir)
    assert report.b_overall == "failed"
    text = triage.format_report(report).splitlines()
    assert text[1] == "run b itself: failed"
    assert text.index("REGRESSIONS (1)") < next(i for i, line in enumerate(text) if line.startswith("NOT RUN IN b (1)"))
