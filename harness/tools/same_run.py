"""Two runs that must be the same run: ``python -m harness.tools.same_run BEFORE AFTER``.

A change that moves code and should change no behaviour (a refactor of the package) is proven by the
same command run before and after it, both with ``--no-cache``: the two runs' ``summary.json`` must hold
the same steps in the same order with the same statuses and details, the same comparisons with every
field equal, and the same verdict.  What differs between two honest runs is left aside: each step's
``seconds``, times said in a detail (``built in 23 s``, ``1 min 50 s``), a build's key (it hashes the
checkout's paths and the harness's own files), what a speed step measured (its tok/s, their ratio and the
test's p, in its detail: its status, the rule's verdict, is compared), and the run's id and time.

Exit status: 0 the same run, 1 a difference (each printed on a line), 2 a summary that cannot be read.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from ..common.errors import EXIT_BAD_INPUT, InputError
from ..common.statistics import OF_MEDIANS, WITHIN_ROUND
from ..record.json_files import read_summary

#: A row's verdict and why, written beside its status from the fields compared (harness.record.verdict): left
#: aside so that a run recorded before summary.json carried them compares with one after.
JUDGED = frozenset({"verdict", "why"})

#: Step fields that two honest runs of one command differ in, and the derived verdict.
STEP_FIELDS_ASIDE = frozenset({"seconds", "up_to_date"}) | JUDGED

#: Comparison fields left aside: the derived verdict only (a comparison holds no time).
COMPARISON_FIELDS_ASIDE: frozenset[str] = JUDGED

#: Times and build keys in a step's detail: ``23 s``, ``1.5 s``, ``2 min 0 s``, ``(key bf14a0ad19ee62e3)``.
_TIMES = re.compile(r"\b\d+(?:\.\d+)?\s*(?:min|ms|s)\b")
_KEYS = re.compile(r"\bkey [0-9a-f]{8,}\b")

#: What a speed step measured, in its detail (harness.stages.speed.speed): ``158.6 vs 136.6 tok/s``, the ratio
#: after the medians' count, named or not (``(medians of 5 and 5): median of within-round ratios 1.16x``; the name
#: is kept, harness.common.statistics) and ``Mann-Whitney p = 0.925``.
_MEASURED = ((re.compile(r"\d+(?:\.\d+)? vs \d+(?:\.\d+)? tok/s"), "… vs … tok/s"),
             (re.compile(rf"(\(medians of \d+ and \d+\)): ((?:{WITHIN_ROUND}|{OF_MEDIANS}) )?\d+(?:\.\d+)?x"), r"\1: \2…x"),
             (re.compile(r"Mann-Whitney p = [\d.]+(?:e-?\d+)?"), "Mann-Whitney p = …"))


def _detail(text: str) -> str:
    for pattern, mask in _MEASURED:
        text = pattern.sub(mask, text)
    return _KEYS.sub("key …", _TIMES.sub("… s", text))


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """What of a parsed summary.json two runs of one command must share: the verdict, the steps in order (their
    fields but :data:`STEP_FIELDS_ASIDE`, times and build keys in the detail masked) and the comparisons in order
    (their fields but :data:`COMPARISON_FIELDS_ASIDE`)."""
    steps = [{k: (_detail(v) if k == "detail" and isinstance(v, str) else v) for k, v in s.items()
              if k not in STEP_FIELDS_ASIDE} for s in summary.get("configurations", [])]
    comparisons = [{k: v for k, v in c.items() if k not in COMPARISON_FIELDS_ASIDE}
                   for c in summary.get("comparisons", [])]
    return {"overall": summary.get("overall"), "steps": steps, "comparisons": comparisons,
            "skipped_platforms": summary.get("skipped_platforms", {}), "incomplete": summary.get("incomplete", [])}


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per difference between two parsed summary.json files (:func:`comparable` of each); [] when they
    are the same run."""
    a, b = comparable(before), comparable(after)
    out = []
    for key in (k for k in a if k not in ("steps", "comparisons")):  # the run's own fields, in their order
        if a[key] != b[key]:
            out.append(f"{key}: {a[key]!r} before, {b[key]!r} after")
    for kind in ("steps", "comparisons"):
        if len(a[kind]) != len(b[kind]):
            out.append(f"{kind}: {len(a[kind])} before, {len(b[kind])} after")
        for i, (x, y) in enumerate(zip(a[kind], b[kind])):
            for field in sorted(set(x) | set(y)):
                if x.get(field) != y.get(field):
                    out.append(f"{kind}[{i}] {field}: {x.get(field)!r} before, {y.get(field)!r} after")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Compare the runs named by ``argv`` (two run directories); print what differs; the exit status above."""
    ap = argparse.ArgumentParser(prog="python -m harness.tools.same_run", description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path, help="the run directory before the change")
    ap.add_argument("after", type=Path, help="the run directory after it")
    args = ap.parse_args(argv)
    try:
        before, after = read_summary(args.before), read_summary(args.after)
    except (OSError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    found = differences(before, after)
    for line in found:
        print(line)
    a = comparable(before)
    print(f"{'the same run' if not found else f'{len(found)} difference(s)'}: {len(a['steps'])} steps, "
          f"{len(a['comparisons'])} comparisons, {a['overall']}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
