"""End to end on the real llama.cpp: base source, patch series, CPU build, native tests, comparisons.

Builds upstream at the pinned commit and the patched fork for linux-x86_64-cpu
(about 10 minutes on 2 cores the first time; ccache and the build key make
reruns fast), runs the native tests and every CPU comparison group on both
models, and checks the results a user would read.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.network,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")]


def harness(*args: str, results: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run([sys.executable, "-m", "harness", *args, "--results-dir", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    # --no-cache: this test checks what generating and testing produce (docs/cache.md; the cache has its own tests)
    proc = harness("build", "test", "compare-outputs", "--no-cache", results=results)
    (results / "harness-output.txt").write_text(proc.stdout + proc.stderr)
    return proc, results


def summary(results: Path) -> dict:
    return json.loads((results / "latest" / "summary.json").read_text())


def test_main_job_passes_and_every_cpu_comparison_is_identical(main_job):
    proc, results = main_job
    data = summary(results)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert data["overall"] == "passed"
    cmps = [c for c in data["comparisons"] if c["platform"] == "linux-x86_64-cpu" and c["group"] != "numerics-control"]
    groups = {(c["group"], c["model"]) for c in cmps}
    # the quantized MoE (moe-small-quant, derived with llama-quantize) runs the CPU's quantized expert kernels in
    # base-vs-fork only: mmap or not is a question of the loader, asked of the F16 models
    assert groups == {(g, m) for g in ("base-vs-fork", "mmap-vs-load-mode-none") for m in ("gemma3-270m", "moe-small")} \
        | {("base-vs-fork", "moe-small-quant")}
    assert len(cmps) == 5 * 4
    assert all(c["status"] == "identical" for c in cmps), [c for c in cmps if c["status"] != "identical"]
    for c in cmps:  # identical numerics: no divergence, KL exactly 0, full top-1 agreement, same bytes
        assert c["first_divergence"] is None
        assert c["kl"]["positions"] > 0 and c["kl"]["max"] == 0.0 and c["kl"]["top1_agreement"] == 1.0
        assert c["text_check"]["status"] in ("identical", "incomplete")


def test_numerics_control_diverges_with_margins_and_the_near_tie_rule(main_job):
    _, results = main_job
    data = summary(results)
    ctl = [c for c in data["comparisons"] if c["group"] == "numerics-control"]
    assert {c["candidate"] for c in ctl} == {"fork-ub-1", "fork-fa-off"}
    for c in ctl:
        assert c["status"] == "diverged" and c["expected"] == "diverged", c["detail"]
        d = c["first_divergence"]
        assert d is not None and isinstance(d["index"], int), c["detail"]
        ref, cand = d["reference"], d["candidate"]
        assert isinstance(ref["margin"], float) and isinstance(cand["margin"], float)
        assert ref["margin"] == ref["top"][0][1] - ref["top"][1][1]
        assert d["near_tie"] == (ref["margin"] < d["near_tie_margin"] and cand["id"] == ref["top"][1][0])
        assert c["kl"]["mean"] > 0  # the candidate's numerics differ on the reference's tokens


def test_platforms_this_machine_cannot_run_are_skipped_with_a_reason(main_job):
    _, results = main_job
    data = summary(results)
    skipped = data["skipped_platforms"]
    assert "nvidia" in skipped["linux-x86_64-cuda"].lower() or "nvcc" in skipped["linux-x86_64-cuda"]
    assert "windows" in skipped["windows-x86_64-cuda"]
    for step in data["configurations"]:
        if step["platform"] in skipped and step["step"] != "compile":
            assert step["status"] == "skipped"


def test_the_cuda_platform_is_compiled_where_it_cannot_run(main_job):
    _, results = main_job
    data = summary(results)
    if "linux-x86_64-cuda" not in data["skipped_platforms"]:
        pytest.skip("this machine has an NVIDIA GPU: the CUDA platform is built and run, not only compiled")
    steps = {(s["config"], s["step"]): s for s in data["configurations"] if s["platform"] == "linux-x86_64-cuda"}
    for variant in ("fork", "base"):
        assert steps[(variant, "compile")]["status"] == "passed", steps[(variant, "compile")]
    record = json.loads((results / "latest" / "linux-x86_64-cuda" / "compile-fork" / "compile.json").read_text())
    assert "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o" in record["units"]
    assert "tests/CMakeFiles/test-cuda-pin-ladder.dir/test-cuda-pin-ladder.cpp.o" in record["units"]
    assert "test-cuda-pin-ladder" in record["linked"] and not record["not_linked"]
    for stage in ("test", "compare-outputs"):
        assert steps[("-", stage)]["status"] == "skipped" and "GPU" in steps[("-", stage)]["detail"]


def test_windows_cpu_was_built_tested_and_compared_under_wine(main_job):
    from harness.matrix.config import load_matrix
    from harness.matrix.platforms import cannot_run
    _, results = main_job
    data = summary(results)
    why = cannot_run(load_matrix(ROOT / "matrix.yaml").platforms["windows-x86_64-cpu"])
    if why:
        assert data["skipped_platforms"]["windows-x86_64-cpu"] == why
        pytest.skip(why)
    steps = {(s["config"], s["step"]): s["status"] for s in data["configurations"]
             if s["platform"] == "windows-x86_64-cpu"}
    assert steps[("fork", "build")] == "passed" and steps[("base", "build")] == "passed"
    assert steps[("fork", "test")] == "passed"
    tests = json.loads((results / "latest" / "windows-x86_64-cpu" / "tests" / "tests.json").read_text())
    by_name = {c["name"]: c["status"] for c in tests["cases"]}
    assert by_name["test-cuda-pin-ladder-host"] == "passed"  # the ladder's VirtualAlloc branch, under Wine
    cmps = [c for c in data["comparisons"] if c["platform"] == "windows-x86_64-cpu"]
    assert {(c["group"], c["model"]) for c in cmps} == {(g, m) for g in ("base-vs-fork", "cross-os")
                                                        for m in ("gemma3-270m", "moe-small", "moe-small-quant")}
    assert len(cmps) == 2 * 3 * 4
    assert all(c["status"] in ("identical", "diverged") for c in cmps), [c for c in cmps
                                                                         if c["status"] not in ("identical", "diverged")]
    assert {c["reference"] for c in cmps if c["group"] == "cross-os"} == {"fork@linux-x86_64-cpu"}
    # the MinGW build changes nothing between base and fork, as on Linux
    assert all(c["status"] == "identical" for c in cmps if c["group"] == "base-vs-fork")


def test_native_tests_ran_through_ctest_with_junit(main_job):
    _, results = main_job
    run = results / "latest" / "linux-x86_64-cpu"
    junit = (run / "tests" / "junit.xml").read_text()
    assert 'name="test-moe-pin-layers"' in junit
    tests = json.loads((run / "tests" / "tests.json").read_text())
    by_name = {c["name"]: c["status"] for c in tests["cases"]}
    assert by_name["test-moe-pin-layers"] == "passed"
    assert tests["status"] == "passed"


def test_results_hold_logs_environment_and_per_config_outputs(main_job):
    _, results = main_job
    run = results / "latest" / "linux-x86_64-cpu"
    env = json.loads((run / "environment.json").read_text())
    assert env["base_commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert env["patches"] and all(len(p["sha256"]) == 64 for p in env["patches"])
    for variant in ("base", "fork"):
        assert (run / f"build-{variant}" / "build.log").exists()
    gen = run / "fork-load-none" / "gen" / "gemma3-270m"
    stdout = (gen / "umlaut-newline.r2.stdout").read_bytes()  # the last repeat is llama-completion's
    assert stdout.strip(), "the generation produced no text"
    tokens = json.loads((gen / "umlaut-newline.r1.tokens.json").read_text())  # the engine's repeat
    assert tokens["tokens"] and all("margin" in t for t in tokens["tokens"])
    assert (gen / "engine.stderr").exists()
    timing = json.loads((run / "compare-timing.json").read_text())
    # one engine load per (configuration, model): base and fork on the three models, fork-load-none on the two F16
    # ones, the two controls on gemma
    assert timing["sessions"] == 2 * 3 + 2 + 2 and timing["pure_generation"] > 0
    compare = json.loads((run / "fork" / "compare.json").read_text())
    assert {c["group"] for c in compare} == {"base-vs-fork"}
    assert (results / "latest" / "summary.md").read_text().count("identical") >= 16


def test_fork_binary_names_the_applied_series(main_job):
    _, results = main_job
    build_json = json.loads((ROOT / ".harness" / "fork" / "build-linux-x86_64-cpu" / "harness-build.json").read_text())
    series = build_json["options"]["LLAMA_FORK_SERIES"]
    exe = ROOT / ".harness" / "fork" / "build-linux-x86_64-cpu" / "bin" / "llama-completion"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert f"fork series: {series}" in out.stdout + out.stderr


def test_second_build_with_nothing_changed_does_not_rebuild(main_job, tmp_path):
    proc = harness("build", "--platform", "linux-x86_64-cpu", results=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [s for s in summary(tmp_path)["configurations"] if s["step"] == "build"]
    assert {s["config"] for s in steps} == {"base", "fork"}
    assert all(s["detail"].startswith("up to date") for s in steps), steps


def test_a_prompt_too_long_for_the_context_is_refused_with_its_exact_tokens_before_any_generation(main_job, tmp_path):
    # 88 tokens of long-prefill (the engine's own count) + 937 pass 1024; its bounds, 9 and 401, leave it open
    proc = harness("compare-outputs", "--platform", "linux-x86_64-cpu", "--group", "mmap-vs-load-mode-none",
                   "--model", "moe-small", "--n-predict", "937", results=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "error: --n-predict 937 does not fit ctx_size 1024 with prompt long-prefill (88 tokens of moe-small): "
        "at most 936 tokens can be generated after it")
    assert not summary(tmp_path)["comparisons"]
