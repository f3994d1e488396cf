"""harness.tools.same_run: two runs of one command are the same run, times and build keys aside; a changed
status, detail or comparison is named."""

from __future__ import annotations

import copy
import json

from harness.tools.same_run import differences, main

RUN = {
    "run_id": "a", "overall": "passed", "skipped_platforms": {}, "incomplete": [],
    "configurations": [
        {"platform": "p", "config": "fork", "step": "build", "status": "passed", "seconds": 22.8,
         "detail": "built in 23 s (key bf14a0ad19ee62e3)", "up_to_date": False},
        {"platform": "p", "config": "fork", "step": "generate", "status": "passed", "seconds": 110.0,
         "detail": "20 generations in 1 min 50 s"},
        {"platform": "p", "config": "fork", "step": "speed:g:pp", "status": "passed", "seconds": 7.0,
         "detail": "pp m: no slowdown by the rule: 158.6 vs 136.6 tok/s (medians of 5 and 5): 1.16x, no slowdown "
                   "asked (fails below 0.909x with p <= 0.01); Mann-Whitney p = 0.925 vs base"}],
    "comparisons": [{"platform": "p", "group": "g", "model": "m", "prompt": "x", "reference": "base",
                     "candidate": "fork", "status": "identical", "first_divergence": None}],
}


def test_another_runs_times_and_build_keys_are_the_same_run():
    other = copy.deepcopy(RUN)
    other["run_id"] = "b"
    other["configurations"][0].update(seconds=40.1, detail="built in 40 s (key 0123456789abcdef)", up_to_date=True)
    other["configurations"][1].update(seconds=90.0, detail="20 generations in 1 min 30 s")
    other["configurations"][2]["detail"] = ("pp m: no slowdown by the rule: 293.7 vs 248.4 tok/s (medians of 5 and 5): "
                                            "1.18x, no slowdown asked (fails below 0.909x with p <= 0.01); "
                                            "Mann-Whitney p = 0.345 vs base")
    assert differences(RUN, other) == []
    other["configurations"][2]["detail"] = other["configurations"][2]["detail"].replace("0.909x", "0.800x")
    assert differences(RUN, other) == [f"steps[2] detail: {x!r} before, {y!r} after" for x, y in [(
        "pp m: no slowdown by the rule: … vs … tok/s (medians of 5 and 5): …x, no slowdown asked (fails below "
        "0.909x with p <= 0.01); Mann-Whitney p = … vs base",
        "pp m: no slowdown by the rule: … vs … tok/s (medians of 5 and 5): …x, no slowdown asked (fails below "
        "0.800x with p <= 0.01); Mann-Whitney p = … vs base")]]


def test_a_changed_status_detail_or_comparison_is_named(tmp_path):
    other = copy.deepcopy(RUN)
    other["configurations"][1]["detail"] = "19 generations in 1 min 50 s"
    other["comparisons"][0].update(status="diverged", first_divergence={"index": 3})
    other["overall"] = "failed"
    found = differences(RUN, other)
    assert found == ["overall: 'passed' before, 'failed' after",
                     "steps[1] detail: '20 generations in … s … s' before, '19 generations in … s … s' after",
                     "comparisons[0] first_divergence: None before, {'index': 3} after",
                     "comparisons[0] status: 'identical' before, 'diverged' after"]
    for name, data in (("a", RUN), ("b", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(data))
    assert main([str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert main([str(tmp_path / "a"), str(tmp_path / "none")]) == 2


def test_a_speed_steps_named_ratio_is_masked_and_its_name_kept():
    """Since the speed stage names its ratio (median of within-round ratios), the number is masked after the name;
    a run judged by the other ratio is a difference."""
    named = copy.deepcopy(RUN)
    named["configurations"][2]["detail"] = named["configurations"][2]["detail"].replace(
        "5): 1.16x", "5): median of within-round ratios 1.16x")
    other = copy.deepcopy(named)
    other["configurations"][2]["detail"] = other["configurations"][2]["detail"].replace("1.16x", "0.98x")
    assert differences(named, other) == []
    other["configurations"][2]["detail"] = other["configurations"][2]["detail"].replace(
        "median of within-round ratios", "ratio of medians")
    [found] = differences(named, other)
    assert "5): median of within-round ratios …x" in found and "5): ratio of medians …x" in found
