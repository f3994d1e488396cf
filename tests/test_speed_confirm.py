"""``triage --confirm`` (harness.triage.speed_confirm): both runs' builds re-measured interleaved, with the fake
engine (tests/fake_engine.py) standing in for llama-harness-engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.triage import speed_confirm, triage
from harness.triage.speed_confirm import ConfirmError, Engine, build_holding, confirm, recorded_build_key
from harness.triage.speed_diff import SUSPECT, SpeedChange
from harness.matrix.model_sources.registry import ModelStore
from harness.record.json_files import write_json
from harness.record.records import StepRecord
from harness.record.run import Run

ROOT = Path(__file__).resolve().parents[1]
FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine.py"
CPU = "linux-x86_64-cpu"
KEY_A, KEY_B = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"


def suspect(metric: str) -> SpeedChange:
    return SpeedChange(CPU, "fork", "gemma3-270m", metric, 300.0, 200.0, 0.67, 0.909, 0.004, 0.01, verdict=SUSPECT,
                       n_prompt=64, n_gen=16)


def fake(scale: float) -> Engine:
    return Engine((sys.executable, str(FAKE_ENGINE)), {"FAKE_BENCH_SCALE": str(scale)})


@pytest.mark.parametrize("b_scale,confirmed", [(2.0, True), (1.0, False)])
def test_confirm_measures_both_builds_interleaved_and_judges_b_against_a(tmp_path, b_scale, confirmed):
    seen = []

    def engine(change, side):
        seen.append((change.metric, side))
        return fake(1.0 if side == "A" else b_scale)

    found = confirm([suspect("pp"), suspect("tg")], engine, tmp_path, repeats=5, factor=0.1)
    assert seen == [("pp", "A"), ("pp", "B")]  # both metrics from one interleaved measurement
    assert [(c.metric, c.confirmed) for c in found] == [("pp", confirmed), ("tg", confirmed)]
    if confirmed:
        assert found[0].ratio == pytest.approx(0.5, rel=0.05) and found[0].p_value < 0.01
    assert "CONFIRMED" in speed_confirm.describe(found[0]) if confirmed else "cleared" in speed_confirm.describe(found[0])
    assert (tmp_path / f"{CPU}.fork.gemma3-270m" / "A.stderr").exists()


def test_a_suspect_measured_across_processes_is_re_measured_across_as_many(tmp_path, monkeypatch):
    # the speed stage measured the pair with five engine processes a side: --confirm starts five pairs of engines
    # and judges the medians of their rounds, as the stage does
    starts = []
    real = speed_confirm.EngineSession

    def counted(argv, env, stderr_path, *args, **kwargs):
        starts.append(Path(stderr_path).stem)
        return real(argv, env, stderr_path, *args, **kwargs)

    monkeypatch.setattr(speed_confirm, "EngineSession", counted)
    change = suspect("pp")
    change.processes = 5
    found = confirm([change], lambda c, side: fake(1.0 if side == "A" else 1.5), tmp_path, repeats=5, factor=0.1)
    assert sorted(starts) == ["A"] * 5 + ["B"] * 5
    assert found[0].confirmed and found[0].ratio == pytest.approx(1 / 1.5, rel=0.05)


@pytest.mark.parametrize("factor,confirmed", [(None, True), (0.1, True), (0.75, False)])
def test_the_re_measurement_is_judged_with_the_factor_the_suspect_was_found_with(tmp_path, factor, confirmed):
    # run B's build at 0.67x of run A's: past the matrix's 10 %, within a rule that allows 0.75
    # (matrix.yaml's cuda-base-vs-fork pp rule, whose noise triage judged the runs with)
    change = suspect("pp")
    change.factor = factor
    found = confirm([change], lambda c, side: fake(1.0 if side == "A" else 1.5), tmp_path, repeats=5, factor=0.1)
    assert found[0].confirmed is confirmed
    assert found[0].threshold == pytest.approx(1 / (1 + (0.1 if factor is None else factor)), rel=1e-3)


def test_an_engine_that_does_not_start_is_a_confirm_error(tmp_path):
    def engine(change, side):
        return Engine((sys.executable, "-c", "import sys; sys.exit(3)"), {}) if side == "B" else fake(1.0)

    with pytest.raises(ConfirmError, match="an engine did not start"):
        confirm([suspect("pp")], engine, tmp_path, repeats=5, factor=0.1)


# --------------------------------------------------------------------------- the builds of each run


def run_with_fork(root: Path, run_id: str, key: str, pp: list[float]) -> Path:
    """A run whose fork build has ``key`` and whose speed stage measured only the fork (no reference)."""
    run = Run(root, run_id)
    run.record_step(StepRecord(CPU, "fork", "build", "passed", 1.0, f"built in 1 s (key {key})"))
    m = {"config": "fork", "model": "gemma3-270m", "n_prompt": 64, "n_gen": 16, "repeats": 5, "pp_tok_s": pp,
         "tg_tok_s": [40, 41, 39, 40.5, 39.5]}
    write_json(run.layout.speed(CPU) / "bench.json",
               {"machine": {"cpu": "x"}, "defaults": {"factor": 0.1, "p_max": 0.01}, "measurements": [m], "rules": []})
    run.close()
    return run.dir


def fake_build(work: Path, key: str, scale: float) -> Path:
    """``work``'s fork build of the CPU platform: a stamp with ``key`` and an engine that is the fake one."""
    build_dir = work / "fork" / f"build-{CPU}"
    (build_dir / "bin").mkdir(parents=True)
    (build_dir / "harness-build.json").write_text(json.dumps({"key": key}))
    exe = build_dir / "bin" / "llama-harness-engine"
    exe.write_text(f"#!{sys.executable}\nimport os, runpy, sys\nos.environ['FAKE_BENCH_SCALE'] = '{scale}'\n"
                   f"sys.argv = [{str(FAKE_ENGINE)!r}]\nrunpy.run_path({str(FAKE_ENGINE)!r}, run_name='__main__')\n")
    exe.chmod(0o755)
    return build_dir


