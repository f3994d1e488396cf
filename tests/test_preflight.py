"""Bad input is refused before it runs (exit 2, one ``error:`` line): a prompt that cannot fit its context, a group
whose reference cannot run here, a CUDA-only setting on a CPU platform, arguments the build does not take.

The fast tests run the command line on the fake project without building anything (the refusal comes first);
the slow ones build the fake project, whose ``llama-tokenize`` and ``llama-completion --help`` answer as
llama.cpp's do (tests/fake_upstream.py), and are refused after the build, before any generation.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml

from fake_upstream import FakeProject, make_fake_project
from harness.matrix.fit import (PlannedGeneration, Vocabulary, context_tokens, fewest_prompt_tokens, fits,
                                most_prompt_tokens, refuse_unfit)
from harness.common.errors import InputError
from harness.stages.outputs.refusals import option_refusal

ROOT = Path(__file__).resolve().parents[1]

#: The fake project's context as the refusals name it
ROOM_64 = "ctx_size 64 (256 tokens once llama.cpp rounds it up to a multiple of 256)"


def edit_matrix(project: FakeProject, change) -> None:
    """Rewrite the fake project's matrix with ``change`` (a function of its parsed document) applied."""
    doc = yaml.safe_load(project.matrix.read_text())
    change(doc)
    project.matrix.write_text(yaml.safe_dump(doc, sort_keys=False))


def add_candidate(project: FakeProject, name: str, **config) -> None:
    """Add configuration ``name`` (matrix keys ``config``, build fork) to the matrix, a candidate of base-vs-fork."""
    def change(doc):
        doc["configs"][name] = {"build": "fork", **config}
        doc["groups"]["base-vs-fork"]["candidates"].append(name)
    edit_matrix(project, change)


