"""Words of the report's speed section that say what the records hold: the machine, the rank test's p
against its limit, an "at least N times" rule's outcome."""

from __future__ import annotations

from pathlib import Path

from harness.views.report import render_html
from harness.common.statistics import judge

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "evidence" / "gpu1-20261204T073536Z"


def _speed(html: str) -> str:
    start = html.index('<section id="speed">')
    return html[start:html.index("</section>", start)]


def test_the_machine_is_named_in_words():
    speed = _speed(render_html(RUN, None))
    assert "[[" not in speed and "NVIDIA H200 (driver 580.159.04)" in speed


def test_a_passing_rules_p_is_set_against_its_limit_as_what_holds():
    """cuda-pin-all against cuda-nopin passed at 4.59x with p 1: the table says 1 > 0.01, not "1 (≤ 0.01)"."""
    speed = _speed(render_html(RUN, None))
    row = next(r for r in speed.split("<tr") if "cuda-pin-all vs cuda-nopin" in r and ">pp<" in r)
    assert "4.59x" in row and "1 &gt; 0.01" in row, row
    assert "(≤ 0.01)" not in speed


def test_an_at_least_n_times_rule_says_whether_it_fell_short():
    reference, fast, slow = [100.0, 101, 99, 100, 102], [400.0, 410, 405, 398, 402], [150.0, 151, 149, 152, 148]
    assert judge(reference, fast, 3.0).outcome() == "not short of 3x by the rule"
    assert judge(reference, slow, 3.0).outcome() == "short of 3x"
    assert judge(reference, fast).outcome() == "no slowdown by the rule"
    assert judge(reference, [50.0, 51, 49, 52, 48]).outcome() == "slowdown"
