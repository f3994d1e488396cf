"""llama-bench rows of the speed stage's measurements (harness.record.llama_bench), read back by upstream's
own scripts/compare-llama-bench.py from the pinned base tree."""

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kinds.registry import GPUS
from harness.record.bench import BenchMeasurement, bench_measurements, read_bench
from harness.record.llama_bench import (Setting, build_commit, llama_bench_rows, logged_model_types, rows_of_run,
                                        llama_bench_time, write_rows)

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "evidence" / "gpu1-20261202T165838Z"
OTHER = ROOT / "results" / "evidence" / "gpu1-20261202T142857Z"
#: the committed run whose base build was found up to date: no configure.log of it in the run
CACHED_BASE = ROOT / "results" / "evidence" / "gpu1-20261204T073536Z"
CUDA = "linux-x86_64-cuda"
NVIDIA = GPUS["nvidia"]
MACHINE = {"cpu": "Test CPU", "gpus": [["NVIDIA H200", "580"]]}
#: the first 7 hex digits of the pinned upstream commit (matrix.yaml) and of the fork tree's HEAD on it
PINNED, FORK_HEAD = "0c1e570", "53fbaed"


def _m(config, pp, tg, pair=("base", "fork"), desc="", threads_used=None):
    return BenchMeasurement(config, "moe-large", 512, 32, None, pair, tuple(pp), tuple(tg), desc, threads_used)


def test_a_measurement_is_a_pp_row_and_a_tg_row_with_llama_bench_statistics():
    settings = {"base": Setting("base", "0c1e570", backend="CUDA", gpu_info="NVIDIA H200")}
    pp, tg = [20000.0, 25000.0, 30000.0], [1000.0, 1100.0, 900.0]
    rows = llama_bench_rows([_m("base", pp, tg)], MACHINE, settings, "2026-12-02T17:05:12Z")
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(512, 0, 0), (0, 32, 512)]
    first = rows[0]
    assert first["build_commit"] == "0c1e570" and first["backends"] == "CUDA" and first["gpu_info"] == "NVIDIA H200"
    assert first["samples_ts"] == pp and first["avg_ts"] == pytest.approx(25000.0)
    assert first["stddev_ts"] == pytest.approx(statistics.stdev(pp))
    # each round's nanoseconds for its 512 prompt tokens
    assert first["samples_ns"] == [round(512e9 / x) for x in pp]
    assert first["avg_ns"] == round(statistics.fmean(round(512e9 / x) for x in pp))
    assert rows[1]["samples_ns"] == [round(32e9 / x) for x in tg]


def test_settings_llama_bench_has_fields_for_become_fields_and_the_rest_a_distinct_build():
    plain = Setting("fork", "53fbaed", ("--load-mode", "none", "--cpu-moe", "-ngl", "99", "-ts", "1,3"))
    [row, _] = llama_bench_rows([_m("cuda-pin-all", [1.0], [1.0])], MACHINE, {"cuda-pin-all": plain}, "t")
    assert row["tensor_buft_overrides"] == r"\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"
    assert (row["n_gpu_layers"], row["load_mode"], row["tensor_split"]) == (99, "none", "1.00/3.00")
    assert build_commit(plain) == "53fbaed"
    unpinned = Setting("fork", "53fbaed", plain.args, {"GGML_CUDA_NO_PINNED": "1"})
    other = build_commit(unpinned)
    assert other != "53fbaed" and len(other) == 7
    assert build_commit(Setting("fork", "53fbaed", plain.args, {"GGML_CUDA_MOE_PIN_LAYERS": "2"})) not in (other, "53fbaed")


def test_a_bench_record_of_the_wrong_shape_names_the_measurement():
    with pytest.raises(ValueError, match=r"measurements\[1\]: KeyError"):
        bench_measurements({"measurements": [{"config": "a", "model": "m", "n_prompt": 1, "n_gen": 1},
                                             {"config": "b"}]}, "x/bench.json")


