"""report.html at 1400 px in headless Chromium: no table runs past the window, so the comparisons' KL and
top-1 columns (the last ones) and the steps' signatures are on screen, not behind a sideways scroll."""

import html
import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.views.report import render_html

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
# an H200 run whose steps table, with its long log paths and keys, ran to 1461 px in a 1400 px window
RUN = ROOT / "results" / "evidence" / "gpu1-20261205T030752Z"
WIDTH = 1400

#: Appended to the page: the window's width, the page's, and each table's right edge and header cells, as JSON.
_PROBE = """<script>
window.addEventListener('load', function () {
  var out = {page: document.documentElement.scrollWidth, view: window.innerWidth, tables: []};
  document.querySelectorAll('table').forEach(function (t) {
    out.tables.push({cls: t.className, right: t.getBoundingClientRect().right,
                     th: Array.from(t.querySelectorAll('thead th')).map(function (h) {
                       return [h.textContent, h.getBoundingClientRect().right]; })});
  });
  var pre = document.createElement('pre'); pre.id = 'layout-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.slow  # one headless Chromium: about 10 s on the 2-core development machine
@pytest.mark.debian
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
def test_no_table_scrolls_sideways_at_1400_px_and_kl_and_top1_show(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(RUN, None).replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},1000",
                           "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    layout = json.loads(html.unescape(found.group(1)))
    assert layout["view"] == WIDTH and layout["page"] <= WIDTH
    assert {"steps", "comparisons"} <= {t["cls"] for t in layout["tables"]}
    for table in layout["tables"]:
        assert table["right"] <= WIDTH, (table["cls"], table["right"])
    comparisons = next(t for t in layout["tables"] if t["cls"] == "comparisons")
    headers = dict(comparisons["th"])
    assert headers["KL mean / max (nats)"] <= WIDTH and headers["top-1 agree"] <= WIDTH