def test_a_run_s_build_is_found_by_the_key_it_recorded(tmp_path):
    a = run_with_fork(tmp_path / "results", "a", KEY_A, [300] * 5)
    assert recorded_build_key(a, CPU, "fork") == KEY_A and recorded_build_key(a, CPU, "base") is None
    build_dir = fake_build(tmp_path / "wa", KEY_A, 1.0)
    fake_build(tmp_path / "wb", KEY_B, 1.0)
    assert build_holding([tmp_path / "wb", tmp_path / "wa"], CPU, "fork", KEY_A) == build_dir
    assert build_holding([tmp_path / "wb"], CPU, "fork", KEY_A) is None


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    """Runs a and b (b's fork pp 0.67x a's, with no reference: a suspect) and b's build in work dir ``wb``."""
    monkeypatch.setattr(ModelStore, "path", lambda self, name: tmp_path / f"{name}.gguf")
    a = run_with_fork(tmp_path / "results", "a", KEY_A, [300, 302, 298, 301, 299])
    b = run_with_fork(tmp_path / "results", "b", KEY_B, [200, 202, 198, 201, 199])
    return a, b


def test_the_command_confirms_a_slower_build(tmp_path, two_runs, capsys):
    a, b = two_runs
    fake_build(tmp_path / "wa", KEY_A, 1.0)
    fake_build(tmp_path / "wb", KEY_B, 2.0)
    argv = [str(a), str(b), "--matrix", str(ROOT / "matrix.yaml"), "--work-dir", str(tmp_path / "wb")]
    assert triage.main(argv) == 0  # a suspect alone is no regression
    assert triage.main([*argv, "--confirm", "--a-work-dir", str(tmp_path / "wa")]) == 1
    out = capsys.readouterr().out
    assert "SUSPECT" in out and "CONFIRM (1 suspect(s)" in out
    assert "fork gemma3-270m pp: run A's build" in out and "CONFIRMED: run B's build is slower" in out


def test_the_command_clears_a_suspect_the_builds_do_not_share(tmp_path, two_runs, capsys):
    a, b = two_runs
    fake_build(tmp_path / "wa", KEY_A, 1.0)
    fake_build(tmp_path / "wb", KEY_B, 1.0)
    assert triage.main([str(a), str(b), "--matrix", str(ROOT / "matrix.yaml"), "--work-dir", str(tmp_path / "wb"),
                        "--a-work-dir", str(tmp_path / "wa"), "--confirm"]) == 0
    assert "cleared: not slower by the rule" in capsys.readouterr().out


def test_the_command_names_run_a_s_build_that_is_gone(tmp_path, two_runs):
    a, b = two_runs
    fake_build(tmp_path / "wb", KEY_B, 1.0)
    with pytest.raises(ConfirmError, match=f"run a's fork build of {CPU} \\(key {KEY_A}\\) is gone.*--a-work-dir"):
        triage.main([str(a), str(b), "--matrix", str(ROOT / "matrix.yaml"), "--work-dir", str(tmp_path / "wb"),
                     "--confirm"])
