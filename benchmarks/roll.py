"""Benchmark: the wall time of a roll with no conflict, from ``roll --onto`` to roll.md.  Prints seconds.

    python benchmarks/roll.py [--platform linux-x86_64-cpu] [-j 2] [--keep DIR] [--cache]

In a fresh clone of this checkout's HEAD (the roll commits there, never here) it rolls onto a synthetic
upstream: a local repository made from this machine's cached pinned base plus one commit that adds a file
the series does not touch, so every patch applies cleanly and the builds find the pinned base's objects in
ccache (a real upstream commit also compiles what upstream changed).  The roll runs as a person runs it
(``python -m harness roll --onto PATH@COMMIT --platform P -j N``, with ``--no-cache`` unless ``--cache``:
every test and generation fresh) and its whole wall time is printed with the times roll.md records
(the series and pin; the main job), the machine and the load average.  Nothing is asserted: the numbers go
into docs/roll.md with the machine and date they came from.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.matrix.config import load_matrix  # noqa: E402
from harness.stages.building.source import cache_dir  # noqa: E402

IDENTITY = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@localhost"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENTITY}).stdout.strip()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="linux-x86_64-cpu")
    ap.add_argument("-j", "--jobs", default="2")
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary directory)")
    ap.add_argument("--cache", action="store_true", help="let the result cache serve tests and generations")
    args = ap.parse_args()
    matrix = load_matrix(ROOT / "matrix.yaml")
    cached = cache_dir() / "base" / matrix.base_commit[:12]
    if not cached.is_dir():
        print(f"the pinned base is not in the download cache ({cached}): run `nox -s source -- fetch` first")
        return 2
    top = args.keep or Path(tempfile.mkdtemp(prefix="roll-bench-"))
    top.mkdir(parents=True, exist_ok=True)
    clone, upstream = top / "checkout", top / "upstream"
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(upstream, ignore_errors=True)
    git("clone", "--quiet", str(ROOT), str(clone), cwd=top)
    git("clone", "--quiet", str(cached), str(upstream), cwd=top)
    git("checkout", "--quiet", "-b", "next", matrix.base_commit, cwd=upstream)
    (upstream / "ROLL-BENCH.md").write_text("an upstream commit the series does not touch\n")
    git("add", "ROLL-BENCH.md", cwd=upstream)
    git("commit", "--quiet", "-m", "upstream: a file the series does not touch", cwd=upstream)
    new = git("rev-parse", "HEAD", cwd=upstream)
    argv = [sys.executable, "-m", "harness", "roll", "--onto", f"{upstream}@{new}", "--platform", args.platform,
            "-j", args.jobs, *([] if args.cache else ["--no-cache"])]
    load = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=clone, env={**os.environ, **IDENTITY})
    seconds = time.monotonic() - started
    after = os.getloadavg()
    roll_md = (clone / "results" / "latest" / "roll.md")
    times = re.findall(r"^- (the .+): ([0-9.]+) s$", roll_md.read_text(), re.M) if roll_md.is_file() else []
    print(f"\nroll benchmark, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_name()}, {os.cpu_count()} cores, "
          f"load average {load[0]:.1f} before, {after[0]:.1f} after")
    print(f"  roll --onto {upstream}@{new[:12]} --platform {args.platform} -j {args.jobs}"
          f"{'' if args.cache else ' --no-cache'}: exit {proc.returncode}, {seconds:.1f} s ({seconds / 60:.1f} min)")
    for what, value in times:
        print(f"  {what}: {value} s")
    print(f"  roll.md: {roll_md}" if roll_md.is_file() else "  no roll.md")
    if args.keep is None:
        shutil.rmtree(top, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
