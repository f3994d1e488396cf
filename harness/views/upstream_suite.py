"""The report's section on upstream's suite: per platform, the tests that fail on both sides, those skipped for
missing data, and test-backend-ops' perf pairs (harness.stages.native_tests.backend_ops) as upstream's
compare-llama-bench.py prints them."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Iterable

from ..record.json_files import read_record_json
from ..record.layout import RunLayout
from ..record.records import RecordError
from ..record.upstream_tests import FAILED_BOTH, read_suite


def upstream_html(run_dir: Path, platforms: Iterable[str]) -> str:
    """Upstream's suite per platform as its records say (harness.record.upstream_tests): the tests that fail on both
    sides (never proven), those skipped for missing data with the file, and test-backend-ops' perf pairs, the table
    upstream's compare-llama-bench.py prints of the same rows; '' where no platform ran the suite."""
    layout, parts = RunLayout(run_dir), []
    for platform in sorted(platforms):
        try:
            suite = read_suite(layout.upstream_file(platform, "pairs"))
        except (FileNotFoundError, RecordError):
            suite = None
        if suite is not None:
            g = suite.glance()
            rows = [(t.name, "fails on both (not proven)", t.fork_message or t.fork) for t in suite.of(FAILED_BOTH)]
            rows += [(name, "skipped for missing data", f"missing {path}") for name, path in g.missing_data.items()]
            parts.append(f'<h3>{escape(platform)}: upstream suite</h3><p>{g.passed_both} pass on both; '
                         f'{g.failed_both} fail on both; {g.regressed} regressed; {len(g.missing_data)} skipped for '
                         f'missing data; {g.declared} skipped by declaration</p>')
            if rows:
                parts.append('<table><thead><tr><th>test</th><th>class</th><th>why</th></tr></thead><tbody>'
                             + "".join(f"<tr><td>{escape(n)}</td><td>{escape(c)}</td><td>{escape(w)}</td></tr>"
                                       for n, c, w in rows) + "</tbody></table>")
        try:
            perf = read_record_json(layout.upstream_file(platform, "perf"), "test-backend-ops' perf mode did not run")
        except (FileNotFoundError, RecordError):
            continue
        cases = perf.get("cases") or []
        parts.append(f'<h3>{escape(platform)}: test-backend-ops perf, fork against base</h3><p class="muted">'
                     f'{len(cases)} cases on {escape(str(perf.get("backend") or "every backend"))}'
                     + (f'; stopped: {escape(str(perf["stopped"]))}' if perf.get("stopped") else "")
                     + f'; <code>compare-llama-bench.py -t test-backend-ops -i {escape(str(perf.get("database")))} '
                     '-b base -c fork</code> prints the same rows</p>'
                     '<table><thead><tr><th>backend</th><th>op</th><th>parameters</th><th>base GFLOPS</th>'
                     '<th>fork GFLOPS</th><th>base GB/s</th><th>fork GB/s</th><th>fork/base time</th></tr></thead><tbody>'
                     + "".join(f'<tr><td>{escape(c["backend"])}</td><td>{escape(c["op"])}</td><td>{escape(c["params"])}'
                               f'</td><td>{c.get("base_flops", 0) / 1e9:.2f}</td><td>{c.get("fork_flops", 0) / 1e9:.2f}'
                               f'</td><td>{c.get("base_gb_s", 0):.2f}</td><td>{c.get("fork_gb_s", 0):.2f}</td>'
                               f'<td>{c["ratio"]:.3f}</td></tr>' for c in cases) + "</tbody></table>")
    return "".join(parts)
