"""Triage's speed comparison on within-run ratios (harness.triage.speed_ratios, speed_diff): unit tests,
and the committed H200 evidence runs (results/evidence/), clean and with planted pinned slowdowns."""

from __future__ import annotations

import copy
from collections import Counter
import json
import shutil
from itertools import combinations
from pathlib import Path

import pytest

from harness.triage import triage
from harness.triage.speed_diff import REGRESSION, SUSPECT, UNCHANGED, compare_bench
from harness.triage.speed_ratios import (FORK_ONLY, UPSTREAM, Reference, choose_reference, compare_ratios,
                                           interleaved, recorded_rule_factors, round_ratios, rule_factors,
                                           rule_references, same_mode_upstream)
from harness.triage.speed_spread import clean, committed, measure, median_ratios
from harness.record.summary import run_dirs_under
from harness.common.statistics import MIN_SAMPLES, judge
from harness.record.bench import instrument
from harness.matrix.config import Generation, Group, GroupSpeed, Matrix, RunConfig, SpeedRule, load_matrix

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "results" / "evidence"
CUDA = "linux-x86_64-cuda"
#: The committed clean one-GPU H200 runs with a speed stage, oldest first: the five patches of one series
#: (the same names and sha256 in each run's environment.json) on upstream 0c1e57098bba, one machine fingerprint.
CLEAN = ["gpu1-20261201T223756Z", "gpu1-20261202T005602Z", "gpu1-20261202T020214Z", "gpu1-20261202T033816Z",
         "gpu1-20261202T050833Z"]
PAIRS = list(combinations(CLEAN, 2))  # (earlier, later), as triage compares them
MATRIX = load_matrix(ROOT / "matrix.yaml")
UPSTREAM_OF = same_mode_upstream(MATRIX)
FACTORS = rule_factors(MATRIX)


def bench(run: str) -> dict:
    return json.loads((EVIDENCE / run / CUDA / "speed" / "bench.json").read_text(encoding="utf-8"))


def with_pinned_pp_scaled(b: dict, factor: float) -> dict:
    """``b`` with cuda-pin-all's pp samples (pinned host experts, the path pinning speeds up) times ``factor``."""
    out = copy.deepcopy(b)
    for m in out["measurements"]:
        if m["config"] == "cuda-pin-all":
            m["pp_tok_s"] = [x * factor for x in m["pp_tok_s"]]
    return out


def change(changes, config, metric):
    return next(c for c in changes if (c.config, c.metric) == (config, metric))


# --------------------------------------------------------------------------- units


def test_per_round_ratios_pair_the_samples_of_one_round():
    assert round_ratios([10, 30, 8], [5, 10, 4, 99]) == [2.0, 3.0, 2.0]
    with pytest.raises(ValueError, match="positive"):
        round_ratios([1, 2], [1, 0])


def test_the_shipped_matrix_names_upstream_in_the_same_mode():
    upstream_of = same_mode_upstream(MATRIX)
    assert upstream_of["fork"] == "base"
    assert upstream_of["cuda-pin-all"] == "cuda-base-host-experts"  # group cuda-base-vs-fork-host-experts
    assert upstream_of["cuda-2gpu-row-pinned"] == "base-2gpu-row"  # the configuration's own upstream key
    assert "cuda-nopin" not in upstream_of and "base" not in upstream_of


def measurement(config, pp, tg=None, model="m"):
    return {"config": config, "model": model, "n_prompt": 64, "n_gen": 16, "repeats": len(pp), "pp_tok_s": pp,
            "tg_tok_s": tg if tg is not None else pp}


def record(*measurements, rules=()):
    return {"machine": {"cpu": "x"}, "defaults": {"factor": 0.1, "p_max": 0.01}, "measurements": list(measurements),
            "rules": [{"candidate": c, "reference": r, "metric": m} for c, r, m in rules]}


def test_the_reference_is_upstream_in_the_same_mode_before_a_rule_s_fork_only_one():
    both = {c: measurement(c, [1, 2, 3]) for c in ("fork", "base", "cuda-nopin")}
    assert choose_reference("fork", "pp", both, both, {"fork": "base"}, ["cuda-nopin"]) == Reference("base", UPSTREAM)
    no_base = {c: m for c, m in both.items() if c != "base"}
    # upstream measured in one run only: not interleaved in both, so the rule's fork-only reference
    assert choose_reference("fork", "pp", both, no_base, {"fork": "base"}, ["cuda-nopin"]) == \
        Reference("cuda-nopin", FORK_ONLY)
    assert choose_reference("fork", "pp", both, no_base, {"fork": "base"}, []) is None


def test_rule_references_are_per_metric():
    b = record(rules=[("cuda-pin-all", "cuda-nopin", "pp"), ("fork", "base", "pp"), ("fork", "base", "tg")])
    assert rule_references(b) == {("cuda-pin-all", "pp"): ["cuda-nopin"], ("fork", "pp"): ["base"],
                                  ("fork", "tg"): ["base"]}


