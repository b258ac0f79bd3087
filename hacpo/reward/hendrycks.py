"""The authors' as-released training reward: Hendrycks-MATH string normalisation + exact string match.

The HACPO authors trained with a verl fork whose math reward is verl's ``verl/utils/reward_score/math.py``
``compute_score`` (spec §10, row "training and validation reward"): take the last ``\\boxed{...}`` of the
response, normalise it and the gold answer with the Hendrycks MATH ``strip_string`` steps, and score 1.0 on
exact equality of the two normalised strings, else 0.0 (no box: 0.0). No symbolic or numeric equivalence:
``\\frac{1}{2}`` matches ``0.5`` and ``1/2`` (those are rewritten by the normalisation), but ``2`` does not
match ``2.0`` and ``0.50`` does not match ``\\frac{1}{2}``. :mod:`hacpo.reward`'s default (math-verify) is
more lenient; this module reproduces the released reward for ablations and comparisons
(``Scorer(reward="hendrycks")``).

This is an independent implementation of the well-known normalisation steps, written to behave like the
original on every input, including its quirks:

- only ``\\%`` is removed, a bare ``%`` is kept (``10%`` does not match ``10``);
- units are dropped only as ``\\text{ ...`` with a space after the brace (``5 \\text{ cm}`` → ``5``);
- ``k = 5`` → ``5`` only if there is exactly one ``=`` and at most two characters (spaces included) before it;
- ``\\sqrt3`` → ``\\sqrt{3}`` and ``\\frac12`` → ``\\frac{1}{2}`` take single characters (``\\sqrt 3`` becomes
  ``\\sqrt{}3`` once spaces are removed, as in the original);
- ``a/b`` → ``\\frac{a}{b}`` only for canonically written integers (``-1/2`` yes, ``01/2`` or ``1 / 2`` no).

Where the original's ``strip_string`` raises (two or more ``\\text{ ``; a ``\\sqrt`` or ``\\frac`` followed by
nothing or by another ``\\sqrt``/``\\frac``), the original's ``is_equiv`` falls back to comparing the raw
strings; :func:`hendrycks_score` does the same. :func:`strip_string` itself never raises: such a step leaves
the string unchanged.

The answer is taken as verl's ``last_boxed_only_string`` + ``remove_boxed`` take it (:func:`released_answer`),
quirks included, not by the math-verify reward's :func:`~hacpo.reward.extract.extract_boxed`: once
``"\\boxed "`` (with a space) occurs anywhere, the answer is the text after its last occurrence up to a ``$``;
``\\fbox{..}`` is found but then rejected (0); braces are counted without regard to escapes. One deviation: a
gold answer that contains a box is reduced to the box's content (verl compares the gold string as given; the
project's data never boxes a gold).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from .extract import extract_boxed
from .fastpath import _coerce_gold

logger = logging.getLogger("hacpo.reward")

# Integers as ``str(int(x))`` writes them: ``a/b`` is rewritten only if ``"{a}/{b}"`` reproduces the string.
_CANON_INT_RE = re.compile(r"0|-?[1-9][0-9]*")
# int() refuses longer digit strings (CPython >= 3.11 default 4300; 0 = no limit), so the original keeps such
# an a/b unchanged.
_INT_MAX_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 0)()


def _drop_right_units(s: str) -> tuple[str, bool]:
    """Keep what precedes ``\\text{ `` (a unit such as ``\\text{ cm}``). More than one: unchanged, not ok."""
    parts = s.split("\\text{ ")
    if len(parts) == 1:
        return s, True
    if len(parts) == 2:
        return parts[0], True
    return s, False


def _fix_sqrt(s: str) -> tuple[str, bool]:
    """``\\sqrt3`` → ``\\sqrt{3}`` (one character). A ``\\sqrt`` followed by nothing: unchanged, not ok."""
    if "\\sqrt" not in s:
        return s, True
    head, *pieces = s.split("\\sqrt")
    out = [head]
    for piece in pieces:
        if not piece:
            return s, False
        if piece[0] == "{":
            out.append("\\sqrt" + piece)
        else:
            out.append("\\sqrt{" + piece[0] + "}" + piece[1:])
    return "".join(out), True


def _fix_fracs(s: str) -> tuple[str, bool]:
    """``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{b}`` → ``\\frac{1}{b}`` (single characters; braced
    numerators untouched). A ``\\frac`` followed by one non-brace character: the whole string unchanged
    (ok); followed by nothing: unchanged, not ok."""
    head, *pieces = s.split("\\frac")
    out = [head]
    for piece in pieces:
        if not piece:
            return s, False
        if piece[0] == "{":
            out.append("\\frac" + piece)
        elif len(piece) < 2:
            return s, True
        elif piece[1] == "{":
            out.append("\\frac{" + piece[0] + "}" + piece[1:])
        else:
            out.append("\\frac{" + piece[0] + "}{" + piece[1] + "}" + piece[2:])
    return "".join(out), True


def _is_canonical_int(s: str) -> bool:
    if _CANON_INT_RE.fullmatch(s) is None:
        return False
    return not _INT_MAX_DIGITS or len(s.lstrip("-")) <= _INT_MAX_DIGITS


def _fix_a_slash_b(s: str) -> str:
    """``a/b`` with both sides canonical integers → ``\\frac{a}{b}``; anything else unchanged."""
    parts = s.split("/")
    if len(parts) == 2 and _is_canonical_int(parts[0]) and _is_canonical_int(parts[1]):
        return "\\frac{" + parts[0] + "}{" + parts[1] + "}"
    return s


def _normalise(s: str) -> tuple[str, bool]:
    """(normalised string, ok). ``ok`` is False where the original ``strip_string`` raises; the failing step
    then leaves the string unchanged and the remaining steps still run."""
    ok = True
    s = s.replace("\n", "")  # linebreaks
    s = s.replace("\\!", "")  # inverse spaces
    s = s.replace("\\\\", "\\")  # a doubled backslash -> one
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")  # degrees
    s = s.replace("\\$", "")  # dollar signs
    s, step_ok = _drop_right_units(s)
    ok &= step_ok
    s = s.replace("\\%", "")  # percent (only the escaped form)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s, ok
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")  # "k = 5" -> " 5"
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s, step_ok = _fix_sqrt(s)
    ok &= step_ok
    s = s.replace(" ", "")
    s, step_ok = _fix_fracs(s)
    ok &= step_ok
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    return s, ok


def strip_string(s: str) -> str:
    """Hendrycks-MATH normalisation of an answer string (see the module docstring). Never raises."""
    try:
        return _normalise(s)[0]
    except Exception:  # pragma: no cover - defensive (non-str input)
        return s


def released_answer(text: str) -> str | None:
    """The answer verl's ``compute_score`` compares: ``remove_boxed(last_boxed_only_string(text))``, None
    where it finds none or ``remove_boxed`` rejects what it found (an ``\\fbox``; verl catches that: 0)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                found = text[start : i + 1]
                return found[len("\\boxed{") : -1] if found.startswith("\\boxed{") else None
    return None


def hendrycks_detailed(response: Any, gold: Any) -> dict[str, Any]:
    """``{"extracted": str | None, "correct": bool, "method": str}`` like ``Scorer.score_detailed``.

    ``method``: ``hendrycks`` (normalised strings compared), ``hendrycks_raw`` (a normalisation step failed,
    raw strings compared, as the original does), ``no_box``, ``bad_input`` or ``error``. Never raises.
    """
    try:
        g = _coerce_gold(gold)
        if not isinstance(response, str) or g is None:
            return {"extracted": None, "correct": False, "method": "bad_input"}
        boxed = released_answer(response)
        if boxed is None:
            return {"extracted": None, "correct": False, "method": "no_box"}
        gold_box = extract_boxed(g)
        if gold_box is not None:
            g = gold_box
        a, ok_a = _normalise(boxed)
        b, ok_g = _normalise(g)
        if ok_a and ok_g:
            return {"extracted": boxed, "correct": a == b, "method": "hendrycks"}
        return {"extracted": boxed, "correct": boxed == g, "method": "hendrycks_raw"}
    except Exception:  # pragma: no cover - defensive
        logger.debug("reward: hendrycks scoring failed", exc_info=True)
        return {"extracted": None, "correct": False, "method": "error"}


def hendrycks_score(response: str, gold: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` equals ``gold`` after Hendrycks normalisation, else 0.0.

    ``gold`` may be plain or itself boxed (then its box's content is used). Never raises.
    """
    return 1.0 if hendrycks_detailed(response, gold)["correct"] else 0.0
