"""The statistics of the claims scorecard (docs/statistics.md), decided once.

A claim compares side a with side b on the same seeds: per seed the paired difference d_s = a_s − b_s (or
a_s / b_s − 1 for a ratio claim; a threshold claim's b is a constant). Over the seeds:

- the mean of d and its 95 % interval: Student's t (n − 1 degrees of freedom) for one look at one machine's
  seeds; with seeds from several machines (*strata*), each machine's differences keep their own mean and the
  interval uses the pooled within-machine spread (N − M degrees of freedom: a blocked t-test); with seeds
  added in blocks after looking (a :class:`Design` of several looks), the *repeated confidence interval* of a
  group-sequential design (Jennison & Turnbull, *Group Sequential Methods*, 2000, ch. 9), whose boundaries
  spend α over the planned looks (Lan & DeMets, Biometrika 1983), so the error rate holds however many
  looks are taken;
- the verdict, exactly one of :data:`VERDICTS`: **holds** (the interval lies wholly on the side of zero the
  paper claims), **reversed** (wholly on the other side), **equivalent** (wholly inside ±margin: two
  one-sided tests, TOST, at α/2 each), **undecided** (it reaches zero and a margin), **one seed** (no
  spread to test: the sign only);
- how many seeds would give 80 % power to decide it at the observed mean and spread (noncentral t);
- the probability of improvement P(a beats b) of rliable (Agarwal et al., NeurIPS 2021: the Mann–Whitney U
  statistic over n_a · n_b, 0.5 for identical samples) with a percentile bootstrap interval that resamples
  each side's seeds apart, as rliable's stratified bootstrap does;
- Holm's step-down correction over the family of tested rows, beside the per-row verdict; with margins, its
  closed-testing form for a row's two disjoint hypotheses (:func:`holm_disjoint`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

VERDICTS = ("holds", "reversed", "equivalent", "undecided", "one seed")
DECIDED = ("holds", "reversed", "equivalent")
LEVEL = 0.95  # two-sided confidence of every interval (and 1 − the family-wise error rate of Holm's test)
POWER = 0.8  # the power `seeds_needed` asks for
MAX_SEEDS = 10_000  # beyond this an effect counts as undecidable at the observed spread
SPENDING = ("pocock", "obrien_fleming")  # Lan–DeMets α-spending functions
NULL_PATHS = 100_000  # simulated null paths behind a design's boundaries (seeded: the same every time)
_ALPHA_GRID = np.geomspace(1e-5, 1.0, 121)  # where a design's boundaries are tabulated for repeated p-values


def spent(spending: str, fraction: float, alpha: float) -> float:
    """The α a Lan–DeMets spending function has spent by information fraction ``fraction`` ∈ (0, 1]: Pocock's
    α · ln(1 + (e − 1) t) (spends early: decides at the first looks) or O'Brien–Fleming's
    2 − 2 Φ(z_{1−α/2} / √t) (spends late: keeps the last look close to a fixed design's)."""
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * fraction)
    if spending == "obrien_fleming":
        return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(fraction)))
    raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")


