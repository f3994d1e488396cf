"""One speed ratio, named: the speed stage, the summary, the report, the history and triage show the same
number for the same pair, the median of within-round ratios (harness.common.statistics.within_round_ratio)."""

import re
from pathlib import Path

import pytest

from harness.views.report import markdown_summary, render_html
from harness.triage.speed_diff import compare_speed
from harness.triage.triage import _speed_line
from harness.common.statistics import OF_MEDIANS, WITHIN_ROUND, judge, round_ratios, within_round_ratio
from harness.record.bench import read_bench, rule_ratio

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "results" / "evidence"
CUDA = "linux-x86_64-cuda"
# two H200 runs of the same series and instrument, a day apart: triage compares every rule's pair
A, B = EVIDENCE / "gpu1-20261204T073536Z", EVIDENCE / "gpu1-20261205T030752Z"


def test_rounds_that_drift_give_one_ratio_not_the_ratio_of_medians():
    """The issue's CPU run: the base build sped up in its late rounds, so its median (228.1) and the fork's
    (169.5) come from different rounds: 0.74x as a ratio of medians, 0.995x round by round."""
    base = [228.1, 240.0, 250.0, 170.0, 165.0]
    fork = [227.0, 239.0, 169.5, 169.2, 164.2]
    ratio = within_round_ratio(base, fork)
    assert ratio == pytest.approx(0.995, abs=0.001)
    paired, unpaired = judge(base, fork, paired=True), judge(base, fork)
    assert paired.ratio == ratio and paired.ratio_name == WITHIN_ROUND and f"{WITHIN_ROUND} 1.00x" in paired.describe()
    assert unpaired.ratio == pytest.approx(169.5 / 228.1) and unpaired.ratio_name == OF_MEDIANS
    with pytest.raises(ValueError):
        within_round_ratio([], [1.0])


def test_round_ratios_pair_the_rounds_both_sides_have_and_refuse_a_reference_that_is_not_positive():
    """Round i of the candidate over round i of the reference, over the rounds both sides have: a reference
    sample past the candidate's last round is neither paired nor checked.  A reference of 0 (or less) tok/s
    is refused in words naming the samples; any positive one, even below 1 tok/s, is a measurement."""
    assert round_ratios([3.0, 1.0], [2.0, 0.5, 0.0]) == [1.5, 2.0]
    assert within_round_ratio([2.0, 0.5, 0.0], [3.0, 1.0]) == 1.75
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^reference samples must be positive tok/s: \[2\.0, {bad}\]$"):
            round_ratios([1.0, 1.0], [2.0, bad])
    with pytest.raises(ValueError, match="^no round on both sides$"):
        within_round_ratio([], [1.0])


@pytest.fixture(scope="module")
def views():
    changes, _ = compare_speed(A, B)
    return changes, render_html(B, None), markdown_summary(B)


def test_triage_and_the_report_give_the_same_ratio_for_the_same_pair(views):
    changes, html, md = views
    rules = read_bench(B, CUDA)["rules"]
    checked = differs = 0
    for c in changes:
        if not c.reference:
            continue
        rule = next((r for r in rules if (r["candidate"], r["reference"], r["metric"]) == (c.config, c.reference, c.metric)),
                    None)
        if rule is None:
            continue
        shown = rule_ratio(rule)
        assert shown and shown.name == WITHIN_ROUND and shown.value == c.after_vs_reference
        text = f"{c.after_vs_reference:.2f}x ({WITHIN_ROUND})"
        row = next(r for r in html.split("<tr") if f"{c.config} vs {c.reference}</td><td>{c.metric}<" in r)
        assert text in row, row
        md_row = next(line for line in md.splitlines() if f"| {c.config} vs {c.reference} | {c.metric} |" in line)
        assert text in md_row, md_row
        assert f"{WITHIN_ROUND}: " in _speed_line(c) and f"-> {c.after_vs_reference:.3g}x" in _speed_line(c)
        checked += 1
        differs += abs(rule["ratio"] - c.after_vs_reference) > 0.05  # recorded as a ratio of medians then
    assert checked >= 8 and differs >= 2


def test_the_history_plots_the_same_ratio_and_names_it(views):
    _, html, _ = views
    rule = next(r for r in read_bench(B, CUDA)["rules"] if r["step"] == "speed:cuda-pin-limits:pp"
                and r["candidate"] == "cuda-sim-partial")
    assert re.search(rf"{B.name} \([^)]*\): passed, {rule_ratio(rule).value:.3f}x \({WITHIN_ROUND}\)", html)
