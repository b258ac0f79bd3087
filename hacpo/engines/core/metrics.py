"""A learner's loss metrics, merged once for both engines.

An engine's update (one optimizer step m) may run as parts: the local engine's micro-batches, OpenRLHF's
micro-batches on each data-parallel rank. :func:`merge_parts` makes the update's metrics of its parts' —
the same numbers as over the whole mini-batch. :func:`aggregate` makes a step's metrics (the
``metrics.jsonl`` row) of its updates', and :func:`update_record` one ``updates.jsonl`` row of each.
"""

from __future__ import annotations

import math

from hacpo.algo import LossSpec
from hacpo.algo.losses import cross_bounds
from hacpo.runio import Update

from .nonfinite import COUNTS, SKIPPED

# A part's share: the parts add up to the whole (hacpo.algo.policy_loss with n_total / own_tokens set).
SUMMED = {"loss", "pg_loss", "kl", "rows", "own_rows", "rescue_rows"}


def _summed(key: str) -> bool:
    """Totals over rows (``*_sum``): summed over an update's parts and over a step's updates."""
    return key.endswith("_sum")


def _weight(key: str, n: float, metrics: dict) -> float:
    """How many rows a part's value of ``key`` averages over: its own rows, its cross rows, or all."""
    own = metrics.get("own_rows", n)
    if key.startswith(("s_homo", "own_")):
        return own
    if key.startswith(("s_hete", "cross_", "omega_")):
        return n - own
    return n


def merge_parts(parts: list[tuple[float, dict]]) -> dict[str, float]:
    """One update's metrics from its parts' (row count, metrics): shares summed, minima and maxima kept,
    means averaged over the rows they cover (own, cross or all), as over the whole mini-batch."""
    if len(parts) == 1:
        return dict(parts[0][1])
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for _, m in parts for k in m):
        vals = [(_weight(key, n, m), m[key]) for n, m in parts if key in m]
        if key in SUMMED or _summed(key):
            out[key] = sum(v for _, v in vals)
        elif key in COUNTS:  # an update is skipped, or had non-finite log-probs, whichever part found it
            out[key] = max(v for _, v in vals)
        elif key.endswith("_min"):
            out[key] = min(v for _, v in vals)
        elif key.endswith("_max"):
            out[key] = max(v for _, v in vals)
        else:
            total = sum(w for w, _ in vals)
            out[key] = sum(w * v for w, v in vals) / total if total else vals[0][1]
    return out


def aggregate(updates: list[dict]) -> dict[str, float]:
    """A step's metrics of its updates': min of ``*_min``, max of ``*_max``, sum of ``*_sum`` and of the
    non-finite counts (``nonfinite/*``), mean of everything else (over the updates that have it), and
    ``updates``, their number. A NaN stays visible: any update's NaN makes the step's value NaN (a diverging
    update's gradient norm is a number to see, not one to leave out)."""
    out: dict[str, float] = {"updates": float(len(updates))}
    for key in sorted({k for log in updates for k in log}):
        vals = [log[key] for log in updates if key in log]
        if not vals or key == Update.UPDATE:
            continue
        if any(math.isnan(v) for v in vals):
            out[key] = math.nan
        elif key in COUNTS:
            out[key] = sum(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        elif key.endswith("_max"):
            out[key] = max(vals)
        elif _summed(key):
            out[key] = sum(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out


def update_record(step: int, agent: str, log: dict, spec: LossSpec) -> dict:
    """One ``updates.jsonl`` row (:class:`hacpo.runio.Update`) of a learner's update ``log`` (its merged
    metrics, with ``update`` = m). ``cross_lo``: lo_m of the stepwise clip whether or not the update had
    cross rows (None for losses without it); fractions: None where the update had no rows they count."""
    m = int(log[Update.UPDATE])
    rows, own = int(round(log.get("rows", 0))), int(round(log.get("own_rows", 0)))
    lo = cross_bounds(spec, m)[0] if spec.kind == "hacpo" else -math.inf
    lo = None if lo == -math.inf else round(lo, 10)  # 0.825, not 0.8250000000000001
    in_bounds = log.get("cross_in_bounds_frac")
    clipped = log.get("cross_clip_frac")  # Naive: GSPO's clip on cross rows
    if clipped is None and in_bounds is not None:
        clipped = 1.0 - in_bounds
    return Update.row(
        step, agent, m, own_rows=own, cross_rows=rows - own, cross_lo=lo,
        cross_in_bounds_frac=in_bounds, own_clip_frac=log.get("own_clip_frac"), cross_clip_frac=clipped,
        kl_term="kl" in log, skipped=bool(log.get(SKIPPED, 0.0)),
    )  # fmt: skip
