"""The result cache (docs/cache.md): a hit reproduces a fresh run, and no change hides behind one.

The greedy runner drives a copy of the fake engine (tests/fake_engine.py) and a fake llama-completion
from a fake build directory, with the real store, keys and restore code.  Each test changes one input
and observes which sessions ran again (``timing.sessions``, ``origins``) rather than assuming it.
"""

from __future__ import annotations

import json

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.matrix.config import Comparison, Generation
from harness.record.cache import DigestMemo, ResultCache, normalized_image
from harness.stages.outputs.compare import GenerationSpec, to_json
from harness.stages.building.binaries import _EMULATOR_VERSIONS
from harness.stages.outputs.generation_cache import SessionCache, side_identity
from harness.stages.outputs.greedy import GreedyRunner, Hooks, Job, Side

HERE = Path(__file__).resolve().parent

FAKE_COMPLETION = """
import sys
sys.stderr.write("load_tensors: CPU_Mapped model buffer size = 1.00 MiB\\n")
sys.stdout.write("hello [end of text]\\n\\n\\n")
"""

FAKE_WINE = """
import sys
if sys.argv[1:] == ["--version"]:
    print(open(__file__ + ".version").read().strip())
"""

PROMPTS = {"p0": "prompt zero", "p1": "prompt one"}


class Setup:
    """A fake build (engine, llama-completion, a library, build-info.cpp), a model, and what a run is given."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "build" / "bin"
        self.bin.mkdir(parents=True)
        shutil.copy(HERE / "fake_engine.py", self.bin / "engine")
        (self.bin / "llama-completion").write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_COMPLETION))
        (self.bin / "llama-completion").chmod(0o755)
        (self.bin / "libllama.so").write_bytes(b"\x00library code\x00")
        (tmp / "build" / "common").mkdir()
        self.label("5 patches, sha256 000000000000")
        self.model = tmp / "model.gguf"
        self.model.write_bytes(b"GGUF model one")
        self.wine = tmp / "wine64"
        self.wine.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_WINE))
        self.wine.chmod(0o755)
        (tmp / "wine64.version").write_text("wine-8.0 (Debian 8.0~repack-4)\n")
        self.prompts = dict(PROMPTS)
        self.args: dict[str, list[str]] = {"b": ["--threads", "2"]}  # b differs from a, as configs do
        self.env: dict[str, dict[str, str]] = {}
        self.store = ResultCache(tmp / "cache" / "results")
        self.stderr_calls: list[tuple[str, str, str]] = []

    def label(self, series: str) -> None:
        """Name the build with ``series`` in build-info.cpp and in the library, as the real build does."""
        (self.tmp / "build" / "common" / "build-info.cpp").write_text(
            f'char const * LLAMA_COMMIT = "abc1234";\nstatic char const * LLAMA_FORK_SERIES = "{series}";\n')
        (self.bin / "libllama.so").write_bytes(b"\x00library code\x00fork series: " + series.encode() + b"\x00")

    def run(self, run_id: str, read: bool = True, out: str | None = None, lanes: int = 1,
            b_is_a_reference: bool = False, groups: list[tuple[str, tuple[str, ...]]] | None = None,
            models: list[tuple[str, Path, tuple[str, ...]]] | None = None) -> GreedyRunner:
        """One comparison run: group g (ref vs a, b) on two prompts, into ``out`` (default: run_id); with
        ``b_is_a_reference`` also group g2 (b vs a), so that a scores against two references; ``groups``
        ((reference, candidates) each) instead of both; ``models`` ((name, file, prompts) each, in order)
        group g once per model instead of model m."""
        out_root = self.tmp / "runs" / (out or run_id)

        def engine(side: Side, model_path: Path, gen: Generation):
            return ([sys.executable, str(self.bin / "engine"), "-m", str(model_path), *self.args.get(side.config, [])],
                    dict(self.env.get(side.config, {})))

        def spec(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
            return GenerationSpec(binary=self.bin / "llama-completion", model=model_path, prompt=prompt,
                                  n_predict=gen.n_predict, args=tuple(self.args.get(side.config, [])),
                                  env=dict(self.env.get(side.config, {})), timeout_s=gen.timeout_s)

        def stderr(side: Side, model: str, stem: Path, text: str) -> None:
            self.stderr_calls.append((side.config, str(stem.relative_to(out_root)), text))

        def identity(side: Side):
            return side_identity(self.bin, ["engine", "llama-completion"], [str(self.wine)], {})

        hooks = Hooks(engine=engine, completion=spec, out_dir=lambda side: out_root / side.config, stderr=stderr)
        self.store.read = read
        cache = SessionCache(self.store, run_id, identity, DigestMemo(self.tmp / "cache" / "digests"))
        gen = Generation(n_predict=4, repeats=2, timeout_s=60)
        job = Job(group="g", model="m", model_path=self.model, reference=Side("p", "ref"),
                  candidates=(Side("p", "a"), Side("p", "b")), prompts=tuple(self.prompts), generation=gen,
                  comparison=Comparison(), label="ref")
        jobs = [job] if groups is None else [
            Job(group=f"g{i}", model="m", model_path=self.model, reference=Side("p", ref),
                candidates=tuple(Side("p", c) for c in cands), prompts=tuple(self.prompts), generation=gen,
                comparison=Comparison(), label=ref) for i, (ref, cands) in enumerate(groups)]
        if models is not None:
            jobs = [Job(group="g", model=name, model_path=path, reference=Side("p", "ref"),
                        candidates=(Side("p", "a"), Side("p", "b")), prompts=prompts, generation=gen,
                        comparison=Comparison(), label="ref") for name, path, prompts in models]
        if b_is_a_reference:
            jobs.append(Job(group="g2", model="m", model_path=self.model, reference=Side("p", "b"),
                            candidates=(Side("p", "a"),), prompts=tuple(self.prompts), generation=gen,
                            comparison=Comparison(), label="b"))
        runner = GreedyRunner(hooks, self.prompts, self.tmp / "work", say=lambda _: None, cache=cache, lanes=lanes)
        self.results = runner.run(jobs)
        return runner


def _comparisons(results) -> list[dict]:
    return [to_json(c) for r in results for c in r.comparisons]


def _files(root: Path) -> dict[str, bytes]:
    """The run directory's files that do not name the run's own paths (.cmd and .prompt are written fresh)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix not in (".cmd",)}


