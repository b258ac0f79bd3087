"""Benchmark metrics over each problem's k sampled rewards, every reward on [0, 1] (a verifier on another
scale declares ``reward.range`` and is mapped onto [0, 1], :func:`hacpo.reward.custom.unit_rewards`).

One definition, partial credit included:

- **avg@k** (and ``accuracy``, the same number): the mean over problems of the mean *reward* over each
  problem's k samples. A 0/1 reward makes it the mean correctness; partial credit counts for its share.
- **pass@k**: the unbiased estimator of Chen et al. (2021), which needs a binary verdict per sample: a sample
  is correct when its reward is at least :data:`CORRECT_AT` (full credit, 1), so partial credit never makes
  a pass. The per-sample audit's ``correct`` is the same verdict (:func:`is_correct`).
"""

from __future__ import annotations

from math import comb

from hacpo.reward.custom import CORRECT_AT, is_correct  # noqa: F401 (the one definition, read here too)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(rewards: list[list[float]]) -> float:
    """Mean over problems of the mean reward over each problem's k samples (partial credit its share)."""
    if not rewards:
        raise ValueError("no problems to average")
    return sum(sum(r) / len(r) for r in rewards) / len(rewards)


def summarize(rewards: list[list[float]], ks: list[int] | None = None) -> dict[str, float]:
    """avg@k and ``accuracy`` (the mean reward), plus pass@k for each k in ``ks`` (default: 1 and k),
    counting a sample correct at full credit (:func:`is_correct`), over each problem's sample rewards."""
    n = len(rewards[0])
    if any(len(r) != n for r in rewards):
        raise ValueError("every problem needs the same number of samples")
    outside = [x for r in rewards for x in r if not 0.0 <= x <= 1.0]
    if outside:  # a verifier's raw scale: its own range must be declared and mapped first
        raise ValueError(
            f"{len(outside)} rewards outside [0, 1] (e.g. {outside[0]!r}): a verifier on another scale "
            "declares `reward.range: [lo, hi]`, which maps it onto [0, 1]"
        )
    ks = sorted({1, n} if ks is None else {k for k in ks if k <= n})
    mean = avg_at_k(rewards)
    out = {f"avg@{n}": mean, "accuracy": mean, "n_problems": len(rewards), "samples_per_problem": n}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(map(is_correct, r)), k) for r in rewards) / len(rewards)
    return out