def test_measurements_of_one_unit_are_the_interleaved_set():
    b = record(measurement("a", [1, 2]), measurement("b", [1, 2]), {**measurement("c", [1, 2]), "n_prompt": 512})
    assert sorted(len(s) for s in interleaved(b).values()) == [1, 2]
    # one unit timed in two separate sets of rounds, each named: two sets, a configuration in each
    pairs = record(*({**measurement(c, [1, 2]), "interleaved": i} for i, cs in enumerate([("a", "b"), ("a", "c")])
                     for c in cs))
    assert sorted(sorted(s) for s in interleaved(pairs).values()) == [["a", "b"], ["a", "c"]]


def test_a_ratio_change_counts_by_the_speed_rule():
    before = [1.00, 1.02, 0.98, 1.01, 0.99]
    assert compare_ratios(before, [0.80, 0.81, 0.79, 0.82, 0.78], 0.1, 0.01).regressed
    assert not compare_ratios(before, [0.95, 0.96, 0.94, 0.97, 0.93], 0.1, 0.01).regressed  # within the factor
    assert not compare_ratios(before, [0.5, 1.2, 0.6, 1.1, 0.7], 0.1, 0.01).regressed  # the rank test disagrees


BASE = [1000, 1010, 990, 1005, 995]


def scaled(xs, f):
    return [x * f for x in xs]


def test_a_drift_of_the_machine_is_no_regression_against_upstream():
    """Everything 25 % slower in run B, upstream's build too: the ratio stays, the tok/s is information.
    The rank test on tok/s alone (the rule before ratios) called this a regression."""
    a = record(measurement("base", BASE), measurement("fork", BASE))
    b = record(measurement("base", scaled(BASE, 0.75)), measurement("fork", scaled(BASE, 0.75)))
    c = change(compare_bench(CUDA, a, b, {"fork": "base"}), "fork", "pp")
    assert c.verdict == UNCHANGED and c.reference == "base" and c.reference_kind == UPSTREAM
    assert c.ratio == pytest.approx(0.75) and c.p_value < 0.01  # shown: past the factor, the rank test agrees


def test_a_slowdown_of_the_fork_alone_is_a_regression_against_upstream():
    a = record(measurement("base", BASE), measurement("fork", BASE))
    b = record(measurement("base", BASE), measurement("fork", scaled(BASE, 0.8)))
    c = change(compare_bench(CUDA, a, b, {"fork": "base"}), "fork", "pp")
    assert c.verdict == REGRESSION and c.vs_reference_ratio == pytest.approx(0.8)


def test_against_a_fork_only_reference():
    rule = [("pin", "nopin", "pp")]
    a = record(measurement("nopin", BASE), measurement("pin", scaled(BASE, 5)), rules=rule)

    def verdict(nopin: float, pin: float) -> str:
        b = record(measurement("nopin", scaled(BASE, nopin)), measurement("pin", scaled(BASE, 5 * pin)), rules=rule)
        return change(compare_bench(CUDA, a, b, {}), "pin", "pp").verdict

    assert verdict(1.0, 0.5) == REGRESSION  # the candidate alone slowed
    assert verdict(1.33, 1.0) == UNCHANGED  # the ratio fell only because the reference got faster
    assert verdict(0.8, 0.8) == SUSPECT  # both sides slowed: the ratio cannot tell the machine from the build
    assert verdict(1.0, 1.0) == UNCHANGED


def test_a_reference_sample_of_zero_gives_no_ratio():
    a = record(measurement("base", BASE), measurement("fork", BASE))
    b = record(measurement("base", [0, *BASE[1:]]), measurement("fork", scaled(BASE, 0.5)))
    c = change(compare_bench(CUDA, a, b, {"fork": "base"}), "fork", "pp")
    assert c.verdict == SUSPECT and c.reference == ""


