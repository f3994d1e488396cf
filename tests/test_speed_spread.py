"""harness.triage.speed_spread on synthetic runs: which runs are a yardstick, which runs are of one machine, and
the ratios a run gives and leaves out (the committed runs' spreads are tested in tests/test_speed_ratios.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.triage.speed_spread import clean, measure, median_ratios

CUDA = "linux-x86_64-cuda"


def measurement(config: str, pp: list[float], tg: list[float]) -> dict:
    """One configuration's samples of the interleaved unit every run here measures (model ``m``)."""
    return {"config": config, "model": "m", "n_prompt": 64, "n_gen": 16, "repeats": len(pp), "pp_tok_s": pp,
            "tg_tok_s": tg}


def run(root: Path, name: str, *measurements: dict, machine: dict | None = None, summary: str | None = None) -> Path:
    """A run ``name`` under ``root`` whose summary.json passed (or is ``summary``) and whose CUDA bench.json holds
    ``measurements``, measured by instrument 2 on ``machine``."""
    d = root / name
    (d / CUDA / "speed").mkdir(parents=True)
    (d / "summary.json").write_text(summary if summary is not None else json.dumps(
        {"run_id": name, "record_version": 1, "overall": "passed", "configurations": [], "comparisons": []}))
    (d / CUDA / "speed" / "bench.json").write_text(json.dumps(
        {"machine": machine or {"cpu": "x"}, "instrument": 2, "measurements": list(measurements)}))
    return d


def pair(fork_over_base: float) -> tuple[dict, dict]:
    """base at 100 tok/s and fork at ``fork_over_base`` times that, in pp and tg, three rounds."""
    return (measurement("base", [100.0] * 3, [100.0] * 3),
            measurement("fork", [100.0 * fork_over_base] * 3, [100.0 * fork_over_base] * 3))


def test_a_run_whose_summary_cannot_be_read_is_no_yardstick(tmp_path):
    """clean(): a run without a summary.json, or with one that is not JSON, did not pass: its ratios, far lower
    than the clean runs', change no spread."""
    (tmp_path / "empty").mkdir()
    assert not clean(tmp_path / "empty") and not clean(tmp_path / "absent")
    runs = [run(tmp_path, "r1", *pair(1.0)), run(tmp_path, "r2", *pair(0.9)),
            run(tmp_path, "broken", *pair(0.1), summary="{")]
    assert [clean(d) for d in runs] == [True, True, False]
    fork = measure(runs)[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (pytest.approx(0.9), 2, 2)


def test_runs_of_one_machine_fingerprint_are_paired_whatever_the_order_of_its_keys(tmp_path):
    """The machine fingerprint is compared as JSON with sorted keys: a bench.json that writes the same machine's
    keys in another order is a run of that machine, paired with the others."""
    runs = [run(tmp_path, "r1", *pair(1.0), machine={"cpu": "x", "gpu": "H200", "driver": "580"}),
            run(tmp_path, "r2", *pair(0.8), machine={"driver": "580", "gpu": "H200", "cpu": "x"})]
    assert len({where for d in runs for where in median_ratios(d)}) == 1
    fork = measure(runs)[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (pytest.approx(0.8), 2, 2)


def test_a_metric_without_a_ratio_leaves_the_other_metric_s_ratio_there(tmp_path):
    """A reference sample of 0 tok/s gives that metric no ratio (speed_ratios.round_ratios); the configuration's
    other metric against that reference, and the other direction, are still measured."""
    d = run(tmp_path, "r1", measurement("base", [0.0, 100.0, 100.0], [50.0] * 3),
            measurement("fork", [100.0] * 3, [40.0] * 3))
    (ratios,) = median_ratios(d).values()
    assert ratios == {("m", "fork", "tg", "base"): pytest.approx(0.8), ("m", "base", "pp", "fork"): 1.0,
                      ("m", "base", "tg", "fork"): pytest.approx(1.25)}


def test_a_ratio_only_one_run_has_gets_no_spread_and_the_others_still_do(tmp_path):
    """A configuration measured in one clean run only (added to the matrix since) has no change to show: no spread,
    and the ratios both runs have keep theirs."""
    r1 = run(tmp_path, "r1", *pair(1.0))
    r2 = run(tmp_path, "r2", *pair(0.8), measurement("pin", [120.0] * 3, [120.0] * 3))
    spreads = measure([r1, r2])
    assert {k[3:] for k in spreads} == {(c, metric, r) for c, r in (("fork", "base"), ("base", "fork"))
                                        for metric in ("pp", "tg")}
    fork = spreads[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (pytest.approx(0.8), 2, 2)


def test_a_ratio_of_zero_in_every_run_has_no_spread(tmp_path):
    """A configuration that measured 0 tok/s has a median ratio of 0 to its reference: no change is measured from
    it (a division by zero), and the ratios of the other direction have none either (a reference of 0)."""
    runs = [run(tmp_path, name, measurement("base", [100.0] * 3, [100.0] * 3),
                measurement("fork", [0.0] * 3, [0.0] * 3)) for name in ("r1", "r2")]
    assert all(r == {("m", "fork", "pp", "base"): 0.0, ("m", "fork", "tg", "base"): 0.0}
               for d in runs for r in median_ratios(d).values())
    assert measure(runs) == {}


def test_a_ratio_of_zero_in_one_run_changes_no_spread_and_the_others_still_count(tmp_path):
    """One run whose fork measured 0 tok/s after runs that measured it: that run gives no change (a spread of
    1 / 0 - 1 would be infinite and hide every slowdown), and the ratios of the runs that measured stay."""
    runs = [run(tmp_path, "r1", *pair(0.9)), run(tmp_path, "r2", *pair(0.8)),
            run(tmp_path, "r3", measurement("base", [100.0] * 3, [100.0] * 3), measurement("fork", [0.0] * 3, [0.0] * 3))]
    spreads = measure(runs)
    fork = spreads[(CUDA, 2, "m", "fork", "tg", "base")]
    assert fork.smallest == pytest.approx(0.8 / 0.9) and fork.factor == pytest.approx(0.9 / 0.8 - 1)
    assert all(s.smallest > 0 for s in spreads.values())


def test_where_two_machines_show_the_same_smallest_change_the_first_one_measured_keeps_the_spread(tmp_path):
    """Per ratio the smallest change over the machines of one platform and instrument; where two machines tie, the
    spread (and the pairs and runs triage's text names) stays the one of the machine whose runs come first."""
    x = [run(tmp_path, "x1", *pair(1.0), machine={"cpu": "x"}), run(tmp_path, "x2", *pair(0.8), machine={"cpu": "x"})]
    y = [run(tmp_path, name, *pair(f), machine={"cpu": "y"}) for name, f in (("y1", 1.0), ("y2", 0.8), ("y3", 0.9))]
    fork = measure([*x, *y])[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (0.8, 2, 2)
    fork = measure([*y, *x])[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (0.8, 6, 3)
