"""The answer of a response: the content of its last ``\\boxed{}``/``\\fbox{}``, in linear time."""

from __future__ import annotations

import re

_BOX_TOKENS = ("\\boxed", "\\fbox")
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped char (``\{``, ``\\``) or a bare brace
_SPACES = " \t\r\n"


def _match_braces(text: str, open_pos: int) -> str | None:
    """Content of the group whose ``{`` is at ``open_pos``; ``None`` if it never closes. Linear time."""
    closers_left = text.count("}", open_pos)  # C-speed upper bound: depth can never exceed it and still close
    depth = 0
    for m in _BRACE_TOKEN_RE.finditer(text, open_pos):
        tok = m.group()
        if tok == "{":
            depth += 1
            if depth > closers_left:
                return None
        elif tok == "}":
            depth -= 1
            closers_left -= 1
            if depth == 0:
                return text[open_pos + 1 : m.start()]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (``None`` if there is none).

    Braces are matched with nesting; escaped braces (``\\{``, ``\\}``) do not count. Whitespace between the
    command and ``{`` is allowed; a ``\\boxed`` not followed by ``{`` (``\\boxed 5``, ``\\boxedfoo``) is not a
    box. If the last box never closes (a truncated response) the result is ``None`` — an earlier box is NOT
    used. Linear time: each candidate is found scanning from the right, and only the last real one is matched.
    """
    if not isinstance(text, str):
        return None
    n = len(text)
    cand = {tok: text.rfind(tok) for tok in _BOX_TOKENS}
    while True:
        tok = max(cand, key=cand.__getitem__)
        pos = cand[tok]
        if pos < 0:
            return None
        j = pos + len(tok)
        while j < n and text[j] in _SPACES:
            j += 1
        if j < n and text[j] == "{":
            return _match_braces(text, j)
        cand[tok] = text.rfind(tok, 0, pos)