def test_a_rerun_takes_every_session_from_the_cache_and_writes_what_a_fresh_run_wrote(tmp_path):
    s = Setup(tmp_path)
    fresh = s.run("run-1")
    assert fresh.timing.sessions == 3 and fresh.timing.cached_sessions == 0 and not fresh.origins
    fresh_cmp, fresh_calls = _comparisons(s.results), list(s.stderr_calls)
    s.stderr_calls.clear()
    again = s.run("run-2")
    assert again.timing.sessions == 0 and again.timing.completion_runs == 0  # nothing was started
    assert again.timing.cached_sessions == 3
    assert set(again.origins.values()) == {"run-1"} and len(again.origins) == 3
    assert _comparisons(s.results) == fresh_cmp  # KL divergence included: scores come back keyed by the pair
    assert all(c["kl"] is not None for c in fresh_cmp)
    # the same files, byte for byte, and the same stderr handed to the hook that derives the
    # pin-ladder and placement records, at the same places
    assert _files(tmp_path / "runs" / "run-2") == _files(tmp_path / "runs" / "run-1")
    assert s.stderr_calls == fresh_calls
    assert s.store.stats["generation"]["hits"] == 3
    # the runs' counts feed the generate steps as for a fresh run
    assert again.side_runs == fresh.side_runs and again.side_ok == fresh.side_ok


