"""Countdown's verifier (TinyZero's task): the last ``\\boxed{…}`` of a response must be an arithmetic
expression that reaches the record's ``target`` from its ``nums``, each number used at most once, with
``+ − × ÷`` and parentheses.

A verifier of your own for hacpo (``reward: {file: config/countdown/verify.py, name: countdown}``): one call
per batch, each record's extra fields in ``metadata``. The expression is parsed with :mod:`ast` and walked
by hand, never ``eval``-ed: only integer literals, the four operators and parentheses are accepted, and
every value is an exact :class:`fractions.Fraction` (``÷`` by zero, or an expression that is too long,
scores 0).
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_CHARS = 200  # longer boxed text is not a Countdown answer (and bounds the parse)
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def value(node: ast.AST, used: list[int]) -> Fraction:
    """The exact value of an expression tree of integer literals and + − × ÷; ``used`` collects the
    literals. Anything else raises ValueError."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = value(node.left, used), value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return OPS[type(node.op)](left, right)
    raise ValueError(f"not allowed in Countdown: {type(node).__name__}")


def reaches(expression: str, nums: list[int], target: int) -> bool:
    """True when ``expression`` equals ``target`` using each of ``nums`` at most once."""
    text = expression.replace("×", "*").replace("÷", "/").replace("\\times", "*").replace("\\div", "/")
    if len(text) > MAX_CHARS:
        return False
    try:
        used: list[int] = []
        result = value(ast.parse(text.strip(), mode="eval").body, used)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return not (Counter(used) - Counter(nums)) and result == target


def countdown(responses: list[str], answers: list[str], metadata: list[dict]) -> list[float]:
    """1.0 where the last boxed expression reaches ``metadata["target"]`` from ``metadata["nums"]``, else 0.
    ``answers`` (a reference solution) are not needed: any valid expression counts."""
    out = []
    for response, meta in zip(responses, metadata, strict=True):
        boxes = BOXED.findall(response)
        nums = [int(n) for n in meta["nums"]]
        out.append(1.0 if boxes and reaches(boxes[-1], nums, int(meta["target"])) else 0.0)
    return out