def run(project: FakeProject, *stages: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(project.argv(*stages, extra=extra), cwd=ROOT, env=project.env(), capture_output=True,
                          text=True, timeout=600)


def assert_refused_before_anything(proc: subprocess.CompletedProcess, project: FakeProject, message: str) -> None:
    """Exit 2, ``message`` as the one ``error:`` line on stderr, and no run directory, no build, no generation."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [f"error: {message}"]
    assert not project.results.exists() and not project.work.exists(), proc.stdout


def write_vocab_model(path: Path, tokens: list[str]) -> Path:
    """A small GGUF with a SentencePiece (``llama``) vocabulary of ``tokens``."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ----------------------------------------------------------------------------------- the rule and the bounds

def test_the_context_is_padded_as_llama_cpp_pads_it_and_llama_completion_keeps_four_tokens_free():
    assert [context_tokens(c) for c in (64, 256, 257, 1024)] == [256, 256, 512, 1024]
    assert fits(88, 936, 1024) and not fits(88, 937, 1024)
    assert fits(1020, 4, 1024) and not fits(1021, 1, 1024)  # llama-completion: the prompt within n_ctx - 4


def test_the_bounds_hold_the_tokens_between_them():
    text = "Grüße aus Köln"  # 17 bytes in UTF-8
    assert most_prompt_tokens(text) == 17 + 3
    assert fewest_prompt_tokens(text, None) == 1
    assert fewest_prompt_tokens(text, Vocabulary("llama", 3)) == 6  # ceil(17 / 3)
    assert fewest_prompt_tokens(text, Vocabulary("gpt2", 48)) == 1
    assert fewest_prompt_tokens(text, Vocabulary("bert", 3)) == 1  # a normalising tokenizer: no vocabulary bound


def test_only_what_the_bounds_leave_open_is_counted_and_the_count_decides():
    gens = [PlannedGeneration("g", "m", pid, text, 250, 64, True, "matrix.yaml")
            for pid, text in (("short", "ab"), ("long", "abcdefgh"))]  # most tokens 5 and 11; room 6
    counted = []

    def count(gen):
        counted.append(gen.prompt)
        return {"long": 7}[gen.prompt]

    with pytest.raises(InputError) as exc:
        refuse_unfit(gens, lambda model: None, count)
    assert counted == ["long"]  # "short" fits whatever its tokens
    assert str(exc.value) == ("--n-predict 250 does not fit ctx_size 64 (256 tokens once llama.cpp rounds it up to a "
                              "multiple of 256) with prompt long (7 tokens of m): at most 249 tokens can be generated "
                              "after it")
    assert refuse_unfit(gens, lambda model: None, lambda gen: 6) == []
    assert refuse_unfit(gens, lambda model: None, lambda gen: None) == []  # not counted: it runs
    assert refuse_unfit(gens, lambda model: None) == [gens[1]]  # before a build: left open


# ------------------------------------------------------------------------------ before any build (fast)

def test_the_first_session_of_the_nox_chain_is_refused_too(tmp_path):
    project = make_fake_project(tmp_path)  # nox -s build test compare-outputs: one stage command per session
    proc = run(project, "build", extra=("--n-predict", "300"))
    assert_refused_before_anything(proc, project, (
        f"--n-predict 300 does not fit {ROOM_64} with prompt one (at least 1 token of tiny): at most 255 tokens "
        "can be generated after it; 3 more prompts do not fit either"))


def test_the_issue_command_on_the_real_matrix_is_refused_at_once(tmp_path):
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HARNESS_RUN_ID", None)
    proc = subprocess.run([sys.executable, "-m", "harness", "compare-outputs", "--platform", "linux-x86_64-cpu",
                           "--group", "base-vs-fork", "--model", "moe-small", "--n-predict", "2000", "--results-dir",
                           str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: --n-predict 2000 does not fit ctx_size 1024 with prompt story "
                                  "(at least 1 token of moe-small)"), proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "work").exists()


def test_the_vocabulary_of_a_model_file_bounds_the_prompt_before_the_build(tmp_path):
    project = make_fake_project(tmp_path)
    model = write_vocab_model(tmp_path / "vocab.gguf", ["<s>", "a", "bb", "c d"])  # longest piece: 3 bytes
    edit_matrix(project, lambda doc: doc["models"]["tiny"].update(path=str(model)))
    # 256 - 253 = 3 tokens of room: "one two three" (13 bytes) is at least ceil(13 / 3) = 5 tokens
    proc = run(project, "compare-outputs", extra=("--n-predict", "253"))
    assert_refused_before_anything(proc, project, (
        f"--n-predict 253 does not fit {ROOM_64} with prompt one (at least 5 tokens of tiny): at most 251 tokens "
        "can be generated after it; 2 more prompts do not fit either"))


def test_a_group_whose_reference_platform_cannot_run_here_is_refused_before_the_build(tmp_path):
    project = make_fake_project(tmp_path)

    def add_arm(doc):
        doc["platforms"]["linux-aarch64-cpu"] = {**doc["platforms"]["linux-x86_64-cpu"], "arch": "aarch64",
                                                 "groups": []}
        doc["groups"]["cross-arch"] = {"models": ["tiny"], "reference": "fork",
                                       "reference_platform": "linux-aarch64-cpu", "candidates": ["fork"]}
        doc["platforms"]["linux-x86_64-cpu"]["groups"].append("cross-arch")
    edit_matrix(project, add_arm)
    proc = run(project, "build", "compare-outputs", extra=("--group", "cross-arch"))
    assert_refused_before_anything(proc, project, (
        "group cross-arch on linux-x86_64-cpu takes its reference from platform linux-aarch64-cpu, which cannot run "
        f"here: needs aarch64; this is x86_64 ({project.matrix}: groups.cross-arch.reference_platform)"))


def test_a_cuda_only_variable_on_a_cpu_platform_is_refused_before_the_build(tmp_path):
    project = make_fake_project(tmp_path)
    add_candidate(project, "fork-pin-layers", env={"GGML_CUDA_MOE_PIN_LAYERS": "2"})
    proc = run(project, "build", "compare-outputs")
    assert_refused_before_anything(proc, project, (
        "configuration fork-pin-layers of group base-vs-fork sets GGML_CUDA_MOE_PIN_LAYERS, which only the CUDA "
        f"backend reads, on linux-x86_64-cpu, a platform without a GPU ({project.matrix}: "
        "configs.fork-pin-layers.env)"))


# ----------------------------------------------------------- after the build, before any generation (slow)

def assert_refused_before_generating(proc: subprocess.CompletedProcess, project: FakeProject, message: str) -> None:
    """Exit 2 with ``message`` as the one ``error:`` line, the builds passed, no generation and no signature."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [f"error: {message}"]
    run_dir = (project.results / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {(s["config"], s["step"], s["status"]) for s in summary["configurations"]} == {
        ("base", "build", "passed"), ("fork", "build", "passed")}
    assert summary["overall"] == "incomplete" and not summary["comparisons"]
    assert not list(run_dir.rglob("gen")) and not list(run_dir.rglob("*.tokens.json"))
    assert json.loads((run_dir / "signatures.json").read_text()) == []


@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
@pytest.mark.parametrize("n_predict, refused, message", [
    # no prompt fits: refused before anything is built
    ("300", "before anything", f"--n-predict 300 does not fit {ROOM_64} with prompt one (at least 1 token of tiny): "
                               "at most 255 tokens can be generated after it; 3 more prompts do not fit either"),
    # 256 - 254 = 2 tokens of room: the bounds (1 and 16) leave "one two three" open; its 3 tokens do not fit
    pytest.param("254", "before generating", f"--n-predict 254 does not fit {ROOM_64} with prompt one (3 tokens of "
                                             "tiny): at most 253 tokens can be generated after it; 1 more prompt "
                                             "does not fit either", marks=pytest.mark.slow)])
def test_an_n_predict_that_does_not_fit_is_refused_as_soon_as_that_is_known(tmp_path, n_predict, refused, message):
    project = make_fake_project(tmp_path)
    proc = run(project, "build", "compare-outputs", extra=("--n-predict", n_predict))
    if refused == "before anything":
        assert_refused_before_anything(proc, project, message)
    else:
        assert_refused_before_generating(proc, project, message)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
@pytest.mark.parametrize("args, why", [
    (["--no-such-option"], "error: invalid argument: --no-such-option"),
    (["-ngl", "99"], "warning: no usable GPU found, --gpu-layers option will be ignored")])
def test_arguments_the_build_does_not_take_are_refused_after_the_build_before_any_generation(tmp_path, args, why):
    project = make_fake_project(tmp_path)
    add_candidate(project, "fork-odd", args=args)
    proc = run(project, "build", "compare-outputs")
    assert_refused_before_generating(proc, project, (
        f"configuration fork-odd of group base-vs-fork on linux-x86_64-cpu: the fork build's llama-completion "
        f"does not take {' '.join(args)}: {why} ({project.matrix}: configs.fork-odd.args)"))


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_arguments_the_build_takes_and_prompts_that_just_fit_run(tmp_path):
    project = make_fake_project(tmp_path)
    add_candidate(project, "fork-ub-1", args=["-ub", "1"])
    # 256 - 253 = 3 tokens of room: every prompt is counted (3, 3, 2 and 2 tokens) and fits
    proc = run(project, "build", "compare-outputs", extra=("--n-predict", "253"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_option_refusal_reads_llama_completion_s_own_words(tmp_path):
    script = tmp_path / "completion.py"
    script.write_text("import sys, time\n"
                      "args = sys.argv[1:]\n"
                      "assert args[-1] == '--help'\n"
                      "if '--bogus' in args: sys.stderr.write('error: invalid argument: --bogus\\n'); sys.exit(1)\n"
                      "if '-sm' in args: sys.stderr.write('warning: llama.cpp was compiled without support for GPU "
                      "offload. Setting the split mode has no effect.\\n')\n"
                      "if '--slow' in args: time.sleep(5)\n")
    completion = [sys.executable, str(script)]
    assert option_refusal(completion, ["--bogus"], {}) == "error: invalid argument: --bogus"
    assert option_refusal(completion, ["-sm", "row"], {}) == (
        "warning: llama.cpp was compiled without support for GPU offload. Setting the split mode has no effect.")
    assert option_refusal(completion, ["-fa", "off"], {}) is None
    assert option_refusal(completion, ["--slow"], {}, timeout_s=0.5) is None  # nothing proven: it runs
