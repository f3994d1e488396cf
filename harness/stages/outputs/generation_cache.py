"""Reusing greedy generations whose inputs are byte-identical (docs/cache.md).

The unit is one engine session of a side (a configuration as built for one
platform) on one model: every prompt's engine repeats, the llama-completion
text checks, and the teacher-forced scores of the references' tokens.  Its key
(:func:`session_identity`) holds everything that can change what it produces:

* the programs and shared libraries that run (engine, llama-completion, every
  library beside them), by content, with only the build's own name zeroed
  (harness.record.cache.normalized_image); the emulator and its version;
  the machine (CPU, C library; for a GPU platform the GPUs, driver and the
  CUDA runtime's bytes); the inherited variables that reach llama.cpp, ggml,
  CUDA, OpenMP or Wine;
* the model file's sha256; each prompt's id and bytes; the engine's and
  llama-completion's arguments and environment with paths replaced by what
  they name; the generation settings;
* for a score against a reference, the identity of the reference's
  generation (its side, model and prompt): the tokens and distributions it
  scores against;
* the harness code that starts the processes and reads their output.

The value: the files a fresh session writes into ``<config>/gen/<model>/``
(``engine.stderr``, each ``<prompt>.r<k>.tokens.json``, llama-completion's
stdout and stderr) and, in ``meta``, the runs' seconds and the scores.  The
records derived from stderr (``*.pin-ladder.json``, ``*.placement.json``) are
derived again from the restored stderr by the same hook as after a fresh run,
and ``engine.cmd``, ``.prompt`` and ``.cmd`` are written for this run's paths,
so a run directory looks the same either way.  Only sessions in which every
run succeeded are stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common.fs import sha256_files
from ...kinds.cpu import CPU
from ...kinds.shape import GpuKind
from ...record.cache import DigestMemo, Hit, ResultCache, identity_key, images_digest
from ..building.binaries import build_labels, emulator_version, inherited_environment, machine_facts, shared_libraries
from .compare import GenerationResult, GenerationSpec, from_text_mode, prepare_generation, split_completion_stdout
from .engine import EngineGeneration, parse_generation
from ...common.json_value import JSON

#: The entry kind of a generation session in the store.
KIND = "generation"

#: Format of the stored value; a change makes every older entry miss.
FORMAT = 1

#: Harness modules whose code decides how a generation runs and is read back (their bytes enter the key).
HARNESS_SOURCES = ("compare.py", "engine.py", "greedy.py", "generation_cache.py")

def harness_digest() -> str:
    """sha256 over :data:`HARNESS_SOURCES` (name and bytes)."""
    here = Path(__file__).resolve().parent
    return sha256_files(here / name for name in HARNESS_SOURCES)


@dataclass(frozen=True)
class SideIdentity:
    """What one side's generations depend on besides their arguments: ``facts`` (JSON: program digests,
    emulator, machine, inherited environment) and ``paths``: path prefixes that appear in its command lines
    (build directory, emulator program) -> the placeholder the key uses instead."""

    facts: Mapping[str, Any]
    paths: Mapping[str, str] = field(default_factory=dict)


def side_identity(bin_dir: Path, programs: Sequence[str], emulator_argv: Sequence[str] = (),
                  emulator_env: Mapping[str, str] | None = None, kind: GpuKind = CPU) -> SideIdentity:
    """The :class:`SideIdentity` of the build whose binaries are in ``bin_dir``.

    ``programs``: the executables' file names (engine and llama-completion, with the platform's suffix);
    every shared library in ``bin_dir`` is added.  ``emulator_argv``/``emulator_env``: the emulator that
    runs them (empty for a native platform).  ``kind``: the platform's GPU kind (:func:`machine_facts`).  Raises OSError when a program
    cannot be read.
    """
    build_dir = bin_dir.parent
    files = [bin_dir / p for p in programs] + shared_libraries(bin_dir)
    facts: dict[str, Any] = {"images": images_digest(files, build_labels(build_dir)),
                             "machine": machine_facts(kind, build_dir / "CMakeCache.txt"),
                             "inherited_env": inherited_environment()}
    paths = {str(bin_dir): "<bin>"}
    if emulator_argv:
        facts["emulator"] = {"program": Path(emulator_argv[0]).name,
                             "version": emulator_version(emulator_argv, emulator_env or {}),
                             "args": list(emulator_argv[1:])}
        paths[emulator_argv[0]] = "<emulator>"
    return SideIdentity(facts, paths)


def abstract_argv(argv: Sequence[str], paths: Mapping[str, str]) -> list[str]:
    """``argv`` with each path prefix of ``paths`` replaced by its placeholder (longest prefix first)."""
    order = sorted(paths, key=len, reverse=True)
    out = []
    for arg in argv:
        arg = str(arg)
        for prefix in order:
            if arg.startswith(prefix):
                arg = paths[prefix] + arg[len(prefix):]
                break
        out.append(arg)
    return out


def spec_identity(spec: GenerationSpec, paths: Mapping[str, str]) -> dict[str, Any]:
    """The parts of a llama-completion run that can change its output (not its paths, timeout or prompt file)."""
    return {"binary": abstract_argv([str(spec.binary)], paths)[0], "n_predict": spec.n_predict, "seed": spec.seed,
            "ctx_size": spec.ctx_size, "threads": spec.threads, "args": list(spec.args), "env": dict(spec.env),
            "launcher": abstract_argv(spec.launcher, paths), "launcher_env": dict(spec.launcher_env),
            "crlf_stdout": spec.crlf_stdout}


def generation_identity(side: SideIdentity, model_digest: str, engine_argv: Sequence[str],
                        engine_env: Mapping[str, str], prompt_id: str, prompt: str, model_path: Path) -> dict[str, Any]:
    """The identity of one prompt's engine generation on a side: what its tokens and distributions depend on."""
    paths = {**side.paths, str(model_path): "<model>"}
    return {"format": FORMAT, "harness": harness_digest(), "side": dict(side.facts), "model": model_digest,
            "engine_argv": abstract_argv(engine_argv, paths), "engine_env": dict(engine_env),
            "prompt": [prompt_id, prompt]}


