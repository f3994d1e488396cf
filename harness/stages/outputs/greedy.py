"""Running the greedy comparisons of the selected groups: one model load per configuration.

For each model, every configuration ("side": a configuration as built for one
platform) that a selected group needs runs in one engine session
(``harness.stages.outputs.engine``): all its prompts' generations, then the teacher-forced
scorings.  A reference writes the full log-probability rows of its own tokens
to a temporary dump; each candidate scores the reference's tokens against that
dump (KL divergence, top-1 agreement), so sides run in an order that puts
references first.  After the session, llama-completion runs once per prompt:
the text users see, compared byte for byte as the last repeat.  A session whose
process dies or times out is restarted for the remaining requests.

Which prompts get that text check is the platform's ``text_check`` (``matrix.yaml``):
``every-prompt`` (the default), or ``first-prompt``: only the first prompt of each group, the
same prompt for the reference and its candidates, so their texts still meet byte for byte
(and any prompt on which the engine failed, to record the failure as users see it).
Each llama-completion run loads the model again; on a GPU machine with the 4.8 GB moe-large
that load is most of the run, and ``first-prompt`` keeps the stage near one load per
configuration and model.

Repeats: ``repeats`` runs per configuration and prompt (at least two), ``repeats - 1`` of
them (at least one) by the engine from one load and one by llama-completion; a prompt
without a text check gets them all from the engine.

Lanes: on a CPU platform the sessions and text checks run side by side, on one lane per core by
default (:func:`lanes_for`), each process with ``cores // lanes`` threads.  A session starts once the
sessions of its references have ended (their dumps are written); text checks wait for nothing and fill
the lanes.  Every record is keyed by side and prompt and the comparisons are decided after all of a
model's work, so the records do not depend on the order the lanes finish in.  A GPU platform runs one
process at a time.

With a result cache (harness.stages.outputs.generation_cache, docs/cache.md) a session whose inputs are
byte-identical to a stored one is restored instead of run: its files are written as a fresh
session writes them and its runs and scores come back, so the comparisons are decided the same way.

Longer than 400 lines: the runner's scheduling (lanes, references before their candidates, sessions
restored from the cache) is one state kept by :class:`GreedyRunner`.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Iterator

from .compare import GenerationResult, GenerationSpec, find_error_line, run_generation
from ...kinds.shape import GpuKind
from ...matrix.config import Comparison, Generation
from .divergence import EngineRun, SideRuns, StreamComparison, compare_streams, summarize_kl
from .engine import EngineError, EngineGeneration, EngineSession, ScoreResult, write_engine_cmd
from .generation_cache import SessionCache, generation_from_record, generation_identity, read_json_file, \
    restored_completion, spec_identity
from ...common.locks import Rank, joined_by_holder_of
from ...common import proc
from ...record.probe import PROBE_FILE
from ...record.reloads import RELOADS_CMD, RELOADS_FILE, RELOADS_LOG, recorded_count
from ...record.json_files import write_json
from ...record.records import Failure
from ...common.statuses import CRASHED, GENERATION_FAILURES, IDENTICAL, UNSUPPORTED_UPSTREAM
from ..building.engine_target import ENGINE_TARGET
from .upstream_support import unsupported_upstream


#: The platform's ``text_check`` values (matrix.yaml): which prompts get a llama-completion text check.
TEXT_CHECKS = ("every-prompt", "first-prompt")

#: Lanes by default on a CPU platform: one per core up to this many.  Each lane holds a process with a model
#: loaded (gemma3-270m: about 0.8 GB with its compute buffers), and the groups of matrix.yaml rarely have more
#: sessions and text checks ready at once.
MAX_LANES = 8


def lanes_for(gpu: GpuKind, requested: int | None, cores: int) -> tuple[int, int | None]:
    """How a platform's generations share the machine: (lanes, threads per process, None: llama.cpp's default).

    ``gpu`` is the platform's GPU kind (harness.kinds), whose ``lanes`` policy this applies; ``requested`` the
    ``--lanes`` option (None: the default); ``cores`` what :func:`available_cores` gives.  A kind of lanes
    ``one`` (a GPU platform) runs one process at a time: its sessions
    share the GPU's memory, the pinned host memory the fork's pin ladder registers, and the bus that the
    speed of pinned transfers is about.  A kind of lanes ``per-core`` (a CPU platform) runs ``requested`` or one lane per core (at most
    :data:`MAX_LANES`), each process with ``cores // lanes`` threads (at least one), so that the lanes never
    ask for more threads than there are cores: ggml's threads wait for each other by spinning, and two
    2-thread decodes on 2 cores ran at 7 tok/s each against 59 tok/s alone (docs/benchmarks.md).  Decoding a
    small model does not speed up with threads as prefill does (gemma3-270m on the 2-core development
    machine: 17 ms per token at 2 threads, 21 ms at 1), so two 1-thread processes at once do about 1.6
    times the work of one 2-thread process.  One lane keeps llama.cpp's default threads.
    """
    if gpu.lanes == "one":
        return 1, None
    lanes = requested or min(max(1, cores), MAX_LANES)
    if lanes <= 1:
        return 1, None
    return lanes, max(1, cores // lanes)


@dataclass(frozen=True)
class Side:
    """A configuration as built and run for one platform."""

    platform: str
    config: str


@dataclass(frozen=True)
class Job:
    """One group on one model: the reference side, the candidate sides, prompt ids, settings.

    ``label`` names the reference in the records (``config`` or ``config@platform``); ``expect``
    is the group's expected status.  ``upstream`` maps a candidate config to the side running
    upstream's build in the same mode: when the candidate crashes or times out and that side
    fails the same way, the comparison is ``unsupported-upstream``.
    """

    group: str
    model: str
    model_path: Path
    reference: Side
    candidates: tuple[Side, ...]
    prompts: tuple[str, ...]
    generation: Generation
    comparison: Comparison
    label: str
    expect: str = IDENTICAL
    upstream: Mapping[str, Side] = field(default_factory=dict)


@dataclass(eq=False)
class _SideWork:
    """What one side runs on one model, outside the cache: its engine session (which starts once the
    sessions of ``waits_for`` have ended, their dumps written) and the text checks of ``checks`` (which wait
    for nothing), into ``out_dir`` with the engine's ``argv`` and ``env``.  ``later_refs``: references planned after it (a cycle of groups), scored afterwards;
    ``needs_dumps``: references taken from the cache whose dumps it scores against (written again by a task
    of their own, which the session waits for when it comes to score).  The lanes fill ``completions``,
    ``later`` and ``failed``."""

    side: Side
    gen: Generation
    need: dict
    identity: dict | None
    waits_for: set[tuple[Side, Generation]]
    checks: list[str]
    out_dir: Path
    argv: list[str]
    env: dict[str, str]
    generate: bool = True
    later_refs: set[tuple[Side, Generation]] = field(default_factory=set)
    needs_dumps: set[tuple[Side, Generation]] = field(default_factory=set)
    completions: dict[str, GenerationResult] = field(default_factory=dict)
    check_facts: dict[str, list[Failure]] = field(default_factory=dict)
    later: list = field(default_factory=list)
    failed: bool = False


@dataclass
class JobResult:
    """The comparisons of one job, per (prompt id, candidate config), in matrix order."""

    job: Job
    comparisons: list[StreamComparison] = field(default_factory=list)


@dataclass
class Timing:
    """Where the stage's time went, in seconds: ``wall`` in total; ``loads``: engine model loads (process start to
    ready); ``engine_generation``: the engine's own prompt + generation time; ``engine_scoring``: teacher-forced
    scoring; ``cached_sessions``: sessions taken from the result cache (harness.stages.outputs.generation_cache);
    ``completion_wall``: llama-completion runs end to end; ``completion_generation``: their prompt eval +
    eval time as llama-completion's perf lines report it; ``probes``: the runtime probe of each load
    (harness.record.probe), request to reply; ``reloads``: the engine processes of the repeated loads
    (harness.record.reloads), start to exit; ``sessions``/``completion_runs``: counts."""

    wall: float = 0.0
    loads: float = 0.0
    probes: float = 0.0
    reloads: float = 0.0
    engine_generation: float = 0.0
    engine_scoring: float = 0.0
    completion_wall: float = 0.0
    completion_generation: float = 0.0
    sessions: int = 0
    completion_runs: int = 0
    cached_sessions: int = 0

    @property
    def pure_generation(self) -> float:
        """Seconds spent evaluating prompts and generating tokens, engine and llama-completion together."""
        return self.engine_generation + self.completion_generation


#: llama.cpp's end-of-run timing lines (src/llama-context.cpp, llama_perf_context_print).
_PERF_LINE = ("prompt eval time =", "       eval time =")


def completion_generation_seconds(stderr: bytes) -> float:
    """Prompt eval plus eval milliseconds from llama-completion's ``llama_perf_context_print`` lines, in seconds (0 if absent)."""
    total = 0.0
    for line in stderr.decode("utf-8", "replace").splitlines():
        for marker in _PERF_LINE:
            if marker in line:
                try:
                    total += float(line.split(marker, 1)[1].split("ms", 1)[0])
                except ValueError:
                    pass
    return total / 1000.0


