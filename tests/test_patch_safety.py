"""Patches that would write outside the tree, and patch files whose line endings a checkout changed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.stages.building.patches import PatchError, read_series

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def project(tmp_path):
    return make_fake_project(tmp_path)


def _only_patch(project) -> Path:
    (patch,) = project.patches.glob("*.patch")
    return patch


def _rewrite(patch: Path, old: str, new: str) -> None:
    text = patch.read_text()
    assert old in text
    patch.write_text(text.replace(old, new))


@pytest.mark.parametrize("target, why", [
    ("/tmp/harness-escape/FORK.md", "absolute path '/tmp/harness-escape/FORK.md'"),
    ("../FORK.md", "path '../FORK.md', which climbs out with '..'"),
    ("docs/../../FORK.md", "path 'docs/../../FORK.md', which climbs out with '..'"),
])
def test_a_patch_naming_a_path_outside_the_tree_is_refused_with_its_line(project, target, why):
    patch = _only_patch(project)
    _rewrite(patch, "a/FORK.md b/FORK.md", f"a/{target} b/{target}")
    _rewrite(patch, "+++ b/FORK.md", f"+++ b/{target}")
    line = next(i for i, text in enumerate(patch.read_text().splitlines(), start=1) if text.startswith("+++ "))
    with pytest.raises(PatchError) as err:
        read_series(project.patches)
    assert str(err.value).startswith(f"{patch}:{line}: the diff names the {why}")


def test_a_crlf_patch_file_is_named_as_the_cause(project):
    patch = _only_patch(project)
    patch.write_bytes(patch.read_bytes().replace(b"\n", b"\r\n"))
    with pytest.raises(PatchError, match=r"has CRLF \(Windows\) line endings.*core.autocrlf"):
        read_series(project.patches)


def test_content_lines_with_crlf_are_not_taken_for_a_converted_file(project):
    patch = _only_patch(project)
    _rewrite(patch, "+the fork's notes\n", "+the fork's notes\r\n")
    assert [p.name for p in read_series(project.patches)] == [patch.name]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_the_build_refuses_an_absolute_path_patch_as_input_and_nothing_lands_anywhere(project):
    # a patch that names a path outside the tree is bad input, refused before any work as `patches check`
    # refuses it (issue 43): exit 2, one error line naming the patch and its line, no run, no tree
    patch = _only_patch(project)
    escape = project.root / "escaped" / "FORK.md"
    _rewrite(patch, "a/FORK.md b/FORK.md", f"a/{escape} b/{escape}")
    _rewrite(patch, "+++ b/FORK.md", f"+++ b/{escape}")
    done = subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(f"error: {patch}:")
    assert f"the diff names the absolute path '{escape}'" in done.stderr
    assert not escape.exists()
    assert not (project.results / "latest").exists()
    fork_tree = project.work / "fork"
    assert not fork_tree.exists() or not list(fork_tree.rglob("FORK.md"))  # git am never ran
