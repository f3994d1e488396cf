"""compute-sanitizer over real generation (harness.stages.outputs.sanitized_generation) on this machine's side.

No GPU here: the generations under compute-sanitizer run on an H200 (docs/checks.md gives the
command).  What is tested here: which configurations and generations are chosen from the real
matrix, the command line, how a run is judged from the sanitizer's log, how the first report's
kernel and host frame are read, and how a crash's signature takes the first error of its run
once more under memcheck.  The logs below are written in compute-sanitizer's report layout (a
header line, indented details, the saved host backtrace, the summary); the kernel is the one
tests/plants/cuda-pinned-upload-writes-past-its-buffer.patch adds.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.triage.signatures import classify_step
from harness.matrix.config import load_matrix
from harness.record.gpu import first_sanitizer_error
from harness.record.layout import RunLayout
from harness.record.records import Failure, StepRecord
from harness.matrix.loading import pin_configuration
from harness.matrix.selection import Selection
from harness.stages.outputs.compare import GenerationResult
from harness.stages.outputs.sanitized_generation import (CRASH_LABEL, first_generation, judge_run, sanitized_configs,
                                                       sanitized_stem, sanitizer_launcher)

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")

REPORT = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 1 bytes
=========     at k_pinned_upload_end_mark(char *)+0x30 in /b/ggml/src/ggml-cuda/ggml-cuda.cu:2452
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f2a3c400000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f2a3c000000 of size 4194304 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f2c3d] in /lib/x86_64-linux-gnu/libcuda.so.1
=========         Host Frame:cudaLaunchKernel [0x75a2b] in /usr/local/cuda/lib64/libcudart.so.12
=========         Host Frame: [0x1a2b] in /b/bin/libggml-cuda.so
=========         Host Frame:ggml_backend_cuda_set_tensor_async(ggml_backend*, ggml_tensor*, void const*, unsigned long, unsigned long) [0x12ab34] in /b/bin/libggml-cuda.so
=========         Host Frame:ggml_backend_sched_graph_compute_async [0x3c1d2] in /b/bin/libggml-base.so
=========
========= Invalid __global__ write of size 1 bytes
=========     at k_pinned_upload_end_mark(char *)+0x30 in /b/ggml/src/ggml-cuda/ggml-cuda.cu:2452
=========
========= ERROR SUMMARY: 2 errors
"""
CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"


def result(status: str = "ok", seconds: float = 12.5) -> GenerationResult:
    return GenerationResult(status=status, text=b"x", returncode=0 if status == "ok" else 1, signal=None,
                            error_line=None if status == "ok" else "CUDA error", seconds=seconds,
                            stdout_path=Path("x.stdout"), stderr_path=Path("x.stderr"), argv=["llama-completion"])


def test_the_first_report_names_its_kernel_and_the_first_host_frame_outside_the_runtime():
    first = first_sanitizer_error(REPORT)
    assert first.message == "Invalid __global__ write of size 1 bytes"
    assert first.kernel == "k_pinned_upload_end_mark(char *)"
    assert first.host_frame == ("ggml_backend_cuda_set_tensor_async(ggml_backend*, ggml_tensor*, void const*, "
                                "unsigned long, unsigned long)")
    assert first_sanitizer_error(CLEAN) is None


def test_a_run_is_judged_from_the_sanitizer_s_log(tmp_path):
    log = tmp_path / "story.memcheck.sanitizer.log"
    log.write_text(REPORT)
    status, detail, failures = judge_run(result(), log, "memcheck", "moe-large/story")
    assert status == "failed" and len(failures) == 1
    assert detail.startswith("memcheck: moe-large/story: first error: Invalid __global__ write of size 1 bytes in "
                             "k_pinned_upload_end_mark(char *) (host: ggml_backend_cuda_set_tensor_async(")
    assert detail.endswith("(12.5 s under memcheck)")
    log.write_text(CLEAN)
    assert judge_run(result(), log, "memcheck", "moe-large/story")[:2] == (
        "passed", "memcheck: moe-large/story: 0 errors over 8 tokens (12.5 s under memcheck)")
    assert judge_run(result("crashed"), log, "memcheck", "moe-large/story")[0] == "failed"
    log.write_text("")  # the tool never wrote its summary: not a pass
    assert judge_run(result(), log, "memcheck", "moe-large/story")[0] == "failed"


#: The memcheck logs of tests/plants/cuda-pinned-upload-writes-past-its-buffer.patch over real generation (one H200,
#: 2026-12-04) and of the clean series over the same configurations (one H200, 2026-12-05).
OOB_PLANT = ROOT / "results" / "evidence" / "plant-oob-20261204T073224Z" / "linux-x86_64-cuda"
CLEAN_MEMCHECK = ROOT / "results" / "evidence" / "gpu1-20261205T030752Z" / "linux-x86_64-cuda"
SANITIZED = ["cuda-pin-all", "cuda-pin-layers-2", "cuda-pin-layers-half", "cuda-sim-partial", "cuda-sim-sticky"]