def test_a_rule_s_wider_factor_is_the_one_triage_judges_its_pair_by():
    a = record(measurement("base", BASE), measurement("fork", BASE))
    b = record(measurement("base", BASE), measurement("fork", scaled(BASE, 0.8)))
    assert change(compare_bench(CUDA, a, b, {"fork": "base"}, {}), "fork", "pp").verdict == REGRESSION
    wide = change(compare_bench(CUDA, a, b, {"fork": "base"}, {("fork", "pp", "base"): 0.5}), "fork", "pp")
    assert wide.verdict == UNCHANGED and wide.threshold == pytest.approx(1 / 1.5)
    assert wide.factor == 0.5  # kept for triage --confirm, which judges a re-measurement by it
    # a rule's factor for another metric or another reference leaves this pair at the default
    other = {("fork", "tg", "base"): 0.5, ("fork", "pp", "cuda-nopin"): 0.5}
    assert change(compare_bench(CUDA, a, b, {"fork": "base"}, other), "fork", "pp").verdict == REGRESSION
    # a narrower rule (factor 0: a minimum ratio, not a slowdown rule) never narrows the default
    slight = record(measurement("base", BASE), measurement("fork", scaled(BASE, 0.95)))
    assert change(compare_bench(CUDA, a, slight, {"fork": "base"}, {("fork", "pp", "base"): 0.0}),
                  "fork", "pp").verdict == UNCHANGED
    # without the matrix: the factor the records' rules were judged with
    rule = {"candidate": "fork", "reference": "base", "metric": "pp", "factor": 0.5}
    a_rec, b_rec = {**a, "rules": [rule]}, {**b, "rules": [rule]}
    assert recorded_rule_factors(b_rec) == {("fork", "pp", "base"): 0.5}
    assert change(compare_bench(CUDA, a_rec, b_rec, {"fork": "base"}), "fork", "pp").verdict == UNCHANGED
    assert change(compare_bench(CUDA, a, b, {"fork": "base"}), "fork", "pp").verdict == REGRESSION


def test_the_shipped_matrix_s_rule_factors():
    assert rule_factors(MATRIX) == FACTORS
    # the default-mode pair is back at the default factor, measured by five engine processes a side
    assert FACTORS[("fork", "pp", "base")] == 0.10 and FACTORS[("fork", "tg", "base")] == 0.10
    assert MATRIX.groups["cuda-base-vs-fork"].speed.processes == 5
    assert FACTORS[("cuda-pin-all", "pp", "cuda-base-host-experts")] == 0.10
    assert FACTORS[("cuda-pin-all", "tg", "cuda-base-host-experts")] == 0.10
    assert FACTORS[("cuda-pin-all", "pp", "cuda-nopin")] == 0.0  # at least 3x: a minimum ratio


def test_without_an_interleaved_reference_a_slowdown_is_suspect_never_a_regression():
    a = record(measurement("fork", BASE))
    b = record(measurement("fork", scaled(BASE, 0.5)))
    c = change(compare_bench(CUDA, a, b, {"fork": "base"}), "fork", "pp")
    assert c.verdict == SUSPECT and not c.regressed and c.reference == "" and c.p_value < 0.01


def synthetic_matrix(configs: dict[str, tuple[str, str | None]], groups: list[tuple[str, str, tuple[str, ...], tuple]]
                     ) -> Matrix:
    """A matrix of ``configs`` (name -> (build, upstream key)) and ``groups`` ((name, reference, candidates,
    speed rules or None), in this order)."""
    return Matrix(path=Path("matrix.yaml"), base_commit="0" * 40, sources=(), generation=Generation(), platforms={},
                  models={}, prompts={},
                  configs={n: RunConfig(n, build, upstream=up) for n, (build, up) in configs.items()},
                  groups={n: Group(n, ("m",), ("p",), ref, cands, Generation(),
                                   speed=None if rules is None else GroupSpeed("m", 64, 16, 5, tuple(rules)))
                          for n, ref, cands, rules in groups})


def test_upstream_in_the_same_mode_is_a_fork_configuration_s_own_key_then_its_first_group_with_a_base_reference():
    m = synthetic_matrix(
        {"base": ("base", None), "base-host": ("base", None), "base-keyed": ("base", "base"), "fork": ("fork", None),
         "pin": ("fork", "base-host"), "nopin": ("fork", None), "other": ("fork", None)},
        [("fork-vs-fork", "nopin", ("other",), None),  # a fork reference: no upstream, and the groups after it count
         ("first", "base", ("fork", "pin", "base-host"), None),  # pin keeps its own key; base-host is upstream's
         ("second", "base-host", ("fork", "nopin"), None)])  # fork keeps the first group's reference
    assert same_mode_upstream(m) == {"pin": "base-host", "fork": "base", "nopin": "base-host"}


def test_a_pair_s_factor_is_the_widest_of_its_groups_rules_per_metric_and_reference():
    m = synthetic_matrix(
        {"base": ("base", None), "fork": ("fork", None), "pin": ("fork", None), "nopin": ("fork", None)},
        [("wide", "base", ("fork", "pin", "nopin"),
          (SpeedRule("fork", "pp", factor=0.3), SpeedRule("pin", "pp", min_ratio=3.0, factor=0.0, reference="nopin"))),
         ("narrow", "base", ("fork",), (SpeedRule("fork", "pp", factor=0.1), SpeedRule("fork", "tg", factor=0.05))),
         ("no-speed", "base", ("fork",), None)])
    assert rule_factors(m) == {("fork", "pp", "base"): 0.3, ("fork", "tg", "base"): 0.05, ("pin", "pp", "nopin"): 0.0}
    rules = [{"candidate": "fork", "reference": "base", "metric": "pp", "factor": f} for f in (0.5, 0.2)]
    assert recorded_rule_factors({"rules": rules}) == {("fork", "pp", "base"): 0.5}


