"""The statistics of the claims scorecard (docs/statistics.md), decided once.

A claim compares side a with side b on the same seeds: per seed the paired difference d_s = a_s − b_s (or
a_s / b_s − 1 for a ratio claim; a threshold claim's b is a constant). Over the n seeds:

- the mean of d and its 95 % Student-t interval (n − 1 degrees of freedom, ``scipy.stats.ttest_1samp``);
- the verdict, exactly one of :data:`VERDICTS`: **holds** (the interval lies wholly on the side of zero the
  paper claims), **reversed** (wholly on the other side), **undecided** (it touches or spans zero), **one
  seed** (n = 1: the sign only, no interval);
- how many seeds would give 80 % power to decide it at the observed mean and spread (noncentral t);
- the probability of improvement P(a beats b) of rliable (Agarwal et al., NeurIPS 2021: the Mann–Whitney U
  statistic over n_a · n_b, 0.5 for identical samples) with a percentile bootstrap interval that resamples
  each side's seeds apart, as rliable's stratified bootstrap does;
- Holm's step-down correction over the family of tested rows, beside the per-row verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

VERDICTS = ("holds", "reversed", "undecided", "one seed")
LEVEL = 0.95  # two-sided confidence of every interval (and 1 − the family-wise error rate of Holm's test)
POWER = 0.8  # the power `seeds_needed` asks for
MAX_SEEDS = 10_000  # beyond this an effect counts as undecidable at the observed spread


@dataclass(frozen=True)
class PairedTest:
    """The paired test of one claim row over its seeds."""

    n: int
    mean: float
    sd: float | None  # sample standard deviation of the differences (ddof 1); None for n = 1
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # two-sided, H0: mean difference 0
    verdict: str


def paired_test(diffs, direction: str, level: float = LEVEL) -> PairedTest:
    """The mean of the paired differences, its Student-t interval and the verdict on ``direction``
    (``">"``: the paper claims a − b > 0; ``"<"``: a − b < 0)."""
    if direction not in (">", "<"):
        raise ValueError(f"direction must be '>' or '<', got {direction!r}")
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1 or d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"need one or more finite differences, got {diffs!r}")
    mean = float(d.mean())
    if d.size == 1:
        return PairedTest(1, mean, None, None, None, None, "one seed")
    if np.ptp(d) == 0.0:  # no spread (ties): the interval is the point itself; scipy's t would be undefined
        mean, sd = float(d[0]), 0.0
        low = high = mean
        p = 1.0 if mean == 0.0 else 0.0
    else:
        sd = float(d.std(ddof=1))
        res = stats.ttest_1samp(d, 0.0)
        ci = res.confidence_interval(confidence_level=level)
        low, high, p = float(ci.low), float(ci.high), float(res.pvalue)
    sign = 1.0 if direction == ">" else -1.0
    lo, hi = sorted((sign * low, sign * high))
    verdict = "holds" if lo > 0 else "reversed" if hi < 0 else "undecided"
    return PairedTest(int(d.size), mean, sd, low, high, p, verdict)


def _power(effect: float, n: int, level: float = LEVEL) -> float:
    """Power of a two-sided one-sample t-test at ``level`` with n samples against a standardized mean
    difference ``effect`` = mean / sd (noncentral t, n − 1 degrees of freedom, noncentrality effect · √n)."""
    crit = stats.t.ppf(0.5 + level / 2, n - 1)
    nc = effect * math.sqrt(n)
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def detectable_effect(n: int, level: float = LEVEL, power: float = POWER) -> float:
    """The design's power statement: the smallest standardized mean difference (mean / sd of the paired
    differences) that ``n`` paired seeds detect with ``power`` (two-sided t-test at ``level``); multiply by
    the spread of the differences for the effect in accuracy (5 seeds: ≈ 1.7 sd)."""
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds, got {n}")
    lo, hi = 0.0, 1.0
    while _power(hi, n, level) < power:
        hi *= 2
    for _ in range(60):  # bisection: power grows with the effect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _power(mid, n, level) < power else (lo, mid)
    return hi


def seeds_needed(mean: float, sd: float | None, level: float = LEVEL, power: float = POWER) -> int | None:
    """The smallest number of seeds n ≥ 2 at which a two-sided one-sample t-test at ``level`` has ``power``
    against a true mean difference ``mean`` with spread ``sd`` (noncentral t with n − 1 degrees of freedom
    and noncentrality mean / sd · √n). None when no number of seeds would (a zero mean, or more than
    :data:`MAX_SEEDS`); 2 when the differences do not spread at all."""
    if sd is None or mean == 0.0:
        return None
    if sd == 0.0:
        return 2
    effect = abs(mean) / sd

    def achieved(n: int) -> float:
        return _power(effect, n, level)

    lo, hi = 2, 2
    while achieved(hi) < power:  # doubling, then bisection: power grows with n
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if achieved(mid) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def holm(p_values: list[float | None], alpha: float = 1 - LEVEL) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error rate ``alpha``); None entries (untested rows)
    stay None and are not part of the family."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m, out, running = len(tested), list[float | None]([None] * len(p_values)), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def holm_verdict(test: PairedTest, p_holm: float | None, alpha: float = 1 - LEVEL) -> str:
    """The verdict with the family's correction: decided only where Holm's adjusted p is below ``alpha``
    (then the sign of the mean says holds or reversed, as the per-row interval does)."""
    if test.n < 2:
        return "one seed"
    if p_holm is None or p_holm >= alpha:
        return "undecided"
    return test.verdict  # p_holm ≥ p: the row's own interval excludes zero too


def _poi(a, b, axis=-1):
    """P(a > b) + ½ P(a = b) over all pairs of a's and b's values along ``axis`` (vectorized)."""
    a, b = np.moveaxis(np.asarray(a, float), axis, -1), np.moveaxis(np.asarray(b, float), axis, -1)
    gt = (a[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
    eq = (a[..., :, None] == b[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(a, b, direction: str) -> float:
    """rliable's probability of improvement for one task: P(a beats b in the claimed direction), i.e. the
    Mann–Whitney U statistic over n_a · n_b (ties count one half; identical samples give 0.5)."""
    sign = 1.0 if direction == ">" else -1.0
    return float(_poi(sign * np.asarray(a, float), sign * np.asarray(b, float)))


def poi_interval(a, b, direction: str, level: float = LEVEL, resamples: int = 2000, seed: int = 0):
    """A percentile bootstrap interval of :func:`probability_of_improvement` (``scipy.stats.bootstrap``),
    resampling each side's seeds independently: rliable's stratified bootstrap with one task.
    ``(low, high)``; None for fewer than two seeds a side."""
    sign = 1.0 if direction == ">" else -1.0
    a, b = sign * np.asarray(a, dtype=float), sign * np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return None
    res = stats.bootstrap(
        (a, b),
        _poi,
        paired=False,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