@dataclass(frozen=True)
class Design:
    """When a claim is looked at: ``looks[k]`` is the number of seeds of each stratum (machine) at look k,
    cumulative. One look is a fixed design (the ordinary scorecard); several are a group-sequential one, whose
    boundaries c_k(α) on |t| spend α over the looks by ``spending`` at information fraction N_k / N_K. The
    t statistic at a look is the blocked one: the mean of every difference over its standard error with the
    pooled within-stratum spread (N − M degrees of freedom). Its null distribution does not depend on the
    spread, so the boundaries come from simulated normal paths, seeded (exact t quantiles for one look)."""

    looks: tuple[tuple[int, ...], ...]
    strata: tuple[str, ...] = ("",)
    spending: str = "pocock"

    def __post_init__(self) -> None:
        if not self.looks or any(len(look) != len(self.strata) for look in self.looks):
            raise ValueError(f"each look needs one count per stratum {self.strata}, got {self.looks}")
        if self.spending not in SPENDING:
            raise ValueError(f"spending must be one of {SPENDING}, got {self.spending!r}")
        for prev, look in zip(self.looks, self.looks[1:], strict=False):
            if any(b < a for a, b in zip(prev, look, strict=True)) or sum(look) <= sum(prev):
                raise ValueError(f"looks must add seeds: {prev} then {look}")

    @classmethod
    def fixed(cls, counts: dict[str, int]) -> Design:
        return cls((tuple(counts.values()),), tuple(counts))

    @classmethod
    def sequential(cls, start: int, block: int, most: int, spending: str = "pocock",
                   stratum: str = "", others: dict[str, int] | None = None) -> Design:  # fmt: skip
        """``start`` seeds, then ``block`` more at each look up to ``most`` on this machine (``stratum``);
        ``others``: seeds of other machines, pooled at every look."""
        if not 1 <= start <= most or block < 1:
            raise ValueError(
                f"need 1 ≤ start ≤ max and block ≥ 1, got start {start}, block {block}, max {most}"
            )
        counts = list(range(start, most, block)) + [most]
        others = others or {}
        return cls(tuple((n, *others.values()) for n in counts), (stratum, *others), spending)

    def n(self, k: int) -> int:
        return sum(self.looks[k])

    def df(self, k: int) -> int:
        return self.n(k) - sum(c > 0 for c in self.looks[k])

    def look_of(self, counts: dict[str, int]) -> int:
        """The look whose seeds per stratum are ``counts``; an error naming the design's looks otherwise."""
        want = tuple(counts.get(s, 0) for s in self.strata)
        if set(counts) - set(self.strata) or want not in self.looks:
            raise ValueError(f"seeds per machine {counts} are not a look of the design {self.looks}")
        return self.looks.index(want)

    def boundary(self, k: int, alpha: float = 1 - LEVEL) -> float:
        """c_k(α): at look k, |t| ≥ c_k rejects; P(some look rejects | no difference) = α."""
        if len(self.looks) == 1:
            return float(stats.t.ppf(1 - alpha / 2, self.df(0))) if self.df(0) > 0 else math.inf
        return float(_boundaries(self, alpha)[k])

    def p_value(self, k: int, x: float) -> float:
        """The smallest α at which |t| = ``x`` at look k reaches c_k(α) (from the tabulated boundaries;
        exact for one look): with :meth:`boundary`, a repeated p-value."""
        x = abs(x)
        if math.isinf(x):
            return 0.0
        if len(self.looks) == 1:
            return float(2 * stats.t.sf(x, self.df(0))) if self.df(0) > 0 else 1.0
        table = _boundary_table(self)[:, k]  # decreasing in α
        if x >= table[0]:
            return float(_ALPHA_GRID[0])
        if x <= table[-1]:
            return 1.0
        i = int(np.searchsorted(-table, -x))  # table[i − 1] > x ≥ table[i]
        if not math.isfinite(table[i - 1]):
            return float(_ALPHA_GRID[i])
        lo, hi = np.log(_ALPHA_GRID[i - 1 : i + 1])
        w = (table[i - 1] - x) / (table[i - 1] - table[i])
        return float(np.exp(lo + w * (hi - lo)))


def _look_statistics(design: Design, diffs: dict[str, np.ndarray], looks: int | None = None):
    """Mean and standard error at each of the first ``looks`` looks (all: ``None``), ``[..., looks]`` arrays;
    ``diffs[stratum]`` holds that stratum's differences in look order on its last axis (leading axes:
    independent paths), at least as many as the last of those looks reads."""
    means, ses = [], []
    for k, look in enumerate(design.looks[:looks]):
        total, ss = 0.0, 0.0
        for s, n in zip(design.strata, look, strict=True):
            if n:
                d = diffs[s][..., :n]
                total = total + d.sum(-1)
                flat = np.ptp(d, -1) == 0  # ties: exactly no spread (rounding would leave 1e-33)
                ss = ss + np.where(flat, 0.0, ((d - d.mean(-1, keepdims=True)) ** 2).sum(-1))
        df = design.df(k)
        means.append(total / design.n(k))
        ses.append(np.sqrt(ss / df / design.n(k)) if df > 0 else np.full_like(means[-1], np.nan))
    return np.stack(means, -1), np.stack(ses, -1)


@functools.lru_cache(maxsize=64)
def _null_t(design: Design) -> np.ndarray:
    """|t| at every look of :data:`NULL_PATHS` paths with no difference (normal, unit spread), ``[P, K]``."""
    rng = np.random.default_rng(20261206)
    last = design.looks[-1]
    diffs = {s: rng.standard_normal((NULL_PATHS, n)) for s, n in zip(design.strata, last, strict=True)}
    mean, se = _look_statistics(design, diffs)
    return np.abs(mean / se)