def test_a_ratio_needs_a_positive_reference_only_in_the_rounds_both_sides_have():
    assert round_ratios([10], [0.5]) == [20.0]  # under 1 tok/s is slow, not absent
    assert round_ratios([10], [5, 0]) == [2.0]  # the reference's round 2 has no candidate sample to divide


def test_measurements_of_another_model_generation_length_or_round_count_are_another_unit():
    b = record(measurement("a", [1, 2]), measurement("b", [1, 2], model="m2"),
               {**measurement("c", [1, 2]), "n_gen": 32}, {**measurement("d", [1, 2]), "repeats": 5})
    assert sorted(sorted(s) for s in interleaved(b).values()) == [["a"], ["b"], ["c"], ["d"]]


def test_a_rule_without_a_reference_names_none():
    b = {"rules": [{"candidate": "fork", "metric": "pp", "reference": None}]}
    assert rule_references(b) == {("fork", "pp"): []}


def test_a_reference_with_the_minimum_samples_in_both_runs_is_usable():
    both = {c: measurement(c, [1.0] * MIN_SAMPLES) for c in ("fork", "base")}
    assert choose_reference("fork", "pp", both, both, {"fork": "base"}, []) == Reference("base", UPSTREAM)


def test_a_ratio_change_is_judged_at_the_p_max_asked():
    before, after = [1.00, 1.02, 0.98, 1.01, 0.99], [0.80, 0.81, 0.79, 0.82, 0.78]
    verdict = compare_ratios(before, after, 0.1, 0.001)
    assert verdict.p_value > 0.001 and not verdict.regressed  # five rounds a side cannot reach p < 0.001
    assert compare_ratios(before, after, 0.1, 0.01).regressed


# --------------------------------------------------------------------------- the committed H200 runs


def test_the_clean_runs_are_one_series_on_one_machine():
    envs = [json.loads((EVIDENCE / r / CUDA / "environment.json").read_text(encoding="utf-8")) for r in CLEAN]
    assert len({json.dumps(e["patches"], sort_keys=True) for e in envs}) == 1 and len(envs[0]["patches"]) == 5
    assert {e["base_commit"] for e in envs} == {"0c1e57098bba43ac29e6e3b677cdceebdd22334f"}
    assert len({json.dumps(bench(r)["machine"], sort_keys=True) for r in CLEAN}) == 1


def test_per_round_pinned_over_pageable_prefill_is_noisy_inside_clean_runs():
    ratios = []
    for r in CLEAN:
        m = {x["config"]: x for x in bench(r)["measurements"]}
        ratios += round_ratios(m["cuda-pin-all"]["pp_tok_s"], m["cuda-nopin"]["pp_tok_s"])
    assert min(ratios) == pytest.approx(3.30, abs=0.01) and max(ratios) == pytest.approx(7.37, abs=0.01)


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a[5:]}-{b[5:]}" for a, b in PAIRS])
def test_triage_finds_no_regression_between_clean_runs_of_one_series(a, b):
    report = triage.diff_runs(EVIDENCE / a, EVIDENCE / b, upstream=UPSTREAM_OF)
    assert len(report.speed_changes) == 8 and not report.speed_not_comparable
    assert report.regressions == []


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a[5:]}-{b[5:]}" for a, b in PAIRS])
def test_pinned_prefill_at_half_speed_is_a_regression_and_at_0_8_at_least_suspect(a, b):
    half = change(compare_bench(CUDA, bench(a), with_pinned_pp_scaled(bench(b), 0.5), UPSTREAM_OF),
                  "cuda-pin-all", "pp")
    assert half.verdict == REGRESSION and half.reference == "cuda-nopin", half
    slower = change(compare_bench(CUDA, bench(a), with_pinned_pp_scaled(bench(b), 0.8), UPSTREAM_OF),
                    "cuda-pin-all", "pp")
    assert slower.verdict in (REGRESSION, SUSPECT), slower


def test_the_command_exits_1_on_the_planted_half_speed_and_0_on_the_clean_pair(tmp_path, capsys):
    a, b = EVIDENCE / CLEAN[0], tmp_path / "planted"
    shutil.copytree(EVIDENCE / CLEAN[-1], b)
    assert triage.main([str(a), str(b), "--matrix", str(ROOT / "matrix.yaml")]) == 0
    path = b / CUDA / "speed" / "bench.json"
    path.write_text(json.dumps(with_pinned_pp_scaled(json.loads(path.read_text()), 0.5)), encoding="utf-8")
    assert triage.main([str(a), str(b), "--matrix", str(ROOT / "matrix.yaml")]) == 1
    text = capsys.readouterr().out
    assert "cuda-pin-all moe-large pp" in text and "REGRESSION" in text and "vs cuda-nopin (fork-only)" in text


