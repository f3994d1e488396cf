"""The speed stage and its rules: statistics, matrix declarations, the stage on fake engines, records, triage."""

from __future__ import annotations

import io
import json
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.triage import triage
from harness.views.report import markdown_summary, render_html
from harness.triage.signatures import classify_run
from harness.common.statistics import judge, spread
from harness.common.console import Console
from harness.matrix.config import MatrixError, load_matrix
from harness.matrix.selection import Selection
from harness.pipeline import Options
from harness.record.bench import parse_step, read_bench, step_name
from harness.record.junit import speed_xml
from harness.record.cache import ResultCache
from harness.record.json_files import write_json
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.stages.outputs.generation_cache import SideIdentity
from harness.stages.outputs.engine import EngineSession
from harness.stages.speed import speed
from harness.stages.speed.speed import stage_speed

ROOT = Path(__file__).resolve().parents[1]
FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine.py"
CPU = "linux-x86_64-cpu"
WINDOWS = "windows-x86_64-cpu"

# --------------------------------------------------------------------------- the rule


def test_a_planted_twofold_slowdown_is_a_regression():
    ref = [100, 104, 98, 101, 103]
    v = judge(ref, [x / 2 for x in ref])
    assert v.regressed and v.slower and v.significant
    assert v.ratio == pytest.approx(0.5) and v.p_value == pytest.approx(1 / 252)


def test_samples_of_one_distribution_pass():
    v = judge([100, 104, 98, 101, 103], [102, 99, 103, 100, 101])
    assert not v.regressed and not v.slower and v.p_value > 0.3


def test_a_small_separated_slowdown_is_within_the_factor():
    ref = [100, 100.5, 101, 101.5, 102]
    v = judge(ref, [x * 0.95 for x in ref])  # every sample 5 % slower: significant, but not past 10 %
    assert v.significant and not v.slower and not v.regressed


def test_a_large_slowdown_the_rank_test_does_not_support_is_not_counted():
    v = judge([100, 20, 100, 20, 100], [50, 100, 20, 30, 25])  # medians 0.3x, samples interleaved
    assert v.slower and not v.significant and not v.regressed


def test_a_speedup_rule_needs_the_factor_asked():
    nopin = [1000, 1010, 990, 1005, 995]
    assert judge(nopin, [5000, 5100, 4900, 5050, 4950], min_ratio=3.0, factor=0).regressed is False
    v = judge(nopin, [2000, 2020, 1980, 2010, 1990], min_ratio=3.0, factor=0)
    assert v.regressed and v.threshold == 3.0 and v.ratio == pytest.approx(2.0)
    assert "at least 3x asked" in v.describe()



def test_a_verdict_says_both_medians_the_ratio_against_its_threshold_and_p_against_p_max():
    """The one line a speed step's detail carries (SpeedVerdict.describe): the candidate's and the reference's
    median tok/s and how many samples each, the ratio, what was asked (no slowdown, or at least min_ratio), the
    threshold it fails below with the p it needs, and the rank test's p."""
    v = judge([100, 104, 98, 101, 103], [50, 52, 49, 50.5, 51.5])
    assert v.describe() == ("50.5 vs 101.0 tok/s (medians of 5 and 5): ratio of medians 0.50x, no slowdown asked "
                            "(fails below 0.909x with p <= 0.01); Mann-Whitney p = 0.00397")
    assert "(medians of 5 and 5): median of within-round ratios 0.50x, no slowdown asked" in \
        judge([100, 104, 98, 101, 103], [50, 52, 49, 50.5, 51.5], paired=True).describe()
    assert "at least 3x asked (fails below 3x with p <= 0.05)" in \
        judge([10, 11, 12], [40, 41, 42], min_ratio=3.0, factor=0, p_max=0.05).describe()


def test_a_spread_gives_the_median_extremes_and_inclusive_quartiles_of_its_samples():
    """The summary bench.json keeps per side (harness.common.statistics.spread): sorted samples, inclusive
    quartiles; one sample is its own quartiles, and a median of 0 gives a relative IQR of 0, not a division."""
    sp = spread([3, 1, 2, 5, 4])
    assert (sp.n, sp.median, sp.min, sp.max, sp.q1, sp.q3) == (5, 3, 1, 5, 2, 4)
    assert sp.rel_iqr == pytest.approx(2 / 3)
    one = spread([7])
    assert (one.n, one.median, one.q1, one.q3, one.rel_iqr) == (1, 7, 7, 7, 0.0)
    assert spread([0, 0, 0]).rel_iqr == 0.0
    with pytest.raises(ValueError, match="no samples"):
        spread([])


