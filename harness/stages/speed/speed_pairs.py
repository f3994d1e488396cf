"""The speed stage's plan: which two configurations are measured together, in what order, with which
engines loaded.

A speed rule compares a candidate with its reference, interleaved, so all a rule needs loaded is
those two engines.  Rules of the same two configurations, model and tokens share one :class:`Pair`
(its samples judge pp and tg, and every group's rule of that pair).  Pairs are measured one after the
other, and only the current pair's engines are resident (:class:`Roster`): the most a platform holds
is two engines, not one per configuration (nine moe-large engines, much of them page-locked host
memory, before).  An engine the next pair also needs stays loaded, which :func:`plan_pairs` makes
as likely as it can by ordering the pairs so that consecutive ones share a configuration.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from ..outputs.engine import EngineError, EngineSession


@dataclass(frozen=True)
class EngineKind:
    """What an engine is started with besides its configuration: the ``model`` and its CPU ``threads``
    (``-t``; None: llama.cpp's default).  Rules of the same kind and configuration share an engine."""

    model: str
    threads: int | None = None


@dataclass(frozen=True)
class Unit:
    """What one interleaved measurement times: ``model``, tokens per request, timed rounds (``repeats``),
    the untimed ``warmup`` rounds before them, the engines' CPU ``threads`` (None: llama.cpp's default)
    and ``processes``: engine processes per side, one after the other (1: one process per side times
    every round; more: each process pair times ``warmup`` and ``repeats`` rounds, and a side's sample is
    the median of its process's rounds, one sample per process, as asv's ``processes``)."""

    model: str
    n_prompt: int
    n_gen: int
    repeats: int
    warmup: int = 1
    threads: int | None = None
    processes: int = 1

    @property
    def samples(self) -> int:
        """Samples per side that a complete measurement has: one per round, or one per process."""
        return self.processes if self.processes > 1 else self.repeats

    @property
    def engine(self) -> EngineKind:
        """The kind of engine it is measured on."""
        return EngineKind(self.model, self.threads)


@dataclass(frozen=True)
class Pair:
    """Two configurations measured interleaved on ``unit``: ``first`` runs first in odd rounds (1, 3, ...),
    ``second`` in even ones.  ``first`` is the reference of the first rule that needs the pair."""

    unit: Unit
    first: str
    second: str

    @property
    def configs(self) -> tuple[str, str]:
        """(first, second)."""
        return (self.first, self.second)

    @property
    def key(self) -> tuple[Unit, frozenset[str]]:
        """What rules of the same pair have in common, whichever side is their reference."""
        return (self.unit, frozenset(self.configs))


#: What identifies a pair whichever side is the reference (:attr:`Pair.key`): its unit and its two configurations.
PairKey = tuple[Unit, frozenset[str]]


def pair_key(unit: Unit, a: str, b: str) -> PairKey:
    """The :attr:`Pair.key` of configurations ``a`` and ``b`` on ``unit``."""
    return (unit, frozenset((a, b)))


def plan_pairs(needs: Iterable[tuple[Unit, str, str]]) -> list[Pair]:
    """The pairs to measure, once each, for ``needs`` ((unit, reference, candidate) per rule, in rule
    order).  Order: the first rule's pair first; then, while one is left, the next unmeasured pair of the
    same engine kind (model and threads) that shares a configuration with the pair before it (its engine
    stays loaded), else the next unmeasured pair of the same kind, else the next one."""
    pairs: dict[tuple[Unit, frozenset[str]], Pair] = {}
    for unit, reference, candidate in needs:
        pairs.setdefault(pair_key(unit, reference, candidate), Pair(unit, reference, candidate))
    left = list(pairs.values())
    out: list[Pair] = []
    while left:
        prev = out[-1] if out else None
        same_model = [q for q in left if prev is not None and q.unit.engine == prev.unit.engine]
        shared = [q for q in same_model if prev is not None and set(q.configs) & set(prev.configs)]
        nxt = (shared or same_model or left)[0]
        out.append(nxt)
        left.remove(nxt)
    return out


#: Prepares the engine of (kind, config) in the calling thread (the model, the build and its lock, the
#: command) and returns what starts it; raises EngineError, OSError or RuntimeError when it cannot be.
Starter = Callable[[EngineKind, str], Callable[[], EngineSession]]


class Roster:
    """The resident engines of one platform's speed stage: at most those of the pair being measured.

    ``start(kind, config)`` prepares one engine in the calling thread (a build's read lock belongs to the
    thread that takes it, and the pipeline releases it from the main one) and returns the function that
    starts it, which may run in another thread.  An engine that could not be started is not tried
    again (:attr:`failed`: why, per (kind, config)).  ``peak`` keeps the largest number of engines
    ever resident at once, for the record and the tests.
    """

    def __init__(self, start: Starter):
        self._start = start
        self.sessions: dict[tuple[EngineKind, str], EngineSession] = {}
        self.failed: dict[tuple[EngineKind, str], Exception] = {}
        self.peak = 0

    def load(self, kind: EngineKind, configs: Iterable[str]) -> tuple[dict[str, EngineSession], list[str]]:
        """Make exactly the engines of ``configs`` of ``kind`` resident: close every other engine first, then start the
        missing ones at the same time (loading is not timed; on the 2-core development machine two
        gemma3-270m engines are ready in 1.5 s together against 2.7 s one after the other).  Returns
        (the resident sessions by configuration, the configurations started for this call)."""
        want = [(kind, c) for c in dict.fromkeys(configs)]
        for key in [k for k in self.sessions if k not in want]:
            self.sessions.pop(key).close()
        missing = [k for k in want if k not in self.sessions and k not in self.failed]
        ready: dict[tuple[EngineKind, str], Callable[[], EngineSession]] = {}
        for key in missing:
            try:
                ready[key] = self._start(*key)
            except (EngineError, OSError, RuntimeError) as exc:
                self.failed[key] = exc
        with ThreadPoolExecutor(max_workers=max(1, len(ready))) as pool:
            futures = {k: pool.submit(start) for k, start in ready.items()}
        for key, future in futures.items():
            try:
                self.sessions[key] = future.result()
            except (EngineError, OSError, RuntimeError) as exc:
                self.failed[key] = exc
        self.peak = max(self.peak, len(self.sessions))
        return {c: self.sessions[(m, c)] for m, c in want if (m, c) in self.sessions}, [c for _, c in missing]

    def drop(self, kind: EngineKind, config: str) -> None:
        """Close and forget the engine of (kind, config) (it broke): a later pair starts a new one."""
        session = self.sessions.pop((kind, config), None)
        if session is not None:
            session.close()

    def close(self) -> None:
        """Close every resident engine."""
        while self.sessions:
            self.sessions.popitem()[1].close()
