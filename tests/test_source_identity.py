"""Every base tree is the pinned commit by content: a tampered mirror or an edited cache is refused."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.matrix.config import load_matrix
from harness.stages.building.source import (MIRROR_MANIFEST, BaseTree, PinnedFiles, SourceError, export_mirror, obtain_base,
                            read_pinned_files, write_pinned_files)


@pytest.fixture()
def pinned(tmp_path):
    """A fake upstream, its pinned file list, and matrices naming the repository (``local``)
    or a mirror archive of it (``archive``) as the only source."""
    project = make_fake_project(tmp_path)
    commit = load_matrix(project.matrix).base_commit
    files = tmp_path / "upstream.files"
    digest = write_pinned_files(BaseTree(project.repo, commit, commit, "test"), files)
    text = project.matrix.read_text().replace(
        "  sources:\n", f"  files: {{path: {files}, sha256: {digest}}}\n  sources:\n")
    local = tmp_path / "matrix-local.yaml"
    local.write_text(text)
    base = obtain_base(load_matrix(local), tmp_path / "cache-export")
    mirror, _ = export_mirror(base, tmp_path / "mirror" / "fake.tar.gz")
    archive = tmp_path / "matrix-archive.yaml"
    archive.write_text(text.replace(f"    - kind: local\n      path: {project.repo}\n",
                                    f"    - kind: archive\n      path: {mirror}\n      sha256_file: {mirror}.sha256\n"))
    return project, local, archive, mirror, files, digest


def _retar(mirror: Path, change: dict[str, bytes]) -> None:
    """Rewrite the mirror with some members' bytes changed, and regenerate its .sha256 the way someone
    covering their tracks would."""
    members = []
    with tarfile.open(mirror) as tf:
        for info in tf.getmembers():
            data = tf.extractfile(info).read() if info.isfile() else None
            members.append((info, change.get(info.name, data)))
    with tarfile.open(mirror, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    digest = hashlib.sha256(mirror.read_bytes()).hexdigest()
    Path(f"{mirror}.sha256").write_text(f"{digest}  {mirror.name}\n")


def test_a_tampered_mirror_with_a_regenerated_checksum_is_refused_and_not_cached(pinned, tmp_path):
    project, _, archive, mirror, _, _ = pinned
    good = obtain_base(load_matrix(archive), tmp_path / "cache-good")
    assert good.source == f"archive {mirror}"
    _retar(mirror, {"launcher.c": (project.repo / "launcher.c").read_bytes() + b"/* planted */\n"})
    cache = tmp_path / "cache-tampered"
    log: list[str] = []
    with pytest.raises(SourceError) as err:
        obtain_base(load_matrix(archive), cache, log)
    assert "refused: its files are not those of the pinned commit (first differing path launcher.c: content " \
           "differs (blob" in str(err.value)
    assert any("removed from the cache" in line for line in log)
    assert not [p for p in (cache / "base").iterdir() if not p.name.endswith(".lock")]  # nothing of it stays


def test_a_mirror_with_an_extra_file_is_refused_naming_it(pinned, tmp_path):
    _, _, archive, mirror, _, _ = pinned
    with tarfile.open(mirror) as tf:
        members = [(i, tf.extractfile(i).read() if i.isfile() else None) for i in tf.getmembers()]
    extra = tarfile.TarInfo("ggml/src/planted.c")
    members.append((extra, b"int planted;\n"))
    with tarfile.open(mirror, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    Path(f"{mirror}.sha256").write_text(hashlib.sha256(mirror.read_bytes()).hexdigest() + "\n")
    with pytest.raises(SourceError, match=r"first differing path ggml/src/planted.c: not a file of the pinned"):
        obtain_base(load_matrix(archive), tmp_path / "cache")


def test_an_edited_cache_is_found_on_reuse_removed_and_obtained_again(pinned, tmp_path):
    project, local, _, _, _, _ = pinned
    cache = tmp_path / "cache"
    base = obtain_base(load_matrix(local), cache)
    original = (base.path / "CMakeLists.txt").read_bytes()
    (base.path / "CMakeLists.txt").write_bytes(original + b"# edited in the cache\n")
    log: list[str] = []
    again = obtain_base(load_matrix(local), cache, log)
    assert any(f"the cached base {base.path} is not the pinned commit by content (first differing path "
               "CMakeLists.txt: changed in the cache (M)); removed" in line for line in log)
    assert (again.path / "CMakeLists.txt").read_bytes() == original
    (again.path / "planted.h").write_text("/* new */\n")
    log.clear()
    obtain_base(load_matrix(local), cache, log)
    assert any("first differing path planted.h: changed in the cache (??)" in line for line in log)
    assert not (again.path / "planted.h").exists()


def test_the_file_list_itself_is_pinned(pinned):
    _, local, _, _, files, digest = pinned
    commit = load_matrix(local).base_commit
    files.write_text(files.read_text().replace("launcher.c", "launcher2.c"))
    with pytest.raises(SourceError, match=rf"pinned file list {files} has sha256 [0-9a-f]{{64}}; "
                                          rf"matrix.yaml pins {digest}"):
        read_pinned_files(files, digest, commit)


def test_the_shipped_file_list_is_the_pinned_commit_and_the_mirror_keeps_its_rule():
    root = Path(__file__).resolve().parents[1]
    matrix = load_matrix(root / "matrix.yaml")
    pinned = read_pinned_files(matrix.base_files, matrix.base_files_sha256, matrix.base_commit)
    assert pinned.entries["CMakeLists.txt"][0] == "100644" and len(pinned.entries) > 3000
    trimmed = pinned.expected("archive")
    assert "models/ggml-vocab-llama-spm.gguf" in trimmed and not any(p.startswith("docs/") for p in trimmed)
    assert pinned.expected("pypi-sdist") == pinned.entries
    assert MIRROR_MANIFEST not in pinned.entries and isinstance(pinned, PinnedFiles)
