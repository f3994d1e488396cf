"""The runtime probe's record (harness.record.probe): a real record parses; a malformed one raises ProbeError
naming the file and the key.

The real record is the engine's probe of cuda-pin-layers-2 (GGML_CUDA_MOE_PIN_LAYERS=2, --cpu-moe, mmap off)
loading moe-large on one H200, results/evidence/gpu1-20261202T142857Z.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from harness.record.probe import PROBE_FILE, ProbeError, parse_probe, read_probe

ROOT = Path(__file__).resolve().parents[1]
RECORD = (ROOT / "results" / "evidence" / "gpu1-20261202T142857Z" / "linux-x86_64-cuda" / "cuda-pin-layers-2" / "gen"
          / "moe-large" / PROBE_FILE)
LAYER = 32 * 3 * 2048 * 1536 * 2  # one layer's experts: 32 x 3 matrices of 2048 x 1536 F16


def record() -> dict:
    return json.loads(RECORD.read_text())


def test_a_real_record_parses_into_weights_buffers_and_the_drivers_counts():
    probe = read_probe(RECORD)
    assert probe.driver == "cuda" and probe.probe_ms > 0
    assert [(b.buffer_type, b.host) for b in probe.buffers] == [("CUDA_Host", True), ("CUDA0", False), ("CPU", True)]
    assert len(probe.weights) == 83 and len(probe.experts) == 24
    assert probe.expert_layers() == {n: {"CUDA_Host" if n < 2 else "CPU"} for n in range(8)}
    assert probe.layers_by_buffer_type() == {"CPU": [2, 3, 4, 5, 6, 7], "CUDA_Host": [0, 1]}
    assert probe.expert_bytes_by_layer() == {n: LAYER for n in range(8)}
    assert probe.page_locked_bytes() == 1339031552  # the CUDA_Host buffer, whole
    assert probe.buffer_bytes_by_type() == {"CUDA_Host": 1339031552, "CUDA0": 334635008, "CPU": 3623878656}
    embd = probe.weights[0]
    assert (embd.name, embd.layer, embd.expert, embd.buffer.buffer_type) == ("token_embd.weight", -1, False, "CUDA_Host")
    device = next(w for w in probe.weights if w.buffer.buffer_type == "CUDA0")
    assert device.page_locked is None and device.file_backed is None
    # the buffer a weight names is the same object as the record's buffer
    assert all(any(w.buffer is b for b in probe.buffers) for w in probe.weights)


def test_a_record_without_a_driver_has_no_page_locked_count():
    data = record()
    data["driver"] = None
    assert parse_probe(data).page_locked_bytes() is None


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / PROBE_FILE
    path.write_text(json.dumps(data))
    return path


def _without(data: dict, *keys) -> dict:
    data = copy.deepcopy(data)
    target = data
    for k in keys[:-1]:
        target = target[k]
    del target[keys[-1]]
    return data


@pytest.mark.parametrize("change, message", [
    (lambda d: _without(d, "weights"), "engine.probe.json: not a probe record (KeyError: 'weights')"),
    (lambda d: _without(d, "buffers", 1, "buffer_type"), "engine.probe.json: not a probe record (KeyError: 'buffer_type')"),
    (lambda d: _without(d, "weights", 3, "buffer"), "engine.probe.json: not a probe record (KeyError: 'buffer')"),
    (lambda d: {**d, "buffers": [dict(d["buffers"][0], bytes=-1)] + d["buffers"][1:]},
     "engine.probe.json: buffers[0].bytes: expected a byte count, got -1"),
    (lambda d: {**d, "weights": d["weights"][:5] + [dict(d["weights"][5], page_locked=-4096)] + d["weights"][6:]},
     "engine.probe.json: weights[5].page_locked: expected a byte count, got -4096"),
    (lambda d: {**d, "weights": d["weights"][:2] + [dict(d["weights"][2], bytes="8 MiB")] + d["weights"][3:]},
     "engine.probe.json: weights[2].bytes: expected a byte count, got '8 MiB'"),
    (lambda d: {**d, "weights": d["weights"][:7] + [dict(d["weights"][7], buffer=3)] + d["weights"][8:]},
     "engine.probe.json: weights[7].buffer 3 names no buffer"),
    (lambda d: {**d, "weights": [dict(d["weights"][0], buffer=-1)] + d["weights"][1:]},
     "engine.probe.json: weights[0].buffer -1 names no buffer"),
], ids=["no-weights", "buffer-without-type", "weight-without-buffer", "negative-buffer-bytes",
        "negative-page-locked", "bytes-not-a-number", "buffer-index-past-the-end", "negative-buffer-index"])
def test_a_malformed_record_raises_naming_the_file_and_the_key(tmp_path, change, message):
    with pytest.raises(ProbeError) as err:
        read_probe(_write(tmp_path, change(record())))
    assert str(err.value) == message


@pytest.mark.parametrize("change", [lambda d: {**d, "weights": [dict(d["weights"][0], layer="blk")] + d["weights"][1:]},
                                    lambda d: {**d, "probe_ms": "fast"},
                                    lambda d: {**d, "weights": [dict(d["weights"][0], buffer=True)] + d["weights"][1:]},
                                    lambda d: {**d, "buffers": [dict(d["buffers"][0], host="false")] + d["buffers"][1:]},
                                    lambda d: {**d, "weights": [dict(d["weights"][0], page_locked=d["weights"][0]["bytes"] + 1)]
                                               + d["weights"][1:]}],
                         ids=["layer", "probe_ms", "buffer-index-true", "host-a-string", "page-locked-past-the-range"])
def test_a_field_that_is_no_number_raises_probe_error(tmp_path, change):
    with pytest.raises(ProbeError):
        read_probe(_write(tmp_path, change(record())))


def test_a_missing_unreadable_or_refused_record_raises_saying_why(tmp_path):
    with pytest.raises(ProbeError, match=r"^engine\.probe\.json missing: the load has no probe record$"):
        read_probe(tmp_path / PROBE_FILE)
    path = tmp_path / PROBE_FILE
    path.write_text("{not json")
    with pytest.raises(ProbeError, match=r"^engine\.probe\.json cannot be read \("):
        read_probe(path)
    with pytest.raises(ProbeError, match=r"^engine\.probe\.json: the engine could not probe the load: probe: the "
                                         r"decode of one token failed$"):
        read_probe(_write(tmp_path, {"error": "probe: the decode of one token failed"}))
    with pytest.raises(ProbeError, match=r"^engine\.probe\.json: not a probe record$"):
        read_probe(_write(tmp_path, [record()]))


def test_page_counts_and_smaps_mappings_parse_and_an_older_record_says_it_read_no_pages():
    """A record of the page-reading engine: per range the bytes whose pages are the file's and those that are
    private copies, and the model file's mappings as smaps reports them.  A record without ``file_mappings``
    (the committed H200 one, of an older engine) has no page counts, and says so."""
    old = parse_probe(record())
    assert not old.pages_read and old.file_mappings is None and old.weights[0].private_pages is None
    data = record()
    data["file_mappings"] = [{"bytes": 8192, "rss": 4096, "shared_clean": 0, "private_clean": 0,
                              "private_dirty": 4096, "anonymous": 4096}]
    embd = data["weights"][0]
    embd.update(file_backed=embd["bytes"], file_pages=embd["bytes"] - 4096, private_pages=4096)
    probe = parse_probe(data)
    assert probe.pages_read and probe.file_mappings[0].anonymous == 4096
    assert (probe.weights[0].file_pages, probe.weights[0].private_pages) == (embd["bytes"] - 4096, 4096)
    assert probe.weights[1].private_pages is None  # null: not asked (a device weight, or no pagemap)


def test_page_counts_beyond_the_file_backed_bytes_raise_naming_the_key(tmp_path):
    data = record()
    embd = data["weights"][0]
    embd.update(file_backed=4096, file_pages=4096, private_pages=4096)
    with pytest.raises(ProbeError, match=r"^engine\.probe\.json: weights\[0\]: 4096 file and 4096 private page bytes "
                                         r"of 4096 file-backed bytes$"):
        read_probe(_write(tmp_path, data))
    data = record()
    data["file_mappings"] = [{"bytes": 8192, "rss": -1, "shared_clean": 0, "private_clean": 0, "private_dirty": 0,
                              "anonymous": 0}]
    with pytest.raises(ProbeError, match=r"file_mappings\[0\]\.rss: expected a byte count, got -1$"):
        read_probe(_write(tmp_path, data))