def test_rows_of_a_committed_h200_run_hold_its_samples():
    rows = rows_of_run(RUN, CUDA, NVIDIA)
    bench = read_bench(RUN, CUDA)
    assert len(rows) == 2 * len(bench["measurements"])
    base = [r for r in rows if r["config"] == "base"]
    assert base[0]["samples_ts"] == bench["measurements"][0]["pp_tok_s"]
    assert {r["build_commit"] for r in rows if r["config"] in ("fork", "cuda-pin-all")} == {FORK_HEAD}
    # the pinned upstream commit, as a maintainer's own llama-bench of it writes, not the base tree's mirror HEAD
    assert {r["build_commit"] for r in base} == {PINNED}


def test_a_base_build_found_up_to_date_is_still_upstream_on_the_gpu():
    """gpu1-20261204T073536Z's base build was found up to date: the run holds no configure log of it.  Its rows
    still name the pinned commit and the platform kind's backend and GPUs, as the fork's rows do."""
    assert not (CACHED_BASE / CUDA / "build-base" / "configure.log").exists()
    rows = rows_of_run(CACHED_BASE, CUDA, NVIDIA)
    base = [r for r in rows if r["config"] == "base"]
    fork = [r for r in rows if r["config"] == "fork"]
    assert base and fork
    for r in base + fork:
        assert (r["backends"], r["gpu_info"]) == ("CUDA", "NVIDIA H200"), r
    assert {r["build_commit"] for r in base} == {PINNED} and {r["build_commit"] for r in fork} == {FORK_HEAD}
    assert {r["test_time"] for r in rows} == {"2026-12-04T07:35:38Z"}


