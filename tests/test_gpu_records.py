"""Tests of the GPU records: pin-ladder lines, buffer placement, pin environment, visible GPUs, unsupported upstream."""

from __future__ import annotations

import json
import textwrap
import sys
from pathlib import Path

import pytest

from harness.kinds import nvidia
from harness.record import gpu
from harness.stages.checks.expectation_load import model_buffers
from harness.stages.outputs.compare import GenerationResult
from harness.matrix.config import MatrixError, load_matrix
from harness.record.records import ComparisonRecord, StepRecord
from harness.record.run import Run
from harness.stages.outputs.upstream_support import unsupported_upstream
from harness.stages.outputs.compare_stage import record_generate_steps, run_compare, run_groups

LADDER_LOG = "\n".join([
    "0.01.000.000 I ggml_cuda_host_malloc: pin ladder: cudaMallocHost requested=4962910208 granted=4962910208 "
    "segments=1 calls=1 seconds=0.912",
    "0.01.100.000 I ggml_cuda_host_malloc: pin ladder: requested=1048576 granted=0 segments=0 calls=3 seconds=0.000",
    "0.01.100.001 W ggml_cuda_host_malloc: pin ladder: no pin: requested=1048576 granted=0 segments=0 "
    "error=cudaErrorMemoryAllocation",
    "0.01.200.000 I ggml_cuda_host_malloc: pin ladder: disabled: requested=9437184 granted=0 segments=0 calls=0 "
    "seconds=0.000",
    "0.09.000.000 W ggml_cuda_host_malloc: pin ladder: no pin: size_class=1048576 allocations=8 requested=8388608 "
    "granted=0 (7 of them not logged above)",
])


def test_every_kind_of_pin_record_parses():
    recs = gpu.parse_ladder_lines(LADDER_LOG)
    assert [r["kind"] for r in recs] == ["malloc_host", "ladder", "none", "disabled", "repeated"]
    assert recs[0]["calls"] == 1 and recs[0]["granted"] == 4962910208 and recs[0]["seconds"] == pytest.approx(0.912)
    assert recs[1]["calls"] == 3 and recs[1]["granted"] == 0
    assert recs[3]["requested"] == 9437184 and recs[3]["calls"] == 0
    assert recs[4]["warning"] == "none" and recs[4]["allocations"] == 8 and recs[4]["size_class"] == 1048576
    totals = gpu.ladder_totals(recs)
    # three allocations (full pin, no pin, disabled); warnings: one logged in full + seven counted
    assert totals == {"allocations": 3, "requested": 4962910208 + 1048576 + 9437184, "granted": 4962910208,
                      "segments": 1, "calls": 4, "seconds": 0.912, "warnings": 8}


def test_buffer_placement_per_device():
    log = textwrap.dedent("""\
        0.02.583.863 I load_tensors: offloaded 9/9 layers to GPU
        0.02.583.869 I load_tensors:        CUDA0 model buffer size =   159.56 MiB
        0.02.583.870 I load_tensors:        CUDA1 model buffer size =   159.57 MiB
        0.02.583.871 I load_tensors:    CUDA_Host model buffer size =  4733.00 MiB
        0.03.656.176 I llama_kv_cache:      CUDA0 KV buffer size =    16.00 MiB
        0.03.656.177 I llama_kv_cache:      CUDA1 KV buffer size =    16.00 MiB
        0.03.664.896 I sched_reserve:      CUDA0 compute buffer size =   219.20 MiB
        0.03.664.903 I sched_reserve:  CUDA_Host compute buffer size =     9.01 MiB
        0.02.100.000 I llama_model_loader: GGML_CUDA_MOE_PIN_LAYERS=4: expert tensors of layers 0-3 in CUDA_Host, layers 4-7 in CPU (pageable); 12 tensors (2304.00 MiB) pinned, 12 tensors (2304.00 MiB) pageable
        0.02.000.000 W llama_model_loader: GGML_CUDA_MOE_PIN_LAYERS=999999999999 is larger than the number of layers of the model (8) - using 8
        """)
    pl = gpu.buffer_placement(log)
    assert pl["offloaded_layers"] == [9, 9]
    assert pl["by_buffer_type"] == {"CUDA0": 394.76, "CUDA1": 175.57, "CUDA_Host": 4742.01}
    assert pl["buffers"][0] == {"stage": "load_tensors", "buffer_type": "CUDA0", "what": "model", "mib": 159.56,
                                "load": 1}
    assert len(pl["routing"]) == 2 and "999999999999 is larger" in pl["routing"][1]


