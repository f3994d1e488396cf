"""Reusing a pair's speed samples when everything they measured is byte-identical (docs/cache.md).

The unit is one measured pair (harness.stages.speed.speed_pairs.Pair): both configurations' samples,
every round, as the stage took them.  Its key (:func:`pair_identity`) holds what can change them:

* per side, in the pair's order: the identity of its build's programs and shared libraries, by content
  (harness.stages.outputs.generation_cache.side_identity: the images with the build's own name zeroed,
  the machine, for a GPU platform the GPUs, driver and CUDA runtime, the inherited ``LLAMA_*``,
  ``GGML_*``, ``CUDA_*`` ... variables, the emulator), the engine's arguments and environment with
  paths replaced by what they name;
* the model file's sha256; the unit (tokens per request, rounds, warm-up rounds, threads) and the
  warm-up request's generated tokens;
* the harness code that starts the engines, times them and reads them back (:data:`HARNESS_SOURCES`).

The rules are not in the key: a restored pair is judged again by today's rules, as a fresh one is.
Only a pair whose samples are all there, with no engine error, and whose every rule passed is stored;
a slowdown, or a pair that could not be measured, is measured again in every run.  ``--no-cache``
measures every pair (and stores it again).  What a fresh measurement still gives on the same bytes is
the machine's noise, which ``benchmarks/speed_stage.py`` and triage's ``--confirm`` measure with the
store left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common.fs import sha256_files
from ...record.cache import Hit, ResultCache, identity_key
from ..outputs.generation_cache import SideIdentity, abstract_argv
from .speed_pairs import Pair

#: The entry kind of a measured pair in the store.
KIND = "speed"

#: Format of the stored value; a change makes every older entry miss.
FORMAT = 1

#: Harness modules whose code decides how a pair is measured and read back (their bytes enter the key).
HARNESS_SOURCES = (Path("speed", "speed.py"), Path("speed", "speed_pairs.py"), Path("speed", "speed_cache.py"),
                   Path("outputs", "engine.py"))


def harness_digest() -> str:
    """sha256 over :data:`HARNESS_SOURCES` (name and bytes), relative to ``harness/stages``."""
    stages = Path(__file__).resolve().parent.parent
    return sha256_files(stages / rel for rel in HARNESS_SOURCES)


def pair_identity(pair: Pair, sides: Sequence[tuple[SideIdentity, Sequence[str], Mapping[str, str]]],
                  model_digest: str, model_path: Path, warmup_gen: int) -> dict[str, Any]:
    """The key's content for ``pair``: ``sides`` are (side identity, engine argv, engine env) of
    ``pair.configs`` in that order; ``model_digest`` the model file's sha256, ``model_path`` its path
    (replaced by a placeholder in the argv); ``warmup_gen`` the tokens each warm-up request generates."""
    out_sides = []
    for config, (side, argv, env) in zip(pair.configs, sides):
        paths = {**side.paths, str(model_path): "<model>"}
        out_sides.append({"config": config, "side": dict(side.facts), "engine_argv": abstract_argv(argv, paths),
                          "engine_env": dict(env)})
    u = pair.unit
    return {"format": FORMAT, "harness": harness_digest(), "model": model_digest,
            "unit": {"n_prompt": u.n_prompt, "n_gen": u.n_gen, "repeats": u.repeats, "warmup": u.warmup,
                     "threads": u.threads, "warmup_gen": warmup_gen},
            "sides": out_sides}


def lookup(store: ResultCache, identity: Mapping[str, Any]) -> Hit | None:
    """The stored pair of ``identity``, or None (a miss, counted under :data:`KIND`)."""
    return store.get(KIND, identity_key(identity))


def store_pair(store: ResultCache, run_id: str, identity: Mapping[str, Any], samples: Mapping[str, Any],
               wall_s: float) -> None:
    """Store a pair's ``samples`` (config -> {"pp": [...], "tg": [...]}, tok/s per round) and the wall seconds
    of its rounds; an OSError (full disk, read-only cache) leaves the run as it is.  Each side's place in
    the rounds is its place in the pair, which the key holds."""
    try:
        store.put(KIND, identity_key(identity), run_id, identity, {"samples": dict(samples), "wall_s": wall_s}, {})
    except OSError:
        pass


def restored_engine_facts(hit: Hit) -> dict[str, dict[str, Any]]:
    """Per configuration of ``hit``, what its engine said of itself when it loaded (``engine`` beside its
    samples: harness.stages.outputs.engine.EngineSession.facts); a side stored without them is left out."""
    samples = hit.meta.get("samples")
    if not isinstance(samples, dict):
        return {}
    return {str(c): dict(s["engine"]) for c, s in samples.items() if isinstance(s, dict) and isinstance(s.get("engine"), dict)}


def restored_samples(hit: Hit, pair: Pair) -> dict[str, tuple[list[float], list[float]]] | None:
    """The samples of ``hit`` for ``pair`` (config -> (pp, tg) tok/s per round), or None when the entry does
    not hold both configurations with every round of both metrics (then the pair is measured)."""
    samples = hit.meta.get("samples")
    if not isinstance(samples, dict) or set(samples) != set(pair.configs):
        return None
    out = {}
    for config in pair.configs:
        try:
            pp, tg = [float(x) for x in samples[config]["pp"]], [float(x) for x in samples[config]["tg"]]
        except (KeyError, TypeError, ValueError):
            return None
        if len(pp) != pair.unit.samples or len(tg) != pair.unit.samples:
            return None
        out[config] = (pp, tg)
    return out
