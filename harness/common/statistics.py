"""The statistics of speed decisions: spread of samples and the slowdown rule, in one place.

A slowdown counts only when **both** hold, the rule airspeed velocity (asv) applies to its
benchmark results:

1. the ratio is past a factor: below ``min_ratio / (1 + factor)`` (``min_ratio`` 1: "no slowdown",
   so with the default factor 0.10 the candidate must be more than 10 % slower);
2. a rank test agrees: the one-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``,
   ``alternative="less"``) of the candidate's samples against the reference's samples scaled
   by ``min_ratio`` gives p at most ``p_max``.

The factor keeps a real but small difference (a few per cent, which the test alone would
call significant given enough samples) from failing a run; the test keeps one noisy median
from doing so.  With 5 samples on each side the exact one-sided p is 1/252 = 0.004 when all
five candidate samples are below all five reference samples and 2/252 = 0.008 with one pair
out of order, so the default ``p_max`` of 0.01 asks for (almost) complete separation.

Which ratio: two configurations timed in interleaved rounds (the speed stage's pairs, --confirm's builds)
share each round's state of the machine, so their ratio is the **median of within-round ratios**
(:func:`within_round_ratio`: candidate's sample over the reference's of the same round), the one number
the stage judges and every view (summary, report, triage, the history) shows, named by
:data:`WITHIN_ROUND`.  Samples that are not rounds of one set (one run's tok/s against another's)
have no rounds in common: their ratio is the **ratio of medians** (:data:`OF_MEDIANS`).  On a loaded
2-core machine the two differ: a run whose base sped up in its late rounds gave 0.74x as a ratio of
medians and 0.995x as the median of within-round ratios (issue 60).

Samples are tok/s (higher is faster).  Nothing here measures; harness.stages.speed.speed does.
"""

from __future__ import annotations

import statistics as pystats
from dataclasses import dataclass
from typing import Sequence

#: The fewest samples per side the rank test is run on.
MIN_SAMPLES = 2
#: The name of each ratio where it is shown: of two interleaved sets of rounds, and of two unpaired sets.
WITHIN_ROUND, OF_MEDIANS = "median of within-round ratios", "ratio of medians"


def round_ratios(candidate: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-round ratios: ``candidate[i] / reference[i]`` (tok/s over tok/s) over the rounds both have.

    Raises ValueError for a reference sample that is not positive (a tok/s of 0 is no measurement).
    """
    n = min(len(candidate), len(reference))
    if any(float(r) <= 0 for r in reference[:n]):
        raise ValueError(f"reference samples must be positive tok/s: {list(reference[:n])}")
    return [float(c) / float(r) for c, r in zip(candidate[:n], reference[:n])]


def within_round_ratio(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """The ratio of two configurations timed in interleaved rounds (:data:`WITHIN_ROUND`): the median of
    :func:`round_ratios` (sample ``i`` of each side is round ``i``), a plain number (1.0: as fast).

    The one definition of a within-run speed ratio: the speed stage judges it, the summary, the report
    and its history figure show it, triage compares it between runs.  Raises ValueError with no round on
    both sides or a reference sample that is not positive.
    """
    ratios = round_ratios(candidate, reference)
    if not ratios:
        raise ValueError("no round on both sides")
    return pystats.median(ratios)


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

    ``ratio``: the candidate's speed over the reference's, by ``ratio_name``: :data:`WITHIN_ROUND` for
    interleaved rounds, :data:`OF_MEDIANS` (the candidate's median over the reference's) else.  ``threshold``:
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
    ratio_name: str = OF_MEDIANS

    @property
    def slower(self) -> bool:
        """The ratio is past the factor."""
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
        """The measure a failing rule is named by: the verdict's ratio (``ratio_name``) and the U test's p, ``0.53x, p 0.004``."""
        return f"{self.ratio:.2f}x, p {self.p_value:.2g}"

    def describe(self) -> str:
        """The decision in one line: both medians, the ratio (named) against its threshold, p against p_max."""
        want = "no slowdown" if self.min_ratio == 1.0 else f"at least {self.min_ratio:g}x"
        return (f"{self.candidate.median:.1f} vs {self.reference.median:.1f} tok/s (medians of "
                f"{self.candidate.n} and {self.reference.n}): {self.ratio_name} {self.ratio:.2f}x, {want} asked "
                f"(fails below {self.threshold:.3g}x with p <= {self.p_max:g}); Mann-Whitney p = {self.p_value:.3g}")


def judge(reference: Sequence[float], candidate: Sequence[float], min_ratio: float = 1.0, factor: float = 0.10,
          p_max: float = 0.01, paired: bool = False) -> SpeedVerdict:
    """Judge ``candidate`` samples against ``reference`` samples (tok/s) by the rule of the module docstring.

    ``min_ratio``: the candidate must reach this many times the reference's speed (1: no
    slowdown).  ``factor``: fraction past which a ratio counts (0.10: 10 %).  ``p_max``: the
    rank test's threshold.  ``paired``: sample ``i`` of both sides is round ``i`` of one interleaved set, and
    the ratio is :func:`within_round_ratio`; else the ratio of the medians.  Returns a :class:`SpeedVerdict`.
    Raises ValueError with fewer than :data:`MIN_SAMPLES` samples on a side, a non-positive ``min_ratio``,
    or (``paired``) a reference sample that is not positive.
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
    ratio = within_round_ratio(reference, candidate) if paired else cand.median / ref.median
    return SpeedVerdict(ratio=ratio, threshold=min_ratio / (1.0 + factor), min_ratio=min_ratio,
                        factor=factor, p_value=p, p_max=p_max, reference=ref, candidate=cand,
                        ratio_name=WITHIN_ROUND if paired else OF_MEDIANS)