def generation_record(gen: EngineGeneration) -> dict:
    """An engine generation as JSON: timings, and per token its id, piece (text and exact bytes as hex),
    end-of-generation flag, top-2 (id, logit) pairs, margin and log-sum-exp."""
    return {"prompt_tokens": gen.prompt_tokens, "eog": gen.eog, "prompt_ms": gen.prompt_ms, "gen_ms": gen.gen_ms,
            "text": gen.text.decode("utf-8", "replace"),
            "tokens": [{"id": t.id, "piece": t.piece.decode("utf-8", "replace"), "piece_hex": t.piece.hex(),
                        "eog": t.eog, "top": [list(t.top[0]), list(t.top[1])], "margin": t.margin, "lse": t.lse}
                       for t in gen.tokens]}


@dataclass
class Hooks:
    """What the runner needs from the pipeline for one side.

    ``engine``: (side, model path, generation) -> (argv, env) of the engine.
    ``completion``: (side, model path, prompt text, generation) -> GenerationSpec.
    ``out_dir``: side -> the side's results directory (``<platform>/<config>``).
    ``doing``: side -> a context manager marking the side's ``generate`` step as in
    progress (so an interrupt can name it).  ``relative``: a path as the run records it.
    ``stderr``: (side, model, stem, stderr text) after each process, where ``stem`` is
    the path prefix its derived files go to (``.../engine`` or ``.../<prompt>.r<k>``).
    ``progress``: (side, what) after each generation.  ``reloads``: side -> how many times a session's model is
    loaded, probed and freed again in an engine process of its own after the session (0: never;
    harness.stages.checks.reloads).
    """

    engine: Callable[[Side, Path, Generation], tuple[list[str], dict[str, str]]]
    completion: Callable[[Side, Path, str, Generation], GenerationSpec]
    out_dir: Callable[[Side], Path]
    doing: Callable[[Side], ContextManager[None]] = lambda side: nullcontext()
    relative: Callable[[Path], str] = str
    stderr: Callable[[Side, str, Path, str], None] = lambda side, model, stem, text: None
    progress: Callable[[Side, str], None] = lambda side, what: None
    reloads: Callable[[Side], int] = lambda side: 0