def _memcheck_log(platform_dir: Path, config: str) -> Path:
    return platform_dir / config / "sanitize" / "moe-large" / "long-prefill.memcheck.sanitizer.log"


@pytest.mark.parametrize("config", SANITIZED)
def test_the_out_of_bounds_plant_fails_memcheck_on_every_pinned_upload_naming_its_kernel(config):
    """The plant's one-byte write after each upload from page-locked memory fails every configuration that pins
    (cuda-sim-sticky is granted nothing and uploads from pageable memory); the clean series passes them all."""
    status, detail, failures = judge_run(result(), _memcheck_log(OOB_PLANT, config), "memcheck", "moe-large/long-prefill")
    if config == "cuda-sim-sticky":
        assert status == "passed" and not failures, detail
    else:
        assert status == "failed" and len(failures) == 1, detail
        assert "in k_pinned_upload_end_mark(char *) (host: ggml_backend_cuda_set_tensor_async(" in detail
    clean = judge_run(result(), _memcheck_log(CLEAN_MEMCHECK, config), "memcheck", "moe-large/long-prefill")
    assert clean[0] == "passed", clean[1]


def test_racecheck_is_judged_by_its_own_summary_line(tmp_path):
    # racecheck closes with RACECHECK SUMMARY, not ERROR SUMMARY (its log over a clean generation on an H200,
    # results/evidence/gpu1-20261205T030752Z): counted, so a clean run passes and an error fails
    log = tmp_path / "long-prefill.racecheck.sanitizer.log"
    log.write_text("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    assert judge_run(result(), log, "racecheck", "moe-large/long-prefill")[:2] == (
        "passed", "racecheck: moe-large/long-prefill: 0 errors over 8 tokens (12.5 s under racecheck)")
    log.write_text("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    status, detail, _ = judge_run(result(), log, "racecheck", "moe-large/long-prefill")
    assert status == "failed" and "1 error(s)" in detail
    log.write_text("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n")
    assert judge_run(result(), log, "racecheck", "moe-large/long-prefill")[0] == "passed"
    log.write_text("========= COMPUTE-SANITIZER\n")  # cut before its summary (the interrupted run there)
    assert judge_run(result(), log, "racecheck", "moe-large/long-prefill")[0] == "failed"


def test_the_pin_modes_of_one_gpu_groups_run_the_first_model_and_prompt_of_their_first_group():
    """Each pin mode once: the values that pin as another configuration does, the seed table's (its model is made
    by a phase of its own) and the two-GPU groups' set ``sanitize: false`` or need two GPUs."""
    cuda = MATRIX.platforms["linux-x86_64-cuda"]
    ctx = SimpleNamespace(matrix=MATRIX, selection=Selection.of(MATRIX))
    assert sanitized_configs(ctx, cuda) == ["cuda-pin-all", "cuda-pin-layers-2", "cuda-pin-layers-half",
                                            "cuda-sim-partial", "cuda-sim-sticky"]
    assert pin_configuration(cuda, MATRIX.configs["cuda-pin-layers-6"]) and MATRIX.configs["cuda-pin-layers-6"].sanitize is False
    assert sanitized_configs(ctx, MATRIX.platforms["linux-x86_64-cpu"]) == []
    model, prompt, gen = first_generation(ctx, cuda, "cuda-pin-layers-2")
    assert model == "moe-large" and prompt in MATRIX.prompts and gen.ctx_size > 0


def test_the_sanitized_generations_follow_the_groups_and_models_the_run_selects():
    """``--group`` leaves the pin modes of the groups it names, ``--model`` generates on the model it names, and a
    selection no CUDA group holds runs none: the sanitizer reads the run's selection as the comparisons do."""
    cuda = MATRIX.platforms["linux-x86_64-cuda"]
    limits = SimpleNamespace(matrix=MATRIX, selection=Selection.of(MATRIX, groups=["cuda-pin-limits"]))
    assert sanitized_configs(limits, cuda) == ["cuda-sim-partial", "cuda-sim-sticky"]
    assert first_generation(limits, cuda, "cuda-pin-all") is None
    quant = SimpleNamespace(matrix=MATRIX, selection=Selection.of(MATRIX, models=["moe-48l-quant"]))
    assert sanitized_configs(quant, cuda) and all(
        first_generation(quant, cuda, c)[0] == "moe-48l-quant" for c in sanitized_configs(quant, cuda))
    none = SimpleNamespace(matrix=MATRIX, selection=Selection.of(MATRIX, models=["gemma3-270m"]))
    assert sanitized_configs(none, cuda) == []


def test_the_sanitizer_writes_its_report_to_a_file_of_its_own(tmp_path):
    from harness.kinds.nvidia import NVIDIA
    argv = sanitizer_launcher("racecheck", tmp_path / "x.sanitizer.log", NVIDIA)
    assert argv[:3] == ("compute-sanitizer", "--tool", "racecheck") and argv[-2:] == ("--log-file",
                                                                                   str(tmp_path / "x.sanitizer.log"))
    assert "--error-exitcode" in argv


def test_a_crash_s_signature_takes_the_first_error_of_its_run_under_memcheck(tmp_path):
    layout = RunLayout(tmp_path)
    gen = layout.config("linux-x86_64-cuda", "cuda-pin-layers-2") / "gen" / "moe-large"
    gen.mkdir(parents=True)
    (gen / "story.r1.stderr").write_text("CUDA error: an illegal memory access was encountered\n"
                                         "  current device: 0, in function ggml_backend_cuda_synchronize at "
                                         "/b/ggml/src/ggml-cuda/ggml-cuda.cu:2580\n  cudaStreamSynchronize(stream)\n")
    step = StepRecord("linux-x86_64-cuda", "cuda-pin-layers-2", "generate", "failed", detail="crashed",
                      failures=[Failure("generation", model="moe-large", prompt="story", repeat=1, status="crashed",
                                        log="linux-x86_64-cuda/cuda-pin-layers-2/gen/moe-large/story.r1.stderr")])
    alone = classify_step(tmp_path, step)
    assert alone.kind == "cuda_error" and "memcheck" not in alone.key
    stem = sanitized_stem(layout.config("linux-x86_64-cuda", "cuda-pin-layers-2"), "moe-large", "story", CRASH_LABEL)
    stem.parent.mkdir(parents=True)
    stem.with_name(stem.name + ".sanitizer.log").write_text(REPORT)
    joined = classify_step(tmp_path, step)
    assert joined.kind == "cuda_error" and joined.key.startswith(alone.key + "; ")
    assert "memcheck: Invalid __global__ write of size 1 bytes in k_pinned_upload_end_mark" in joined.key


def test_a_failed_sanitized_generation_step_is_signed_by_its_first_report(tmp_path):
    log = tmp_path / "linux-x86_64-cuda" / "cuda-pin-all" / "sanitize" / "moe-large" / "story.memcheck.sanitizer.log"
    log.parent.mkdir(parents=True)
    log.write_text(REPORT)
    step = StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate-memcheck", "failed", detail="memcheck: ...",
                      log=str(log.relative_to(tmp_path)))
    sig = classify_step(tmp_path, step)
    assert sig.kind == "sanitizer_report" and "k_pinned_upload_end_mark" in sig.key and sig.key.startswith("cuda-pin-all")


