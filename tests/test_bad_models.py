"""Truncated and malformed GGUF files, and a configuration whose models partly fail."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from fake_upstream import make_fake_project, write_tiny_gguf
from harness.matrix.models import ModelError, model_summary, open_gguf

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tiny(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def test_a_truncated_gguf_names_the_file_and_the_expected_and_actual_size(tiny):
    whole = tiny.stat().st_size
    assert open_gguf(tiny).tensors[0].name == "token_embd.weight"
    tiny.write_bytes(tiny.read_bytes()[:whole - 24])
    with pytest.raises(ModelError) as err:
        model_summary(tiny, cache=False)
    assert str(err.value) == (f"GGUF {tiny}: truncated: its 1 tensors end at byte {whole} (the last, "
                              f"token_embd.weight), so the file must be at least {whole} bytes; it has "
                              f"{whole - 24} (24 missing)")


def test_a_gguf_cut_inside_its_header_names_the_offsets(tiny):
    tiny.write_bytes(tiny.read_bytes()[:30])
    with pytest.raises(ModelError, match=rf"^GGUF {tiny}: truncated in its header: a field needs bytes "
                                         r"\d+\.\.\d+, the file has 30 bytes$"):
        open_gguf(tiny)


def test_not_a_gguf_empty_and_a_bad_field(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    (tmp_path / "ggml.gguf").write_bytes(b"GGML" + bytes(data[4:]))
    with pytest.raises(ModelError, match=r"ggml.gguf: not a GGUF file: it starts with b'GGML', not b'GGUF'"):
        open_gguf(tmp_path / "ggml.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match=r"empty.gguf: empty file \(0 bytes\)"):
        open_gguf(tmp_path / "empty.gguf")
    # the tensor's ggml type (uint32 after its name, dims and offset) set to a type that does not exist
    name = b"token_embd.weight"
    at = bytes(data).index(name) + len(name) + 4 + 2 * 8
    assert struct.unpack_from("<I", data, at)[0] == 0  # F32
    struct.pack_into("<I", data, at, 1000)
    (tmp_path / "badtype.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"badtype.gguf: malformed: 1000 is not a valid GGMLQuantizationType"):
        open_gguf(tmp_path / "badtype.gguf")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_every_failing_model_is_kept_and_a_partly_failed_configuration_says_which(tmp_path):
    project = make_fake_project(tmp_path)
    good = project.model
    bad1 = write_tiny_gguf(tmp_path / "cut.gguf")
    bad1.write_bytes(bad1.read_bytes()[:-8])
    bad2 = tmp_path / "notgguf.gguf"
    bad2.write_bytes(b"GGML" + bytes(100))
    text = project.matrix.read_text()
    text = text.replace("models:\n  tiny:\n", f"models:\n  cut:\n    kind: file\n    path: {bad1}\n"
                                             f"  notgguf:\n    kind: file\n    path: {bad2}\n  tiny:\n")
    text = text.replace("    models: [tiny]", "    models: [cut, tiny, notgguf]")
    project.matrix.write_text(text)
    done = subprocess.run(project.argv("build", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    run = project.results / "latest"
    summary = json.loads((run / "summary.json").read_text())
    gen = {c["config"]: c for c in summary["configurations"] if c["step"] == "generate"}
    for config in ("base", "fork"):
        step = gen[config]
        assert step["status"] == "failed"  # not "error": the good model's generations ran
        assert step["detail"].startswith("partly failed: generations succeeded (model tiny); failed: ")
        assert f"GGUF {bad1}: truncated" in step["detail"] and f"GGUF {bad2}: not a GGUF file" in step["detail"]
        assert sorted(f["model"] for f in step["failures"]) == ["cut", "notgguf"]
    assert [c["status"] for c in summary["comparisons"]] == ["identical"] * 4
    signatures = json.loads((run / "signatures.json").read_text())
    base = next(e for e in signatures if e["config"] == "base" and e["step"] == "generate")
    texts = [s["summary"] for s in (base["signature"], *base.get("other_signatures", []))]
    assert any("cut.gguf" in t for t in texts) and any("notgguf.gguf" in t for t in texts)
    assert good.exists()
