"""Which prompts get a llama-completion text check: every prompt, or the first prompt of each group.

The runner drives the fake engine (tests/fake_engine.py) and a fake llama-completion that logs
each prompt it was given, so which text checks ran is observed, not assumed.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.common.errors import HarnessError
from harness.matrix.config import Comparison, Generation, load_matrix
from harness.stages.outputs.compare import GenerationSpec
from harness.stages.outputs.greedy import GreedyRunner, Hooks, Job, Side

ROOT = Path(__file__).resolve().parents[1]

# prints the engine's generation ("hello" then end of generation) and logs the prompt it got
FAKE_COMPLETION = """
import os, sys
prompt = open(sys.argv[sys.argv.index("-f") + 1]).read()
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(prompt.strip() + "\\n")
if os.environ.get("FAKE_CRASH") and "crash" in prompt:
    sys.stderr.write("GGML_ASSERT(false) failed\\n")
    sys.exit(134)
sys.stdout.write("hello [end of text]\\n\\n\\n")  # the piece, the end-of-generation marker, the trailer
"""

PROMPTS = {"p0": "prompt zero", "p1": "prompt one", "p2": "this one may crash"}


def _run(tmp_path: Path, text_check: str, env: dict[str, str] | None = None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    completion = tmp_path / "llama-completion"
    completion.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_COMPLETION))
    completion.chmod(0o755)
    log = tmp_path / "prompts.log"
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    extra = {"FAKE_LOG": str(log), **(env or {})}

    def engine(side: Side, model_path: Path, gen: Generation) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, str(Path(__file__).with_name("fake_engine.py"))], {}

    def spec(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
        return GenerationSpec(binary=completion, model=model_path, prompt=prompt, n_predict=gen.n_predict,
                              env=extra, timeout_s=gen.timeout_s)

    hooks = Hooks(engine=engine, completion=spec, out_dir=lambda side: tmp_path / "out" / side.config)
    gen = Generation(n_predict=4, repeats=2, timeout_s=60)
    ref = Side("p", "ref")
    jobs = [Job(group="g1", model="m", model_path=model, reference=ref, candidates=(Side("p", "a"),),
                prompts=("p0", "p1", "p2"), generation=gen, comparison=Comparison(), label="ref"),
            Job(group="g2", model="m", model_path=model, reference=ref, candidates=(Side("p", "b"),),
                prompts=("p2",), generation=gen, comparison=Comparison(), label="ref")]
    runner = GreedyRunner(hooks, PROMPTS, tmp_path / "tmp", say=lambda _: None, text_check=text_check)
    results = runner.run(jobs)
    checked = sorted(log.read_text().splitlines()) if log.exists() else []
    return runner, results, checked


def _by_prompt(results) -> dict[tuple[str, str], object]:
    return {(c.candidate, c.prompt_id): c for r in results for c in r.comparisons}


def test_every_prompt_checks_the_text_of_every_prompt_of_every_side(tmp_path):
    runner, results, checked = _run(tmp_path, "every-prompt")
    # ref runs p0-p2, a runs p0-p2, b runs p2
    assert checked == sorted(["prompt zero", "prompt one", "this one may crash"] * 2 + ["this one may crash"])
    assert runner.timing.completion_runs == 7
    assert all(c.status == "identical" and c.text_check is not None and c.text_check.status == "identical"
               for c in _by_prompt(results).values())
    # one engine repeat and one llama-completion run per prompt
    assert sorted(p.name for p in (tmp_path / "out" / "a" / "gen" / "m").glob("*.tokens.json")) == [
        "p0.r1.tokens.json", "p1.r1.tokens.json", "p2.r1.tokens.json"]


def test_first_prompt_checks_each_groups_first_prompt_on_both_sides(tmp_path):
    runner, results, checked = _run(tmp_path, "first-prompt")
    # g1's first prompt (p0) for ref and a; g2's (p2) for ref and b
    assert checked == sorted(["prompt zero", "prompt zero", "this one may crash", "this one may crash"])
    assert runner.timing.completion_runs == 4
    comps = _by_prompt(results)
    assert comps[("a", "p0")].text_check is not None and comps[("a", "p0")].text_check.status == "identical"
    assert comps[("b", "p2")].text_check is not None
    assert comps[("a", "p1")].text_check is None and comps[("a", "p2")].text_check is None
    assert {c.status for c in comps.values()} == {"identical"}
    # a prompt without a text check gets both repeats from the engine, so nondeterminism is still seen
    assert sorted(p.name for p in (tmp_path / "out" / "a" / "gen" / "m").glob("*.tokens.json")) == [
        "p0.r1.tokens.json", "p1.r1.tokens.json", "p1.r2.tokens.json", "p2.r1.tokens.json", "p2.r2.tokens.json"]
    assert runner.side_runs[Side("p", "a")] == 6  # two runs for each of the three prompts, as with every-prompt


def test_a_crashing_text_check_fails_its_comparison_in_either_mode(tmp_path):
    facts = {}
    for mode in ("every-prompt", "first-prompt"):
        runner, results, _ = _run(tmp_path / mode, mode, env={"FAKE_CRASH": "1"})
        comps = _by_prompt(results)
        assert comps[("b", "p2")].status == "crashed"  # g2's first prompt is checked in both modes
        # the reference's check of p2 crashed, so a's p2 comparison is crashed too, whoever ran a check
        assert comps[("a", "p2")].status == "crashed"
        assert comps[("a", "p0")].status == "identical"
        facts[mode] = {(side.config, f.prompt, f.status) for side, fs in runner.problems.items() for f in fs}
    assert facts["every-prompt"] == {("ref", "p2", "crashed"), ("a", "p2", "crashed"), ("b", "p2", "crashed")}
    # in first-prompt mode a runs no llama-completion on p2 (not g1's first prompt)
    assert facts["first-prompt"] == {("ref", "p2", "crashed"), ("b", "p2", "crashed")}


def test_an_unknown_text_check_is_refused(tmp_path):
    with pytest.raises(ValueError, match="every-prompt, first-prompt"):
        GreedyRunner(Hooks(engine=None, completion=None, out_dir=None), {}, tmp_path,  # type: ignore[arg-type]
                     text_check="some-prompts")
    doc = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    doc["platforms"]["linux-x86_64-cpu"]["text_check"] = "some-prompts"
    bad = tmp_path / "matrix.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(HarnessError, match="text_check"):
        load_matrix(bad)


def test_the_cuda_platform_checks_first_prompts_and_the_cpu_platform_every_prompt():
    m = load_matrix(ROOT / "matrix.yaml")
    assert m.platforms["linux-x86_64-cuda"].text_check == "first-prompt"
    assert m.platforms["linux-x86_64-cpu"].text_check == "every-prompt"
