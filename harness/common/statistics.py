"""The statistics of speed decisions: spread of samples and the slowdown rule, in one place.

A slowdown counts only when **both** hold, the rule airspeed velocity (asv) applies to its
benchmark results:

1. the ratio of the medians is past a factor: the candidate's median tok/s is below
   ``min_ratio / (1 + factor)`` times the reference's (``min_ratio`` 1: "no slowdown", so with
   the default factor 0.10 the candidate must be more than 10 % slower);
2. a rank test agrees: the one-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``,
   ``alternative="less"``) of the candidate's samples against the reference's samples scaled
   by ``min_ratio`` gives p at most ``p_max``.

The factor keeps a real but small difference (a few per cent, which the test alone would
call significant given enough samples) from failing a run; the test keeps one noisy median
from doing so.  With 5 samples on each side the exact one-sided p is 1/252 = 0.004 when all
five candidate samples are below all five reference samples and 2/252 = 0.008 with one pair
out of order, so the default ``p_max`` of 0.01 asks for (almost) complete separation.

Samples are tok/s (higher is faster).  Nothing here measures; harness.stages.speed.speed does.
"""

from __future__ import annotations

import statistics as pystats
from dataclasses import dataclass
from typing import Sequence

#: The fewest samples per side the rank test is run on.
MIN_SAMPLES = 2


@dataclass(frozen=True)
class Spread:
    """Summary of samples (tok/s): ``n``, ``median``, ``min``, ``max`` and the quartiles ``q1``/``q3``
    (``statistics.quantiles``, inclusive method); ``rel_iqr`` is (q3 - q1) / median."""

    n: int
    median: float
    min: float
    max: float
    q1: float
    q3: float

    @property
    def rel_iqr(self) -> float:
        """The interquartile range as a fraction of the median (0 for a single sample)."""
        return (self.q3 - self.q1) / self.median if self.median else 0.0


def spread(samples: Sequence[float]) -> Spread:
    """The :class:`Spread` of ``samples``; raises ValueError for no samples."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(float(x) for x in samples)
    q1, _, q3 = pystats.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0], xs[0], xs[0])
    return Spread(len(xs), pystats.median(xs), xs[0], xs[-1], q1, q3)


@dataclass(frozen=True)
class SpeedVerdict:
    """A slowdown decision (see the module docstring).

    ``ratio``: the candidate's median over the reference's (tok/s over tok/s).  ``threshold``:
    ``min_ratio / (1 + factor)``, the ratio below which the candidate is past the factor.
    ``p_value``: the one-sided Mann-Whitney U test's p that the candidate is slower than
    ``min_ratio`` times the reference.  ``slower``: ratio below the threshold;
    ``significant``: p at most ``p_max``; ``regressed``: both.
    """

    ratio: float
    threshold: float
    min_ratio: float
    factor: float
    p_value: float
    p_max: float
    reference: Spread
    candidate: Spread

    @property
    def slower(self) -> bool:
        """The median ratio is past the factor."""
        return self.ratio < self.threshold

    @property
    def significant(self) -> bool:
        """The rank test agrees at ``p_max``."""
        return self.p_value <= self.p_max

    @property
    def regressed(self) -> bool:
        """Both: a slowdown by the rule."""
        return self.slower and self.significant

    def outcome(self) -> str:
        """What the rule decided in words: ``slowdown`` / ``no slowdown by the rule`` for a rule that asks for no
        slowdown (``min_ratio`` 1), ``short of 3x`` / ``not short of 3x by the rule`` for one that asks for at
        least that many times the reference's speed."""
        if self.min_ratio == 1.0:
            return "slowdown" if self.regressed else "no slowdown by the rule"
        return f"short of {self.min_ratio:g}x" if self.regressed else f"not short of {self.min_ratio:g}x by the rule"

    def measure(self) -> str:
        """The measure a failing rule is named by: the ratio of the medians and the U test's p, ``0.53x, p 0.004``."""
        return f"{self.ratio:.2f}x, p {self.p_value:.2g}"

    def describe(self) -> str:
        """The decision in one line: both medians, the ratio against its threshold, p against p_max."""
        want = "no slowdown" if self.min_ratio == 1.0 else f"at least {self.min_ratio:g}x"
        return (f"{self.candidate.median:.1f} vs {self.reference.median:.1f} tok/s (medians of "
                f"{self.candidate.n} and {self.reference.n}): {self.ratio:.2f}x, {want} asked "
                f"(fails below {self.threshold:.3g}x with p <= {self.p_max:g}); Mann-Whitney p = {self.p_value:.3g}")


def judge(reference: Sequence[float], candidate: Sequence[float], min_ratio: float = 1.0, factor: float = 0.10,
          p_max: float = 0.01) -> SpeedVerdict:
    """Judge ``candidate`` samples against ``reference`` samples (tok/s) by the rule of the module docstring.

    ``min_ratio``: the candidate must reach this many times the reference's speed (1: no
    slowdown).  ``factor``: fraction past which a ratio counts (0.10: 10 %).  ``p_max``: the
    rank test's threshold.  Returns a :class:`SpeedVerdict`.  Raises ValueError with fewer than
    :data:`MIN_SAMPLES` samples on a side or a non-positive ``min_ratio``.
    """
    if len(reference) < MIN_SAMPLES or len(candidate) < MIN_SAMPLES:
        raise ValueError(f"the rank test needs at least {MIN_SAMPLES} samples per side "
                         f"(reference {len(reference)}, candidate {len(candidate)})")
    if min_ratio <= 0:
        raise ValueError(f"min_ratio must be positive, not {min_ratio}")
    ref, cand = spread(reference), spread(candidate)
    scaled = [min_ratio * float(x) for x in reference]
    # imported here: scipy.stats takes 1.1 s to import on the 2-core development machine, and every
    # harness command imports this module through the pipeline, most of them never judging a sample
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu([float(x) for x in candidate], scaled, alternative="less").pvalue)
    return SpeedVerdict(ratio=cand.median / ref.median, threshold=min_ratio / (1.0 + factor), min_ratio=min_ratio,
                        factor=factor, p_value=p, p_max=p_max, reference=ref, candidate=cand)