def side_order(jobs: Iterable[Job]) -> list[Side]:
    """Sides in an order that runs every reference before its candidates where possible (first-seen order otherwise)."""
    sides: list[Side] = []
    refs_of: dict[Side, set[Side]] = {}
    for job in jobs:
        for s in (job.reference, *job.upstream.values(), *job.candidates):
            if s not in sides:
                sides.append(s)
            refs_of.setdefault(s, set())
        for c in job.candidates:
            if c != job.reference:
                refs_of[c].add(job.reference)
    done: list[Side] = []
    pending = list(sides)
    while pending:
        ready = next((s for s in pending if refs_of[s] <= set(done)), pending[0])  # a cycle: first pending
        done.append(ready)
        pending.remove(ready)
    return done


class GreedyRunner:
    """Runs jobs (see the module docstring) and returns their comparisons; ``say`` prints progress.

    ``text_check``: ``every-prompt`` or ``first-prompt`` (see the module docstring).  ``cache``: where
    sessions whose inputs are byte-identical to a stored one are taken from (None: every session runs);
    ``origins[(side, model)]`` then names the run a restored session came from.
    """

    def __init__(self, hooks: Hooks, prompts: Mapping[str, str], work_dir: Path, n_predict: int | None = None,
                 repeats: int | None = None, say: Callable[[str], None] = print, text_check: str = "every-prompt",
                 cache: SessionCache | None = None, lanes: int = 1, threads: int | None = None):
        if text_check not in TEXT_CHECKS:
            raise ValueError(f"text_check must be one of {', '.join(TEXT_CHECKS)}, not {text_check!r}")
        if lanes < 1 or (threads is not None and threads < 1):
            raise ValueError(f"lanes and threads must be at least 1, not {lanes} and {threads}")
        self.lanes, self.threads = lanes, threads
        self._lock = threading.Lock()  # the shared records below, written from every lane
        self._dump_lock = threading.Lock()  # writing a restored reference's dumps, once, before they are read
        self._dumps_made = 0
        self.hooks, self.prompts, self.work_dir, self.say = hooks, prompts, work_dir, say
        self.n_predict, self.repeats, self.text_check = n_predict, repeats, text_check
        self.timing = Timing()
        self.problems: dict[Side, list[Failure]] = {}
        self.side_seconds: dict[Side, float] = {}
        self.side_runs: dict[Side, int] = {}
        self.side_ok: dict[Side, set[str]] = {}  # models of which at least one generation of the side succeeded
        self.unsupported: set[tuple[Side, str, str]] = set()  # (side, model, prompt) that upstream fails alike
        self.cache = cache
        self.origins: dict[tuple[Side, str], str] = {}  # (side, model) -> run id of a session taken from the cache
        self._undumped: dict[tuple[Side, Generation], list[str]] = {}  # restored references: prompts without dump

    def _gen(self, job: Job) -> Generation:
        g = job.generation
        return Generation(n_predict=self.n_predict or g.n_predict, repeats=self.repeats or g.repeats, seed=g.seed,
                          ctx_size=g.ctx_size, timeout_s=g.timeout_s, threads=self.threads)

    def run(self, jobs: Sequence[Job], on_result: Callable[[JobResult], None] = lambda r: None) -> list[JobResult]:
        """Run every job; a failure of one side is recorded in its comparisons and the others still run.

        ``on_result`` gets each job's result as soon as its model is done (so a
        later interrupt keeps it); the results are also returned, in job order
        per model.  Failure facts collect in ``problems`` per side.
        """
        start = time.monotonic()
        results = []
        by_model: dict[str, list[Job]] = {}
        for job in jobs:
            by_model.setdefault(job.model, []).append(job)
        try:
            for model_jobs in by_model.values():
                self.work_dir.mkdir(parents=True, exist_ok=True)
                dumps = Path(tempfile.mkdtemp(prefix="logprobs-", dir=self.work_dir))
                try:
                    done = self._run_model(model_jobs, dumps)
                finally:
                    shutil.rmtree(dumps, ignore_errors=True)
                for res in done:
                    on_result(res)
                results += done
        finally:
            self.timing.wall += time.monotonic() - start
        return results

    # ----- one model ---------------------------------------------------------------------------
    def _run_model(self, jobs: list[Job], dumps: Path) -> list[JobResult]:
        needs: dict[tuple[Side, Generation], dict] = {}
        for job in jobs:
            gen = self._gen(job)
            for side in (job.reference, *job.candidates, *job.upstream.values()):
                n = needs.setdefault((side, gen), {"prompts": [], "dump": set(), "score": [], "checked": set()})
                n["prompts"] += [p for p in job.prompts if p not in n["prompts"]]
                n["checked"] |= set(job.prompts if self.text_check == "every-prompt" else job.prompts[:1])
            needs[(job.reference, gen)]["dump"] |= set(job.prompts)
            for c in job.candidates:
                needs[(c, gen)]["score"] += [(p, job.reference) for p in job.prompts
                                             if (p, job.reference) not in needs[(c, gen)]["score"]]
        self.runs: dict[tuple[Side, Generation, str], SideRuns] = {}
        self.scores: dict[tuple[Side, Generation, str, Side], ScoreResult | EngineRun] = {}
        self.dumped: dict[tuple[Side, Generation, str], Path] = {}
        # keyed by side and generation, like the records above: a model's restored references only (another
        # model's would name its prompts and its dumps folder, already removed)
        self._undumped = {}
        model_path = jobs[0].model_path
        model = jobs[0].model
        plan = [(side, gen, n) for side in side_order(jobs) for (s, gen), n in needs.items() if s == side]
        work = []
        for side, gen, need in plan:  # the cache first: what is restored needs no lane
            w = self._side_work(side, gen, model, model_path, need, [(x.side, x.gen) for x in work])
            if w is not None:
                work.append(w)
        for i, w in enumerate(work):
            w.later_refs = {(ref, w.gen) for _, ref in w.need["score"] if ref != w.side} & \
                {(x.side, x.gen) for x in work[i + 1:]}
            w.needs_dumps = {(ref, w.gen) for p, ref in w.need["score"] if p in self._undumped.get((ref, w.gen), ())}
        deferred = [(w.side, w.gen, w.later) for w in self._execute(work, model, model_path, dumps) if w.later]
        for side, gen, later in deferred:  # references that ran after their candidate (a cycle of groups)
            self._score_later(side, gen, later, model, model_path, dumps)
        out = []
        for job in jobs:
            gen = self._gen(job)
            res = JobResult(job)
            for prompt in job.prompts:
                ref = self.runs[(job.reference, gen, prompt)]
                for cand in job.candidates:
                    side = self.runs[(cand, gen, prompt)]
                    score = self.scores.get((cand, gen, prompt, job.reference))
                    if isinstance(score, EngineRun):
                        side = SideRuns(engine=side.engine + [score], completion=side.completion)
                    kl = summarize_kl(score) if isinstance(score, ScoreResult) else None
                    pc = compare_streams(prompt, job.label, ref, cand.config, side, job.comparison.near_tie_margin, kl)
                    up = job.upstream.get(cand.config)
                    if pc.status in GENERATION_FAILURES and up is not None:
                        self._judge_upstream(pc, self.runs[(up, gen, prompt)], side, up, cand, model, prompt)
                    res.comparisons.append(pc)
            out.append(res)
        return out

    def _side_work(self, side: Side, gen: Generation, model: str, model_path: Path, need: dict,
                   earlier: list[tuple[Side, Generation]]) -> "_SideWork | None":
        """Restore ``side``'s session from the cache (None: nothing left to run) or describe what it runs:
        its engine session, which waits for the references among ``earlier`` (sides planned before it), and
        its prompts' llama-completion text checks, which wait for nothing."""
        out_dir = self.hooks.out_dir(side) / "gen" / model
        out_dir.mkdir(parents=True, exist_ok=True)
        argv, env = self.hooks.engine(side, model_path, gen)
        identity = self._session_identity(side, gen, model, model_path, need, argv, env)
        if identity is not None and self._restore(side, gen, model, model_path, need, out_dir, argv, env, identity):
            if self._reloads_owed(side, out_dir):  # the stored session has no record of this many reloads
                self._reloads(side, gen, out_dir, argv, env)
            return None
        refs = {(ref, gen) for _, ref in need["score"] if ref != side}
        return _SideWork(side, gen, need, identity, waits_for=refs & set(earlier),
                         checks=[p for p in need["prompts"] if p in need["checked"]], out_dir=out_dir, argv=argv,
                         env=env)

    def _execute(self, work: list["_SideWork"], model: str, model_path: Path, dumps: Path) -> list["_SideWork"]:
        """Run the sessions and text checks of ``work`` on ``self.lanes`` lanes; returns ``work``.

        A session starts once the sessions it waits for have ended (their dumps are written); text checks fill
        the lanes sessions leave free.  With one lane everything runs here, in plan order.  An interrupt or an
        exception stops what the lanes run (harness.common.proc.stop_and_wait: what they were doing is
        interrupted, not failed), waits for them, and propagates.
        """
        dump_tasks = list(dict.fromkeys(d for w in work for d in sorted(w.needs_dumps, key=str)))
        if self.lanes <= 1:
            for ref, gen in dump_tasks:
                self._dump_task(ref, gen, model, model_path, dumps)
            for w in work:
                self._task(w, None, model, model_path, dumps)
                for p in w.checks:
                    self._task(w, p, model, model_path, dumps)
                self._finish_side(w, model, model_path)
            return work
        tasks: list[tuple[_SideWork, str | None]] = [(w, None) for w in work] + [(w, p) for w in work for p in w.checks]
        left = {id(w): 1 + len(w.checks) for w in work}
        ended: set[tuple[Side, Generation]] = set()
        running: dict[Future, tuple[_SideWork, str | None] | None] = {}
        # the caller holds its builds for reading while it waits for the lanes: they take only later locks
        pool = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix="greedy-lane",
                                  initializer=joined_by_holder_of, initargs=(Rank.BUILD,))
        try:
            # Sessions first: a session generates before it scores, so one whose restored references' dumps are
            # not written yet may start while another lane writes them; it takes a lane only where one is left
            # for those dumps (or none is left to write), and when it comes to score it waits for a dump being
            # written or writes a missing one itself.  Then the dumps, which wait for nothing; text checks fill
            # what is left.  (A session's generations are most of a lane's work: started first, the longest
            # chain of a model ends first.)
            started = set()
            while tasks or running or dump_tasks:
                for task in [t for t in tasks if t[1] is None and t[0].waits_for <= ended]:
                    if len(running) >= self.lanes:
                        break
                    if dump_tasks and not task[0].needs_dumps <= started and len(running) + 1 >= self.lanes:
                        continue  # it would take the last lane while the dumps it scores against wait for one
                    tasks.remove(task)
                    running[pool.submit(self._task, task[0], task[1], model, model_path, dumps)] = task
                while dump_tasks and len(running) < self.lanes:
                    ref, gen = dump_tasks.pop(0)
                    started.add((ref, gen))
                    running[pool.submit(self._dump_task, ref, gen, model, model_path, dumps)] = None
                for task in [t for t in tasks if t[1] is not None]:
                    if len(running) >= self.lanes:
                        break
                    tasks.remove(task)
                    running[pool.submit(self._task, task[0], task[1], model, model_path, dumps)] = task
                if not running:  # pragma: no cover - waits_for holds only earlier sides, so something is ready
                    raise RuntimeError("greedy runner: no task can start")
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    task = running.pop(fut)
                    fut.result()
                    if task is None:
                        continue
                    w, prompt = task
                    if prompt is None:
                        ended.add((w.side, w.gen))
                    left[id(w)] -= 1
                    if not left[id(w)]:
                        self._finish_side(w, model, model_path)
        except BaseException as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            proc.stop_and_wait(running, getattr(exc, "signum", signal.SIGTERM))
            raise
        pool.shutdown(wait=True)
        return work

    def _task(self, w: "_SideWork", prompt: str | None, model: str, model_path: Path, dumps: Path) -> None:
        """One task of ``w``: its engine session (``prompt`` None) or the text check of ``prompt``."""
        with self._timed(w.side), self.hooks.doing(w.side):
            if prompt is None:
                w.later = self._session(w, model, model_path, dumps)
            else:
                w.completions[prompt] = self._completion(w.side, w.gen, model, model_path, prompt, w.out_dir,
                                                         max(1, w.gen.repeats - 1) + 1,
                                                         facts=w.check_facts.setdefault(prompt, []))

    def _dump_task(self, ref: Side, gen: Generation, model: str, model_path: Path, dumps: Path) -> None:
        """Write the dumps of ``ref``, a reference taken from the cache, for the candidates that run (under the
        lock their sessions take before they score, so they wait for it)."""
        with self._timed(ref), self._dump_lock:
            if (ref, gen) in self._undumped:
                self._dump_restored(ref, gen, model, model_path, dumps)

    def _finish_side(self, w: "_SideWork", model: str, model_path: Path) -> None:
        """After every task of ``w``: its text checks join its runs and their failure facts follow the session's
        (in prompt order, however the lanes finished), and a whole session is stored."""
        for prompt, res in w.completions.items():
            self.runs[(w.side, w.gen, prompt)].completion = res
        facts = [f for p in w.checks for f in w.check_facts.get(p, [])]
        if facts:
            with self._lock:
                self.problems.setdefault(w.side, []).extend(facts)
        if w.identity is not None and not w.later and not w.failed and not facts:
            self._store(w.side, w.gen, w.need, w.out_dir, w.identity)

    def _judge_upstream(self, pc: StreamComparison, up: SideRuns, cand_runs: SideRuns, up_side: Side, cand: Side,
                        model: str, prompt: str) -> None:
        """Mark ``pc`` unsupported-upstream when every run of upstream's build and the candidate failed, and
        their llama-completion runs failed the same way (harness.stages.outputs.upstream_support)."""
        sides = (up, cand_runs)
        if any(r.status == "ok" for s in sides for r in s.engine) or any(s.completion is None for s in sides):
            return
        why = unsupported_upstream([up.completion], [cand_runs.completion])  # type: ignore[list-item]
        if why:
            pc.status, pc.detail = UNSUPPORTED_UPSTREAM, why
            self.unsupported |= {(up_side, model, prompt), (cand, model, prompt)}

    def _score_later(self, side: Side, gen: Generation, later: list, model: str, model_path: Path,
                     dumps: Path) -> None:
        """One more session of ``side`` for the scorings ``later`` (prompt, reference) whose reference ran after
        it (a cycle of groups)."""
        argv, env = self.hooks.engine(side, model_path, gen)
        w = _SideWork(side, gen, {"prompts": [], "dump": set(), "score": later, "checked": set()}, None, set(), [],
                      out_dir=self.hooks.out_dir(side) / "gen" / model, argv=argv, env=env, generate=False)
        self._task(w, None, model, model_path, dumps)

    def _session(self, w: "_SideWork", model: str, model_path: Path, dumps: Path) -> list:
        side, gen, need, generate = w.side, w.gen, w.need, w.generate
        out_dir, argv, env = w.out_dir, w.argv, w.env
        with self._lock:
            problems = self.problems.setdefault(side, [])
        problems_before = len(problems)
        session: list[EngineSession | None] = [None]
        n_session = [0]
        load_failed: list[EngineRun] = []

        def call(what: str, fn: Callable[[EngineSession], object], prompt: str, repeat: int = 0) -> object:
            """Run fn on a live session (starting one if needed); returns the result or an EngineRun failure."""
            t0 = time.monotonic()
            if load_failed:  # the model did not load: the same failure for every request, no reload
                return EngineRun(status=load_failed[0].status, error=load_failed[0].error)
            loading = False
            try:
                if session[0] is None:
                    loading = True
                    n_session[0] += 1
                    self._count(sessions=1)
                    session[0] = EngineSession(argv, env, out_dir / "engine.stderr", out_dir / "engine.cmd",
                                               load_timeout_s=gen.timeout_s, request_timeout_s=gen.timeout_s)
                    self._count(loads=session[0].load_seconds)
                    self._probe(session[0], out_dir / PROBE_FILE)
                    loading = False
                return fn(session[0])
            except (EngineError, OSError) as exc:
                kind = exc.kind if isinstance(exc, EngineError) else CRASHED
                if session[0] is not None:
                    session[0].kill()
                    session[0].close()
                session[0] = None
                log = out_dir / "engine.stderr"
                line = find_error_line(log.read_bytes()) if log.exists() else None
                problems.append(Failure("generation", model=model, prompt=prompt, repeat=repeat, status=kind,
                                        signal=getattr(exc, "signal", None) or "",
                                        error_line=line or f"engine {what}: {exc}", log=self.hooks.relative(log),
                                        program=ENGINE_TARGET))
                failed = EngineRun(status=kind, error=str(exc) + (f": {line}" if line else ""),
                                   seconds=time.monotonic() - t0)
                if loading:
                    load_failed.append(failed)
                return failed

        try:
            later = self._session_requests(w, model, model_path, dumps, call)
        finally:
            if session[0] is not None:
                session[0].close()
        if generate and not load_failed:
            self._reloads(w.side, gen, out_dir, argv, env)
        if (out_dir / "engine.stderr").exists():
            self.hooks.stderr(side, model, out_dir / "engine",
                              (out_dir / "engine.stderr").read_bytes().decode("utf-8", "replace"))
        if generate:
            for prompt in need["prompts"]:
                engine_runs = self.runs[(side, gen, prompt)].engine
                # a prompt without a text check still gets a llama-completion run where the engine failed:
                # the failure as users see it, and what tells an upstream limit from a fork failure
                if prompt not in w.checks and any(r.status != "ok" for r in engine_runs):
                    w.completions[prompt] = self._completion(side, gen, model, model_path, prompt, out_dir,
                                                             len(engine_runs) + 1)
        w.failed = w.failed or len(problems) != problems_before
        return later

    def _probe(self, session: EngineSession, path: Path) -> None:
        """The probe of a load just made (harness.record.probe), once per load; the speed stage's engines are
        never probed.  A refusal of a live engine is written as ``{"error": ...}``, which the expectations
        step reports as incomplete; an engine that dies while probing fails the load like any request."""
        t0 = time.monotonic()
        try:
            session.probe(path)
        except EngineError as exc:
            if session.proc.poll() is not None:
                raise
            write_json(path, {"error": str(exc)})
        self._count(probes=time.monotonic() - t0)

    def _reloads_owed(self, side: Side, out_dir: Path) -> bool:
        """True when ``side`` reloads (``hooks.reloads``) and ``out_dir`` holds no reload record of that count (a
        session restored from the cache that was stored without one, or with another count or an error)."""
        count = self.hooks.reloads(side)
        if count < 1:
            return False
        return recorded_count(out_dir / RELOADS_FILE) != count

    def _reloads(self, side: Side, gen: Generation, out_dir: Path, argv: list[str], env: dict[str, str]) -> None:
        """The repeated loads of ``side`` (``hooks.reloads``) in an engine process of its own, whose log is
        ``engine.reloads.log`` (not a load the expectations judge); an engine that fails or dies is written as
        ``{"error": ...}``, which fails the ``reloads`` step (harness.stages.checks.reloads)."""
        count = self.hooks.reloads(side)
        if count < 1:
            return
        t0 = time.monotonic()
        path = out_dir / RELOADS_FILE
        try:
            with EngineSession(argv, env, out_dir / RELOADS_LOG, out_dir / RELOADS_CMD,
                               load_timeout_s=gen.timeout_s, request_timeout_s=gen.timeout_s * count) as session:
                session.reload(count, path)
        except (EngineError, OSError) as exc:
            write_json(path, {"error": str(exc)})
        self._count(reloads=time.monotonic() - t0)

    def _session_requests(self, w: "_SideWork", model: str, model_path: Path, dumps: Path,
                          call: Callable[..., object]) -> list:
        """The requests of ``w``'s session through ``call``: generations, its own dumps, then its scorings of
        references' tokens; returns the scorings whose reference runs after it (a cycle of groups)."""
        side, gen, need, out_dir = w.side, w.gen, w.need, w.out_dir
        if w.generate:
            for prompt in need["prompts"]:
                runs: list[EngineRun] = []
                # a text check is the last repeat; without one the engine runs them all
                engine_repeats = max(1, gen.repeats - 1) if prompt in need["checked"] else max(2, gen.repeats)
                for r in range(1, engine_repeats + 1):
                    t0 = time.monotonic()
                    got = call("generating", lambda s, _p=prompt: s.generate(self.prompts[_p]), prompt, r)
                    self._count_run(side)
                    if isinstance(got, EngineRun):
                        runs.append(got)
                        continue
                    self.hooks.progress(side, f"{model}/{prompt}.r{r}")
                    self._count(engine_generation=(got.prompt_ms + got.gen_ms) / 1000.0)
                    runs.append(EngineRun(status="ok", generation=got, seconds=time.monotonic() - t0))
                    with self._lock:
                        self.side_ok.setdefault(side, set()).add(model)
                    write_json(out_dir / f"{prompt}.r{r}.tokens.json", generation_record(got))
                self.runs[(side, gen, prompt)] = SideRuns(engine=runs)
            for prompt in sorted(need["dump"], key=need["prompts"].index):
                first = self.runs[(side, gen, prompt)].engine[0]
                if first.generation is None or not first.generation.tokens:
                    continue
                path = self._dump_path(dumps)
                got = call("scoring its own tokens", lambda s, _p=prompt, _t=first.generation.ids, _d=path:
                           s.score(self.prompts[_p], _t, dump=_d), prompt)
                if isinstance(got, ScoreResult):
                    self._count(engine_scoring=got.score_ms / 1000.0)
                    self.dumped[(side, gen, prompt)] = path
        later = []
        for prompt, ref in need["score"]:
            ref_runs = self.runs.get((ref, gen, prompt))
            if ref_runs is None or (ref, gen) in w.later_refs:
                later.append((prompt, ref))
                continue
            first = ref_runs.engine[0]
            # a restored reference's dumps: written by a task of their own (this waits for it to end) or,
            # where none runs, by the first session that needs them
            with self._dump_lock:
                if (ref, gen, prompt) not in self.dumped and prompt in self._undumped.get((ref, gen), ()):
                    self._dump_restored(ref, gen, model, model_path, dumps)
            dump = self.dumped.get((ref, gen, prompt))
            if first.generation is None or not first.generation.tokens or dump is None:
                continue
            got = call(f"scoring {ref.config}'s tokens", lambda s, _p=prompt, _t=first.generation.ids, _d=dump:
                       s.score(self.prompts[_p], _t, reference=_d), prompt)
            if isinstance(got, ScoreResult):
                self._count(engine_scoring=got.score_ms / 1000.0)
            self.scores[(side, gen, prompt, ref)] = got  # type: ignore[assignment]
        return later

    def _completion(self, side: Side, gen: Generation, model: str, model_path: Path, prompt: str, out_dir: Path,
                    repeat: int, facts: list[Failure] | None = None) -> GenerationResult:
        """llama-completion's run of ``prompt`` as repeat ``repeat``; a failure's fact goes to ``facts`` (None: the
        side's problems)."""
        spec = self.hooks.completion(side, model_path, self.prompts[prompt], gen)
        res = run_generation(spec, out_dir / f"{prompt}.r{repeat}")
        stderr = res.stderr_path.read_bytes()
        self._count(completion_runs=1, completion_wall=res.seconds,
                    completion_generation=completion_generation_seconds(stderr))
        self._count_run(side)
        if res.status != "ok":
            fact = Failure("generation", model=model, prompt=prompt, repeat=repeat, status=res.status,
                           signal=res.signal or "", error_line=f"llama-completion: {res.error_line or ''}".rstrip(": "),
                           log=self.hooks.relative(res.stderr_path), program="llama-completion")
            with self._lock:
                (self.problems.setdefault(side, []) if facts is None else facts).append(fact)
        self.hooks.stderr(side, model, out_dir / f"{prompt}.r{repeat}", stderr.decode("utf-8", "replace"))
        self.hooks.progress(side, f"{model}/{prompt}.r{repeat}")
        return res

    # ----- shared state of the lanes -------------------------------------------------------------
    @contextmanager
    def _timed(self, side: Side) -> Iterator[None]:
        """Add the block's wall time to ``side_seconds[side]``."""
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.side_seconds[side] = self.side_seconds.get(side, 0.0) + time.monotonic() - started

    def _count(self, **seconds_or_counts: float) -> None:
        """Add to the :class:`Timing` fields named."""
        with self._lock:
            for name, value in seconds_or_counts.items():
                setattr(self.timing, name, getattr(self.timing, name) + value)

    def _count_run(self, side: Side) -> None:
        """One more generation (engine or llama-completion) of ``side``."""
        with self._lock:
            self.side_runs[side] = self.side_runs.get(side, 0) + 1

    def _dump_path(self, dumps: Path) -> Path:
        """A new file for a full-distribution dump in ``dumps``."""
        with self._lock:
            self._dumps_made += 1
            return dumps / f"{self._dumps_made}.f32"

    # ----- the result cache ----------------------------------------------------------------------
    def _session_identity(self, side: Side, gen: Generation, model: str, model_path: Path, need: dict,
                          argv: Sequence[str], env: Mapping[str, str]) -> dict | None:
        """The key material of ``side``'s session (harness.stages.outputs.generation_cache), None without a cache or
        when an input cannot be read (the session then runs, uncached)."""
        if self.cache is None:
            return None
        try:
            digest = self.cache.models.digest(model_path)
            mine = self.cache.side(side)
            prompts = []
            for p in need["prompts"]:
                checked = p in need["checked"]
                spec = self.hooks.completion(side, model_path, self.prompts[p], gen) if checked else None
                prompts.append({"id": p, "text": self.prompts[p], "checked": checked, "dumped": p in need["dump"],
                                "completion": spec_identity(spec, {**mine.paths, str(model_path): "<model>"})
                                if spec else None})
            scores = []
            for p, ref in need["score"]:
                ref_argv, ref_env = self.hooks.engine(ref, model_path, gen)
                scores.append(generation_identity(self.cache.side(ref), digest, ref_argv, ref_env, p,
                                                  self.prompts[p], model_path))
        except OSError:
            return None
        own = generation_identity(mine, digest, argv, env, "", "", model_path)
        return {**own, "prompt": None, "repeats": gen.repeats, "prompts": prompts, "scores": scores}

    def _store(self, side: Side, gen: Generation, need: dict, out_dir: Path, identity: dict) -> None:
        """Store the session just run when every run of it succeeded and every score it owes was made."""
        assert self.cache is not None
        files: dict[str, bytes] = {"engine.stderr": (out_dir / "engine.stderr").read_bytes()}
        for name in (PROBE_FILE, RELOADS_FILE, RELOADS_LOG):
            if (out_dir / name).exists():
                files[name] = (out_dir / name).read_bytes()
        prompts: dict[str, dict] = {}
        for p in need["prompts"]:
            runs = self.runs[(side, gen, p)]
            if any(r.status != "ok" or r.generation is None for r in runs.engine):
                return
            for k in range(1, len(runs.engine) + 1):
                files[f"{p}.r{k}.tokens.json"] = (out_dir / f"{p}.r{k}.tokens.json").read_bytes()
            entry: dict = {"engine_seconds": [r.seconds for r in runs.engine], "completion": None}
            c = runs.completion
            if c is not None:
                if c.status != "ok" or not c.complete:
                    return  # a failed or cut run is not a result to keep
                n = len(runs.engine) + 1
                files[f"{p}.r{n}.stdout"] = c.stdout_path.read_bytes()
                files[f"{p}.r{n}.stderr"] = c.stderr_path.read_bytes()
                entry["completion"] = {"repeat": n, "seconds": c.seconds}
            prompts[p] = entry
        scores = []
        for p, ref in need["score"]:
            got = self.scores.get((side, gen, p, ref))
            if isinstance(got, ScoreResult):
                scores.append({"positions": got.positions, "kl": got.kl, "top1": got.top1, "score_ms": got.score_ms})
                continue
            first = self.runs[(ref, gen, p)].engine[0] if (ref, gen, p) in self.runs else None
            if got is not None or first is None or first.generation is None or first.generation.tokens:
                return  # a score that failed or could not be made: the session is not whole
            scores.append(None)  # the reference generated nothing: nothing to score, as in a fresh run
        self.cache.put(identity, {"prompts": prompts, "scores": scores}, files)

    def _restore(self, side: Side, gen: Generation, model: str, model_path: Path, need: dict, out_dir: Path,
                 argv: Sequence[str], env: Mapping[str, str], identity: dict) -> bool:
        """Take ``side``'s session from the cache when stored; write its files as a fresh session would.

        Returns False on a miss (or an entry whose content does not read back: the session then runs).
        """
        assert self.cache is not None
        hit = self.cache.get(identity)
        if hit is None:
            return False
        try:
            prompts, scores = hit.meta["prompts"], hit.meta["scores"]
            restored: dict[str, SideRuns] = {}
            for p in need["prompts"]:
                entry = prompts[p]
                engine = [EngineRun(status="ok", seconds=float(sec), generation=generation_from_record(
                    read_json_file(hit.files[f"{p}.r{k}.tokens.json"]))) for k, sec in enumerate(entry["engine_seconds"], 1)]
                restored[p] = SideRuns(engine=engine)
            if len(scores) != len(need["score"]):
                return False
        except (KeyError, ValueError, TypeError):
            return False
        for name, data in hit.files.items():
            (out_dir / name).write_bytes(data)
        write_engine_cmd(out_dir / "engine.cmd", argv, env, gen.timeout_s)
        for p, runs in restored.items():
            self.runs[(side, gen, p)] = runs
            self.side_runs[side] = self.side_runs.get(side, 0) + len(runs.engine)
            for k in range(1, len(runs.engine) + 1):
                self.hooks.progress(side, f"{model}/{p}.r{k}")
        for (p, ref), got in zip(need["score"], scores):
            if got is not None:
                self.scores[(side, gen, p, ref)] = ScoreResult(positions=int(got["positions"]), kl=list(got["kl"]),
                                                               top1=list(got["top1"]), score_ms=float(got["score_ms"]))
        self.side_ok.setdefault(side, set()).add(model)
        self.origins[(side, model)] = hit.run_id
        self._count(cached_sessions=1)
        self._undumped[(side, gen)] = [p for p in need["prompts"] if p in need["dump"]]
        self.hooks.stderr(side, model, out_dir / "engine", hit.files["engine.stderr"].decode("utf-8", "replace"))
        for p in need["prompts"]:
            done = prompts[p]["completion"]
            if done is None:
                continue
            n = int(done["repeat"])
            spec = self.hooks.completion(side, model_path, self.prompts[p], gen)
            stderr = hit.files[f"{p}.r{n}.stderr"]
            self.runs[(side, gen, p)].completion = restored_completion(
                spec, out_dir / f"{p}.r{n}", hit.files[f"{p}.r{n}.stdout"], stderr, float(done["seconds"]))
            self.side_runs[side] += 1
            self.hooks.stderr(side, model, out_dir / f"{p}.r{n}", stderr.decode("utf-8", "replace"))
            self.hooks.progress(side, f"{model}/{p}.r{n}")
        return True

    def _dump_restored(self, ref: Side, gen: Generation, model: str, model_path: Path, dumps: Path) -> None:
        """Write the full-distribution dumps of a reference taken from the cache, for a candidate that runs:
        one engine load of the reference scoring its own stored tokens (stderr kept beside the dumps, so the
        reference's restored ``engine.stderr`` stays as stored).  A failure is a fact of the reference."""
        prompts = self._undumped.pop((ref, gen), [])
        argv, env = self.hooks.engine(ref, model_path, gen)
        stem = self._dump_path(dumps).with_suffix("")
        log = stem.with_name(f"dump-{stem.name}.stderr")
        try:
            self._count(sessions=1)
            with EngineSession(argv, env, log, stem.with_name(f"dump-{stem.name}.cmd"),
                               load_timeout_s=gen.timeout_s, request_timeout_s=gen.timeout_s) as session:
                self._count(loads=session.load_seconds)
                for p in prompts:
                    first = self.runs[(ref, gen, p)].engine[0]
                    if first.generation is None or not first.generation.tokens:
                        continue
                    path = self._dump_path(dumps)
                    got = session.score(self.prompts[p], first.generation.ids, dump=path)
                    self._count(engine_scoring=got.score_ms / 1000.0)
                    self.dumped[(ref, gen, p)] = path
        except (EngineError, OSError) as exc:
            with self._lock:
                self.problems.setdefault(ref, []).append(Failure(
                    "generation", model=model, prompt=prompts[0] if prompts else "",
                    status=getattr(exc, "kind", CRASHED),
                    error_line=f"engine scoring its cached tokens for a candidate: {exc}", log=self.hooks.relative(log),
                    program=ENGINE_TARGET))