def test_the_suspects_between_clean_runs_are_the_ones_docs_speed_md_lists():
    suspects = {(a[5:17], b[5:17]): sorted(f"{c.config} {c.metric}" for c in
                                           compare_bench(CUDA, bench(a), bench(b), UPSTREAM_OF) if c.suspect)
                for a, b in PAIRS}
    assert {k: v for k, v in suspects.items() if v} == {
        ("20261201T223", "20261202T005"): ["cuda-nopin tg", "cuda-pin-all tg"],
        ("20261202T020", "20261202T050"): ["cuda-nopin pp", "cuda-nopin tg"],
        ("20261202T033", "20261202T050"): ["base pp", "cuda-nopin pp", "cuda-pin-all tg"]}


def test_later_to_earlier_half_speed_is_a_regression_in_8_of_10_pairs_suspect_in_2_and_clean_has_none():
    verdicts = [change(compare_bench(CUDA, bench(b), with_pinned_pp_scaled(bench(a), 0.5), UPSTREAM_OF),
                       "cuda-pin-all", "pp").verdict for a, b in PAIRS]
    assert verdicts.count(REGRESSION) == 8 and verdicts.count(SUSPECT) == 2
    assert not any(c.regressed for a, b in PAIRS for c in compare_bench(CUDA, bench(b), bench(a), UPSTREAM_OF))


# --------------------------------------------------------------------------- records of the pair-by-pair stage

#: The first committed clean H200 run of the pair-by-pair speed stage (every set of rounds named by its pair),
#: the same series and machine fingerprint as CLEAN, and the run of the 512 KiB upload plant after it.
PAIRWISE = "gpu1-20261202T165838Z"
PLANTED_512 = "plant-cuda-pinned-uploads-in-512-kib-pieces-20261202T172353Z"
EARLIER = [*CLEAN, "gpu1-20261202T142857Z"]  # one set of rounds per unit, as every record before


def test_the_pair_by_pair_run_is_the_clean_runs_series_on_their_machine():
    env = json.loads((EVIDENCE / PAIRWISE / CUDA / "environment.json").read_text(encoding="utf-8"))
    first = json.loads((EVIDENCE / CLEAN[0] / CUDA / "environment.json").read_text(encoding="utf-8"))
    assert env["patches"] == first["patches"] and bench(PAIRWISE)["machine"] == bench(CLEAN[0])["machine"]
    assert all(m.get("interleaved") for m in bench(PAIRWISE)["measurements"])
    assert not any(m.get("interleaved") for r in EARLIER for m in bench(r)["measurements"])


@pytest.mark.parametrize("a", EARLIER, ids=[r[5:] for r in EARLIER])
def test_a_record_of_one_set_per_unit_and_one_of_sets_per_pair_are_judged_against_each_other(a):
    for before, after in ((a, PAIRWISE), (PAIRWISE, a)):
        changes = compare_bench(CUDA, bench(before), bench(after), UPSTREAM_OF)
        assert len(changes) >= 8 and not any(c.regressed for c in changes), (before, after)
        pinned = [c for c in changes if (c.config, c.metric) == ("cuda-pin-all", "pp")]
        assert any(c.reference == "cuda-nopin" for c in pinned), (before, after)


@pytest.mark.parametrize("a", EARLIER, ids=[r[5:] for r in EARLIER])
def test_pinned_prefill_scaled_in_the_pair_by_pair_run_is_still_caught(a):
    for factor, caught in ((0.5, {REGRESSION}), (0.8, {REGRESSION, SUSPECT})):
        changes = compare_bench(CUDA, bench(a), with_pinned_pp_scaled(bench(PAIRWISE), factor), UPSTREAM_OF)
        pinned = [c for c in changes if (c.config, c.metric) == ("cuda-pin-all", "pp")]
        assert pinned and all(c.verdict in {REGRESSION, SUSPECT} for c in pinned), (factor, pinned)
        assert {c.verdict for c in pinned} & caught, (factor, pinned)
    half = compare_bench(CUDA, bench(a), with_pinned_pp_scaled(bench(PAIRWISE), 0.5), UPSTREAM_OF)
    assert any(c.regressed for c in half if (c.config, c.metric) == ("cuda-pin-all", "pp"))


def test_the_512_kib_plant_is_a_regression_against_upstream_s_pinned_host_experts():
    changes = compare_bench(CUDA, bench(PAIRWISE), bench(PLANTED_512), UPSTREAM_OF)
    regressed = [c for c in changes if c.regressed]
    assert [(c.config, c.metric, c.reference, c.reference_kind) for c in regressed] == [
        ("cuda-pin-all", "pp", "cuda-base-host-experts", UPSTREAM)]
    assert regressed[0].vs_reference_ratio == pytest.approx(0.83, abs=0.03)