def test_the_rule_refuses_too_few_samples():
    with pytest.raises(ValueError, match="at least 2 samples"):
        judge([1.0], [1.0, 2.0])
    sp = spread([3, 1, 2, 5, 4])
    assert (sp.n, sp.median, sp.min, sp.max, sp.q1, sp.q3) == (5, 3, 1, 5, 2, 4)


def test_two_samples_a_side_are_enough_and_a_ratio_that_is_not_positive_is_refused_saying_so():
    """MIN_SAMPLES (2) is the fewest the rule judges, counted on each side apart: two and two are judged, one on
    either side is refused naming both counts.  A ``min_ratio`` of 0 or below asks for nothing and is refused."""
    v = judge([100, 102], [50, 51])
    assert (v.reference.n, v.candidate.n) == (2, 2) and v.slower
    with pytest.raises(ValueError, match=r"at least 2 samples per side \(reference 2, candidate 1\)"):
        judge([100, 102], [50])
    with pytest.raises(ValueError, match=r"at least 2 samples per side \(reference 1, candidate 2\)"):
        judge([100], [50, 51])
    for bad in (0, -1.5):
        with pytest.raises(ValueError, match=rf"^min_ratio must be positive, not {bad}$"):
            judge([100, 102], [50, 51], min_ratio=bad)


def test_a_verdict_keeps_what_it_was_judged_by_and_words_its_outcome_by_the_rule_asked():
    """SpeedVerdict carries the min_ratio, factor and p_max it was judged by (the speed step records them), and
    outcome() words the decision: slowdown / no slowdown by the rule for a rule of no slowdown, short of Nx /
    not short of Nx by the rule for one that asks for N times the reference's speed."""
    ref = [100, 104, 98, 101, 103]
    v = judge(ref, [x / 2 for x in ref], factor=0.2, p_max=0.05)
    assert (v.min_ratio, v.factor, v.p_max) == (1.0, 0.2, 0.05) and v.threshold == pytest.approx(1 / 1.2)
    assert judge(ref, ref).factor == 0.10
    assert v.outcome() == "slowdown"
    assert judge(ref, ref).outcome() == "no slowdown by the rule"
    nopin = [1000, 1010, 990, 1005, 995]
    assert judge(nopin, [2000, 2020, 1980, 2010, 1990], min_ratio=3.0, factor=0).outcome() == "short of 3x"
    assert judge(nopin, [5000, 5100, 4900, 5050, 4950], min_ratio=3.0, factor=0).outcome() == \
        "not short of 3x by the rule"


def test_two_samples_have_their_inclusive_quartiles_and_no_samples_is_refused_in_those_words():
    """From two samples up the quartiles are statistics.quantiles' inclusive ones (1.5 and 2.5 of 1 and 3); only
    a single sample is its own quartiles.  No samples: ValueError("no samples")."""
    two = spread([3, 1])
    assert (two.n, two.median, two.min, two.max, two.q1, two.q3) == (2, 2, 1, 3, 1.5, 2.5)
    with pytest.raises(ValueError, match="^no samples$"):
        spread([])


# --------------------------------------------------------------------------- matrix


def matrix_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "matrix.yaml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


SPEED_OF_BASE_VS_FORK = "      model: gemma3-270m\n      rules: [{metric: pp}, {metric: tg}]\n"
SPEED_PLATFORMS = "      platforms: [linux-x86_64-cpu]\n"


def test_the_shipped_matrix_declares_the_issue_s_rules():
    m = load_matrix(ROOT / "matrix.yaml")
    fork = m.groups["base-vs-fork"].speed
    assert fork is not None and fork.model == "gemma3-270m" and fork.repeats >= 5
    assert [(r.candidate, r.metric, r.min_ratio) for r in fork.rules] == [("fork", "pp", 1.0), ("fork", "tg", 1.0)]
    cuda = m.groups["cuda-base-vs-fork"].speed
    assert cuda is not None and {r.metric for r in cuda.rules} == {"pp", "tg"}
    pin = m.groups["cuda-pin-routes"].speed
    assert pin is not None and [(r.candidate, r.metric, r.min_ratio, r.factor) for r in pin.rules][0] == \
        ("cuda-pin-all", "pp", 3.0, 0.0)  # the order of the pin routes after it: tests/test_speed_pairs.py
    assert m.groups["cuda-pin-routes"].reference == "cuda-nopin"