def test_an_engine_log_of_two_processes_claims_the_buffers_of_the_last_load():
    """An engine's stderr is appended to by every process started for it (a restart, the dumps a later
    platform's comparison needs): each load's buffer lines are numbered, and the buffers a load claims are
    those of the last load, which wrote the probe beside it, not the sum of both."""
    one = ("0.00.013.417 I llama_model_loader: loaded meta data with 25 key-value pairs and 43 tensors from m.gguf\n"
           "0.00.072.551 I load_tensors:   CPU_Mapped model buffer size =    56.79 MiB\n")
    pl = gpu.buffer_placement(one + one.replace("56.79", "60.00"))
    assert [b["load"] for b in pl["buffers"]] == [1, 2]
    assert model_buffers(pl) == {"CPU_Mapped": round(60.0 * 2**20)}
    assert model_buffers(gpu.buffer_placement(one)) == {"CPU_Mapped": round(56.79 * 2**20)}


def test_pin_environment_records_inherited_variables_whatever_their_value():
    env = {"GGML_CUDA_NO_PINNED": "0", "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "", "GGML_CUDA_MOE_PIN_LAYERS": "4",
           "CUDA_VISIBLE_DEVICES": "1", "PATH": "/bin", "GGML_CUDA_FORCE_MMQ": "1"}
    assert gpu.pin_environment(env) == {"CUDA_VISIBLE_DEVICES": "1", "GGML_CUDA_MOE_PIN_LAYERS": "4",
                                        "GGML_CUDA_NO_PINNED": "0", "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": ""}


@pytest.mark.parametrize("value, expected", [
    (None, 2), ("0", 1), ("0,1", 2), ("1,0", 2), ("", 0), ("1,5,0", 1), ("7", 0), ("GPU-abc,GPU-def", 2), ("-1", 0),
])
def test_visible_gpu_count_follows_cuda_visible_devices(value, expected):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert nvidia.visible_gpu_count([{}, {}], env) == expected


def _run(status: str, error_line: str | None = None, returncode: int | None = 1) -> GenerationResult:
    return GenerationResult(status=status, text=b"", returncode=returncode if status != "ok" else 0,  # type: ignore[arg-type]
                            signal=None, error_line=error_line, seconds=1.0, stdout_path=Path("x.stdout"),
                            stderr_path=Path("x.stderr"), argv=["llama-completion"])


def test_a_mode_upstream_fails_the_same_way_is_unsupported_upstream():
    split = "0.01.{} E llama_init_from_model: device CUDA0 does not support split buffers at 0x{}"
    upstream = [_run("crashed", split.format("100.001", "7f00")), _run("crashed", split.format("100.002", "7f10"))]
    fork = [_run("crashed", split.format("200.001", "7e00")), _run("crashed", split.format("200.005", "7e80"))]
    why = unsupported_upstream(upstream, fork)
    assert why is not None and "does not support split buffers" in why


@pytest.mark.parametrize("upstream, fork", [
    ([_run("ok")], [_run("crashed", "E CUDA error: invalid argument")]),  # only the fork fails
    ([_run("crashed", "E out of memory")], [_run("crashed", "E CUDA error: invalid argument")]),  # differently
    ([_run("crashed", "E x")], [_run("crashed", "E x"), _run("ok")]),  # one fork repeat ran
    ([], [_run("crashed", "E x")]),
])
def test_a_fork_only_or_different_failure_stays_a_failure(upstream, fork):
    assert unsupported_upstream(upstream, fork) is None


