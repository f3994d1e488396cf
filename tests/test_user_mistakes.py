"""A user's mistake is exit 2 with one ``error:`` line, before any work: no run directory, no build.

Each reproduction of issue 43 ("user mistakes that end as fork failures or tracebacks") and a plant of
the same kind of our own.  Nothing is built: the refusals come before the first stage, so these run
on the fake project (tests/fake_upstream.py) and on the real matrix in seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.triage import run_choice, triage
from harness.matrix.config import MatrixError, load_matrix
from harness.record.records import StepRecord
from harness.record.run import Run
from test_preflight import edit_matrix, write_vocab_model

ROOT = Path(__file__).resolve().parents[1]


def refused(project, *stages: str, extra: tuple[str, ...] = (), matrix: Path | None = None) -> str:
    """Run ``stages`` of the fake project; assert exit 2, one ``error:`` line, nothing started; return that line."""
    argv = project.argv(*stages, extra=extra)
    if matrix is not None:
        argv[argv.index("--matrix") + 1] = str(matrix)
    done = subprocess.run(argv, cwd=ROOT, env=project.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert not project.results.exists() and not project.work.exists(), done.stdout
    return errors[0]


@pytest.fixture()
def project(tmp_path):
    return make_fake_project(tmp_path)


# --------------------------------------------------------------------------- the n_predict fit, every model kind


def test_n_predict_with_a_derived_model_of_the_real_matrix_is_refused_not_a_traceback(tmp_path):
    """The reproduction: ``KeyError: 'path'`` in made_model_path with ``--model moe-small-quant``."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "HARNESS_RUN_ID"}
    env["HARNESS_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-m", "harness", "compare-outputs", "--platform", "linux-x86_64-cpu",
                           "--model", "moe-small-quant", "--n-predict", "2000", "--results-dir",
                           str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: --n-predict 2000 does not fit ctx_size 1024 with prompt"), done.stderr
    assert "of moe-small-quant)" in done.stderr.splitlines()[0]
    assert not (tmp_path / "results").exists() and not (tmp_path / "work").exists()


def test_a_derived_model_is_bounded_by_the_vocabulary_of_the_model_it_is_derived_from(project, tmp_path):
    vocab = write_vocab_model(tmp_path / "vocab.gguf", ["<s>", "a", "bb", "c d"])  # longest piece: 3 bytes

    def derive(doc):
        doc["models"]["tiny"]["path"] = str(vocab)
        doc["models"]["tiny-quant"] = {"kind": "quantized", "from": "tiny", "type": "Q8_0"}
        doc["groups"]["base-vs-fork"]["models"] = ["tiny-quant"]
    edit_matrix(project, derive)
    line = refused(project, "compare-outputs", extra=("--n-predict", "253"))
    # "one two three" is 13 bytes: at least ceil(13 / 3) = 5 tokens, read from tiny's vocabulary
    assert "with prompt one (at least 5 tokens of tiny-quant)" in line, line


# --------------------------------------------------------------------------- matrix paths


def test_a_copy_of_the_matrix_outside_the_checkout_means_what_the_shipped_one_means(tmp_path):
    """The reproduction: ``--matrix ../m.yaml`` resolved ``upstream-files/…`` against its own folder, and both
    builds erred.  Relative paths are read from the checkout (docs/matrix.md, "Paths")."""
    copy = tmp_path / "m.yaml"
    shutil.copy(ROOT / "matrix.yaml", copy)
    shipped, copied = load_matrix(ROOT / "matrix.yaml"), load_matrix(copy)
    assert copied.base_files == shipped.base_files == ROOT / "upstream-files" / "llama.cpp-0c1e57098bba.files"
    assert copied.sources == shipped.sources
    assert copied.platforms["windows-x86_64-cpu"].cross == shipped.platforms["windows-x86_64-cpu"].cross


def test_a_pinned_file_list_that_is_not_there_is_refused_at_load_naming_the_rule(project, tmp_path):
    edit_matrix(project, lambda doc: doc["base"].update(files={"path": "upstream-files/none.files", "sha256": "0" * 64}))
    assert refused(project, "build") == "error: invalid matrix:"
    with pytest.raises(MatrixError) as exc:
        load_matrix(project.matrix)
    assert exc.value.problems == [
        f"{project.matrix}:8: base.files.path: upstream-files/none.files does not exist: "
        f"{ROOT / 'upstream-files/none.files'} (a relative path is read from the checkout, {ROOT}, wherever the "
        "matrix file is; docs/matrix.md#paths)"]


def test_a_toolchain_the_matrix_names_where_there_is_none_is_refused_at_load(project, tmp_path):
    def cross(doc):
        doc["platforms"]["linux-x86_64-cpu"]["cross"] = {
            "toolchain": "toolchains/none.cmake", "compiler": {"program": "cc", "debian": "gcc"}, "emulator": "wine"}
    edit_matrix(project, cross)
    line = refused(project, "build")
    assert line == "error: invalid matrix:"


# --------------------------------------------------------------------------- malformed patches


TRUNCATED_HUNK = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: t <t@example.org>
Date: Mon, 1 Jan 2024 00:00:01 +0000
Subject: Add more notes

More notes.

diff --git a/MORE.md b/MORE.md
new file mode 100644
--- /dev/null
+++ b/MORE.md
@@ -0,0 +1,3 @@
+one
"""


@pytest.mark.parametrize("patch, where", [
    (TRUNCATED_HUNK, "corrupt patch at line 14"),  # the reproduction: a hunk cut short
    (TRUNCATED_HUNK.replace("@@ -0,0 +1,3 @@\n+one\n", "@@ -0,0 +1,3 @@\n+one\ntwo\n+three\n"),
     "corrupt patch at line 14"),  # our plant: a hunk line that lost its '+' (an editor's doing)
], ids=["truncated-hunk", "line-without-prefix"])
def test_a_malformed_patch_is_bad_input_before_any_build(project, patch, where):
    (project.patches / "add-more-notes.patch").write_text(patch)
    with open(project.patches / "series", "a", encoding="utf-8") as fh:
        fh.write("add-more-notes.patch\n")
    line = refused(project, "build", "test", "compare-outputs")
    assert line.startswith(f"error: {project.patches / 'add-more-notes.patch'}: malformed diff: {where}"), line


# --------------------------------------------------------------------------- names and values


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "latest", ".hidden"])
def test_a_run_id_that_is_not_a_plain_name_is_refused(project, run_id):
    line = refused(project, "build", extra=("--run-id", run_id))
    assert line.startswith(f"error: run id {run_id!r} (--run-id or HARNESS_RUN_ID) is not a plain name"), line
    # where the run directory would have been: ../../x resolves outside the results directory
    assert not (project.results / run_id).resolve().exists()


@pytest.mark.parametrize("option, value", [("--group", ""), ("--model", "tiny,"), ("--platform", " "),
                                           ("--group", "base-vs-fork,,base-vs-fork")])
def test_an_empty_name_option_is_refused_not_read_as_everything(project, option, value):
    assert refused(project, "compare-outputs", extra=(option, value)) == \
        f"error: {option} {value!r}: an empty name; name what to select, or leave {option} out to select everything"


@pytest.mark.parametrize("text", ["   ", "\n\t "])
def test_a_whitespace_only_prompt_is_refused_at_load(project, text):
    edit_matrix(project, lambda doc: doc["prompts"][1].update(text=text))
    refused(project, "compare-outputs")
    with pytest.raises(MatrixError, match=r"prompts\[1\]\.text: prompt 'two' is only whitespace"):
        load_matrix(project.matrix)


# --------------------------------------------------------------------------- triage


def test_triage_of_a_run_against_itself_is_warned(tmp_path, capsys):
    run = Run(tmp_path, "r1")
    run.record_step(StepRecord("p", "fork", "build", "passed"))
    run.close()
    for argv in (["r1", "r1"], ["r1", str(run.dir)]):
        assert triage.main([*argv, "--results-dir", str(tmp_path), "--matrix", str(tmp_path / "none.yaml")]) == 0
        out, err = capsys.readouterr()
        assert err.strip() == run_choice.SAME_RUN_WARNING.format(run="r1")
        assert run_choice.SAME_RUN_WARNING.format(run="r1") in out
    assert json.loads(json.dumps(triage.diff_runs(run.dir, run.dir).to_json()))["same_run"] is True
    other = Run(tmp_path, "r2")
    other.record_step(StepRecord("p", "fork", "build", "passed"))
    other.close()
    assert triage.main(["r1", "r2", "--results-dir", str(tmp_path), "--matrix", str(tmp_path / "none.yaml")]) == 0
    assert "warning" not in capsys.readouterr().err
