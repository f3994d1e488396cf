"""The GPU machine's wheel selection (.ci/lock_subset.py): the lock's entries whose wheels are carried, hashes kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "lock_subset.py"
LOCK = ROOT / ".ci" / "requirements-gpu.txt"


def run(wheel_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(LOCK), str(wheel_dir)], capture_output=True, text=True)


def test_only_the_carried_wheels_entries_are_printed_with_their_hashes(tmp_path):
    for name in ("PyYAML-6.0.3-cp312-cp312-manylinux_2_17_x86_64.whl", "jsonschema-4.26.0-py3-none-any.whl",
                 "rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    names = [line.split("==")[0] for line in out.stdout.splitlines() if "==" in line]
    assert names == ["jsonschema", "pyyaml", "rpds-py"]
    assert out.stdout.count("--hash=sha256:") >= 3 and "numpy" not in out.stdout and "scipy==" not in out.stdout


def test_a_wheel_the_lock_does_not_list_is_refused_by_name(tmp_path):
    (tmp_path / "torch-2.9.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    out = run(tmp_path)
    assert out.returncode == 2 and "torch" in out.stderr and out.stdout == ""


def test_the_whole_lock_when_every_wheel_is_there(tmp_path):
    lock_names = [line.split("==")[0] for line in LOCK.read_text().splitlines() if "==" in line and line[0].isalpha()]
    for name in lock_names:
        (tmp_path / f"{name.replace('-', '_')}-1-py3-none-any.whl").write_bytes(b"")
    out = run(tmp_path)
    assert out.returncode == 0 and len([x for x in out.stdout.splitlines() if "==" in x]) == len(lock_names) >= 20
