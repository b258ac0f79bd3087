"""The paper's printed numbers (v2 numbering, see ``paper_results.csv`` shipped with the package).

Key: ``(table, block, model, method, benchmark)``, e.g.
``("table1", "Qwen3-1.7B-Base+Qwen3-4B-Base", "Qwen3-1.7B-Base", "hacpo", "math500") -> 0.69``.
Values are as printed: fractions for accuracies, minutes for runtime (Table 7), percent for memory (Table 8).
"""

from __future__ import annotations

import csv
import io
from functools import lru_cache
from importlib import resources

Key = tuple[str, str, str, str, str]


@lru_cache(maxsize=1)
def paper_values() -> dict[Key, float]:
    """All 719 printed values of the paper, keyed by (table, block, model, method, benchmark)."""
    text = resources.files("hacpo.report").joinpath("paper_results.csv").read_text()
    rows = csv.DictReader(io.StringIO(text))
    cols = ("table", "block", "model", "method", "benchmark")
    return {tuple(r[c] for c in cols): float(r["value"]) for r in rows}


def paper_value(table, block, model, method, benchmark) -> float | None:
    """The printed value, or None when any key part is None or the paper prints no such number."""
    key = (table, block, model, method, benchmark)
    if any(k is None for k in key):
        return None
    return paper_values().get(key)