@pytest.mark.parametrize("new, message", [
    ("      model: gemma3-270m\n      rules: [{metric: pp, candidate: fork-fa-off}]\n",
     "speed.rules[0].candidate: 'fork-fa-off' is not a candidate of the group"),
    ("      model: moe-large\n      rules: [{metric: pp}]\n", "speed.model: model 'moe-large' is not one of"),
    ("      model: gemma3-270m\n      repeats: 3\n      rules: [{metric: pp}]\n", "speed.repeats: 3 is less than"),
    ("      model: gemma3-270m\n      n_prompt: 1020\n      rules: [{metric: pp}]\n",
     "do not fit the group's ctx_size (1024 tokens)"),
    ("      model: gemma3-270m\n      rules: [{metric: speed}]\n", "speed.rules[0].metric: 'speed' is not one of"),
])
def test_bad_speed_declarations_name_the_line_and_key(tmp_path, new, message):
    path = matrix_with(tmp_path, SPEED_OF_BASE_VS_FORK, new)
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert message in str(err.value) and f"{path}:" in str(err.value)


def test_a_speed_platform_that_does_not_run_the_group_is_refused(tmp_path):
    path = matrix_with(tmp_path, SPEED_PLATFORMS, "      platforms: [linux-x86_64-cuda]\n")
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert "groups.base-vs-fork.speed.platforms[0]: platform 'linux-x86_64-cuda' does not run group " \
           "'base-vs-fork' (platforms that do: linux-x86_64-cpu, windows-x86_64-cpu)" in str(err.value)


def test_the_speed_platforms_decide_where_the_rules_are_measured(tmp_path, monkeypatch):
    # a matrix written under tmp_path names a toolchain file that is not there: whether this machine can
    # run the platform is not what is tested
    monkeypatch.setattr(speed, "cannot_run", lambda p: None)
    shipped = load_matrix(ROOT / "matrix.yaml")
    assert shipped.groups["base-vs-fork"].speed.platforms == (CPU,)
    both = load_matrix(matrix_with(tmp_path, SPEED_PLATFORMS, ""))
    for matrix, on_windows in ((shipped, []), (both, [step_name("base-vs-fork", "pp"), step_name("base-vs-fork", "tg")])):
        pipe = FakePipeline(tmp_path, f"win-{len(on_windows)}")
        pipe.matrix, pipe.opts = matrix, Options(platforms=[WINDOWS], groups=["base-vs-fork"])
        stage_speed(pipe)
        assert sorted(speed_steps(pipe.run)) == on_windows
        assert (read_bench(pipe.run.dir, WINDOWS) is not None) == bool(on_windows)


def test_a_cross_platform_group_cannot_declare_speed(tmp_path):
    path = matrix_with(tmp_path, "    expect: informational\n",
                       "    expect: informational\n    speed: {rules: [{metric: tg}]}\n")
    with pytest.raises(MatrixError, match="groups.cross-os.speed: speed is measured on one platform's machine"):
        load_matrix(path)


# --------------------------------------------------------------------------- the stage on fake engines