def test_a_cpu_only_kind_names_no_gpu_whatever_the_machine_has(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(CACHED_BASE / CUDA / "speed", run / CUDA / "speed")
    for name in ("run.json", "summary.json"):
        shutil.copy(CACHED_BASE / name, run / name)
    shutil.copy(CACHED_BASE / CUDA / "environment.json", run / CUDA / "environment.json")
    for config in ("base", "fork"):
        shutil.copytree(CACHED_BASE / CUDA / config, run / CUDA / config, ignore=shutil.ignore_patterns("gen"))
    rows = rows_of_run(run, CUDA, GPUS["none"])
    assert rows and {(r["backends"], r["gpu_info"]) for r in rows} == {("CPU", "")}


def test_test_time_is_written_as_llama_bench_writes_it():
    assert llama_bench_time("2026-12-04T07:35:38.422060+00:00") == "2026-12-04T07:35:38Z"
    assert llama_bench_time("2026-12-04T08:35:38.9+01:00") == "2026-12-04T07:35:38Z"
    assert llama_bench_time("") == ""


def test_model_type_and_threads_are_the_engines_word_then_the_loads_log(tmp_path):
    settings = {"base": Setting("base", PINNED)}
    said = _m("base", [1.0], [1.0], desc="llama 34B Q4_K - Medium", threads_used=16)
    [row, _] = llama_bench_rows([said], MACHINE, settings, "t", {"moe-large": "llama ?B F16"})
    assert (row["model_type"], row["n_threads"]) == ("llama 34B Q4_K - Medium", 16)
    [row, _] = llama_bench_rows([_m("base", [1.0], [1.0])], MACHINE, settings, "t", {"moe-large": "llama ?B F16"})
    assert (row["model_type"], row["n_threads"]) == ("llama ?B F16", -1)
    log = tmp_path / "run" / CUDA / "fork" / "gen" / "moe-large" / "engine.stderr"
    log.parent.mkdir(parents=True)
    log.write_text("0.00.26 I print_info: file type   = Q4_K - Medium\n0.00.28 I print_info: arch                  = "
                   "llama\n0.00.28 I print_info: model type            = 34B\n")
    assert logged_model_types(tmp_path / "run", CUDA) == {"moe-large": "llama 34B Q4_K - Medium"}


def _compare_script() -> Path:
    from harness.matrix.config import load_matrix
    from harness.stages.building.source import obtain_base
    script = obtain_base(load_matrix(ROOT / "matrix.yaml")).path / "scripts" / "compare-llama-bench.py"
    assert script.is_file(), script
    return script


def _table(script: Path, rows: Path, baseline: str, compare: str, cwd: Path) -> list[list[str]]:
    done = subprocess.run([sys.executable, str(script), "-t", "llama-bench", "-i", str(rows), "-b", baseline,
                           "-c", compare], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-4:] == ["Test", f"t/s {baseline}", f"t/s {compare}", "Speedup"], header
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


@pytest.mark.network
@pytest.mark.parametrize("run", [RUN, OTHER, CACHED_BASE], ids=lambda p: p.name)
def test_upstreams_compare_llama_bench_prints_base_against_fork_of_a_committed_h200_run(run, tmp_path):
    """The script joins rows on every llama-bench setting and compares two build_commits: upstream (base)
    against the fork over the same settings, each t/s the mean of that side's rounds in bench.json; also for
    gpu1-20261204T073536Z, whose base build was found up to date and configured nothing in the run."""
    run_copy = tmp_path / run.name
    shutil.copytree(run / CUDA / "speed", run_copy / CUDA / "speed")
    for name in ("run.json", "summary.json"):
        shutil.copy(run / name, run_copy / name)
    shutil.copy(run / CUDA / "environment.json", run_copy / CUDA / "environment.json")
    for config in {m["config"] for m in read_bench(run, CUDA)["measurements"]}:
        shutil.copytree(run / CUDA / config, run_copy / CUDA / config,
                        ignore=lambda d, names: [n for n in names if n == "gen"])
    for build in ("build-base", "build-fork"):
        (run_copy / CUDA / build).mkdir()
        if (run / CUDA / build / "configure.log").is_file():
            shutil.copy(run / CUDA / build / "configure.log", run_copy / CUDA / build / "configure.log")
    rows = write_rows(run_copy, CUDA, NVIDIA)
    table = _table(_compare_script(), rows, PINNED, FORK_HEAD, tmp_path)
    bench = read_bench(run, CUDA)
    base = next(m for m in bench["measurements"] if m["config"] == "base")
    fork = next(m for m in bench["measurements"] if m["config"] == "fork")
    means = (round(statistics.fmean(base["pp_tok_s"]), 2), round(statistics.fmean(fork["pp_tok_s"]), 2))
    assert means in [(float(r[-3]), float(r[-2])) for r in table if r[-4] == "pp512"], table
    assert any(r[-4] == "tg32@d512" for r in table)


@pytest.mark.network
def test_configurations_that_differ_only_in_environment_are_compared_not_averaged(tmp_path):
    """cuda-nopin (GGML_CUDA_NO_PINNED=1) and cuda-pin-all run the same fork build with the same arguments: only
    their distinct build_commits keep the script from averaging pinned and pageable rounds together."""
    rows = [r for r in rows_of_run(RUN, CUDA, NVIDIA) if r["config"] in ("cuda-nopin", "cuda-pin-all")]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    nopin = next(r["build_commit"] for r in rows if r["config"] == "cuda-nopin")
    table = _table(_compare_script(), path, nopin, FORK_HEAD, tmp_path)
    pp = next(r for r in table if r[-4] == "pp512")
    assert float(pp[-1]) > 3, pp  # pinned experts upload several times faster on the H200 run


def test_a_build_of_no_recorded_commit_gives_no_rows_and_the_command_says_why(tmp_path, capsys):
    """Without environment.json's build_commits or a configure log, the fork's commit is not known: its rows are
    left out (never a made-up build_commit), and llama-bench-rows names the configurations and why."""
    from harness import cli
    run = tmp_path / "run"
    shutil.copytree(CACHED_BASE / CUDA / "speed", run / CUDA / "speed")
    for name in ("run.json", "summary.json"):
        shutil.copy(CACHED_BASE / name, run / name)
    shutil.copytree(CACHED_BASE / CUDA / "fork", run / CUDA / "fork", ignore=shutil.ignore_patterns("gen"))
    assert rows_of_run(run, CUDA, NVIDIA) == []
    assert cli.main(["llama-bench-rows", str(run), "--out", str(tmp_path / "rows.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no record of the commit the builds of" in err and "fork" in err
