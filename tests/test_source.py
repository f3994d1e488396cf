"""Base source: sources tried in order, pinned commit verified, mirror export reproducible, cache reused."""

import subprocess
from pathlib import Path

import pytest

from harness.matrix.config import Generation, Matrix, Source
from harness.stages.building.source import SourceError, export_mirror, obtain_base, sha256_file

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
       "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": "/usr/bin:/bin"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, str, str]:
    """A small upstream repo with two commits; returns (path, pinned commit, later commit)."""
    repo = tmp_path / "upstream"
    (repo / "models").mkdir(parents=True)
    (repo / "docs").mkdir()
    git(repo.parent, "init", "-q", str(repo))
    (repo / "CMakeLists.txt").write_text("project(x)\n")
    (repo / "models" / "ggml-vocab-llama-spm.gguf").write_bytes(b"vocab")
    (repo / "models" / "big.gguf").write_bytes(b"x" * 1000)
    (repo / "docs" / "a.md").write_text("doc\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    pinned = git(repo, "rev-parse", "HEAD")
    (repo / "CMakeLists.txt").write_text("project(y)\n")
    git(repo, "commit", "-qam", "two")
    return repo, pinned, git(repo, "rev-parse", "HEAD")


def matrix(commit: str, *sources: Source) -> Matrix:
    return Matrix(path=Path("matrix.yaml"), base_commit=commit, sources=tuple(sources), generation=Generation(),
                  platforms={}, models={}, prompts={}, configs={}, groups={})


def test_local_source_gives_the_pinned_commit_and_is_cached(upstream, tmp_path):
    repo, pinned, _ = upstream
    cache = tmp_path / "cache"
    base = obtain_base(matrix(pinned, Source("local", path=tmp_path / "missing"), Source("local", path=repo)), cache)
    assert base.commit == base.git_rev == pinned
    assert (base.path / "CMakeLists.txt").read_text() == "project(x)\n"
    assert base.source == f"local {repo}"
    # the second call reuses the cache: even with no usable source left
    again = obtain_base(matrix(pinned, Source("local", path=tmp_path / "missing")), cache)
    assert again == base


def test_every_failing_source_is_named(upstream, tmp_path):
    repo, _, _ = upstream
    with pytest.raises(SourceError) as exc:
        obtain_base(matrix("f" * 40, Source("local", path=repo), Source("archive", path=tmp_path / "none.tar.gz",
                                                                          sha256="0" * 64)), tmp_path / "c")
    text = str(exc.value)
    assert "does not contain commit ffff" in text and "none.tar.gz does not exist" in text


def test_mirror_is_trimmed_reproducible_and_verified(upstream, tmp_path):
    repo, pinned, _ = upstream
    base = obtain_base(matrix(pinned, Source("local", path=repo)), tmp_path / "c1")
    a, digest_a = export_mirror(base, tmp_path / "m1" / "mirror.tar.gz")
    b, digest_b = export_mirror(base, tmp_path / "m2" / "other.tar.gz")
    assert digest_a == digest_b == sha256_file(a)
    assert (tmp_path / "m1" / "mirror.tar.gz.sha256").read_text().split()[0] == digest_a
    from_archive = obtain_base(matrix(pinned, Source("archive", path=a, sha256_file=Path(str(a) + ".sha256"))),
                               tmp_path / "c2")
    assert from_archive.commit == pinned and from_archive.git_rev != pinned
    assert (from_archive.path / "models" / "ggml-vocab-llama-spm.gguf").exists()
    assert not (from_archive.path / "models" / "big.gguf").exists()
    assert not (from_archive.path / "docs").exists()
    assert (from_archive.path / "CMakeLists.txt").read_text() == "project(x)\n"


def test_archive_with_wrong_checksum_or_commit_is_refused(upstream, tmp_path):
    repo, pinned, later = upstream
    base = obtain_base(matrix(pinned, Source("local", path=repo)), tmp_path / "c1")
    archive, _ = export_mirror(base, tmp_path / "mirror.tar.gz")
    with pytest.raises(SourceError, match="does not match expected"):
        obtain_base(matrix(pinned, Source("archive", path=archive, sha256="0" * 64)), tmp_path / "c2")
    with pytest.raises(SourceError, match=f"is commit {pinned}, expected the pinned {later}"):
        obtain_base(matrix(later, Source("archive", path=archive, sha256=sha256_file(archive))), tmp_path / "c3")


def test_local_source_takes_the_commit_not_the_work_tree(upstream, tmp_path):
    repo, pinned, later = upstream
    (repo / "CMakeLists.txt").write_text("edited\n")  # the clone is taken from commits, not the work tree
    base = obtain_base(matrix(later, Source("local", path=repo)), tmp_path / "c")
    assert (base.path / "CMakeLists.txt").read_text() == "project(y)\n"


def test_vendored_tree_must_be_the_pinned_commit_and_clean(upstream):
    from harness.stages.building.source import _verify_checkout
    repo, pinned, later = upstream
    assert _verify_checkout(repo, later) is None
    assert "expected the pinned" in _verify_checkout(repo, pinned)
    (repo / "CMakeLists.txt").write_text("edited\n")
    assert "tree differs" in _verify_checkout(repo, later)


def test_checking_a_tree_leaves_its_git_index_alone(tmp_path):
    # llama.cpp's build-info lists .git/index as a CMake input: a check that wrote the index back would make
    # a build of the tree reconfigure while the compile step builds from it in another thread
    from harness.stages.building.source import git, tree_state
    tree = tmp_path / "tree"
    tree.mkdir()
    git(["init", "--quiet"], tree)
    (tree / "a.txt").write_text("a\n")
    git(["add", "a.txt"], tree)
    git(["-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "a"], tree)
    index = tree / ".git" / "index"
    before = index.stat().st_mtime_ns
    import os
    os.utime(tree / "a.txt", ns=(before + 10**9, before + 10**9))  # same bytes, newer file time
    head, dirty = tree_state(tree)
    assert not dirty and len(head) == 40
    assert index.stat().st_mtime_ns == before
    # plain git status does write it back here, so the check above can fail
    subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], check=True, capture_output=True)
    assert index.stat().st_mtime_ns != before


def test_the_data_archive_carries_the_suites_data_is_verified_and_may_leave_a_file_out(upstream, tmp_path):
    from dataclasses import replace
    import tarfile
    from harness.stages.building.source import data_archive, export_data, write_pinned_files
    repo, _, _ = upstream
    (repo / "models" / "templates").mkdir()
    (repo / "models" / "templates" / "chat.jinja").write_text("{{ x }}\n")
    for name in ("falcon", "mpt"):
        (repo / "models" / f"ggml-vocab-{name}.gguf").write_bytes(name.encode())
        (repo / "models" / f"ggml-vocab-{name}.gguf.inp").write_text("in\n")
        (repo / "models" / f"ggml-vocab-{name}.gguf.out").write_text("out\n")
    (repo / "models" / "ggml-vocab-aquila.gguf").write_bytes(b"untested")  # no .inp: no test reads it
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "data")
    pinned = git(repo, "rev-parse", "HEAD")
    base = obtain_base(matrix(pinned, Source("local", path=repo)), tmp_path / "c1")
    files = tmp_path / "files"
    m = replace(matrix(pinned), base_files=files, base_files_sha256=write_pinned_files(base, files))
    mirror, _ = export_mirror(base, tmp_path / "m" / "llama.cpp-x.tar.gz")
    data, digest = export_data(base, mirror)
    assert data == tmp_path / "m" / "llama.cpp-x.data.tar.xz" == data_archive(mirror)
    assert export_data(base, mirror)[1] == digest == sha256_file(data)  # reproducible
    with tarfile.open(data) as tf:
        assert sorted(tf.getnames()) == ["models/ggml-vocab-falcon.gguf", "models/ggml-vocab-falcon.gguf.inp",
                                         "models/ggml-vocab-falcon.gguf.out", "models/ggml-vocab-mpt.gguf",
                                         "models/ggml-vocab-mpt.gguf.inp", "models/ggml-vocab-mpt.gguf.out",
                                         "models/templates/chat.jinja"]
    src = Source("archive", path=mirror, sha256_file=Path(f"{mirror}.sha256"))
    tree = obtain_base(replace(m, sources=(src,)), tmp_path / "c2")
    assert (tree.path / "models" / "templates" / "chat.jinja").exists() and tree.data == digest
    assert not (tree.path / "models" / "ggml-vocab-aquila.gguf").exists()

    export_data(base, mirror, leave_out={"models/ggml-vocab-falcon.gguf"})  # a file left out: still the pinned commit
    tree = obtain_base(replace(m, sources=(src,)), tmp_path / "c2")  # the cached tree is obtained again
    assert not (tree.path / "models" / "ggml-vocab-falcon.gguf").exists()
    assert (tree.path / "models" / "ggml-vocab-mpt.gguf").read_bytes() == b"mpt"

    data.write_bytes(data.read_bytes()[:-8] + b"\0" * 8)  # bytes that are not its .sha256
    with pytest.raises(SourceError, match="data archive .*does not match"):
        obtain_base(replace(m, sources=(src,)), tmp_path / "c3")
