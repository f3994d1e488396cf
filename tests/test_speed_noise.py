"""The speed stage's noise, measured: the warm-up rounds, harness.triage.speed_noise and the benchmark
that reports it (benchmarks/speed_stage.py noise), on fake engines (tests/fake_engine.py)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from harness.triage.speed_noise import cv, markdown, noise
from harness.matrix.config import MatrixError, load_matrix
from harness.pipeline import Options
from harness.record.bench import read_bench
from harness.stages.speed import speed
from harness.stages.speed.speed import stage_speed
from test_speed import CPU, ROOT, FakePipeline, matrix_with


def rule(status: str, ratio: float, p: float, ref: list[float], cand: list[float]) -> dict:
    return {"group": "g", "step": "speed:g:pp", "candidate": "fork", "reference": "base", "metric": "pp",
            "min_ratio": 1.0, "factor": 0.1, "p_max": 0.01, "status": status, "ratio": ratio, "p_value": p,
            "reference_tok_s": ref, "candidate_tok_s": cand}


def test_a_rule_s_false_alarms_ratios_and_the_factor_it_would_have_needed():
    runs = [{"rules": [rule("passed", 1.0, 0.5, [100, 100], [100, 100])]},
            {"rules": [rule("failed", 0.8, 0.004, [100, 200], [80, 160])]},
            {"rules": [rule("passed", 0.5, 0.2, [100, 100], [50, 50])]}]  # past the factor, the test disagreeing
    [r], _ = noise(("cpu", b) for b in runs)
    assert (r.false_alarms, len(r.statuses), r.false_alarm_rate) == (1, 3, pytest.approx(1 / 3))
    assert r.ratios == [1.0, 0.8, 0.5] and r.round_ratios == [1.0, 1.0, 0.8, 0.8, 0.5, 0.5]
    assert r.factor_needed == pytest.approx(0.25)  # 1 / 0.8 - 1; the 0.5x run had p 0.2
    assert r.to_json()["round_ratio_range"] == (0.5, 0.8, 1.0)
    table = markdown([r], [])
    assert "| 1/3 |" in table and "25.0 %" in table


def test_a_configuration_s_spread_inside_and_across_runs_and_its_first_round():
    runs = [{"measurements": [{"config": "base", "model": "m", "pp_tok_s": [50, 100, 100, 102, 98], "tg_tok_s": [5]}]},
            {"measurements": [{"config": "base", "model": "m", "pp_tok_s": [120, 120, 118, 122, 120], "tg_tok_s": []}]}]
    _, [c] = noise(("cpu", b) for b in runs)
    assert (c.config, c.metric) == ("base", "pp")  # tg: fewer than 2 samples, left out
    first = [50, 100, 100, 102, 98]
    assert c.cvs[0] == pytest.approx(statistics.stdev(first) / statistics.fmean(first))
    assert c.medians == [100, 120] and c.first == [0.5, 1.0]
    assert cv([1.0]) is None and cv([2.0, 2.0]) == 0.0


# --------------------------------------------------------------------------- warm-up rounds


def test_the_matrix_sets_the_warm_up_rounds_within_limits(tmp_path):
    assert load_matrix(ROOT / "matrix.yaml").groups["base-vs-fork"].speed.warmup >= 1
    for bad in ("-1", "21"):
        path = matrix_with(tmp_path, "      model: gemma3-270m\n", f"      model: gemma3-270m\n      warmup: {bad}\n")
        with pytest.raises(MatrixError, match="speed.warmup"):
            load_matrix(path)


class CountingBench(speed.EngineSession):
    """Counts bench requests by generated tokens: the warm-up ones generate 2 (speed.WARMUP_GEN)."""

    requests: list[int] = []

    def bench(self, n_prompt, n_gen):
        CountingBench.requests.append(n_gen)
        return super().bench(n_prompt, n_gen)


@pytest.mark.parametrize("warmup", [0, 3])
def test_the_stage_runs_the_warm_up_rounds_asked_before_the_timed_ones(tmp_path, monkeypatch, warmup):
    monkeypatch.setattr(speed, "EngineSession", CountingBench)
    monkeypatch.setattr(CountingBench, "requests", [])
    pipe = FakePipeline(tmp_path, f"warm{warmup}")
    pipe.opts = Options(platforms=[CPU], groups=["base-vs-fork"], bench_warmup=warmup)
    stage_speed(pipe)
    assert CountingBench.requests == [speed.WARMUP_GEN] * (2 * warmup) + [16] * 10
    assert {m["warmup"] for m in read_bench(pipe.run.dir, CPU)["measurements"]} == {warmup}


# --------------------------------------------------------------------------- the benchmark's report


def fake_runs(tmp_path: Path, n: int, **scale: float) -> list[Path]:
    dirs = []
    for i in range(n):
        pipe = FakePipeline(tmp_path, f"run{i}-{'-'.join(scale)}", scale=scale)
        stage_speed(pipe)
        pipe.run.close()
        dirs.append(pipe.run.dir)
    return dirs


def report(dirs: list[Path], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "speed_stage.py"), "noise", "--from-runs",
                           *map(str, dirs), "--json", str(out)], capture_output=True, text=True, cwd=ROOT)


def test_the_noise_report_counts_every_rule_that_did_not_pass_as_a_false_alarm(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_MS", "0.05")  # the ratios are the scales; the sleeps only need to be short
    clean = report(fake_runs(tmp_path, 3), tmp_path / "clean.json")
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.count("| 0/3 |") == 2 and "| fork (gemma3-270m) | pp |" in clean.stdout
    slow = report(fake_runs(tmp_path, 3, fork=2.0), tmp_path / "slow.json")  # a real slowdown: every run fails
    assert slow.returncode == 0 and slow.stdout.count("| 3/3 |") == 2, slow.stdout
    missing = report([tmp_path / "no-such-run"], tmp_path / "none.json")
    assert missing.returncode == 1 and "error: no-such-run/linux-x86_64-cpu: no speed/bench.json" in missing.stdout


def test_the_cpu_rules_run_their_engines_on_the_threads_the_group_sets(tmp_path):
    assert load_matrix(ROOT / "matrix.yaml").groups["base-vs-fork"].speed.threads == 1
    assert load_matrix(ROOT / "matrix.yaml").groups["cuda-pin-routes"].speed.threads is None  # llama.cpp's default
    pipe = FakePipeline(tmp_path, "threads")
    seen = []
    engine = pipe.hooks(None).engine
    pipe.hooks = lambda p: type("Hooks", (), {"engine": staticmethod(
        lambda side, model_path, gen: seen.append(gen.threads) or engine(side, model_path, gen))})
    stage_speed(pipe)
    assert seen == [1, 1]
    assert {m["threads"] for m in read_bench(pipe.run.dir, CPU)["measurements"]} == {1}
    path = matrix_with(tmp_path, "      threads: 1\n", "      threads: 0\n")
    with pytest.raises(MatrixError, match="speed.threads"):
        load_matrix(path)


def test_each_of_the_benchmark_s_runs_is_a_speed_stage_of_its_own_with_every_rule_judged(tmp_path, monkeypatch):
    """``noise``/``repeat`` run the speed stage themselves (benchmarks/speed_stage.py speed_runs): each of the runs
    asked is a results run of its own whose speed stage measured the pairs and judged every rule of the groups
    asked, the result cache left unread (every run measures).  The stage's context is the fake engines' one
    (tests/test_speed.py FakePipeline) around the run and options speed_runs gives it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import speed_stage
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setenv("FAKE_BENCH_MS", "0.05")
    contexts = []

    def fake_context(matrix, run, opts, say=None, **_):
        pipe = FakePipeline(tmp_path, f"fake-{len(contexts)}", no_cache=opts.no_cache)
        pipe.run.close()  # the fake's own run, unused: the stage records into the run speed_runs opened
        pipe.matrix, pipe.run, pipe.opts = matrix, run, opts
        pipe.close = lambda: None
        contexts.append(pipe)
        return pipe

    monkeypatch.setattr(speed_stage_context(), "open_context", fake_context)
    dirs = list(speed_stage.speed_runs(2, tmp_path / "results", [CPU], ["base-vs-fork"], tmp_path / "work"))
    assert len(dirs) == 2 and dirs[0] != dirs[1] and [c.opts.no_cache for c in contexts] == [True, True]
    for run_dir in dirs:
        bench = read_bench(run_dir, CPU)
        assert bench is not None, run_dir
        assert sorted((r["step"], r["status"]) for r in bench["rules"]) == [
            ("speed:base-vs-fork:pp", "passed"), ("speed:base-vs-fork:tg", "passed")]
        assert [(m["config"], len(m["pp_tok_s"])) for m in bench["measurements"]] == [("base", 5), ("fork", 5)]


def speed_stage_context():
    """The module whose ``open_context`` speed_runs opens its stage context with."""
    from harness import pipeline
    return pipeline