def test_unsupported_upstream_does_not_fail_the_run(tmp_path):
    run = Run.open(tmp_path, "r")
    run.record_step(StepRecord("linux-x86_64-cuda", "fork", "build", "passed"))
    run.record_comparisons([ComparisonRecord("linux-x86_64-cuda", "cuda-2gpu-row-vs-upstream", "moe-large", "story",
                                             "base-2gpu-row", "cuda-2gpu-row-pinned", "unsupported-upstream",
                                             detail="upstream's build fails the same way")])
    assert run.overall() == "passed"
    assert "unsupported-upstream" in (run.dir / "summary.md").read_text()
    run.record_comparisons([ComparisonRecord("linux-x86_64-cuda", "cuda-2gpu-row", "moe-large", "story",
                                             "cuda-1gpu-nopin", "cuda-2gpu-layer-pinned", "crashed")])
    assert run.overall() == "failed"


def test_the_matrix_declares_two_gpu_groups_with_their_upstream_partners():
    m = load_matrix(Path(__file__).resolve().parents[1] / "matrix.yaml")
    for mode in ("layer", "ts", "main-gpu", "row"):
        for suffix in ("", "-vs-upstream"):
            g = m.groups[f"cuda-2gpu-{mode}{suffix}"]
            assert g.min_gpus == 2
            assert {m.configs[c].upstream for c in g.candidates} == {f"base-2gpu-{mode}"}
        assert m.configs[f"base-2gpu-{mode}"].args == m.configs[f"cuda-2gpu-{mode}-pinned"].args
    assert m.groups["cuda-base-vs-fork"].min_gpus == 1
    for p in ("linux-x86_64-cuda", "windows-x86_64-cuda"):
        assert {"cuda-base-vs-fork", "cuda-base-vs-fork-host-experts", "cuda-2gpu-row"} <= set(m.platforms[p].groups)