def test_the_engine_session_times_a_bench_request(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_MS", "2")
    with EngineSession([sys.executable, str(FAKE_ENGINE)], {}, tmp_path / "e.stderr", tmp_path / "e.cmd", 30, 30) as s:
        got = s.bench(40, 8)
    assert (got.n_prompt, got.n_gen) == (40, 8)
    assert got.tg_tok_s == pytest.approx(8 / (got.tg_ms / 1000)) and 400 < got.tg_tok_s < 500


class FakeSessions:
    """What the speed stage's result cache reads of harness.stages.outputs.sessions.Sessions: a side's identity
    (``images``: config -> the digest its build's programs would have) and the model digests."""

    def __init__(self, images: dict[str, str]):
        self.images = images
        self.models = SimpleNamespace(digest=lambda path: "sha256-of-" + Path(path).name)

    def session_cache(self):
        return self

    def side(self, side):
        return SideIdentity({"images": {"engine": self.images.get(side.config, "same bytes")}})


class FakePipeline:
    """What the speed stage uses of harness.stages.shape.Context, with fake engines (tests/fake_engine.py):
    ``scale`` maps a configuration to its FAKE_BENCH_SCALE (2: twice as slow), ``crash`` names one whose
    engine exits before it is ready.  The result cache is ``<tmp_path>/store`` (shared by the pipelines of
    one test); ``images`` stands for the builds' bytes (config -> digest)."""

    def __init__(self, tmp_path: Path, run_id: str, scale: dict[str, float] | None = None, crash: str = "",
                 images: dict[str, str] | None = None, no_cache: bool = False):
        self.matrix = load_matrix(ROOT / "matrix.yaml")
        self.run = Run(tmp_path / "results", run_id)
        self.opts = Options(platforms=[CPU], groups=["base-vs-fork"], no_cache=no_cache)
        self.console = Console(out=io.StringIO())
        self.scale, self.crash, self.tmp = scale or {}, crash, tmp_path
        self.requests: list[str] = []
        self.results_cache = ResultCache(tmp_path / "store", read=not no_cache)
        self.sessions = FakeSessions(images or {})
        # environment.json as harness.stages.building.builds writes it: the commit each variant was made from
        self.builds = SimpleNamespace(write_environment=lambda p: write_json(
            self.run.layout.environment_json(p.name), {"build_commits": {"base": "0c1e57098bba", "fork": "53fbaed1"}}))

    @property
    def selection(self) -> Selection:
        return Selection.of(self.matrix, self.opts.platforms, self.opts.groups, self.opts.models)

    def model_path(self, name: str) -> Path:
        return self.tmp / f"{name}.gguf"

    def build_variant(self, p, variant):
        return SimpleNamespace(status="passed")

    def doing(self, *what):
        return nullcontext()

    def hooks(self, p):
        def engine(side, model_path, gen):
            self.requests.append(side.config)
            if side.config == self.crash:
                return [sys.executable, "-c", "import sys; sys.exit(3)"], {}
            return [sys.executable, str(FAKE_ENGINE)], {"FAKE_BENCH_SCALE": str(self.scale.get(side.config, 1))}
        return SimpleNamespace(engine=engine)


def speed_steps(run: Run) -> dict[str, StepRecord]:
    return {s.step: s for s in run.steps if parse_step(s.step)}


def test_a_clean_fork_passes_both_rules(tmp_path):
    pipe = FakePipeline(tmp_path, "clean")
    stage_speed(pipe)
    steps = speed_steps(pipe.run)
    assert set(steps) == {step_name("base-vs-fork", "pp"), step_name("base-vs-fork", "tg")}
    assert all(s.status == "passed" and s.config == "fork" for s in steps.values()), steps
    assert "no slowdown by the rule" in steps["speed:base-vs-fork:tg"].detail
    bench = read_bench(pipe.run.dir, CPU)
    assert bench is not None and bench["machine"]["cpu_count"]
    assert [(m["config"], len(m["pp_tok_s"]), len(m["tg_tok_s"])) for m in bench["measurements"]] == \
        [("base", 5, 5), ("fork", 5, 5)]
    assert (pipe.run.dir / steps["speed:base-vs-fork:pp"].log).read_text().count("tok/s") >= 2



@pytest.mark.parametrize("failed_build", ["base", "fork"])
def test_a_rule_whose_reference_or_candidate_build_failed_is_an_error_naming_that_build_and_is_not_measured(
        tmp_path, failed_build):
    """A speed rule needs both builds of its pair: when either did not pass (the reference's ``base`` as much as
    the candidate's ``fork``), each rule of the pair is recorded ``error`` with a ``blocked`` failure naming the
    build, never ``failed`` (no slowdown was measured) and never passed; no engine starts."""
    pipe = FakePipeline(tmp_path, f"blocked-{failed_build}")
    pipe.build_variant = lambda p, variant: SimpleNamespace(status="failed" if variant == failed_build else "passed")
    said: list[str] = []
    pipe.say = said.append
    stage_speed(pipe)
    steps = speed_steps(pipe.run)
    assert set(steps) == {step_name("base-vs-fork", "pp"), step_name("base-vs-fork", "tg")}
    for s in steps.values():
        assert (s.status, s.config, s.blocked_by()) == ("error", "fork", [failed_build]), s
        assert f"build {failed_build}" in s.detail and s.detail.startswith("not run: ")
    assert pipe.requests == [] and read_bench(pipe.run.dir, CPU) is None and len(said) == 2


def test_the_speed_stage_interleaves_one_resident_engine_per_configuration(tmp_path):
    pipe = FakePipeline(tmp_path, "order")
    stage_speed(pipe)
    assert pipe.requests == ["base", "fork"]  # each engine started once, for every round
    # the fake engine's jitter counts its own requests: 1 warm-up then 5 timed ones each, in both engines
    bench = read_bench(pipe.run.dir, CPU)
    for m in bench["measurements"]:
        assert m["pp"]["n"] == 5 and m["position"] == ["base", "fork"].index(m["config"])


def test_the_stage_writes_its_measurements_as_llama_bench_rows_too(tmp_path):
    pipe = FakePipeline(tmp_path, "rows")
    for config in ("base", "fork"):  # as the comparisons leave them (harness.stages.outputs.sessions)
        write_json(pipe.run.layout.config_json(CPU, config), {"build": config, "args": [], "env": {}})
    stage_speed(pipe)
    bench = read_bench(pipe.run.dir, CPU)
    lines = (pipe.run.layout.speed(CPU) / "llama-bench.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["config"], r["n_prompt"], r["n_gen"]) for r in rows] == \
        [(m["config"], n_prompt, n_gen) for m in bench["measurements"]
         for n_prompt, n_gen in ((m["n_prompt"], 0), (0, m["n_gen"]))]
    assert [r["samples_ts"] for r in rows[::2]] == [m["pp_tok_s"] for m in bench["measurements"]]
    assert (rows[0]["build_commit"], rows[2]["build_commit"], rows[0]["backends"]) == ("0c1e570", "53fbaed", "CPU")
    assert {(r["model_type"], r["n_threads"], r["gpu_info"]) for r in rows} == {("gemma3 270M F16", 2, "")}


def test_llama_completion_s_own_timings_are_kept_as_a_cross_check(tmp_path):
    pipe = FakePipeline(tmp_path, "perf")
    for config, pp, tg in (("base", 250.0, 80.0), ("fork", 200.0, 40.0)):
        gen = pipe.run.layout.gen_dir(CPU, config, "gemma3-270m")
        gen.mkdir(parents=True)
        for k in (1, 2):
            (gen / f"story.r{k}.stderr").write_text(
                f"I common_perf_print: prompt eval time =  55.03 ms /  14 tokens ( 3.93 ms per token, {pp + k} tokens "
                f"per second)\nI common_perf_print:        eval time = 1546.01 ms / 119 runs ( 12.99 ms per token, "
                f"{tg + k} tokens per second)\n", encoding="utf-8")
    stage_speed(pipe)
    bench = read_bench(pipe.run.dir, CPU)
    assert bench["completion_timings"] == {"base/gemma3-270m": {"pp_tok_s": 251.5, "tg_tok_s": 81.5, "runs": 2},
                                           "fork/gemma3-270m": {"pp_tok_s": 201.5, "tg_tok_s": 41.5, "runs": 2}}
    log = (pipe.run.dir / speed_steps(pipe.run)["speed:base-vs-fork:tg"].log).read_text()
    assert "cross-check, llama-completion's own tg tok/s" in log and "41.5 vs 81.5, ratio of medians 0.51x (no rounds in common)" in log
    # a cross-check judges nothing: the fake engines are equally fast, so both rules pass
    assert {s.status for s in speed_steps(pipe.run).values()} == {"passed"}


def with_processes(pipe: FakePipeline, processes: int) -> FakePipeline:
    """``pipe`` with ``base-vs-fork``'s speed measured by ``processes`` engine processes per side."""
    group = pipe.matrix.groups["base-vs-fork"]
    pipe.matrix.groups["base-vs-fork"] = replace(group, speed=replace(group.speed, processes=processes))
    return pipe


def test_with_several_processes_a_side_s_samples_are_its_processes_medians(tmp_path, monkeypatch):
    started: list[str] = []

    class Counted(EngineSession):
        def __init__(self, argv, env, stderr_path, *args, **kwargs):
            started.append(Path(stderr_path).name.split(".")[0])
            super().__init__(argv, env, stderr_path, *args, **kwargs)

    monkeypatch.setattr(speed, "EngineSession", Counted)
    pipe = with_processes(FakePipeline(tmp_path, "processes"), 5)
    stage_speed(pipe)
    # a new pair of engines for each of the five process pairs
    assert sorted(started) == ["base"] * 5 + ["fork"] * 5
    assert {s.status for s in speed_steps(pipe.run).values()} == {"passed"}
    bench = read_bench(pipe.run.dir, CPU)
    for m in bench["measurements"]:
        rounds = m["process_rounds"]
        assert len(rounds) == 5 and all(len(r["pp"]) == 5 and len(r["tg"]) == 5 for r in rounds)
        assert m["pp_tok_s"] == [sorted(r["pp"])[2] for r in rounds]
        assert m["tg_tok_s"] == [sorted(r["tg"])[2] for r in rounds]
        # the fake engine queues its prompt in half the time it takes: both are kept
        assert len(m["pp_queued_tok_s"]) == 25 and min(m["pp_queued_tok_s"]) > max(m["pp_tok_s"])
    assert [q["started"] for q in bench["pairs"]] == [["base", "fork"] * 5]


def test_with_several_processes_a_slower_fork_fails_on_the_process_figures(tmp_path):
    pipe = with_processes(FakePipeline(tmp_path, "processes-slow", scale={"fork": 1.25}), 5)
    stage_speed(pipe)
    steps = speed_steps(pipe.run)
    assert {s.status for s in steps.values()} == {"failed"}, steps
    assert "medians of 5 and 5" in steps["speed:base-vs-fork:pp"].detail


def test_processes_must_leave_the_rank_test_able_to_fail(tmp_path):
    bad = matrix_with(tmp_path, "      threads: 1\n", "      threads: 1\n      processes: 3\n")
    with pytest.raises(MatrixError, match="processes"):
        load_matrix(bad)


def test_the_engines_load_their_models_at_the_same_time(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LOAD_S", "1.5")
    pipe = FakePipeline(tmp_path, "loads")
    stage_speed(pipe)
    bench = read_bench(pipe.run.dir, CPU)
    assert {s.status for s in speed_steps(pipe.run).values()} == {"passed"}
    # two loads of 1.5 s each: one after the other the stage could not end before 3 s
    assert bench["wall_s"] < 2.9, bench["wall_s"]


def test_a_planted_slowdown_fails_both_rules_with_a_signature_in_every_record(tmp_path):
    pipe = FakePipeline(tmp_path, "slow", scale={"fork": 2.0})
    stage_speed(pipe)
    steps = speed_steps(pipe.run)
    assert {s.status for s in steps.values()} == {"failed"}
    assert "slowdown" in steps["speed:base-vs-fork:pp"].detail and "0.50x" in steps["speed:base-vs-fork:pp"].detail
    assert pipe.run.overall() == "failed"
    sigs = {e["step"]: e["signature"] for e in classify_run(pipe.run.dir)}
    sig = sigs["speed:base-vs-fork:tg"]
    assert sig["kind"] == "speed_regression"
    assert sig["key"] == "base-vs-fork/gemma3-270m: fork vs base tg"  # no numbers in the key
    assert "0.50x" in sig["summary"] and "no slowdown asked" in sig["summary"]
    junit = speed_xml(pipe.run.steps[0].platform, pipe.run.steps).getroot()
    assert junit.get("tests") == "2" and junit.get("failures") == "2"
    assert {c.get("name") for c in junit.iter("testcase")} == {"fork pp", "fork tg"}
    html = render_html(pipe.run.dir)
    assert 'id="speed"' in html and "0.50x" in html
    md = markdown_summary(pipe.run.dir)
    assert "### Speed rules" in md and "| failed |" in md


def test_an_engine_that_does_not_start_makes_the_rules_errors_not_passes(tmp_path):
    pipe = FakePipeline(tmp_path, "crash", crash="fork")
    stage_speed(pipe)
    steps = speed_steps(pipe.run)
    assert {s.status for s in steps.values()} == {"error"}
    assert "not measured" in steps["speed:base-vs-fork:pp"].detail and "engine for fork" in \
        steps["speed:base-vs-fork:pp"].detail
    assert pipe.run.overall() == "failed"


def test_a_pair_on_the_same_bytes_is_restored_and_judged_again(tmp_path):
    first = FakePipeline(tmp_path, "first")
    stage_speed(first)
    assert first.results_cache.stats["speed"] == {"hits": 0, "misses": 1, "stored": 1, "corrupt": 0}
    again = FakePipeline(tmp_path, "again")
    stage_speed(again)
    assert again.results_cache.stats["speed"]["hits"] == 1
    steps = speed_steps(again.run)
    assert {(s.status, s.cached, s.seconds) for s in steps.values()} == {("passed", "first", 0.0)}
    bench, before = read_bench(again.run.dir, CPU), read_bench(first.run.dir, CPU)
    # no engine started: the samples came from the store
    assert [(q.get("cached"), q["started"]) for q in bench["pairs"]] == [("first", [])]
    assert not list((again.run.dir / CPU / "speed").glob("*.engine.stderr"))
    assert [m["tg_tok_s"] for m in bench["measurements"]] == [m["tg_tok_s"] for m in before["measurements"]]
    # what the engines said of themselves when they loaded is restored with their samples: the llama-bench rows'
    # model_type and n_threads of a restored pair are those of the run that measured it
    assert [m["engine"] for m in bench["measurements"]] == [{"model_desc": "gemma3 270M F16", "n_threads": 2}] * 2
    assert all(r["cached"] == "first" for r in bench["rules"])
    assert "measured by run first" in (again.run.dir / steps["speed:base-vs-fork:tg"].log).read_text()
    # judged by today's rule: a matrix that asks for a twofold speedup fails the same samples
    strict = FakePipeline(tmp_path, "strict")
    g = strict.matrix.groups["base-vs-fork"]
    strict.matrix.groups["base-vs-fork"] = replace(
        g, speed=replace(g.speed, rules=tuple(replace(r, min_ratio=2.0) for r in g.speed.rules)))
    stage_speed(strict)
    assert {s.status for s in speed_steps(strict.run).values()} == {"failed"}
    assert read_bench(strict.run.dir, CPU)["pairs"][0]["started"] == []


@pytest.mark.parametrize("change", ["fork's bytes", "no-cache"])
def test_other_bytes_or_no_cache_measure_again(tmp_path, change):
    stage_speed(FakePipeline(tmp_path, "first"))
    kw = {"images": {"fork": "other bytes"}} if change == "fork's bytes" else {"no_cache": True}
    again = FakePipeline(tmp_path, "again", **kw)
    stage_speed(again)
    assert read_bench(again.run.dir, CPU)["pairs"][0]["started"] == ["base", "fork"]
    assert {s.cached for s in speed_steps(again.run).values()} == {""}
    assert not any(q.get("cached") for q in read_bench(again.run.dir, CPU)["pairs"])


def test_a_slowdown_is_never_stored_so_it_is_measured_again(tmp_path):
    slow = FakePipeline(tmp_path, "slow", scale={"fork": 2.0})
    stage_speed(slow)
    assert slow.results_cache.stats["speed"]["stored"] == 0
    again = FakePipeline(tmp_path, "again", scale={"fork": 2.0})
    stage_speed(again)
    assert read_bench(again.run.dir, CPU)["pairs"][0]["started"] == ["base", "fork"]
    assert {s.status for s in speed_steps(again.run).values()} == {"failed"}


def test_no_bench_runs_nothing(tmp_path):
    pipe = FakePipeline(tmp_path, "off")
    pipe.opts.bench = False
    stage_speed(pipe)
    assert not speed_steps(pipe.run) and read_bench(pipe.run.dir, CPU) is None


# --------------------------------------------------------------------------- triage across runs


def write_bench_run(root: Path, run_id: str, fork_tg: list[float], *, cpu: str = "AMD EPYC") -> Path:
    run = Run(root, run_id)
    run.record_step(StepRecord(CPU, "fork", "build", "passed"))
    unit = {"model": "gemma3-270m", "n_prompt": 64, "n_gen": 16, "repeats": 5}
    measurements = [{"config": "base", **unit, "pp_tok_s": [300, 302, 298, 301, 299], "tg_tok_s": [40, 41, 39, 40.4, 39.6]},
                    {"config": "fork", **unit, "pp_tok_s": [300, 301, 299, 302, 298], "tg_tok_s": fork_tg}]
    write_json(run.layout.speed(CPU) / "bench.json",
               {"machine": {"cpu": cpu, "cpu_count": 2, "gpus": []}, "defaults": {"factor": 0.1, "p_max": 0.01},
                "measurements": measurements,
                "rules": [{"group": "base-vs-fork", "reference": "base", "candidate": "fork", "metric": m}
                          for m in ("pp", "tg")]})
    run.close()
    return run.dir


def test_triage_counts_a_speed_regression_between_runs_of_one_machine(tmp_path):
    a = write_bench_run(tmp_path, "a", [40, 41, 39, 40.5, 39.5])
    b = write_bench_run(tmp_path, "b", [20, 20.5, 19.5, 20.2, 19.8])
    report = triage.diff_runs(a, b, upstream={"fork": "base"})
    assert [t.what for t in report.regressions] == ["fork gemma3-270m tg tok/s"]
    slower = report.regressions[0]
    assert slower.signature["kind"] == "speed_regression" and slower.signature["key"] == "speed fork gemma3-270m tg"
    assert (slower.kind, slower.platform) == ("speed", "linux-x86_64-cpu")
    assert slower.where == {"platform": "linux-x86_64-cpu", "config": "fork", "model": "gemma3-270m", "metric": "tg"}
    assert slower.before.endswith(" tok/s") and slower.after.endswith(" tok/s")
    assert {(c.config, c.metric): c.regressed for c in report.speed_changes} == \
        {("base", "pp"): False, ("base", "tg"): False, ("fork", "pp"): False, ("fork", "tg"): True}
    assert report.regressions[0].detail.startswith("speed fork gemma3-270m tg: 0.5x base in the run against 1x")
    text = triage.format_report(report)
    assert "vs base (upstream)" in text and "REGRESSION" in text and "verdict: 1 regression(s)" in text
    assert triage.main([str(a), str(b)]) == 1
    assert triage.main([str(a), str(write_bench_run(tmp_path, "c", [40.2, 40.8, 39.1, 40.1, 39.9]))]) == 0


def test_triage_judges_each_pair_by_the_rule_factor_it_is_given_over_the_one_its_runs_recorded(tmp_path):
    """A fork tg 0.8x its earlier ratio to base is a regression by the runs' own factor (0.1); judged with a
    matrix's wider factor for that pair (0.5, as ``triage`` hands diff_runs the matrix's rule factors) it is not,
    and the change carries the factor it was judged by."""
    a = write_bench_run(tmp_path, "a", [40, 41, 39, 40.5, 39.5])
    b = write_bench_run(tmp_path, "b", [32, 32.8, 31.2, 32.4, 31.6])
    recorded = triage.diff_runs(a, b, upstream={"fork": "base"})
    assert [t.what for t in recorded.regressions] == ["fork gemma3-270m tg tok/s"]
    wide = triage.diff_runs(a, b, upstream={"fork": "base"}, factors={("fork", "tg", "base"): 0.5})
    assert wide.regressions == []
    assert {(c.config, c.metric): (c.regressed, c.factor) for c in wide.speed_changes if c.config == "fork"} == \
        {("fork", "pp"): (False, 0.1), ("fork", "tg"): (False, 0.5)}


def test_triage_does_not_compare_speed_across_machines(tmp_path):
    a = write_bench_run(tmp_path, "a", [40, 41, 39, 40.5, 39.5])
    b = write_bench_run(tmp_path, "b", [20, 20.5, 19.5, 20.2, 19.8], cpu="Intel Xeon")
    report = triage.diff_runs(a, b)
    assert not report.regressions and not report.speed_changes
    assert report.speed_not_comparable == [f"{CPU}: another machine (cpu differ); speed not compared"]
    assert "not comparable" in triage.format_report(report)


def test_the_command_line_turns_the_stage_off_and_refuses_too_few_rounds(capsys):
    from harness import cli
    args = cli.parse(["compare-outputs", "--no-bench", "--bench-repeats", "7"])
    assert args.bench is False and args.bench_repeats == 7
    assert cli.parse(["compare-outputs"]).bench is True
    with pytest.raises(SystemExit):
        cli.parse(["compare-outputs", "--bench-repeats", "3"])
    assert "at least 5 rounds" in capsys.readouterr().err