# --------------------------------------------------------------------------- back-to-back runs on one H200

NOISE = EVIDENCE / "h200-noise-20261202"
SPEED_0312 = EVIDENCE / "h200-speed-20261203"
#: The speed stage of every one-GPU group with rules, 11 times back to back on one machine with the
#: matrix's settings (benchmarks/speed_stage.py noise, docs/speed.md "Noise").
STAGE = sorted(p for p in (NOISE / "stage").iterdir())
ORDERED = [(a, b) for a in STAGE for b in STAGE if a != b]


def noise_bench(run: Path) -> dict:
    return json.loads((run / CUDA / "speed" / "bench.json").read_text(encoding="utf-8"))


def test_the_back_to_back_runs_are_the_clean_series_on_the_committed_runs_machine():
    assert len(STAGE) == 11
    assert {json.dumps(noise_bench(r)["machine"], sort_keys=True) for r in STAGE} == \
        {json.dumps(bench(CLEAN[0])["machine"], sort_keys=True)}
    assert all(len(noise_bench(r)["rules"]) == 10 for r in STAGE)


@pytest.mark.slow  # thousands of Mann-Whitney U tests over the committed runs (docs/ci.md#where-the-suites-time-goes)
def test_triage_between_back_to_back_runs_finds_no_regression_by_the_measured_spreads():
    """At the matrix's factors alone triage finds 13 regressions in the 110 ordered pairs of the engine of before,
    every one the fork against upstream with every weight in VRAM; judged by each ratio's measured cross-run
    spread (harness.triage.speed_spread), none, and each of the 13 is suspect."""
    benches = {r: noise_bench(r) for r in STAGE}
    by_factors = [(a, b) for a, b in ORDERED for c in compare_bench(CUDA, benches[a], benches[b], UPSTREAM_OF, FACTORS)
                  if c.regressed and (c.config, c.reference) == ("fork", "base")]
    # the requirement: the matrix's factors alone would call clean back-to-back runs regressions (13 of the 110
    # ordered pairs in the record of 2026-12-02 below), which is why each ratio is judged by its measured spread
    assert by_factors
    assert len(by_factors) == 13  # record of the measured data (h200-noise-20261202), not a requirement
    spreads = committed()
    judged = [c for a, b in ORDERED for c in compare_bench(CUDA, benches[a], benches[b], UPSTREAM_OF, FACTORS, spreads)]
    assert not [c for c in judged if c.regressed]
    for a, b in by_factors:
        fork = [c for c in compare_bench(CUDA, benches[a], benches[b], UPSTREAM_OF, FACTORS, spreads)
                if (c.config, c.reference) == ("fork", "base") and c.suspect]
        assert fork and "clean runs" in fork[0].why, (a.name, b.name)


@pytest.mark.slow  # thousands of Mann-Whitney U tests over the committed runs (docs/ci.md#where-the-suites-time-goes)
def test_pinned_prefill_at_half_and_0_8_speed_is_a_regression_in_every_back_to_back_pair():
    benches = {r: noise_bench(r) for r in STAGE}
    for factor in (0.5, 0.8):
        for a, b in ORDERED:
            pinned = [c for c in compare_bench(CUDA, benches[a], with_pinned_pp_scaled(benches[b], factor),
                                               UPSTREAM_OF, FACTORS) if (c.config, c.metric) == ("cuda-pin-all", "pp")]
            assert pinned and any(c.regressed for c in pinned), (factor, a.name, b.name)


def test_every_clean_h200_run_passes_the_shipped_rules_of_the_fork_on_default_settings():
    """The ten back-to-back runs of the speed stage with the engine that decodes through llama_process and the
    default-mode pair measured across five processes a side (2026-12-03), judged again by the shipped rules: every
    rule passes.  The records of the engine of before are another instrument, judged by the factors they were."""
    runs = sorted(SPEED_0312.glob("stage/*/linux-x86_64-cuda/speed/bench.json"))
    assert len(runs) == 10
    rules = {(g, r.candidate, r.metric, r.reference): r for g, grp in MATRIX.groups.items() if grp.speed
             for r in grp.speed.rules}
    judged = 0
    for path in runs:
        record_ = json.loads(path.read_text(encoding="utf-8"))
        assert instrument(record_) == 2
        for r in record_["rules"]:
            rule = rules[(r["group"], r["candidate"], r["metric"], r["reference"])]
            verdict = judge(r["reference_tok_s"], r["candidate_tok_s"], rule.min_ratio, rule.factor, rule.p_max)
            assert not verdict.regressed, (path, r["step"], verdict)
            judged += 1
    assert judged == 10 * 10