def generation_from_record(record: Mapping[str, Any]) -> EngineGeneration:
    """An EngineGeneration from its ``<prompt>.r<k>.tokens.json`` form (harness.stages.outputs.greedy.generation_record).

    Raises KeyError/ValueError/TypeError for a record of another shape.
    """
    # the record keeps each piece's bytes as piece_hex, where the engine's reply has them as piece
    return parse_generation({**record, "tokens": [{**t, "piece": t["piece_hex"]} for t in record["tokens"]]})


def restored_completion(spec: GenerationSpec, stem: Path, stdout: bytes, stderr: bytes,
                        seconds: float) -> GenerationResult:
    """Write a stored successful llama-completion run back under ``stem`` (``.prompt`` and ``.cmd`` for this
    run's paths, ``.stdout`` and ``.stderr`` as stored) and return its GenerationResult."""
    argv, stdout_path, stderr_path = prepare_generation(spec, stem)
    stdout_path.write_bytes(stdout)
    stderr_path.write_bytes(stderr)
    raw = from_text_mode(stdout) if spec.crlf_stdout else stdout
    text, eog, complete = split_completion_stdout(raw)
    return GenerationResult(status="ok", text=text, returncode=0, signal=None, error_line=None, seconds=seconds,
                            stdout_path=stdout_path, stderr_path=stderr_path, argv=argv, stopped_at_eog=eog,
                            complete=complete)


class SessionCache:
    """The store's view for the greedy runner: keys from identities, sessions in and out.

    ``store``: the harness's result store; ``run_id``: the run writing entries; ``identity``: side ->
    its :class:`SideIdentity` (the pipeline computes it from the side's build); ``models``: digests of
    model files.
    """

    def __init__(self, store: ResultCache, run_id: str,
                 identity: Callable[[Any], SideIdentity],  # Any: greedy.Side, unnamed: greedy.py imports this module
                 models: DigestMemo):
        self.store, self.run_id, self._identity, self.models = store, run_id, identity, models
        self._sides: dict[Any, SideIdentity] = {}  # Any: greedy.Side (see __init__)

    def side(self, side: Any) -> SideIdentity:  # Any: greedy.Side (see __init__)
        """The side's identity (computed once per run)."""
        if side not in self._sides:
            self._sides[side] = self._identity(side)
        return self._sides[side]

    def get(self, identity: Mapping[str, Any]) -> Hit | None:
        """The stored session of ``identity``, or None.  A session that owes no score is also found under
        :func:`generations_identity`, where a session with scores left its generations (one lookup event
        either way)."""
        alone = generations_identity(identity)
        if alone == identity or identity.get("scores"):
            return self.store.get(KIND, identity_key(identity))
        return self.store.get(KIND, identity_key(identity), count_miss=False) or \
            self.store.get(KIND, identity_key(alone))

    def put(self, identity: Mapping[str, Any], meta: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
        """Store a session, and where it owes scores its generations alone under :func:`generations_identity`
        (``scores`` empty), for a run that needs only them; an OSError (full disk, read-only cache) leaves
        the run as it is."""
        entries = [(identity, meta)]
        alone = generations_identity(identity)
        if alone != identity:
            entries.append((alone, {**meta, "scores": []}))
        try:
            for ident, value in entries:
                self.store.put(KIND, identity_key(ident), self.run_id, ident, value, files)
        except OSError:
            pass


def generations_identity(identity: Mapping[str, Any]) -> dict[str, Any]:
    """What a session's generations alone depend on: ``identity`` (greedy's session identity) without its
    scores and with no prompt marked as dumped (the dumps are never stored: a restored reference's are
    written again).  The platform of a cross-platform group's reference needs its generations with other
    scores than its own platform's run made (harness.stages.outputs.greedy): this key finds them."""
    prompts = identity.get("prompts")
    return {**identity, "scores": [],
            "prompts": [{**p, "dumped": False} for p in prompts] if isinstance(prompts, list) else prompts}


def read_json_file(data: bytes) -> JSON:
    """JSON from stored bytes (raises ValueError for bytes that are not UTF-8 JSON)."""
    return json.loads(data.decode("utf-8"))
