"""The report's "Changes" section against the committed H200 runs: triage's own choice of the earlier run
(the same patch series, platforms and groups), triage's findings first, new records folded."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness.views import report
from harness.triage.run_choice import TriageInputError, previous_run, recorded_series

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "results" / "evidence"
RUN = EVIDENCE / "gpu1-20261204T073536Z"
EARLIER = EVIDENCE / "gpu1-20261203T233251Z"
CUDA = "linux-x86_64-cuda"


def _changes(html: str) -> str:
    start = html.index('<section id="changes">')
    return html[start:html.index("</section>", start)]


def test_the_previous_run_is_of_the_same_series_platforms_and_groups():
    """Between the two clean one-GPU runs lie the numerics control (other groups) and two planted faults
    (another series, as their environment.json records it): none of them is the earlier state of the run."""
    between = [EVIDENCE / "kl-gpu1-20261204T072134Z", EVIDENCE / "plant-oob-20261204T073224Z",
               EVIDENCE / "plant-reload-20261204T073318Z"]
    assert recorded_series(between[1], CUDA) != recorded_series(RUN, CUDA)
    assert previous_run(RUN, EVIDENCE) == EARLIER.resolve()
    assert report.default_baseline(RUN) == EARLIER.resolve()


def test_a_planted_fault_has_no_clean_run_as_its_previous_state():
    with pytest.raises(TriageInputError, match="series"):
        previous_run(EVIDENCE / "plant-reload-20261204T073318Z", EVIDENCE)


@pytest.mark.parametrize("against", [report.PREVIOUS, EARLIER], ids=["triage's choice", "a full path"])
def test_triages_suspect_leads_the_changes(against):
    """Nothing changed status between the two runs; triage flags one speed change as suspect
    (cuda-pin-all against cuda-pin-layers-half, 0.906x), and the section says so first."""
    section = _changes(report.render_html(RUN, against))
    assert "Changes since gpu1-20261203T233251Z" in section
    rows = re.findall(r"<tr class=\"([a-z]+)\"><td>([a-z]+)</td><td>[^<]*</td><td>([^<]*)</td><td>([^<]*)", section)
    assert rows[0][:3] == ("suspect", "suspect", "cuda-pin-all moe-large pp vs cuda-pin-layers-half"), rows
    assert "(0.906x)" in rows[0][3]
    assert "1 suspect speed change(s)" in section


def test_records_new_in_the_run_are_folded_below_the_findings():
    """Against the numerics-only run, the run's 70-odd steps and comparisons are new: folded, not in the table."""
    section = _changes(report.render_html(RUN, EVIDENCE / "kl-gpu1-20261204T072134Z"))
    head, _, folded = section.partition("<details>")
    assert "absent" not in head and "nothing that ran in both runs changed its status" in head
    assert folded.count("absent") > 50 and re.search(r"<summary>\d+ record\(s\) new in this run", "<details>" + folded)


def test_against_takes_a_run_id_beside_the_run(tmp_path, capsys):
    """A name is looked for beside the run, where the default baseline is found, before --results-dir (copies
    of both runs: ``report`` writes the run's summary.md again)."""
    beside = tmp_path / "beside"
    run = Path(shutil.copytree(RUN, beside / RUN.name))
    shutil.copytree(EARLIER, beside / EARLIER.name)
    out = tmp_path / "report.html"
    assert report.main([str(run), "--against", EARLIER.name, "--results-dir", str(tmp_path), "--out", str(out)]) == 0
    assert "Changes since gpu1-20261203T233251Z" in out.read_text()
    with pytest.raises(TriageInputError, match="unknown run 'nope'"):
        report.against_run("nope", RUN, tmp_path)