@pytest.mark.slow  # thousands of Mann-Whitney U tests over the committed runs (docs/ci.md#where-the-suites-time-goes)
def test_every_ordered_pair_of_the_committed_clean_h200_runs_is_free_of_regressions():
    """Triage of every ordered pair of the committed clean H200 runs (2026-12-01 to 12-03, several machines of one
    fingerprint, both instruments; only pairs of one instrument compare): no regression, where the matrix's factors
    alone give some.  And with run B's default-mode pp or tg of the fork scaled by 0.88 (a 12 % loss), the pairs of
    the instrument of 2026-12-03 that report it."""
    runs = [d for d in run_dirs_under(EVIDENCE) if clean(d) and (d / CUDA / "speed" / "bench.json").is_file()]
    benches = {d: noise_bench(d) for d in runs}
    spreads = committed()
    pairs = [(a, b) for a in runs for b in runs if a != b and instrument(benches[a]) == instrument(benches[b])
             and benches[a].get("machine") == benches[b].get("machine")]
    assert len(runs) >= 70 and len(pairs) > 3000
    without = sum(c.regressed for a, b in pairs[::7] for c in compare_bench(CUDA, benches[a], benches[b], UPSTREAM_OF,
                                                                            FACTORS))
    assert without > 0
    assert not [(a.name, b.name, c.config, c.metric) for a, b in pairs
                for c in compare_bench(CUDA, benches[a], benches[b], UPSTREAM_OF, FACTORS, spreads) if c.regressed]
    new = [(a, b) for a, b in pairs if instrument(benches[a]) == 2]
    # of 2026-12-03: ten back-to-back runs and the clean compare-1gpu run (gpu1-20261203T233251Z), the default-mode
    # pair on moe-large; of 2026-12-04: ten back-to-back runs and gpu1-20261204T073536Z, the pair on moe-48l-quant
    assert len(new) == 22 * 21
    flagged: Counter = Counter()
    missed = []
    for a, b in new:
        for metric in ("pp", "tg"):
            slower = copy.deepcopy(benches[b])
            for m in slower["measurements"]:
                if m["config"] == "fork":
                    m[f"{metric}_tok_s"] = [x * 0.88 for x in m[f"{metric}_tok_s"]]
            for c in compare_bench(CUDA, benches[a], slower, UPSTREAM_OF, FACTORS, spreads):
                if (c.config, c.metric, c.reference) == ("fork", metric, "base"):
                    flagged[(c.model, metric, c.regressed or c.suspect)] += 1
                    if not (c.regressed or c.suspect):
                        missed.append((a.name, b.name, c.model, metric, c.vs_reference_ratio,
                                       spreads[(CUDA, 2, c.model, "fork", metric, "base")].smallest))
    # the requirement: a 12 % loss of the fork against upstream is reported in every pair where it moved the ratio
    # further than two clean runs of that model have moved it (the ratio's measured spread); it may go unreported
    # only where the change stays within that spread, and never in tg, whose spread is narrower than the loss
    assert missed and not [m for m in missed if m[3] == "tg"]
    assert not [m for m in missed if m[4] < m[5]], [m for m in missed if m[4] < m[5]]
    assert all(flagged[(model, "tg", True)] == 110 for model in ("moe-large", "moe-48l-quant"))
    # record of the measured data (evidence of 2026-12-03 and 12-04), beside the requirement above: which pairs
    # leave the loss within the spread.  A 12 % loss of the fork is reported in every pair of one model but two
    # kinds: moe-large's prefill, whose F16
    # experts' prefill moves up to 1.26x between engine processes (docs/speed.md), and one quantized pair, whose run A
    # measured the fork's pp at 0.970x upstream's (the lowest of its ten runs) and run B's scaled one at 0.910x: a
    # change of 0.938x, no further than two clean runs have moved
    assert flagged == {("moe-large", "tg", True): 110, ("moe-large", "pp", True): 74, ("moe-large", "pp", False): 36,
                       ("moe-48l-quant", "tg", True): 110, ("moe-48l-quant", "pp", True): 109,
                       ("moe-48l-quant", "pp", False): 1}

def test_a_pair_restored_from_the_result_cache_is_no_run_of_its_own_in_the_spreads():
    """gpu1-20261204T073536Z took its default-mode pair from the result cache of the last back-to-back run before it
    (the same builds): those samples are that run's, so the spreads count them once."""
    run = EVIDENCE / "gpu1-20261204T073536Z"
    assert [p["cached"] for p in noise_bench(run)["pairs"] if p["model"] == "moe-48l-quant"] == ["20261204T072658Z-1475"]
    (ratios,) = median_ratios(run).values()
    assert ("moe-48l-quant", "fork", "pp", "base") not in ratios
    assert ("moe-large", "cuda-pin-all", "pp", "cuda-base-host-experts") in ratios