def _spend_boundaries(null_t: np.ndarray, design: Design, alpha: float) -> np.ndarray:
    paths, looks = null_t.shape
    out, alive, before = np.empty(looks), np.ones(paths, bool), 0.0
    for k in range(looks):
        total = spent(design.spending, design.n(k) / design.n(looks - 1), alpha)
        want = int(round((total - before) * paths))  # paths this look may reject
        left = np.sort(null_t[alive, k])[::-1]
        out[k] = np.inf if want <= 0 else left[min(want, left.size) - 1]
        alive &= null_t[:, k] < out[k]
        before = total
    return out


@functools.lru_cache(maxsize=256)
def _boundaries(design: Design, alpha: float) -> np.ndarray:
    return _spend_boundaries(_null_t(design), design, alpha)


@functools.lru_cache(maxsize=64)
def _boundary_table(design: Design) -> np.ndarray:
    """c_k(α) on :data:`_ALPHA_GRID` (rows) for every look (columns)."""
    null_t = _null_t(design)
    return np.stack([_spend_boundaries(null_t, design, a) for a in _ALPHA_GRID])


@dataclass(frozen=True)
class PairedTest:
    """The paired test of one claim row over its seeds (at its last look)."""

    n: int
    mean: float
    sd: float | None  # pooled within-machine spread of the differences; None without spread to test
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # two-sided, H0: mean difference 0 (a repeated p-value over a design's looks)
    verdict: str
    margin: float | None = None
    p_equivalent: float | None = None  # H0: |mean difference| ≥ margin (2 × the TOST p; None: no margin)
    look: int = 0  # the look (0-based) the verdict was reached at, or the last one
    strata: dict[str, int] | None = None  # seeds per machine


def _verdict(low: float, high: float, direction: str, margin: float | None) -> str:
    sign = 1.0 if direction == ">" else -1.0
    lo, hi = sorted((sign * low, sign * high))
    if lo > 0:
        return "holds"
    if hi < 0:
        return "reversed"
    if margin and -margin < low and high < margin:
        return "equivalent"
    return "undecided"


def paired_test(diffs, direction: str, level: float = LEVEL, *, margin: float | None = None,
                strata: Sequence[str] | None = None, design: Design | None = None) -> PairedTest:  # fmt: skip
    """The mean of the paired differences, its interval and the verdict on ``direction`` (``">"``: the paper
    claims a − b > 0; ``"<"``: a − b < 0), and equivalence within ±``margin`` where one is given.

    ``strata``: each difference's machine (None: one machine); ``design``: the looks the seeds were added in
    (None: one look at all of them). ``diffs`` are in look order within each stratum; the verdict is the one
    reached at the first look that decides, as the sequential rule stops there."""
    if direction not in (">", "<"):
        raise ValueError(f"direction must be '>' or '<', got {direction!r}")
    if margin is not None and not margin >= 0:
        raise ValueError(f"a margin is a non-negative number, got {margin!r}")
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1 or d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"need one or more finite differences, got {diffs!r}")
    labels = list(strata) if strata is not None else [""] * d.size
    if len(labels) != d.size:
        raise ValueError(f"{d.size} differences but {len(labels)} strata labels")
    by = {s: d[[i for i, x in enumerate(labels) if x == s]] for s in dict.fromkeys(labels)}
    counts = {s: v.size for s, v in by.items()}
    design = design or Design.fixed(counts)
    last = design.look_of(counts)
    alpha = 1 - level
    mean, se = _look_statistics(design, by, last + 1)  # the looks up to this one: later ones have no data
    for k, look in enumerate(design.looks[: last + 1]):  # every difference equal: the mean is that value
        seen = np.concatenate([by[s][:n] for s, n in zip(design.strata, look, strict=True) if n])
        if np.ptp(seen) == 0:
            mean[k] = seen[0]
    if design.df(last) < 1:  # no spread to test: the sign only
        return PairedTest(int(d.size), float(mean[last]), None, None, None, None, "one seed", margin,
                          strata=counts if strata is not None else None)  # fmt: skip
    verdict, p_dir, p_eq, at = "undecided", 1.0, 1.0 if margin else None, last
    for k in range(last + 1):
        m, e = float(mean[k]), float(se[k])
        if design.df(k) < 1:
            continue
        if e == 0.0:  # no spread (ties): the interval is the point itself; t would be undefined
            t0, t_lo, t_hi = (math.copysign(math.inf, m) if m else 0.0), math.inf, -math.inf
            if margin is not None and abs(m) >= margin:
                t_lo, t_hi = (math.inf, math.inf) if m >= margin else (-math.inf, -math.inf)
        else:
            t0 = m / e
            t_lo, t_hi = ((m + margin) / e, (m - margin) / e) if margin is not None else (0.0, 0.0)
        p_dir = min(p_dir, design.p_value(k, abs(t0)) if t0 else 1.0)
        if margin:
            lo_side = design.p_value(k, t_lo) if t_lo > 0 else 1.0  # H0: mean ≤ −margin, one-sided at α/2
            hi_side = design.p_value(k, -t_hi) if t_hi < 0 else 1.0  # H0: mean ≥ +margin
            p_eq = min(p_eq, max(lo_side, hi_side))
        c = design.boundary(k, alpha)
        low, high = m - c * e, m + c * e
        v = _verdict(low, high, direction, margin)
        if v != "undecided":
            verdict, at = v, k
            break
    m, e = float(mean[at]), float(se[at])
    c = design.boundary(at, alpha)
    low, high = (m - c * e, m + c * e) if e else (m, m)
    sd = e * math.sqrt(design.n(at))
    return PairedTest(design.n(at), m, sd, low, high, p_dir, verdict, margin, p_eq, at,
                      strata=counts if strata is not None else None)  # fmt: skip


