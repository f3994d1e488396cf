"""The engine stops where llama-completion stops: a prompt that ends in an end-of-generation token.

llama-completion queues its prompt n_batch tokens at a time and ends the run, printing only
" [end of text]", when the queued batch ends in an end-of-generation token
(tools/completion/completion.cpp of the base tree).  The engine must then generate nothing too,
or each side disagrees with itself and base against fork is reported "diverged".  Runs on the real
CPU build of linux-x86_64-cpu with gemma3-270m: the suite's shared build (tests/conftest.py:
llama_cpu_builds), in the checkout's work directory.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.stages.outputs.compare import split_completion_stdout

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.network,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")]

#: gemma3's chat turn end and its end of sequence; "story" is an ordinary prompt beside them
PROMPTS = [{"id": "turn-end", "text": "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>"},
           {"id": "eos", "text": "The end.<eos>"},
           {"id": "story", "text": "Once upon a time, in a small village by the sea,"}]


def eog_matrix(path: Path) -> Path:
    """matrix.yaml with its relative paths made absolute, and :data:`PROMPTS` for the CPU groups' prompts."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["base"]["files"]["path"] = str(ROOT / data["base"]["files"]["path"])
    for src in data["base"]["sources"]:
        for key in ("path", "sha256_file"):
            if key in src:
                src[key] = str(ROOT / src[key])
    data["prompts"] = PROMPTS
    for group in data["groups"].values():
        group.pop("prompts", None)
    data["platforms"]["linux-x86_64-cpu"]["text_check"] = "every-prompt"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def test_a_prompt_ending_in_an_end_token_generates_nothing_on_either_side_like_llama_completion(tmp_path,
                                                                                              llama_cpu_builds):
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    done = subprocess.run([sys.executable, "-m", "harness", "compare-outputs", "--matrix", str(eog_matrix(tmp_path / "m.yaml")),
                           "--platform", "linux-x86_64-cpu", "--group", "base-vs-fork", "--model", "gemma3-270m",
                           "--n-predict", "8", "-j", "2", "--results-dir", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run = (results / "latest").resolve()
    summary = json.loads((run / "summary.json").read_text())
    status = {c["prompt"]: c for c in summary["comparisons"]}
    assert set(status) == {"turn-end", "eos", "story"}
    for prompt in ("turn-end", "eos"):
        c = status[prompt]
        assert c["status"] == "identical", c["detail"]
        assert c["text_check"]["status"] == "identical", c["text_check"]
        for side in ("base", "fork"):
            for tokens_json in sorted((run / "linux-x86_64-cpu" / side / "gen" / "gemma3-270m").glob(f"{prompt}.r*.tokens.json")):
                gen = json.loads(tokens_json.read_text())
                assert gen["tokens"] == [] and gen["eog"] is True, tokens_json
            stdout = run / "linux-x86_64-cpu" / side / "gen" / "gemma3-270m" / f"{prompt}.r2.stdout"
            text, stopped_at_eog, _ = split_completion_stdout(stdout.read_bytes())
            assert (text, stopped_at_eog) == (b"", True)  # llama-completion generated nothing either
    story = status["story"]
    assert story["status"] == "identical" and story["text_check"]["status"] in ("identical", "incomplete")
    assert len(json.loads((run / "linux-x86_64-cpu" / "base" / "gen" / "gemma3-270m" / "story.r1.tokens.json")
                          .read_text())["tokens"]) > 0