def test_a_cached_pair_leaves_out_only_its_own_rounds_and_the_live_pairs_of_its_model_and_tokens_still_count(tmp_path):
    """A pair restored from the result cache is matched by its model and configurations (fde79b0): another set of
    rounds of the same model, tokens and repeats, measured live in the run, keeps its four ratios (two
    configurations, both directions, pp and tg); matching by model and tokens alone would leave out none of the
    cached pair's and all of the live pair's."""
    def side(config, pair, rounds, pp):
        return {"config": config, "model": "m", "n_prompt": 64, "n_gen": 16, "repeats": 3, "pair": list(pair),
                "interleaved": rounds, "pp_tok_s": pp, "tg_tok_s": pp}
    bench_ = {"machine": {"cpu": "x"}, "instrument": 2,
              "pairs": [{"configs": ["base", "fork"], "model": "m", "n_prompt": 64, "n_gen": 16, "repeats": 3,
                         "cached": "r0"},
                        {"configs": ["nopin", "pin"], "model": "m", "n_prompt": 64, "n_gen": 16, "repeats": 3}],
              "measurements": [side("base", ("base", "fork"), "1", [10, 10, 10]),
                               side("fork", ("base", "fork"), "1", [9, 9, 9]),
                               side("nopin", ("nopin", "pin"), "2", [10, 10, 10]),
                               side("pin", ("nopin", "pin"), "2", [12, 12, 12])]}
    speed_dir = tmp_path / "run" / CUDA / "speed"
    speed_dir.mkdir(parents=True)
    (speed_dir / "bench.json").write_text(json.dumps(bench_), encoding="utf-8")
    (ratios,) = median_ratios(tmp_path / "run").values()
    assert ratios == {("m", "pin", "pp", "nopin"): 1.2, ("m", "pin", "tg", "nopin"): 1.2,
                      ("m", "nopin", "pp", "pin"): pytest.approx(10 / 12), ("m", "nopin", "tg", "pin"): pytest.approx(10 / 12)}



def test_a_spread_is_the_smallest_change_between_clean_runs_of_one_machine_and_instrument(tmp_path):
    """measure(): over every ordered pair of clean runs of one platform, instrument and machine, a ratio's
    smallest change (run B's median ratio over run A's), the pairs and runs it was measured over.  A failed run, a
    planted fault's (``plant-*``) and a run of another machine are no yardstick: their ratios, far lower, change
    nothing."""
    def run(name, ratio, overall="passed", machine="x"):
        d = tmp_path / name
        (d / CUDA / "speed").mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"run_id": name, "record_version": 1, "overall": overall,
                                                    "configurations": [], "comparisons": []}))
        (d / CUDA / "speed" / "bench.json").write_text(json.dumps(
            {"machine": {"cpu": machine}, "instrument": 2,
             "measurements": [measurement("base", [100.0] * 3), measurement("fork", [100.0 * ratio] * 3)]}))
        return d
    runs = [run("r1", 1.0), run("r2", 0.8), run("r3", 0.9), run("r4", 0.1, overall="failed"),
            run("plant-r5", 0.1), run("r6", 0.1, machine="y")]
    assert [clean(d) for d in runs] == [True, True, True, False, False, True]
    spreads = measure(runs)
    fork = spreads[(CUDA, 2, "m", "fork", "pp", "base")]
    assert (fork.smallest, fork.pairs, fork.runs) == (pytest.approx(0.8), 6, 3)
    assert fork.factor == pytest.approx(0.25)
    base = spreads[(CUDA, 2, "m", "base", "pp", "fork")]  # the other direction: 1/0.8 over 1/1.0 at most
    assert base.smallest == pytest.approx(0.8 / 1.0)
    assert {k[2:] for k in spreads} == {("m", c, metric, r) for c, r in (("fork", "base"), ("base", "fork"))
                                        for metric in ("pp", "tg")}


def test_a_ratio_s_spread_is_its_model_s():
    """The default-mode pair measured on moe-large (2026-12-03) and on moe-48l-quant (2026-12-04) by the same engine
    on machines of one fingerprint: each model keeps its own spread (harness.triage.speed_spread.Key), the F16
    experts' prefill moving about three times as far as the quantized one's."""
    spreads = committed()
    large = spreads[(CUDA, 2, "moe-large", "fork", "pp", "base")]
    quant = spreads[(CUDA, 2, "moe-48l-quant", "fork", "pp", "base")]
    # the requirement: two models' spreads are kept apart, the F16 experts' prefill the wider
    assert large is not quant and large.smallest < quant.smallest < 1
    # record of the measured data (2026-12-03 and 12-04), not a requirement: the runs and the spreads they showed
    assert (large.runs, quant.runs) == (11, 10)
    assert large.smallest == pytest.approx(0.819, abs=0.001) and quant.smallest == pytest.approx(0.938, abs=0.001)