CHANGES = {
    "engine binary": lambda s: (s.bin / "engine").write_text((s.bin / "engine").read_text() + "\n# rebuilt\n"),
    "library": lambda s: (s.bin / "libllama.so").write_bytes(b"\x00library code, changed\x00"),
    "model": lambda s: s.model.write_bytes(b"GGUF model two"),
    "prompt": lambda s: s.prompts.update(p1="prompt one, edited"),
    "arg": lambda s: s.args.update(a=["-ub", "1"]),
    "env value": lambda s: s.env.update(a={"GGML_CUDA_MOE_PIN_LAYERS": "4"}),
    # Wine upgraded between two harness processes (the version is read once per process)
    "emulator": lambda s: ((s.tmp / "wine64.version").write_text("wine-9.0\n"), _EMULATOR_VERSIONS.clear()),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_of_any_input_misses(tmp_path, change):
    s = Setup(tmp_path)
    s.run("run-1")
    CHANGES[change](s)
    again = s.run("run-2")
    changed_sides = {"arg": {"a"}, "env value": {"a"}}.get(change, {"ref", "a", "b"})
    ran_again = {side.config for side in (Side("p", c) for c in ("ref", "a", "b"))
                 if (side, "m") not in again.origins}
    assert ran_again == changed_sides
    # a configuration generated fresh still runs its repeats: one engine run and one text check per prompt
    for c in changed_sides:
        assert again.side_runs[Side("p", c)] == 2 * len(s.prompts)


def test_an_inherited_variable_that_reaches_ggml_misses(tmp_path, monkeypatch):
    s = Setup(tmp_path)
    s.run("run-1")
    monkeypatch.setenv("GGML_CUDA_NO_PINNED", "1")
    assert not s.run("run-2").origins
    monkeypatch.delenv("GGML_CUDA_NO_PINNED")
    monkeypatch.setenv("HARNESS_UNRELATED", "1")
    assert len(s.run("run-3").origins) == 3


def test_the_build_name_alone_does_not_miss_but_code_beside_it_does(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    s.label("5 patches, sha256 111111111111")  # a comment edit in a patch: only the series digest changes
    assert len(s.run("run-2").origins) == 3
    (s.bin / "libllama.so").write_bytes((s.bin / "libllama.so").read_bytes() + b"\x01")
    assert not s.run("run-3").origins


def test_a_candidate_that_misses_scores_against_a_cached_reference(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    first = _comparisons(s.results)
    s.env["a"] = {"X": "1"}
    again = s.run("run-2")
    assert (Side("p", "ref"), "m") in again.origins and (Side("p", "a"), "m") not in again.origins
    # one load of the reference to write its distributions again, one of the candidate
    assert again.timing.sessions == 2
    assert _comparisons(s.results) == first  # the KL divergence is there, as in a fresh run


def test_with_two_lanes_a_cached_references_dumps_are_written_beside_the_candidates_generations(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    first = _comparisons(s.results)
    s.env["a"] = {"X": "1"}
    s.env["b"] = {"X": "1"}
    again = s.run("run-2", lanes=2)
    assert (Side("p", "ref"), "m") in again.origins and len(again.origins) == 1
    # one load of the reference to write its distributions again, for both candidates, and one of each
    assert again.timing.sessions == 3
    assert _comparisons(s.results) == first
    assert Side("p", "ref") in again.side_seconds  # that load is the reference's time, not a candidate's


def test_a_candidate_generates_while_its_cached_references_dumps_are_written(tmp_path, monkeypatch):
    # a scores against two references taken from the cache, each needing its dumps written again; on two
    # lanes a's session starts at once beside the first dump (it generates before it scores), not after both
    s = Setup(tmp_path)
    s.run("run-1", b_is_a_reference=True)
    first = _comparisons(s.results)
    s.env["a"] = {"X": "1"}
    log = tmp_path / "requests.log"
    monkeypatch.setenv("FAKE_REQUEST_LOG", str(log))
    monkeypatch.setenv("FAKE_LOAD_S", "0.3")
    again = s.run("run-2", lanes=2, b_is_a_reference=True)
    assert {side.config for side, _ in again.origins} == {"ref", "b"}
    assert again.timing.sessions == 3  # a's session and one load per reference for its dumps
    events = [line.split() for line in log.read_text().splitlines()]
    generating = {pid for pid, what in events if what == "generate"}
    ready = [pid for pid, what in events if what == "ready"]
    assert len(generating) == 1 and len(ready) == 3
    assert ready.index(next(iter(generating))) < 2, events  # among the first two processes, not the third
    assert _comparisons(s.results) == first  # both references' scores, as in a fresh run


def test_a_model_whose_sessions_all_come_from_the_cache_leaves_nothing_for_the_next_models_candidates(tmp_path):
    # the first model is restored whole (its reference's dumps never needed), the second runs: its candidates
    # score against its own reference's live dumps, never against the first model's restored prompts
    s = Setup(tmp_path)
    second = tmp_path / "model-2.gguf"
    second.write_bytes(b"GGUF model two")
    models = [("m", s.model, ("p0", "p1")), ("m2", second, ("p0",))]
    s.run("run-1", models=models)
    first = _comparisons(s.results)
    second.write_bytes(b"GGUF model two, made again")  # every session of m2 misses, every one of m stays
    again = s.run("run-2", models=models)
    assert {(side.config, model) for side, model in again.origins} == {("ref", "m"), ("a", "m"), ("b", "m")}
    assert again.timing.sessions == 3  # m2's three sessions, and no load to write m's dumps again
    assert _comparisons(s.results) == first  # m2's comparisons, scored against its own reference


def test_a_session_with_scores_serves_a_run_that_needs_its_generations_alone(tmp_path):
    # a cross-platform group's reference: the other platform's run needs the generations a session of this
    # platform made with scores of its own (harness.stages.outputs.generation_cache.generations_identity)
    s = Setup(tmp_path)
    s.args["a"] = ["--threads", "3"]  # a generates other tokens' distributions than ref: its own identity
    s.run("run-1")  # a and b score against ref
    before = dict(s.store.stats["generation"])
    again = s.run("run-2", groups=[("a", ("b",))])  # a only generates (and dumps, for b)
    assert set(again.origins) == {(Side("p", "a"), "m")}  # b owes scores against a, never made: it runs
    after = s.store.stats["generation"]
    assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (1, 1)  # one event each
    assert again.timing.sessions == 2  # b's session, and one load of a to write its dumps for b
    assert all(c.status == "identical" and c.kl is not None for r in s.results for c in r.comparisons)
    # a session that owes scores never takes another session's generations without them: ref, stored
    # with no scores against b, runs; b, a reference now, is restored from its generations alone
    third = s.run("run-3", groups=[("b", ("ref",))])
    assert set(third.origins) == {(Side("p", "b"), "m")}


def _scored_entries(store: ResultCache) -> list[Path]:
    """The entry directories of sessions that owe scores (their own key is the only one that serves them;
    each also left its generations alone under another key)."""
    out = []
    for manifest in sorted(store.entries.glob("*/*/manifest.json")):
        if json.loads(manifest.read_text())["identity"].get("scores"):
            out.append(manifest.parent)
    return out


def test_a_corrupt_entry_is_detected_and_regenerated(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    # 3 sessions and their generations alone, of which ref's and a's are one entry: the same programs,
    # arguments and prompts (the configuration's name is not an input)
    assert len(list(s.store.entries.glob("*/*/manifest.json"))) == 5
    stored = [d / "files" / "p0.r1.tokens.json" for d in _scored_entries(s.store)]
    assert len(stored) == 2  # a's and b's, which score against ref
    data = bytearray(stored[0].read_bytes())
    data[data.index(b'"id": 2')+6] = ord("3")  # another token id, same size
    stored[0].write_bytes(bytes(data))
    again = s.run("run-2")
    assert s.store.stats["generation"]["corrupt"] == 1
    assert len(again.origins) == 2
    # the corrupted session ran again (for a candidate, with one more load of the reference to write its
    # distributions) and was stored again, with the bytes it generated
    assert again.timing.sessions in (1, 2)
    assert b'"id": 2' in stored[0].read_bytes() and stored[0].read_bytes() != bytes(data)
    assert all(c.status == "identical" for r in s.results for c in r.comparisons)
    assert len(s.run("run-3").origins) == 3  # the regenerated session was stored again


def test_a_corrupt_manifest_is_detected(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    manifest = _scored_entries(s.store)[0] / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"run-1"', '"run-X"'))
    assert len(s.run("run-2").origins) == 2
    assert s.store.stats["generation"]["corrupt"] == 1


def test_no_cache_regenerates_everything_and_refreshes_the_entries(tmp_path):
    s = Setup(tmp_path)
    s.run("run-1")
    forced = s.run("run-2", read=False)
    assert not forced.origins and forced.timing.sessions == 3
    assert set(s.run("run-3").origins.values()) == {"run-2"}


def test_the_store_keeps_the_most_recently_used_entries_within_its_bound(tmp_path):
    store = ResultCache(tmp_path / "results", max_bytes=10**9)
    for i in range(4):
        store.put("k", f"{i:02d}" + "0" * 62, f"run-{i}", {}, {}, {"f": bytes(1000)})
    assert store.get("k", "00" + "0" * 62) is not None  # used: now the most recent
    size = store.size()
    store.max_bytes = size - 1  # room for three entries
    store.evict()
    kept = {p.parent.name[:2] for p in store.entries.glob("*/*/manifest.json")}
    assert kept == {"00", "02", "03"}  # entry 01, the least recently used, went first


def test_concurrent_writers_and_readers_never_see_half_an_entry(tmp_path):
    root = tmp_path / "results"
    key = "ab" + "0" * 62
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE.parent)!r})
        from pathlib import Path
        from harness.record.cache import ResultCache
        store = ResultCache(Path({str(root)!r}))
        for i in range(40):
            store.put("k", {key!r}, sys.argv[1], {{}}, {{}}, {{"f": sys.argv[1].encode() * 50000}})
    """)
    writers = [subprocess.Popen([sys.executable, "-c", script, w]) for w in ("a", "b")]
    reader = ResultCache(root)
    seen = set()
    while any(w.poll() is None for w in writers):
        hit = reader.get("k", key)
        if hit is not None:
            assert hit.files["f"] == hit.run_id.encode() * 50000  # whole, and the writer's own bytes
            seen.add(hit.run_id)
    assert all(w.wait() == 0 for w in writers)
    assert reader.stats["k"]["corrupt"] == 0 and seen


def test_normalized_images_zero_only_the_build_names():
    elf = b"\x7fELF" + b"\x00" * 60 + b"code" + b"5 patches, sha256 aaaa\x00" + b"more"
    other = elf.replace(b"aaaa", b"bbbb")
    assert normalized_image(elf, [b"5 patches, sha256 aaaa"]) == normalized_image(other, [b"5 patches, sha256 bbbb"])
    assert normalized_image(elf, [b"5 patches, sha256 aaaa"]) != normalized_image(elf.replace(b"code", b"cods"),
                                                                                    [b"5 patches, sha256 aaaa"])
    # a label followed by more characters is other data, kept
    assert normalized_image(b"xlabel-suffix\x00", [b"label"]) == b"xlabel-suffix\x00"


def test_a_commands_entries_are_pending_until_it_ends_as_it_should(tmp_path):
    """harness.record.cache.ResultCache.hold: what a command stores is served to its own process at once, to
    others only once published; a discarded (interrupted) command's entries are gone."""
    mine, other = ResultCache(tmp_path / "store"), ResultCache(tmp_path / "store")
    mine.hold("run-a:compare-outputs")
    other.hold("run-b:compare-outputs")
    mine.put("generation", "k1", "run-a", {}, {"m": 1}, {"f": b"x"})
    assert mine.get("generation", "k1").files == {"f": b"x"}  # its own command's: a cross-platform reference
    assert other.get("generation", "k1") is None and other.stats["generation"]["misses"] == 1
    assert mine.publish() == 1
    assert other.get("generation", "k1").meta == {"m": 1}
    mine.hold("run-a:later")
    mine.put("generation", "k2", "run-a", {}, {}, {"f": b"y"})
    assert mine.discard() == 1
    assert mine.get("generation", "k2") is None and not (tmp_path / "store" / "entries" / "k2"[:2] / "k2").exists()
