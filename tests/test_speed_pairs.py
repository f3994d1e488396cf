"""The speed rules of the fork's own path (issue 29): a rule's own reference, the pin routes in order,
the simulated limits, the pinned host experts against upstream's; measured pair by pair on fake engines
(tests/fake_engine.py), with the engines' peak memory recorded."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from harness.triage.signatures import classify_run
from harness.common.proc import peak_rss_bytes
from harness.common.statistics import WITHIN_ROUND, within_round_ratio
from harness.matrix.config import MatrixError, load_matrix
from harness.pipeline import Options
from harness.kinds import nvidia
from harness.record.bench import RuleStep, parse_rule_step, parse_step, read_bench, step_name
from harness.record.junit import speed_xml
from harness.stages.speed import speed
from harness.stages.speed.speed import stage_speed
from harness.stages.speed.speed_pairs import Pair, Unit, plan_pairs
from test_speed import ROOT, FakePipeline, matrix_with

CUDA = "linux-x86_64-cuda"
CUDA_GROUPS = ["cuda-base-vs-fork", "cuda-base-vs-fork-host-experts", "cuda-pin-routes", "cuda-pin-limits"]
#: Relative time per token of each configuration on the fake engines (FAKE_BENCH_SCALE: 2 is twice as
#: slow), shaped like the H200's numbers: pinned prefill about 5x pageable, partial pins in between.
CLEAN = {"base": 1.0, "fork": 1.0, "cuda-base-host-experts": 1.0, "cuda-pin-all": 1.0, "cuda-pin-layers-half": 2.5,
         "cuda-pin-layers-2": 4.0, "cuda-nopin": 5.0, "cuda-sim-partial": 3.5, "cuda-sim-sticky": 5.0}

PIN_ALL_VS_UPSTREAM = step_name("cuda-base-vs-fork-host-experts", "pp")
HALF_VS_2 = step_name("cuda-pin-routes", "pp", "cuda-pin-layers-2")
ALL_VS_HALF = step_name("cuda-pin-routes", "pp", "cuda-pin-layers-half")


# --------------------------------------------------------------------------- declarations


def test_the_shipped_matrix_declares_the_fork_s_own_rules():
    m = load_matrix(ROOT / "matrix.yaml")

    def rules(group):
        return [(r.candidate, r.metric, r.reference, r.min_ratio) for r in m.groups[group].speed.rules]

    assert rules("cuda-base-vs-fork-host-experts") == [("cuda-pin-all", "pp", "cuda-base-host-experts", 1.0),
                                                       ("cuda-pin-all", "tg", "cuda-base-host-experts", 1.0)]
    assert m.configs["cuda-base-host-experts"].build == "base"
    assert rules("cuda-pin-routes") == [("cuda-pin-all", "pp", "cuda-nopin", 3.0),
                                        ("cuda-pin-layers-2", "pp", "cuda-nopin", 1.0),
                                        ("cuda-pin-layers-half", "pp", "cuda-pin-layers-2", 1.0),
                                        ("cuda-pin-all", "pp", "cuda-pin-layers-half", 1.0)]
    assert rules("cuda-pin-limits") == [("cuda-sim-partial", "pp", "cuda-nopin", 1.0),
                                        ("cuda-sim-sticky", "pp", "cuda-nopin", 1.0)]


CHAIN_RULE = "        - {metric: pp, candidate: cuda-pin-layers-half, reference: cuda-pin-layers-2}\n"


@pytest.mark.parametrize("new, message", [
    ("        - {metric: pp, candidate: cuda-pin-layers-half, reference: cuda-pin-layer-2}\n",
     "speed.rules[2].reference: 'cuda-pin-layer-2' is not a configuration of the group (its reference cuda-nopin "
     "or a candidate: cuda-pin-all, cuda-pin-layers-2, cuda-pin-layers-half)"),
    ("        - {metric: pp, candidate: cuda-pin-layers-half, reference: cuda-sim-partial}\n",
     "speed.rules[2].reference: 'cuda-sim-partial' is not a configuration of the group"),
    ("        - {metric: pp, candidate: cuda-pin-layers-half, reference: cuda-pin-layers-half}\n",
     "speed.rules[2].reference: 'cuda-pin-layers-half' cannot be measured against itself"),
    ("        - {metric: pp, candidate: cuda-pin-layers-2, reference: cuda-nopin}\n",
     "speed.rules[2]: a second rule of cuda-pin-layers-2 pp against cuda-nopin"),
    ("        - {metric: pp, candidate: cuda-pin-layers-half, referenc: cuda-pin-layers-2}\n", "referenc"),
])
def test_a_rule_s_reference_is_checked_with_its_line(tmp_path, new, message):
    path = matrix_with(tmp_path, CHAIN_RULE, new)
    line = (ROOT / "matrix.yaml").read_text(encoding="utf-8").splitlines().index(CHAIN_RULE.rstrip("\n")) + 1
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert message in str(err.value) and f"{path}:{line}:" in str(err.value), str(err.value)


def test_step_names_keep_the_group_s_reference_implicit_and_name_a_rule_s_own():
    assert step_name("cuda-pin-routes", "pp") == "speed:cuda-pin-routes:pp"  # the steps of before, unchanged
    assert step_name("cuda-pin-routes", "pp", "cuda-pin-layers-half") == "speed:cuda-pin-routes:pp:vs-cuda-pin-layers-half"
    assert parse_rule_step(ALL_VS_HALF) == RuleStep("cuda-pin-routes", "pp", "cuda-pin-layers-half")
    assert parse_rule_step("speed:base-vs-fork:tg") == RuleStep("base-vs-fork", "tg", "")
    assert parse_step(ALL_VS_HALF) == ("cuda-pin-routes", "pp")
    for other in ("speed:g:pp:cuda-nopin", "speed:g:xx", "speed::pp", "build", "speed:g:pp:vs-a:b"):
        assert parse_rule_step(other) is None, other


def test_pairs_are_planned_once_each_with_shared_engines_next_to_each_other():
    u = Unit("moe-large", 512, 32, 5)
    g = Unit("gemma3-270m", 64, 16, 5)
    needs = [(u, "base", "fork"), (u, "base", "fork"), (u, "cuda-nopin", "cuda-pin-all"), (g, "base", "fork"),
             (u, "cuda-nopin", "cuda-pin-layers-2"), (u, "cuda-pin-layers-2", "cuda-pin-layers-half"),
             (u, "cuda-pin-layers-half", "cuda-pin-all"), (u, "cuda-pin-all", "cuda-nopin")]
    assert plan_pairs(needs) == [Pair(u, "base", "fork"), Pair(u, "cuda-nopin", "cuda-pin-all"),
                                 Pair(u, "cuda-nopin", "cuda-pin-layers-2"),
                                 Pair(u, "cuda-pin-layers-2", "cuda-pin-layers-half"),
                                 Pair(u, "cuda-pin-layers-half", "cuda-pin-all"), Pair(g, "base", "fork")]


# --------------------------------------------------------------------------- the CUDA rules on fake engines


class CountingSession(speed.EngineSession):
    """An engine session that counts how many are loaded at once (class attributes, reset per test)."""

    live = 0
    most = 0
    started: list[str] = []

    def __init__(self, argv, env, *args, **kwargs):
        super().__init__(argv, env, *args, **kwargs)
        CountingSession.live += 1
        CountingSession.most = max(CountingSession.most, CountingSession.live)
        CountingSession.started.append(Path(args[0]).name.split(".")[0])

    def close(self):
        CountingSession.live -= 1
        super().close()


@pytest.fixture
def cuda_stage(tmp_path, monkeypatch):
    """Run the speed stage of the shipped CUDA groups on one visible "GPU" with fake engines scaled by
    ``scale`` (CLEAN's entries replaced); returns the pipeline."""
    monkeypatch.setattr(speed, "cannot_run", lambda p: None)
    monkeypatch.setattr(nvidia, "visible_gpu_count", lambda *a: 1)
    monkeypatch.setattr(speed, "EngineSession", CountingSession)
    monkeypatch.setattr(CountingSession, "live", 0)
    monkeypatch.setattr(CountingSession, "most", 0)
    monkeypatch.setattr(CountingSession, "started", [])
    monkeypatch.setenv("FAKE_BENCH_MS", "0.02")  # the ratios are the scales; the sleeps only need to be short

    def run(name: str, **changes: float) -> FakePipeline:
        pipe = FakePipeline(tmp_path, name, scale={**CLEAN, **changes})
        pipe.opts = Options(platforms=[CUDA], groups=CUDA_GROUPS)
        stage_speed(pipe)
        return pipe

    return run


def test_the_clean_series_passes_every_cuda_rule_each_its_own_step_and_junit_case(cuda_stage):
    pipe = cuda_stage("clean")
    assert {(s.config, s.step): s.status for s in pipe.run.steps} == {
        ("fork", "speed:cuda-base-vs-fork:pp"): "passed", ("fork", "speed:cuda-base-vs-fork:tg"): "passed",
        ("cuda-pin-all", PIN_ALL_VS_UPSTREAM): "passed",
        ("cuda-pin-all", "speed:cuda-base-vs-fork-host-experts:tg"): "passed",
        ("cuda-pin-all", "speed:cuda-pin-routes:pp"): "passed",
        ("cuda-pin-layers-2", "speed:cuda-pin-routes:pp"): "passed",
        ("cuda-pin-layers-half", HALF_VS_2): "passed", ("cuda-pin-all", ALL_VS_HALF): "passed",
        ("cuda-sim-partial", "speed:cuda-pin-limits:pp"): "passed",
        ("cuda-sim-sticky", "speed:cuda-pin-limits:pp"): "passed"}
    assert len(pipe.run.steps) == 10
    junit = speed_xml(pipe.run.steps[0].platform, pipe.run.steps).getroot()
    names = sorted(c.get("name") for c in junit.iter("testcase"))
    assert junit.get("tests") == "10" and junit.get("failures") == "0"
    assert "cuda-pin-all pp vs cuda-pin-layers-half" in names and "cuda-pin-all pp" in names
    bench = read_bench(pipe.run.dir, CUDA)
    rule = next(r for r in bench["rules"] if r["step"] == ALL_VS_HALF)
    assert (rule["reference"], rule["candidate"], rule["pair"]) == \
        ("cuda-pin-layers-half", "cuda-pin-all", ["cuda-pin-layers-half", "cuda-pin-all"])
    assert len(rule["reference_tok_s"]) == len(rule["candidate_tok_s"]) == 5
    assert rule["ratio"] == pytest.approx(2.5, rel=0.05)
    # the one ratio: the stage judges and records the median of within-round ratios, named
    assert rule["ratio"] == within_round_ratio(rule["reference_tok_s"], rule["candidate_tok_s"])
    assert rule["ratio_name"] == WITHIN_ROUND and WITHIN_ROUND in next(
        s.detail for s in pipe.run.steps if s.step == ALL_VS_HALF)


def test_a_20_percent_slower_pinned_path_fails_against_upstream_while_3x_pageable_holds(cuda_stage):
    # the plant: pinned host-expert prefill 20 % slower, still far above 3x pageable
    pipe = cuda_stage("plant", **{"cuda-pin-all": 1.25})
    steps = {(s.config, s.step): s for s in pipe.run.steps}
    failed = sorted(k for k, s in steps.items() if s.status == "failed")
    assert failed == [("cuda-pin-all", PIN_ALL_VS_UPSTREAM), ("cuda-pin-all", "speed:cuda-base-vs-fork-host-experts:tg")]
    assert steps[("cuda-pin-all", "speed:cuda-pin-routes:pp")].status == "passed"  # 4x pageable: the old rule passes
    assert "0.80x" in steps[("cuda-pin-all", PIN_ALL_VS_UPSTREAM)].detail
    sigs = {e["step"]: e["signature"] for e in classify_run(pipe.run.dir)}
    assert sigs[PIN_ALL_VS_UPSTREAM]["key"] == \
        "cuda-base-vs-fork-host-experts/moe-large: cuda-pin-all vs cuda-base-host-experts pp"


@pytest.mark.parametrize("changes, fails", [
    ({"cuda-pin-layers-half": 4.8}, [("cuda-pin-layers-half", HALF_VS_2)]),          # half pinned slower than 2 layers
    ({"cuda-pin-layers-2": 5.8}, [("cuda-pin-layers-2", "speed:cuda-pin-routes:pp")]),  # 2 layers slower than pageable
    ({"cuda-pin-all": 3.0, "cuda-base-host-experts": 3.0},                          # all pinned slower than half
     [("cuda-pin-all", "speed:cuda-pin-routes:pp"), ("cuda-pin-all", ALL_VS_HALF)]),
    ({"cuda-sim-partial": 6.0}, [("cuda-sim-partial", "speed:cuda-pin-limits:pp")]),  # a partial pin below pageable
])
def test_each_link_of_the_order_fails_on_its_own(cuda_stage, changes, fails):
    pipe = cuda_stage("order", **changes)
    assert sorted((s.config, s.step) for s in pipe.run.steps if s.status != "passed") == sorted(fails)
    for config, step in fails:
        rule = parse_rule_step(step)
        expected_ref = rule.reference or {"cuda-pin-routes": "cuda-nopin", "cuda-pin-limits": "cuda-nopin"}[rule.group]
        sig = next(e["signature"] for e in classify_run(pipe.run.dir) if (e["step"], e["config"]) == (step, config))
        assert sig["key"] == f"{rule.group}/moe-large: {config} vs {expected_ref} pp"


def test_engines_are_loaded_pair_by_pair_and_their_peak_memory_is_recorded(cuda_stage, monkeypatch):
    monkeypatch.setenv("FAKE_RSS_MB", "40")
    pipe = cuda_stage("pairs")
    assert {s.status for s in pipe.run.steps} == {"passed"}
    assert CountingSession.most == 2 and CountingSession.live == 0  # never more than one pair, all closed
    bench = read_bench(pipe.run.dir, CUDA)
    pairs = [tuple(p["configs"]) for p in bench["pairs"]]
    assert len(pairs) == len({frozenset(p) for p in pairs}) == 8  # 10 rules, 8 pairs: rules of a pair share it
    # an engine the next pair needs stays loaded: 16 sides, 11 engine starts, and 8 more for the four further
    # process pairs of cuda-base-vs-fork (processes: 5)
    assert sum(len(p["started"]) for p in bench["pairs"]) == len(CountingSession.started) == 19
    assert bench["engines_resident_max"] == 2
    for p in bench["pairs"]:
        assert set(p["peak_rss_bytes"]) == set(p["configs"])
        assert all(40 * 2**20 < b < 400 * 2**20 for b in p["peak_rss_bytes"].values()), p  # the 40 MB held, and more
        assert p["total_rss_bytes"] == sum(p["peak_rss_bytes"].values())
    assert bench["peak_host_rss_bytes"] == max(p["total_rss_bytes"] for p in bench["pairs"])
    log = (pipe.run.layout.speed(CUDA) / "speed.log").read_text()
    assert log.count("pair ") == 8 and "engines resident at once: at most 2" in log
    assert f"peak host memory of the engines: {bench['peak_host_rss_bytes'] / 2**30:.2f} GiB" in log
    # each measurement says which pair it was interleaved in, sample i of both sides from round i
    for m in bench["measurements"]:
        assert m["config"] in m["pair"] and m["pair"][m["position"]] == m["config"] and len(m["pp_tok_s"]) == 5


def test_the_memory_recorded_is_the_kernel_s_peak_resident_set():
    # VmHWM of this process is what getrusage reports as its maximum resident set (both the kernel's
    # hiwater_rss); a process that is gone has none
    mine = peak_rss_bytes(os.getpid())
    assert mine == pytest.approx(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, abs=8 * 2**20)
    assert peak_rss_bytes(2**22 + 12345) is None


def test_builds_and_models_are_taken_in_the_stage_s_own_thread(cuda_stage, monkeypatch):
    # a build's read lock (harness.common.locks) belongs to the thread that takes it, and the pipeline
    # releases it from the main thread: engines start in a pool, but their builds are asked for before
    import threading
    seen = []
    real = FakePipeline.build_variant

    def build_variant(self, p, variant):
        seen.append(threading.current_thread() is threading.main_thread())
        return real(self, p, variant)

    monkeypatch.setattr(FakePipeline, "build_variant", build_variant)
    pipe = cuda_stage("threads")
    assert {s.status for s in pipe.run.steps} == {"passed"}
    # 19 engines started (11, and 8 for cuda-base-vs-fork's further processes), both builds of each of the
    # 8 pairs asked for the pair's result-cache key, and both builds of each rule checked before anything runs
    # (a rule whose build did not pass is not run)
    rules = sum(1 for s in pipe.run.steps if s.step.startswith("speed:"))
    assert rules == 10 and len(seen) == 19 + 2 * 8 + 2 * rules and all(seen)


def test_triage_reads_each_pair_as_its_own_set_of_rounds(cuda_stage, tmp_path):
    # harness.triage.speed_ratios groups measurements by unit_key, which names a unit's set of rounds
    # ("interleaved") where the stage measured the unit in several pairs
    from harness.triage.speed_ratios import interleaved, round_ratios
    bench = read_bench(cuda_stage("sets").run.dir, CUDA)
    sets = interleaved(bench)
    assert len(sets) == 8 and all(len(configs) == 2 for configs in sets.values())
    pin_vs_upstream = next(c for c in sets.values() if set(c) == {"cuda-pin-all", "cuda-base-host-experts"})
    rule = next(r for r in bench["rules"] if r["step"] == PIN_ALL_VS_UPSTREAM)
    assert round_ratios(pin_vs_upstream["cuda-pin-all"]["pp_tok_s"], pin_vs_upstream["cuda-base-host-experts"]["pp_tok_s"]) \
        == [c / r for c, r in zip(rule["candidate_tok_s"], rule["reference_tok_s"])]
    cpu = FakePipeline(tmp_path, "one-pair")  # a unit of one pair keeps the records of before: no name
    stage_speed(cpu)
    assert all("interleaved" not in m for m in read_bench(cpu.run.dir, "linux-x86_64-cpu")["measurements"])