def test_a_crashed_generation_run_again_under_memcheck_is_recorded_and_shown_by_its_stage(tmp_path, monkeypatch):
    """The crash-memcheck stage, run by the loop, records one step per configuration with a crash and shows it as a
    console step of its own (harness.stages.shape: one console shape for every stage); the run itself is faked."""
    from contextlib import nullcontext
    from io import StringIO

    from harness import pipeline
    from harness.common.console import Console
    from harness.record.run import Run
    from harness.stages.outputs import sanitized_generation as sg

    cuda, config = "linux-x86_64-cuda", "cuda-pin-all"
    run = Run(tmp_path / "results", "crash")
    crash = Failure("generation", model="moe-large", prompt="story", repeat=1, status="crashed")
    run.record_step(StepRecord(cuda, config, "generate", "failed", detail="crashed", failures=[crash, crash]))
    run.record_step(StepRecord(cuda, "cuda-pageable", "generate", "passed"))
    ran = []

    def sanitized_run(ctx, p, name, model, prompt, tool, gen, label):
        ran.append((name, model, prompt, tool, label))
        log = tmp_path / f"{prompt}.{label}.sanitizer.log"
        log.write_text(REPORT)
        return result("crashed"), log, None

    monkeypatch.setattr(sg, "sanitized_run", sanitized_run)
    monkeypatch.setattr(sg, "first_generation", lambda ctx, p, name: None)
    monkeypatch.setattr(sg.shutil, "which", lambda program: f"/usr/bin/{program}")
    out = StringIO()
    console = Console(out, interactive=False, github=False, heartbeat_s=0)
    ctx = SimpleNamespace(matrix=MATRIX, run=run, console=console, say=console.say,
                          doing=lambda *where: nullcontext(), generated={cuda: [config, "cuda-pageable"]})
    pipeline.run_stage(ctx, sg.CRASH_STAGE)
    assert ran == [(config, "moe-large", "story", "memcheck", CRASH_LABEL)]  # the same crash twice: run once
    (step,) = [s for s in run.steps if s.step == CRASH_LABEL]
    assert (step.platform, step.config, step.status) == (cuda, config, "failed")
    assert "Invalid __global__ write of size 1 bytes" in step.detail
    lines = out.getvalue().splitlines()
    assert lines[0] == f"▶ [{cuda}] {CRASH_LABEL} {config}"
    assert lines[1].startswith(f"✘ [{cuda}] {CRASH_LABEL} {config}: failed — {step.detail} (")
