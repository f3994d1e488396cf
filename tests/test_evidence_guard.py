"""The suite's guard over the committed evidence (tests/conftest.py): a file a test adds, removes or rewrites
under results/evidence/ is named, and the session fails."""

from __future__ import annotations

import os

from conftest import changed_files, file_state


def test_a_file_added_removed_or_rewritten_is_named_and_an_untouched_one_is_not(tmp_path):
    (tmp_path / "run").mkdir()
    for name in ("run/summary.json", "run/kept.json", "gone.md"):
        (tmp_path / name).write_text("{}")
    before = file_state(tmp_path)
    assert set(before) == {"run/summary.json", "run/kept.json", "gone.md"}
    (tmp_path / "run" / "new.json").write_text("{}")
    (tmp_path / "gone.md").unlink()
    summary = tmp_path / "run" / "summary.json"
    stat = summary.stat()
    summary.write_text("{}")  # the same size and bytes, written again: its time tells
    os.utime(summary, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert changed_files(before, file_state(tmp_path)) == ["added run/new.json", "changed run/summary.json",
                                                          "removed gone.md"]
    assert changed_files(before, before) == []
