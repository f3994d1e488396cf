"""Tests for harness.stages.building.patches: series validation, git am import, stable export, up-to-date check."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.stages.building.patches import (
    COMMITTER_EMAIL,
    COMMITTER_NAME,
    FORK_BRANCH,
    PatchApplyError,
    PatchError,
    apply_series,
    check_series,
    export_series,
    read_series,
    series_digest,
    series_env_summary,
)

A_C = [f"int line_{i} = {i};\n" for i in range(1, 21)]
README = "# demo\n\nA small tree the patch tests work on.\n"

#: (subject, body, author date, {path: new content}) for the three fork commits.
COMMITS = [
    ("Add host buffer size helper",
     "Callers need the size of a host buffer in bytes before they allocate\nthe pinned copy.",
     "2024-03-01T10:00:00+01:00",
     {"src/a.c": "".join(A_C[:2] + ["int line_3 = 3; /* host buffer size */\n"] + A_C[3:]),
      "src/size.c": "unsigned long host_buffer_size(void) { return 4096; }\n"}),
    ("[CUDA] Pin host buffers with cudaHostRegister",
     "Page-locked memory lets the copy engine overlap transfers with compute,\nso expert tensors stream faster.",
     "2024-03-02T11:30:00-05:00",
     {"src/a.c": "".join(A_C[:2] + ["int line_3 = 3; /* host buffer size */\n"] + A_C[3:14]
                         + ["int line_15 = 1500; /* pinned */\n"] + A_C[15:])}),
    ("Document the tensor override option",
     "Users asked how to keep expert tensors in host memory; the README\nnow says which option does it.",
     "2024-03-03T09:15:00+00:00",
     {"README.md": README + "\nUse a tensor override to keep expert tensors on the host.\n"}),
]


def git(repo: Path, *args: str, date: str = "2024-01-01T00:00:00+00:00") -> str:
    """Run git in ``repo`` with a fixed test identity and dates; return stripped stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_AUTHOR_NAME="Ada Author", GIT_AUTHOR_EMAIL="ada@example.org",
               GIT_COMMITTER_NAME="Ada Author", GIT_COMMITTER_EMAIL="ada@example.org",
               GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    proc = subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=repo, env=env,
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def write_files(repo: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def commit(repo: Path, subject: str, body: str, date: str, files: dict[str, str]) -> str:
    write_files(repo, files)
    git(repo, "add", "-A")
    args = ["commit", "-q", "-m", subject] + (["-m", body] if body else [])
    git(repo, *args, date=date)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def upstream(tmp_path: Path) -> tuple[Path, str]:
    """A repository with a base commit and the three fork commits on top; returns (repo, base id)."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, "Base", "Upstream tree.", "2024-01-01T00:00:00+00:00",
                  {"src/a.c": "".join(A_C), "src/b.h": "#pragma once\n", "README.md": README,
                   ".gitignore": "*.rej\n*.orig\nbuild/\n"})
    for subject, body, date, files in COMMITS:
        commit(repo, subject, body, date, files)
    return repo, base


@pytest.fixture()
def series(upstream: tuple[Path, str], tmp_path: Path) -> Path:
    """The fork commits exported into ``tmp_path/patches``."""
    repo, base = upstream
    out = tmp_path / "patches"
    export_series(repo, base, out)
    return out


def clone(upstream: tuple[Path, str], dest: Path, *, checkout: bool = True) -> Path:
    repo, _ = upstream
    git(repo.parent, "clone", "-q", *([] if checkout else ["--no-checkout"]), str(repo), str(dest))
    return dest


def listed(patches_dir: Path) -> list[str]:
    lines = (patches_dir / "series").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


# --------------------------------------------------------------------------- export


def test_export_names_files_from_subjects_in_commit_order(series: Path) -> None:
    names = listed(series)
    assert names == ["add-host-buffer-size-helper.patch",
                     "cuda-pin-host-buffers-with-cudahostregister.patch",
                     "document-the-tensor-override-option.patch"]
    assert sorted(p.name for p in series.iterdir()) == sorted(names + ["series"])
    patches = read_series(series)
    assert [p.subject for p in patches] == [c[0] for c in COMMITS]
    text = (series / names[1]).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [CUDA] Pin host buffers with cudaHostRegister\n" in text
    assert "Page-locked memory lets the copy engine" in text
    assert "\n-- \n" not in text  # no signature with the git version
    assert " 1 file changed" not in text  # no diffstat
    # full blob ids on the index line
    index_line = next(line for line in text.splitlines() if line.startswith("index "))
    assert len(index_line.split()[1].split("..")[0]) == 40


def test_reexport_is_byte_identical(upstream: tuple[Path, str], series: Path, tmp_path: Path) -> None:
    repo, base = upstream
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    again = tmp_path / "again"
    export_series(repo, base, again)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == before


def test_export_deletes_stale_patches_only(upstream: tuple[Path, str], series: Path) -> None:
    repo, base = upstream
    (series / "old-fix.patch").write_text("stale\n")
    (series / "NOTES.txt").write_text("kept\n")
    export_series(repo, base, series)
    assert not (series / "old-fix.patch").exists()
    assert (series / "NOTES.txt").read_text() == "kept\n"


def test_export_refuses_commit_without_body(upstream: tuple[Path, str], tmp_path: Path) -> None:
    repo, base = upstream
    commit(repo, "Tweak header", "", "2024-03-04T00:00:00+00:00", {"src/b.h": "#pragma once\n// x\n"})
    out = tmp_path / "out"
    with pytest.raises(PatchError, match="Tweak header.*no message body"):
        export_series(repo, base, out)
    assert not out.exists()  # nothing written


def test_export_dedupes_equal_subjects(upstream: tuple[Path, str], tmp_path: Path) -> None:
    repo, base = upstream
    commit(repo, "Document the tensor override option", "Second pass on the wording.",
           "2024-03-05T00:00:00+00:00", {"README.md": README + "\nTensor overrides keep experts on the host.\n"})
    names = [p.name for p in export_series(repo, base, tmp_path / "out")]
    assert names[2:] == ["document-the-tensor-override-option.patch",
                         "document-the-tensor-override-option-2.patch"]


# --------------------------------------------------------------------------- apply + round trip


def test_round_trip_apply_export_is_identical(upstream: tuple[Path, str], series: Path, tmp_path: Path) -> None:
    repo, base = upstream
    work = clone(upstream, tmp_path / "work", checkout=False)
    ids = apply_series(work, base, read_series(series))
    assert len(ids) == 3
    assert git(work, "rev-list", "--reverse", f"{base}..HEAD").split() == ids
    assert git(work, "rev-parse", "--abbrev-ref", "HEAD") == FORK_BRANCH
    # same trees and messages as the original commits
    assert git(work, "rev-parse", "HEAD^{tree}") == git(repo, "rev-parse", "HEAD^{tree}")
    assert git(work, "log", "--format=%an <%ae> %aI%n%B", f"{base}..HEAD") == \
        git(repo, "log", "--format=%an <%ae> %aI%n%B", f"{base}..HEAD")

    out = tmp_path / "reexported"
    export_series(work, base, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in series.iterdir()}
    assert check_series(clone(upstream, tmp_path / "scratch"), base, series) == []


def test_upto_applies_only_the_first(upstream: tuple[Path, str], series: Path, tmp_path: Path) -> None:
    _, base = upstream
    work = clone(upstream, tmp_path / "work")
    patches = read_series(series)
    ids = apply_series(work, base, patches, upto=1)
    assert len(ids) == 1
    assert git(work, "rev-list", "--count", f"{base}..HEAD") == "1"
    assert git(work, "log", "-1", "--format=%s") == patches[0].subject
    assert (work / "src/size.c").exists()
    assert "1500" not in (work / "src/a.c").read_text()  # patch 2 not applied
    assert apply_series(work, base, patches, upto=0) == []
    assert git(work, "rev-parse", "HEAD") == base
    with pytest.raises(ValueError):
        apply_series(work, base, patches, upto=4)


def test_apply_is_reproducible_and_resets_the_tree(upstream: tuple[Path, str], series: Path,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, base = upstream
    patches = read_series(series)
    first = clone(upstream, tmp_path / "first")
    ids = apply_series(first, base, patches)
    # committer is the harness identity and the commit date is the patch's author date
    for line in git(first, "log", "--format=%cn|%ce|%cI|%aI", f"{base}..HEAD").splitlines():
        name, email, cdate, adate = line.split("|")
        assert (name, email) == (COMMITTER_NAME, COMMITTER_EMAIL)
        assert cdate == adate
    assert sorted(git(first, "log", "--format=%aI", f"{base}..HEAD").splitlines()) == \
        sorted(d for _, _, d, _ in COMMITS)

    # the caller's git environment must not leak into the commits
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Someone Else")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2030-01-01T00:00:00+00:00")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2030-01-01T00:00:00+00:00")
    second = clone(upstream, tmp_path / "second", checkout=False)
    assert apply_series(second, base, patches) == ids

    # again in the first tree, after leaving it dirty on another commit
    (first / "src/a.c").write_text("dirty\n")
    (first / "untracked.txt").write_text("x\n")
    git(first, "checkout", "-q", "-f", "main")
    (first / "src/b.h").write_text("dirty too\n")
    log = tmp_path / "logs" / "apply.log"
    assert apply_series(first, base, patches, log=log) == ids
    assert git(first, "status", "--porcelain") == ""
    # each git call's line can be pasted back: in its directory, with the environment the harness gives git
    lines = log.read_text().splitlines()
    [rev_parse] = [i for i, line in enumerate(lines) if line.startswith("$ cd ") and " rev-parse " in line][-1:]
    again = subprocess.run(["sh", "-c", lines[rev_parse][2:]], capture_output=True, text=True, check=True)
    assert lines[rev_parse + 1] == "# exit 0" and again.stdout.splitlines() == [lines[rev_parse + 2]]
    assert any(" git -c core.autocrlf=false " in line and " am --3way " in line for line in lines)


def test_conflicting_patch_raises_with_rejected_hunk(upstream: tuple[Path, str], series: Path,
                                                     tmp_path: Path) -> None:
    _, base = upstream
    work = clone(upstream, tmp_path / "work")
    git(work, "checkout", "-q", "-b", "newbase", base)
    new_base = commit(work, "Upstream moves on", "Line 15 changed upstream.", "2024-02-01T00:00:00+00:00",
                      {"src/a.c": "".join(A_C[:14] + ["int line_15 = -15; /* upstream */\n"] + A_C[15:])})
    (work / "build").mkdir()
    (work / "build" / "kept.o").write_text("object\n")  # ignored build output survives
    patches = read_series(series)
    with pytest.raises(PatchApplyError) as info:
        apply_series(work, new_base, patches)
    err = info.value
    assert err.patch == "cuda-pin-host-buffers-with-cudahostregister.patch"
    assert "cuda-pin-host-buffers-with-cudahostregister.patch" in str(err)
    assert "patch 2 of 3" in str(err)
    # the hunk that did not apply: its removed and added lines
    for line in ("-int line_15 = 15;", "+int line_15 = 1500; /* pinned */"):
        assert line in err.rejected
        assert line in str(err)
    # tree left clean at new base + patch 1, no am session, no .rej files
    assert git(work, "rev-parse", "HEAD^") == new_base
    assert git(work, "log", "-1", "--format=%s") == patches[0].subject
    assert git(work, "status", "--porcelain", "--ignored") == "!! build/"
    assert (work / "build" / "kept.o").read_text() == "object\n"
    assert not (work / ".git" / "rebase-apply").exists()
    assert git(work, "rev-parse", "HEAD")[:12] in str(err)


def test_three_way_merge_applies_over_changed_context(upstream: tuple[Path, str], series: Path,
                                                     tmp_path: Path) -> None:
    _, base = upstream
    work = clone(upstream, tmp_path / "work")
    git(work, "checkout", "-q", "-b", "newbase", base)
    # line 17 is context of patch 2's hunk (line 15): a plain apply fails, a 3-way merge does not
    new_base = commit(work, "Upstream moves on", "Line 17 changed upstream.", "2024-02-01T00:00:00+00:00",
                      {"src/a.c": "".join(A_C[:16] + ["int line_17 = -17;\n"] + A_C[17:])})
    patch2 = read_series(series)[1].path
    plain = subprocess.run(["git", "apply", "--check", str(patch2)], cwd=work, capture_output=True)
    assert plain.returncode != 0
    ids = apply_series(work, new_base, read_series(series))
    assert len(ids) == 3
    text = (work / "src/a.c").read_text()
    assert "int line_15 = 1500; /* pinned */\n" in text and "int line_17 = -17;\n" in text


# --------------------------------------------------------------------------- check


def test_check_reports_hand_edited_patch(upstream: tuple[Path, str], series: Path, tmp_path: Path) -> None:
    _, base = upstream
    name = "cuda-pin-host-buffers-with-cudahostregister.patch"
    path = series / name
    text = path.read_text()
    assert "+int line_15 = 1500; /* pinned */\n" in text
    path.write_text(text.replace("+int line_15 = 1500; /* pinned */\n", "+int line_15 = 1501; /* pinned */\n"))
    diffs = check_series(clone(upstream, tmp_path / "scratch"), base, series)
    assert len(diffs) == 1
    assert str(path) in diffs[0]
    # the edit applies, but the index line still names the old result blob; export writes the real one
    edited = "".join(A_C[:2] + ["int line_3 = 3; /* host buffer size */\n"] + A_C[3:14]
                     + ["int line_15 = 1501; /* pinned */\n"] + A_C[15:])
    new_blob = subprocess.run(["git", "hash-object", "--stdin"], input=edited, text=True,
                              capture_output=True, check=True).stdout.strip()
    stale_blob = re.search(r"^index [0-9a-f]{40}\.\.([0-9a-f]{40})", path.read_text(), re.MULTILINE).group(1)
    assert "\n-index " in diffs[0] and stale_blob in diffs[0]
    assert re.search(rf"^\+index [0-9a-f]{{40}}\.\.{new_blob} 100644$", diffs[0], re.MULTILINE)


def test_check_reports_edited_message_and_series(upstream: tuple[Path, str], series: Path,
                                                 tmp_path: Path) -> None:
    _, base = upstream
    name = "document-the-tensor-override-option.patch"
    # extra blank lines below the message: git am drops them, so export writes the file without them
    (series / name).write_text((series / name).read_text().replace("does it.\n\ndiff", "does it.\n\n\n\ndiff"))
    (series / "series").write_text((series / "series").read_text() + "# trailing note\n")
    diffs = check_series(clone(upstream, tmp_path / "scratch"), base, series)
    assert len(diffs) == 2
    assert str(series / "series") in diffs[0] and "# trailing note" in diffs[0]
    assert str(series / name) in diffs[1]
    assert "\n-\n" in diffs[1] and "\n+" not in diffs[1].split("(as exported)", 1)[1]


def test_check_reports_file_exported_under_another_name(upstream: tuple[Path, str], series: Path,
                                                        tmp_path: Path) -> None:
    _, base = upstream
    old = "document-the-tensor-override-option.patch"
    (series / old).rename(series / "readme.patch")
    (series / "series").write_text((series / "series").read_text().replace(old, "readme.patch"))
    diffs = check_series(clone(upstream, tmp_path / "scratch"), base, series)
    joined = "\n".join(diffs)
    assert str(series / "readme.patch") in joined and "delete" in joined
    assert f"{series / old}: missing" in joined


# --------------------------------------------------------------------------- read_series validation


def test_missing_listed_file_names_series_line(series: Path) -> None:
    series_file = series / "series"
    series_file.write_text(series_file.read_text() + "\nghost.patch\n")
    lineno = series_file.read_text().splitlines().index("ghost.patch") + 1
    with pytest.raises(PatchError, match=rf"{series_file}:{lineno}: ghost\.patch"):
        read_series(series)


def test_missing_series_file(tmp_path: Path) -> None:
    with pytest.raises(PatchError, match="series file not found"):
        read_series(tmp_path)


def test_duplicate_entry_is_an_error(series: Path) -> None:
    series_file = series / "series"
    first = listed(series)[0]
    series_file.write_text(series_file.read_text() + first + "\n")
    with pytest.raises(PatchError, match=rf"{first} is listed twice"):
        read_series(series)


def test_unlisted_patch_is_an_error(series: Path) -> None:
    (series / "extra.patch").write_bytes((series / listed(series)[0]).read_bytes())
    with pytest.raises(PatchError, match=r"extra\.patch not listed"):
        read_series(series)


def test_patch_without_body_is_an_error(series: Path) -> None:
    name = listed(series)[0]
    path = series / name
    text = path.read_text()
    head, _, rest = text.partition("Subject: Add host buffer size helper\n")
    body_and_diff = rest.split("diff --git", 1)[1]
    path.write_text(head + "Subject: Add host buffer size helper\n\ndiff --git" + body_and_diff)
    with pytest.raises(PatchError, match=rf"{name}.*no body"):
        read_series(series)


def test_file_without_subject_is_an_error(series: Path) -> None:
    name = listed(series)[2]
    path = series / name
    path.write_text("diff --git" + path.read_text().split("diff --git", 1)[1])  # a bare diff, no e-mail headers
    with pytest.raises(PatchError, match=rf"{name}: not a git format-patch file"):
        read_series(series)


# --------------------------------------------------------------------------- digest / summary


def test_digest_tracks_order_and_content(series: Path) -> None:
    patches = read_series(series)
    digest = series_digest(patches)
    assert series_digest(read_series(series)) == digest
    assert series_digest(list(reversed(patches))) != digest
    assert series_digest(patches[:2]) != digest
    path = patches[0].path
    path.write_bytes(path.read_bytes().replace(b"pinned copy.", b"pinned copy!"))
    assert series_digest(read_series(series)) != digest
    summary = series_env_summary(read_series(series))
    assert [s["name"] for s in summary] == listed(series)
    assert summary[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
