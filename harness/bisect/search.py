"""The search of a bisection: which position first makes a check fail, where a position may also be undecided.

Positions are 0..n (0 is the unpatched base, k counts the patches applied).  A position is judged ``good``,
``bad`` or ``undecided`` (:data:`OUTCOMES`); an undecided position is stepped around as ``git bisect skip``
does, so a range whose inner points cannot be decided ends as a range, never as a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: What a position can be judged.
GOOD, BAD, UNDECIDED = "good", "bad", "undecided"
OUTCOMES = (GOOD, BAD, UNDECIDED)


@dataclass(frozen=True)
class Found:
    """What the search found: ``last_good`` and ``first_bad`` (positions); ``first_bad - last_good`` is 1 when
    the search ended on one position, more when every position between them was undecided."""

    last_good: int
    first_bad: int

    @property
    def exact(self) -> bool:
        """True when ``first_bad`` is the first bad position, not the end of an undecided range."""
        return self.first_bad - self.last_good == 1


def _inner(lo: int, hi: int) -> list[int]:
    """The positions strictly between ``lo`` and ``hi``, the middle first, then outwards (lower side first)."""
    mid = (lo + hi) // 2
    return sorted(range(lo + 1, hi), key=lambda k: (abs(k - mid), k))


def search(judge: Callable[[int], str], good: int, bad: int) -> Found:
    """The first bad position after ``good`` up to ``bad`` by binary search; ``judge(k)`` returns one of
    :data:`OUTCOMES` and is called at most once per position, only for positions strictly between the two ends
    (the caller has judged the ends: ``good`` good and ``bad`` bad).

    A position judged undecided is skipped in favour of the next nearest to the middle; when every position
    between the current ends is undecided, the search stops there (:attr:`Found.exact` False).  Assumes one
    transition from good to bad, as git bisect does.  Raises ValueError unless ``good < bad`` and ValueError
    for an outcome not in :data:`OUTCOMES`.
    """
    if not good < bad:
        raise ValueError(f"need good < bad; got good={good}, bad={bad}")
    lo, hi = good, bad
    while hi - lo > 1:
        for k in _inner(lo, hi):
            outcome = judge(k)
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome {outcome!r} of position {k} not in {OUTCOMES}")
            if outcome == GOOD:
                lo = k
                break
            if outcome == BAD:
                hi = k
                break
        else:
            break
    return Found(lo, hi)
