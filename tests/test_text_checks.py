"""llama-completion text checks run beside the engine: several at a time where the platform asks for it.

The runner drives the fake engine (tests/fake_engine.py) and a fake llama-completion that records
when it started and ended, so the overlap of the checks is measured, not assumed.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from harness.stages.compare import GenerationSpec
from harness.matrix.config import Comparison, Generation
from harness.stages.greedy import GreedyRunner, Hooks, Job, Side, text_check_slots

GIB = 1024 ** 3

# prints the engine's generation ("hello" then end of generation); records its start and end times
FAKE_COMPLETION = """
import json, os, sys, time
start = time.time()
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
prompt = open(sys.argv[sys.argv.index("-f") + 1]).read()
if os.environ.get("FAKE_CRASH") and "crash" in prompt:
    sys.stderr.write("GGML_ASSERT(false) failed\\n")
    sys.exit(134)
sys.stdout.write("hello [end of text]\\n\\n\\n")  # the piece, the end-of-generation marker, the trailer
with open(os.environ["FAKE_SPANS"], "a") as fh:
    fh.write(json.dumps([start, time.time()]) + "\\n")
"""


@pytest.mark.parametrize("requested, model_bytes, ram, expected", [
    (4, int(4.83e9), 128 * GIB, 4),   # moe-large on the one-H200 machine: 4 checks beside the engine
    (4, int(4.83e9), 16 * GIB, 1),    # the platform's minimum host RAM holds one copy beside the engine's
    (4, int(4.83e9), 24 * GIB, 1),
    (4, int(4.83e9), 40 * GIB, 3),
    (4, 300_000_000, 16 * GIB, 4),    # gemma3-270m
    (1, 300_000_000, 128 * GIB, 1),   # the default: one after the other
    (4, 300_000_000, None, 1),        # unknown host RAM: no parallel copies
])
def test_text_check_slots_keep_the_model_copies_within_half_the_host_ram(requested, model_bytes, ram, expected):
    assert text_check_slots(requested, model_bytes, ram) == expected


def _runner(tmp_path: Path, jobs: int, sleep: float, env: dict[str, str] | None = None) -> tuple[GreedyRunner, Job]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    completion = tmp_path / "llama-completion"
    completion.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_COMPLETION))
    completion.chmod(0o755)
    spans = tmp_path / "spans.jsonl"
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    prompts = {f"p{i}": f"prompt {i}" for i in range(4)}
    prompts["p3"] = "this one may crash"
    extra = {"FAKE_SLEEP": str(sleep), "FAKE_SPANS": str(spans), **(env or {})}

    def engine(side: Side, model_path: Path, gen: Generation) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, str(Path(__file__).with_name("fake_engine.py"))], {}

    def spec(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
        return GenerationSpec(binary=completion, model=model_path, prompt=prompt, n_predict=gen.n_predict,
                              env=extra, timeout_s=gen.timeout_s)

    hooks = Hooks(engine=engine, completion=spec, out_dir=lambda side: tmp_path / "out" / side.config)
    ref, cands = Side("p", "ref"), (Side("p", "a"), Side("p", "b"))
    job = Job(group="g", model="m", model_path=model, reference=ref, candidates=cands, prompts=tuple(prompts),
              generation=Generation(n_predict=4, repeats=2, timeout_s=60), comparison=Comparison(), label="ref")
    runner = GreedyRunner(hooks, prompts, tmp_path / "tmp", say=lambda _: None, text_check_jobs=jobs)
    return runner, job


def _max_overlap(spans_file: Path) -> int:
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def _outcome(results) -> list[tuple]:
    return [(c.prompt_id, c.candidate, c.status) for r in results for c in r.comparisons]


def test_parallel_text_checks_overlap_and_give_the_same_comparisons(tmp_path):
    seq, job = _runner(tmp_path / "seq", jobs=1, sleep=0.3)
    seq_results = seq.run([job])
    par, pjob = _runner(tmp_path / "par", jobs=3, sleep=0.3)
    par_results = par.run([pjob])

    assert _max_overlap(tmp_path / "seq" / "spans.jsonl") == 1
    assert _max_overlap(tmp_path / "par" / "spans.jsonl") >= 2
    assert _outcome(par_results) == _outcome(seq_results)
    assert {s for _, _, s in _outcome(par_results)} == {"identical"}
    assert par.timing.completion_runs == seq.timing.completion_runs == 12  # 3 sides x 4 prompts
    # a side's time includes its text checks in both modes
    for side in (job.reference, *job.candidates):
        assert par.side_seconds[side] >= 4 * 0.3
        assert par.side_runs[side] == seq.side_runs[side]


def test_a_failing_parallel_text_check_is_recorded_like_a_sequential_one(tmp_path):
    outcomes, facts = [], []
    for jobs in (1, 3):
        runner, job = _runner(tmp_path / f"j{jobs}", jobs=jobs, sleep=0.0, env={"FAKE_CRASH": "1"})
        outcomes.append(_outcome(runner.run([job])))
        facts.append(sorted((side.config, f.prompt, f.status, f.error_line)
                            for side, fs in runner.problems.items() for f in fs))
    assert outcomes[0] == outcomes[1]
    assert facts[0] == facts[1]
    assert ("a", "p3", "crashed", "llama-completion: GGML_ASSERT(false) failed") in facts[1]
    assert [s for p, c, s in outcomes[1] if p == "p3"] == ["crashed", "crashed"]