def verdict_rates(design: Design, mean: float, sd: float, direction: str, margin: float | None = None,
                  reps: int = 2000, seed: int = 0, level: float = LEVEL) -> dict[str, float]:  # fmt: skip
    """How often each verdict comes out when the true mean difference is ``mean`` with spread ``sd`` (normal,
    every machine alike), the seeds added look by look and each path stopped at its first decision, as the
    sequential target does: the error rates of the rule (``mean`` 0: false holds and reversed; ``mean`` =
    ±margin: false equivalence) and its power at an observed effect. Simulated with :func:`paired_test`
    itself, ``reps`` paths, seeded."""
    rng = np.random.default_rng(seed)
    last = design.looks[-1]
    labels = [s for s, n in zip(design.strata, last, strict=True) for _ in range(n)]
    out = dict.fromkeys(VERDICTS, 0)
    for _ in range(reps):
        d = rng.normal(mean, sd, len(labels))
        t = paired_test(d, direction, level, margin=margin, strata=labels, design=design)
        out[t.verdict] += 1
    return {v: c / reps for v, c in out.items()}


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
    return holm_disjoint(p_values, [None] * len(p_values))[0]


def holm_disjoint(p_direction: list[float | None], p_equivalence: list[float | None]):
    """Adjusted p-values of each row's two hypotheses, "no difference" (``p_direction``) and "a difference of
    at least the margin" (``p_equivalence``; None: no margin), with the family-wise error rate held over all
    rows. A row's two hypotheses are disjoint, so at most one of them is true: the closed test over
    intersections that take at most one hypothesis a row, each tested by Bonferroni (Marcus, Peritz & Gabriel,
    1976). h's adjusted p is max over k of (k + 1) · min(p_h, Q_k), Q_k the k-th largest of the other rows'
    max(p_direction, p_equivalence). Without margins this is exactly Holm's step-down. ``(direction,
    equivalence)`` lists; None where the row is untested."""
    rows = [i for i, p in enumerate(p_direction) if p is not None]
    hard = {i: max(p_direction[i], p_equivalence[i] if p_equivalence[i] is not None else 0.0) for i in rows}

    def adjusted(i: int, p: float) -> float:
        others = sorted((hard[j] for j in rows if j != i), reverse=True)
        best = p
        for k, q in enumerate(others, start=1):
            best = max(best, (k + 1) * min(p, q))
        return min(1.0, best)

    direction = [adjusted(i, p) if p is not None else None for i, p in enumerate(p_direction)]
    equivalence = [
        adjusted(i, q) if q is not None and p_direction[i] is not None else None
        for i, q in enumerate(p_equivalence)
    ]
    return direction, equivalence


def holm_verdict(test: PairedTest, p_holm: float | None, alpha: float = 1 - LEVEL,
                 p_holm_equivalent: float | None = None) -> str:  # fmt: skip
    """The verdict with the family's correction: holds or reversed only where the adjusted p of "no
    difference" is below ``alpha`` (the sign of the mean says which, as the per-row interval does);
    equivalent where the adjusted p of "a difference of at least the margin" is."""
    if test.verdict == "one seed":
        return "one seed"
    if p_holm is not None and p_holm < alpha and test.verdict in ("holds", "reversed"):
        return test.verdict
    if p_holm_equivalent is not None and p_holm_equivalent < alpha and test.verdict == "equivalent":
        return "equivalent"
    return "undecided"


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
