"""Lanes: a CPU platform's sessions and text checks run side by side (harness.stages.outputs.greedy).

The runner drives the fake engine (tests/fake_engine.py) and a fake llama-completion, each started
through a shell wrapper that logs when its process starts and ends and with which arguments, so
what ran beside what is observed, not assumed.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from harness.matrix.config import Comparison, Generation
from harness.stages.outputs.compare import GenerationSpec
from harness.kinds.registry import GPUS
from harness.stages.outputs.greedy import MAX_LANES, GreedyRunner, Hooks, Job, Side, lanes_for

FAKE_COMPLETION = """
import sys, time
time.sleep(0.4)
sys.stdout.write("hello [end of text]\\n\\n\\n")
"""

PROMPTS = {"p0": "prompt zero", "p1": "prompt one"}


def _logged(tmp_path: Path, name: str, command: str) -> Path:
    """A shell script that logs ``start <side> <time> <args>`` and ``end <side> <time>`` around ``command``."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        side=$1; shift
        echo "start $side $(date +%s.%N) $*" >> "$LANES_LOG"
        {command} "$@"
        echo "end $side $(date +%s.%N)" >> "$LANES_LOG"
        """))
    script.chmod(0o755)
    return script


def _run(tmp_path: Path, lanes: int, threads: int | None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "lanes.log"
    completion = tmp_path / "llama-completion.py"
    completion.write_text(textwrap.dedent(FAKE_COMPLETION))
    engine_sh = _logged(tmp_path, "engine.sh", f"{sys.executable} {Path(__file__).with_name('fake_engine.py')}")
    completion_sh = _logged(tmp_path, "completion.sh", f"{sys.executable} {completion}")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    env = {"LANES_LOG": str(log), "FAKE_LOAD_S": "0.4"}

    def engine(side: Side, model_path: Path, gen: Generation) -> tuple[list[str], dict[str, str]]:
        return [str(engine_sh), f"engine:{side.config}", *(["-t", str(gen.threads)] if gen.threads else [])], env

    def spec(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
        wrapper = tmp_path / f"completion-{side.config}"
        if not wrapper.exists():
            wrapper.write_text(f'#!/bin/sh\nexec {completion_sh} "completion:{side.config}" "$@"\n')
            wrapper.chmod(0o755)
        return GenerationSpec(binary=wrapper, model=model_path, prompt=prompt, n_predict=gen.n_predict, env=env,
                              timeout_s=gen.timeout_s, threads=gen.threads)

    hooks = Hooks(engine=engine, completion=spec, out_dir=lambda side: tmp_path / "out" / side.config)
    gen = Generation(n_predict=4, repeats=2, timeout_s=60)
    ref = Side("p", "ref")
    jobs = [Job(group="g", model="m", model_path=model, reference=ref, candidates=(Side("p", "a"), Side("p", "b")),
                prompts=("p0", "p1"), generation=gen, comparison=Comparison(), label="ref")]
    runner = GreedyRunner(hooks, PROMPTS, tmp_path / "tmp", say=lambda _: None, lanes=lanes, threads=threads)
    results = runner.run(jobs)
    events = [line.split(" ", 3) for line in log.read_text().splitlines()]
    spans: dict[str, list[tuple[float, float, str]]] = {}
    opened: dict[str, list[tuple[float, str]]] = {}
    for ev in events:
        kind, who, when = ev[0], ev[1], float(ev[2])
        if kind == "start":
            opened.setdefault(who, []).append((when, ev[3] if len(ev) > 3 else ""))
        else:
            began, args = opened[who].pop(0)
            spans.setdefault(who, []).append((began, when, args))
    return runner, results, spans


def _outcome(results) -> list[tuple]:
    return [(c.candidate, c.prompt_id, c.status, c.detail, c.text_check.status if c.text_check else None)
            for r in results for c in r.comparisons]


def _most_at_once(spans: dict[str, list[tuple[float, float, str]]]) -> int:
    edges = sorted([(b, 1) for v in spans.values() for b, _, _ in v] + [(e, -1) for v in spans.values() for _, e, _ in v])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_two_lanes_run_text_checks_beside_sessions_and_candidates_after_their_reference(tmp_path):
    runner, results, spans = _run(tmp_path / "two", lanes=2, threads=1)
    ref_end = max(e for _, e, _ in spans["engine:ref"])
    for cand in ("a", "b"):  # a candidate's session scores the reference's dumps: it starts after they exist
        assert min(b for b, _, _ in spans[f"engine:{cand}"]) >= ref_end
    assert _most_at_once(spans) == 2  # two processes at a time, never more
    # every process got its share of the cores
    assert all(" -t 1" in f" {args}" for v in spans.values() for _, _, args in v)
    # the same records as one lane, which keeps llama.cpp's default threads
    _, alone, alone_spans = _run(tmp_path / "one", lanes=1, threads=None)
    assert _outcome(results) == _outcome(alone)
    assert all(c.kl is not None for r in results for c in r.comparisons)
    assert _most_at_once(alone_spans) == 1
    assert not any("-t" in args.split() for v in alone_spans.values() for _, _, args in v)
    assert runner.timing.completion_runs == 6 and runner.side_runs == {Side("p", c): 4 for c in ("ref", "a", "b")}
    out = tmp_path / "two" / "out"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tokens.json")) == sorted(
        f"{c}/gen/m/{p}.r1.tokens.json" for c in ("ref", "a", "b") for p in ("p0", "p1"))


@pytest.mark.parametrize(("gpu", "requested", "cores", "expected"), [
    ("none", None, 2, (2, 1)),            # the development machine: two lanes of one thread
    ("none", None, 1, (1, None)),         # one core: one lane, llama.cpp's default threads
    ("none", None, 4, (4, 1)),
    ("none", None, 32, (MAX_LANES, 4)),   # lanes capped, the cores shared among them
    ("none", 1, 16, (1, None)),           # --lanes 1: one process at a time, as before lanes
    ("none", 3, 16, (3, 5)),
    ("none", 8, 2, (8, 1)),               # more lanes than cores: never fewer than one thread
    ("nvidia", None, 16, (1, None)),      # a GPU platform: one process at a time
    ("nvidia", 4, 16, (1, None)),
])
def test_lanes_for_shares_the_cores_and_keeps_a_gpu_platform_to_one_process(gpu, requested, cores, expected):
    assert lanes_for(GPUS[gpu], requested, cores) == expected


def test_lanes_and_threads_below_one_are_refused(tmp_path):
    hooks = Hooks(engine=lambda *a: ([], {}), completion=lambda *a: None, out_dir=lambda side: tmp_path)  # type: ignore
    with pytest.raises(ValueError, match="at least 1"):
        GreedyRunner(hooks, PROMPTS, tmp_path, lanes=0)
    with pytest.raises(ValueError, match="at least 1"):
        GreedyRunner(hooks, PROMPTS, tmp_path, lanes=2, threads=0)