def test_upstream_must_name_a_base_configuration(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "matrix.yaml").read_text()
    bad = text.replace("    upstream: base-2gpu-layer\n", "    upstream: cuda-nopin\n", 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(bad)
    with pytest.raises(MatrixError, match=r"configs\.cuda-2gpu-layer-pinned\.upstream: a fork configuration names a base"):
        load_matrix(path)


# --- the pipeline: two-GPU groups, unsupported upstream --------------------------------------------------------

CUDA = "linux-x86_64-cuda"
ROW_FAILURE = ("echo \"0.01.$$.100 E llama_init_from_model: failed to initialize the context: device CUDA0 does not "
               "support split buffers at 0x$$\" >&2; exit 1")


def _fake_cuda_build(tmp_path: Path, variant: str, script: str):
    import stat

    from harness.stages.building.build import BuildResult
    bin_dir = tmp_path / variant / "bin"
    bin_dir.mkdir(parents=True)
    engine = f"exec {sys.executable} {Path(__file__).with_name('fake_engine.py')}\n"
    # the engine fails in the same modes as llama-completion, else serves (tests/fake_engine.py)
    for name, body in (("llama-completion", script), ("llama-harness-engine", script.replace('echo "hello world"\n', "") + engine)):
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return BuildResult(CUDA, variant, "passed", "k", tmp_path / variant, 0.0, False)


def _cuda_pipeline(tmp_path, monkeypatch, base_script: str, fork_script: str, groups=()):
    from harness.pipeline import Options
    from harness.pipeline import open_context
    monkeypatch.setattr("harness.stages.outputs.jobs.model_summary", lambda path: {})
    monkeypatch.setattr("harness.stages.outputs.refusals.model_summary", lambda path: {})
    matrix = load_matrix(Path(__file__).resolve().parents[1] / "matrix.yaml")
    run = Run.open(tmp_path / "results", "r1")
    pipe = open_context(matrix, run, Options(platforms=[CUDA], repeats=2, n_predict=4, groups=list(groups)),
                        say=lambda _: None)
    pipe.builds.built[(CUDA, "base")] = _fake_cuda_build(tmp_path, "base", base_script)
    pipe.builds.built[(CUDA, "fork")] = _fake_cuda_build(tmp_path, "fork", fork_script)
    model = tmp_path / "moe-large.gguf"
    model.write_bytes(b"")
    pipe.models.known["moe-large"] = model
    return matrix, run, pipe


def _row_mode(failure: str) -> str:
    return f'case "$*" in *"-sm row"*) {failure};; esac\necho "hello world"\n'


def test_a_two_gpu_mode_upstream_fails_too_is_unsupported_upstream_in_both_groups(tmp_path, monkeypatch):
    matrix, run, pipe = _cuda_pipeline(tmp_path, monkeypatch, _row_mode(ROW_FAILURE), _row_mode(ROW_FAILURE))
    p = matrix.platform(CUDA)
    gen_steps: dict = {}
    runner = run_groups(pipe, p, ["cuda-2gpu-row", "cuda-2gpu-row-vs-upstream"], gen_steps)
    record_generate_steps(pipe, p, runner, gen_steps)
    statuses = {(c.group, c.candidate, c.prompt): c.status for c in run.comparisons}
    assert len(statuses) == 2 * 3 * 2 and set(statuses.values()) == {"unsupported-upstream"}
    assert "does not support split buffers" in run.comparisons[0].detail
    for config in ("base-2gpu-row", "cuda-2gpu-row-pinned", "cuda-2gpu-row-pin-layers", "cuda-2gpu-row-sim-partial"):
        step = run.step(CUDA, config, "generate")
        assert step.status == "skipped" and step.detail.startswith("unsupported upstream: "), step
    assert run.step(CUDA, "cuda-1gpu-nopin", "generate").status == "passed"
    assert run.overall() == "passed"


def test_a_two_gpu_mode_only_the_fork_fails_is_a_fork_failure(tmp_path, monkeypatch):
    matrix, run, pipe = _cuda_pipeline(tmp_path, monkeypatch, _row_mode("echo 'hello world'; exit 0"),
                                       _row_mode(ROW_FAILURE))
    p = matrix.platform(CUDA)
    gen_steps: dict = {}
    runner = run_groups(pipe, p, ["cuda-2gpu-row"], gen_steps)
    record_generate_steps(pipe, p, runner, gen_steps)
    assert {c.status for c in run.comparisons} == {"crashed"}
    assert run.step(CUDA, "cuda-2gpu-row-pinned", "generate").status == "failed"
    assert run.overall() == "failed"


def test_two_gpu_groups_are_skipped_with_the_reason_on_one_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr("harness.stages.shape.cannot_run", lambda p: None)
    monkeypatch.setattr("harness.stages.outputs.jobs.cannot_run", lambda p: None)
    monkeypatch.setattr("harness.kinds.nvidia.nvidia_gpus", lambda: [{"name": "H200"}, {"name": "H200"}])
    matrix, run, pipe = _cuda_pipeline(tmp_path, monkeypatch, "echo hello", "echo hello",
                                       groups=["cuda-2gpu-layer"])
    run_compare(pipe)
    step = run.step(CUDA, "cuda-2gpu-layer", "compare-outputs")
    assert step.status == "skipped"
    assert step.detail == "needs 2 NVIDIA GPUs; 1 visible here (CUDA_VISIBLE_DEVICES=0)"
    assert not run.comparisons
    assert any("cuda-2gpu-layer skipped: needs 2 NVIDIA GPUs" in r for r in run.incomplete)
    env = json.loads((run.dir / CUDA / "environment.json").read_text())
    assert env["visible_gpus"] == 1 and env["pin_environment"] == {"CUDA_VISIBLE_DEVICES": "0"}
