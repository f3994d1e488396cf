"""A cached model file the harness made (synthetic, derived with llama-quantize) is checked against the digest
recorded when it was made before every use, and made again when it is wrong (harness.matrix.models.reusable).

No llama.cpp build: the derived model's llama-quantize is tests/test_derived_models.py's fake.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from harness.matrix import models
from harness.matrix.models import MADE_SUFFIX, made_file_problem
from harness.matrix.moe_generator import generate_synthetic_moe

from test_derived_models import derive, fake, source  # noqa: F401  (fixtures)
from test_models import TINY, vocab  # noqa: F401  (the vocabulary fixture)


def truncate(path: Path) -> None:
    """Cut ``path`` to half its size, as an interrupted copy or a full disk leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip_byte(path: Path, at: int) -> None:
    """Change one byte of ``path`` in place (same size): bit rot, or a stray write."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_a_truncated_synthetic_model_is_generated_again_whole(vocab, tmp_path, caplog):  # noqa: F811
    first = generate_synthetic_moe(vocab, TINY, tmp_path)
    whole = first.read_bytes()
    recorded = json.loads(first.with_name(first.name + MADE_SUFFIX).read_text())
    assert recorded["size"] == len(whole)
    truncate(first)
    assert "bytes where" in made_file_problem(first)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        again = generate_synthetic_moe(vocab, TINY, tmp_path)
    assert again == first and again.read_bytes() == whole
    assert f"cached file {first} is damaged ({len(whole) // 2} bytes where {len(whole)} were written)" in caplog.text
    assert made_file_problem(again) is None


def test_a_synthetic_model_with_one_byte_changed_is_generated_again(vocab, tmp_path, caplog):  # noqa: F811
    first = generate_synthetic_moe(vocab, TINY, tmp_path)
    whole = first.read_bytes()
    flip_byte(first, len(whole) - 100)  # inside the last tensor's data: still a readable GGUF
    models.open_gguf(first)
    assert "sha256" in made_file_problem(first)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        assert generate_synthetic_moe(vocab, TINY, tmp_path).read_bytes() == whole
    assert "is damaged (sha256" in caplog.text


def test_a_model_made_by_an_older_harness_is_recorded_when_whole_and_made_again_when_not(vocab, tmp_path):  # noqa: F811
    first = generate_synthetic_moe(vocab, TINY, tmp_path)
    whole = first.read_bytes()
    first.with_name(first.name + MADE_SUFFIX).unlink()
    assert made_file_problem(first) is None and first.with_name(first.name + MADE_SUFFIX).exists()
    first.with_name(first.name + MADE_SUFFIX).unlink()
    truncate(first)
    assert "not a whole GGUF" in made_file_problem(first)
    assert generate_synthetic_moe(vocab, TINY, tmp_path).read_bytes() == whole


def test_a_truncated_derived_model_is_derived_again(fake, source, caplog):  # noqa: F811
    first = derive(fake, source)
    whole = first.read_bytes()
    assert derive(fake, source) == first and len(fake.calls()) == 1  # whole: reused, llama-quantize not run
    truncate(first)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        again = derive(fake, source)
    assert again == first and again.stat().st_size == len(whole)  # the fake's output ends with its temporary name
    assert made_file_problem(again) is None and len(fake.calls()) == 2
    assert "model tiny-quant: cached file" in caplog.text


def test_a_derived_model_with_one_byte_changed_is_derived_again(fake, source):  # noqa: F811
    first = derive(fake, source)
    whole = first.read_bytes()
    flip_byte(first, 64)
    again = derive(fake, source)
    healed = again.read_bytes()
    # the flipped byte is the first one compared; the fake's output ends with its temporary name, so the rest
    # of the file is compared by its length
    assert healed[64] == whole[64] and healed[:64] == whole[:64] and len(healed) == len(whole)
    assert made_file_problem(again) is None and len(fake.calls()) == 2


def test_the_model_store_that_models_and_the_stages_use_makes_a_damaged_file_again(vocab, tmp_path,  # noqa: F811
                                                                                   caplog):
    """``python -m harness models NAME`` and the stages take a model's path from ModelStore: a truncated cached
    file is not handed out (the issue: ``models moe-small-quant`` printed the truncated path as fine)."""
    from dataclasses import asdict

    from harness.matrix.config import Model
    from harness.matrix.model_sources.registry import ModelStore
    shutil.copy(vocab, tmp_path / "vocab.gguf")
    spec = {"vocab": "vocab.gguf", "params": asdict(TINY)}
    store = lambda: ModelStore({"moe": Model("moe", "synthetic-moe", spec)}, tmp_path / "cache",  # noqa: E731
                               lambda: tmp_path)
    first = store().path("moe")
    whole = first.read_bytes()
    truncate(first)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        assert store().path("moe").read_bytes() == whole
    assert f"cached file {first} is damaged" in caplog.text


def test_a_model_that_could_not_be_made_is_no_regression_of_the_fork(tmp_path):
    from harness.triage.triage import diff_runs
    from harness.record.records import Failure, StepRecord
    from harness.record.run import Run

    def run(run_id: str, *steps: StepRecord) -> Path:
        r = Run(tmp_path, run_id)
        for s in steps:
            r.record_step(s)
        r.close()
        return r.dir

    good = run("a", StepRecord("p", "fork", "generate", "passed"))
    unmade = Failure("model", model="moe-small-quant", message="ModelError: llama-quantize exited 1")
    b = run("b", StepRecord("p", "fork", "generate", "error", detail=unmade.text(), failures=[unmade]))
    report = diff_runs(good, b)
    assert report.regressions == [] and [(t.category, t.after) for t in report.transitions] == [("other", "error")]
    assert report.transitions[0].detail == "error: model moe-small-quant: ModelError: llama-quantize exited 1"
    # the plant: a generation of the fork that crashed is the fork's, and stays a regression
    crash = Failure("generation", model="moe-small-quant", prompt="story", status="crashed", signal="SIGSEGV")
    c = run("c", StepRecord("p", "fork", "generate", "failed", failures=[crash]))
    assert [t.what for t in diff_runs(good, c).regressions] == ["fork generate"]
