"""Input files are UTF-8 text or refused: a matrix, a patch or a series file with a byte that is not UTF-8 is
exit 2, naming the file, its line and the byte offset, never a traceback (harness.common.fs.read_utf8)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _plant_ff(path: Path, after: bytes) -> int:
    """Put byte 0xff into ``path`` right after the first ``after``; returns its offset."""
    data = path.read_bytes()
    at = data.index(after) + len(after)
    path.write_bytes(data[:at] + b"\xff" + data[at:])
    return at


def _harness(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_matrix_copy_inside_the_checkout_with_0xff_in_a_prompt_is_exit_2_naming_file_and_offset():
    copy = ROOT / "m3-not-utf8.yaml"  # inside the checkout, as the reproduction had it
    try:
        shutil.copy(ROOT / "matrix.yaml", copy)
        offset = _plant_ff(copy, b"text: ")
        done = _harness("compare-outputs", "--platform", "linux-x86_64-cpu", "--matrix", copy.name)
    finally:
        copy.unlink(missing_ok=True)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "UnicodeDecodeError" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {copy.name}:") and f"byte offset {offset} (0xff" in line
    assert line.count("error:") == 1


def test_a_patch_and_a_series_file_that_are_not_utf8_are_exit_2_naming_them(tmp_path):
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    first = sorted(patches.glob("*.patch"))[0]
    offset = _plant_ff(first, b"Subject: ")
    done = _harness("build", "--platform", "linux-x86_64-cpu", "--patches-dir", str(patches))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {first}:") and f"byte offset {offset} (0xff" in line
    shutil.copy(ROOT / "patches" / first.name, first)  # the patch whole again: now the series file
    _plant_ff(patches / "series", b"\n")
    done = _harness("patches", "check", "--patches-dir", str(patches))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {patches / 'series'}:2: the series file is not UTF-8 text: byte offset")


def test_the_shipped_matrix_and_patches_read_as_utf8():
    from harness.common.fs import read_utf8
    for path in [ROOT / "matrix.yaml", ROOT / "patches" / "series", *sorted((ROOT / "patches").glob("*.patch"))]:
        read_utf8(path, "input")
