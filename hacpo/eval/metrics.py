"""Benchmark metrics: avg@k (mean accuracy over k samples per problem) and unbiased pass@k."""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(correct: list[list[float]]) -> float:
    """Mean over problems of the mean correctness over each problem's k samples."""
    if not correct:
        raise ValueError("no problems to average")
    return sum(sum(c) / len(c) for c in correct) / len(correct)


def summarize(correct: list[list[float]], ks: list[int] | None = None) -> dict[str, float]:
    """avg@k plus pass@k for each k in ``ks`` (default: 1 and k) over per-problem sample correctness."""
    n = len(correct[0])
    if any(len(c) != n for c in correct):
        raise ValueError("every problem needs the same number of samples")
    ks = sorted({1, n} if ks is None else {k for k in ks if k <= n})
    out = {f"avg@{n}": avg_at_k(correct), "n_problems": len(correct), "samples_per_problem": n}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, int(sum(c)), k) for c in correct) / len(correct)
    return out
