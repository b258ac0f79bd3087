"""Verdicts decided without math-verify: exact match, integers, plain rationals, size and nesting
guards (pipeline step 2 of :mod:`hacpo.reward`)."""

from __future__ import annotations

import logging
import math
import re
from fractions import Fraction
from typing import Any

from .extract import extract_boxed
from .limits import MAX_ANSWER_CHARS, MAX_NESTING

logger = logging.getLogger("hacpo.reward")

# ASCII digits only; no "+" with thousands commas (math-verify reads "+1,000" as the set {1, 0}).
_INT_RE = re.compile(r"[+-]?[0-9]+|-?[1-9][0-9]{0,2}(?:,[0-9]{3})+")
_BRACKETS_RE = re.compile(r"[^{}()\[\]]+")


def _norm(s: str) -> str:
    """Drop NUL characters, strip surrounding whitespace and ``$`` (``$5$`` → ``5``)."""
    if "\x00" in s:
        s = s.replace("\x00", "")
    return s.strip().strip("$").strip()


def _int_key(s: str) -> tuple[bool, str]:
    """(is_negative, digits without leading zeros) of a string matching ``_INT_RE``; -0 is 0."""
    neg = s[0] == "-"
    digits = s.lstrip("+-").replace(",", "").lstrip("0") or "0"
    return (neg and digits != "0", digits)


# Plain rationals: an integer, a decimal, a/b, or \frac{a}{b} (also \dfrac, \tfrac, \frac12), with an optional
# leading sign. No thousands commas, percent signs or mixed numbers: those go to math-verify.
_RAT_RE = re.compile(
    r"(?P<sign>[+-]?)\s*(?:"
    r"(?P<dec>[0-9]{1,60}(?:\.[0-9]{1,60})?)"
    r"|(?P<n1>[0-9]{1,60})\s*/\s*(?P<d1>[0-9]{1,60})"
    r"|\\[dt]?frac\s*(?:\{\s*(?P<n2>[0-9]{1,60})\s*\}|(?P<n3>[0-9]))\s*(?:\{\s*(?P<d2>[0-9]{1,60})\s*\}|(?P<d3>[0-9]))"
    r")"
)
_RAT_MARGIN = Fraction(1, 10**4)  # relative gap that math-verify's 6-digit float rounding cannot bridge


def _as_fraction(s: str) -> Fraction | None:
    m = _RAT_RE.fullmatch(s)
    if m is None:
        return None
    if m["dec"] is not None:
        v = Fraction(m["dec"])
    else:
        num = m["n1"] or m["n2"] or m["n3"]
        den = int(m["d1"] or m["d2"] or m["d3"])
        if den == 0:
            return None
        v = Fraction(int(num), den)
    return -v if m["sign"] == "-" else v


def _too_nested(s: str) -> bool:
    depth = 0
    for ch in _BRACKETS_RE.sub("", s):
        if ch in "{([":
            depth += 1
            if depth > MAX_NESTING:
                return True
        else:
            depth -= 1
    return False


def _coerce_gold(gold: Any) -> str | None:
    if isinstance(gold, str):
        return gold
    if isinstance(gold, int | float) and not isinstance(gold, bool):
        if isinstance(gold, float) and not math.isfinite(gold):
            return None
        return str(gold)
    return None


def prepare(response: Any, gold: Any) -> tuple[str | None, float | None, str, tuple[str, str] | None]:
    """(extracted, decided score or None, method, math-verify key or None). Never raises."""
    try:
        g = _coerce_gold(gold)
        if not isinstance(response, str) or g is None:
            return None, 0.0, "bad_input", None
        boxed = extract_boxed(response)
        if boxed is None:
            return None, 0.0, "no_box", None
        c, g = _norm(boxed), _norm(g)
        if not c or not g:
            return boxed, 0.0, "empty", None
        if c == g:
            return boxed, 1.0, "exact", None
        if len(c) > MAX_ANSWER_CHARS or len(g) > MAX_ANSWER_CHARS:
            return boxed, 0.0, "too_long", None
        if _INT_RE.fullmatch(c) and _INT_RE.fullmatch(g):
            return boxed, float(_int_key(c) == _int_key(g)), "int", None
        fc = _as_fraction(c)
        fg = _as_fraction(g) if fc is not None else None
        if fc is not None and fg is not None:
            if fc == fg:
                return boxed, 1.0, "rational", None
            if abs(fc - fg) > _RAT_MARGIN * max(1, abs(fc), abs(fg)):
                return boxed, 0.0, "rational", None
        if _too_nested(c):
            return boxed, 0.0, "too_nested", None
        return boxed, None, "math_verify", (c, g)
    except Exception:  # pragma: no cover - defensive
        logger.debug("reward: prepare failed", exc_info=True)
        return None, 0.0, "error", None
