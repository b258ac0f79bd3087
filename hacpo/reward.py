"""Verifiable 0/1 reward: the last ``\\boxed{...}`` of a response vs the gold answer, judged by math-verify.

Used both as the RL training reward and for benchmark scoring, so it must be correct, fast and *bounded*:
no input (megabyte strings, exponent towers, 5000-deep nesting, null bytes ...) may take more than about
``timeout_s`` (default 2 s) of wall time per item, and nothing here raises on bad input.

Public API
----------
- :func:`extract_boxed` — content of the last ``\\boxed{}``/``\\fbox{}``, linear time.
- :func:`score_one` / :func:`score_detailed` — one item (never raise).
- :class:`Scorer` / :func:`score_batch` — batches, in-process (``workers=0``) or in a process pool.

Pipeline for one item
---------------------
1. Extract the last box. No box → 0, even if the text ends with the right number (the paper's reward
   requires the box; math-verify alone would pick up a bare trailing number).
2. Decided in the calling process, in this order:

   - exact string match after dropping NULs and stripping surrounding whitespace and ``$`` → 1 (both sides
     are parsed from the same ``\\boxed{...}`` wrapping, and math-verify accepted every identical pair we
     tried except degenerate golds such as ``\\text{}``);
   - boxed content or gold over :data:`MAX_ANSWER_CHARS` chars → 0;
   - both sides plain ASCII integers (optional sign, leading zeros, ``1,000``-style thousands groups, but no
     ``+`` with commas: math-verify reads ``+1,000`` as the set {1, 0}) → compared as integers, which is
     what math-verify concludes for those forms;
   - both sides plain rationals (integer, decimal, ``a/b``, ``\\frac{a}{b}``, ``\\dfrac``, ``\\tfrac``,
     ``\\frac12``; optional sign) → equal as exact fractions: 1; relative gap over 1e-4: 0; closer than that
     (math-verify's 6-digit float rounding may merge them, e.g. ``0.3333333`` vs ``\\frac{1}{3}``): left to
     math-verify;
   - bracket nesting deeper than :data:`MAX_NESTING` → 0 (ANTLR gets exponentially slow with depth).

   The int and rational verdicts are checked against math-verify on random samples in the tests (and on
   ~10k pairs during development, with no disagreement).
3. math-verify: ``parse`` of ``\\boxed{gold}`` (LaTeX + plain-expression extraction) and of
   ``\\boxed{content}`` (LaTeX extraction, so it sees exactly the boxed content), a size guard on the parsed
   SymPy trees (numbers with more than :data:`MAX_NUMBER_BITS` bits, e.g. ``9^{9^{9^{9}}}`` or ``(10^7)!``,
   are rejected *before* ``verify`` evaluates them — those evaluations run in C and cannot be interrupted),
   then ``verify``.

Timeouts
--------
math-verify's own timeouts are integer-second ``signal.alarm`` calls, one per ``parse`` and one per
gold×target pair inside ``verify`` (up to 4 pairs here), and each ends with ``alarm(0)``, which would cancel
any outer timer. Their smallest setting (1 s) therefore bounds an item only by ~6 s. We pass
``parsing_timeout=None`` / ``timeout_seconds=None`` and instead run the whole item (both parses + verify)
under one ``signal.setitimer`` deadline of ``0.75 * timeout_s`` whose handler raises a ``BaseException``
(so math-verify's ``except Exception`` cannot swallow it) and re-fires every 50 ms until disarmed. Three
guards keep asynchronous interrupts from corrupting the process: each process first runs math-verify over a
few typical answers with no deadline (lazy SymPy imports happen there), the handler never raises while a
module import is running (it waits for the next re-fire), and once the deadline has fired the item counts as
a timeout even if some library swallowed the exception and returned a value.

Signals only work in the main thread, so:

- ``workers=0`` scores in the calling process when called from the main thread. Interruption happens
  between Python bytecodes; the size guard removes the known uninterruptible C-level cases, but in-process
  scoring has no *hard* bound against an unknown one.
- ``workers>=1`` (and ``workers=0`` called from a non-main thread, which falls back automatically to a
  1-worker pool) uses worker subprocesses. Each worker applies the same soft deadline in its own main thread,
  and the parent kills and replaces a worker whose current item has run past ``timeout_s`` of wall time
  (that item scores 0). This is the hard bound. A worker that dies is replaced and its item retried once.
  A per-item RLIMIT_CPU backstop kills a worker that is stuck after its parent has died. The environment
  variable ``HACPO_REWARD_HANG_FOR_TESTS`` (tests only) makes workers hang uninterruptibly on that content.

Workers are fresh interpreters (``python -c`` running :func:`_worker_entry`, talking pickled messages over
two pipes) rather than ``multiprocessing`` processes: ``spawn`` and ``forkserver`` both re-import the
parent's ``__main__`` in every child (≈1.1 s per worker when the trainer's main imports torch, measured),
whereas a bare interpreter with math-verify is ready in ≈0.35 s, does not inherit CUDA/torch state, and is
cheap to replace after a kill. Fast-path items and cache hits never reach the pool; identical
(content, gold) pairs within a batch are scored once.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from fractions import Fraction
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _conn_wait
from typing import Any

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_NESTING",
    "MAX_NUMBER_BITS",
    "Scorer",
    "extract_boxed",
    "score_batch",
    "score_detailed",
    "score_one",
]

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000
"""Boxed content (and gold) longer than this scores 0 unless it matches the gold exactly."""
MAX_NESTING = 16
"""Deeper ``{}``/``()``/``[]`` nesting in the boxed content scores 0 (keeps the ANTLR parser shallow)."""
MAX_NUMBER_BITS = 1 << 20
"""Parsed expressions whose numeric value may need more bits than this (≈315k decimal digits) score 0."""

_SOFT_FRACTION = 0.75  # soft (signal) deadline as a fraction of timeout_s; the rest is headroom
_REFIRE_S = 0.05  # the deadline signal repeats until disarmed, in case some library swallows it
_WORKER_START_TIMEOUT_S = 60.0
_MAX_CHUNK = 4  # items per message; math-verify items take ms, so small chunks balance load at no cost
_DEFAULT_CACHE = 32768
# Deterministic verdicts only: timeouts/kills depend on machine load (a busy moment must not pin a 0 for the
# rest of the run); within one batch a repeated pair is scored once anyway.
_CACHEABLE = frozenset({"math_verify", "unparsed", "gold_unparsed", "too_big"})
_GOLD_CACHE_SIZE = 4096

# ----------------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------
# Fast paths and pre-filters (no math-verify)
# ----------------------------------------------------------------------------------------------------------

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


def _prepare(response: Any, gold: Any) -> tuple[str | None, float | None, str, tuple[str, str] | None]:
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
        logger.debug("reward: _prepare failed", exc_info=True)
        return None, 0.0, "error", None


# ----------------------------------------------------------------------------------------------------------
# math-verify with a size guard, under a signal deadline
# ----------------------------------------------------------------------------------------------------------

_MV: dict[str, Any] = {}


class _MVWarningFilter(logging.Filter):
    """Drop math-verify's one-time 'Timeout is disabled' warning: we impose our own deadline."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _mv() -> dict[str, Any]:
    if not _MV:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_MVWarningFilter())
        _MV.update(
            parse=parse,
            verify=verify,
            gold_cfg=[LatexExtractionConfig(), ExprExtractionConfig()],
            ans_cfg=[LatexExtractionConfig(boxed_match_priority=0)],
        )
    return _MV


_BIG = float("inf")
_HUGE_FUNCS = frozenset(  # integer-valued functions whose value has ~n·log n bits (or more)
    "factorial factorial2 subfactorial gamma RisingFactorial FallingFactorial binomial catalan fibonacci "
    "lucas bell bernoulli euler harmonic primorial tribonacci".split()
)


def _log2_abs(n: int) -> float:
    return math.log2(abs(n)) if n else 0.0


def _log2_bound(e: Any, depth: int = 0) -> float:
    """Upper bound on log2|value| of the numbers SymPy may build while evaluating ``e`` (≈ bits needed).

    Symbols count as 1 bit, so ``x^{10^{100}}`` is as suspicious as ``2^{10^{100}}``. Exponents known to be
    below 2^60 are evaluated exactly (cheap by construction) so that e.g. ``2^{2^{2^{2^{2}}}}`` (65536 bits)
    is accepted while one more level is not.
    """
    if depth > 200:
        return _BIG
    from sympy import MatrixBase

    if isinstance(e, MatrixBase):
        return max((_log2_bound(x, depth + 1) for x in e), default=0.0)
    args = getattr(e, "args", None)
    if args is None:
        return 0.0
    if getattr(e, "is_Integer", False):
        return _log2_abs(int(e.p))
    if getattr(e, "is_Rational", False):
        return max(_log2_abs(int(e.p)), _log2_abs(int(e.q)))
    if getattr(e, "is_Float", False):
        mpf = e._mpf_
        return float(max(0, mpf[2] + mpf[3])) if mpf[1] else 0.0
    if not args:
        return 2.0  # symbols, pi, E, I, oo, ...
    if getattr(e, "is_Pow", False):
        lb = max(1.0, _log2_bound(args[0], depth + 1))
        x = args[1]
        if getattr(x, "is_Rational", False):  # b^(p/q) costs ~|p| times the bits of b (1/b, sqrt b: 1×)
            p = abs(int(x.p))
            return _BIG if p > 1 << 60 else lb * max(1, p)
        lx = _log2_bound(x, depth + 1)
        if lx > 60:
            return _BIG
        xv = 2.0**lx
        if getattr(x, "is_number", False):
            try:
                xv = min(xv, abs(complex(x.evalf(20))))
            except Exception:
                pass
        return lb * max(1.0, xv)
    sub = [_log2_bound(a, depth + 1) for a in args]
    if getattr(e, "is_Mul", False):
        return sum(sub)
    if getattr(e, "is_Add", False):
        return max(sub) + math.log2(len(sub))
    name = getattr(getattr(e, "func", None), "__name__", "")
    if name in _HUGE_FUNCS:  # f(n) has about n·log2(n) bits
        ln = max(sub)
        return _BIG if ln > 60 else 2.0**ln * max(1.0, ln)
    return max(sub) + 1.0


def _too_big(parsed: Sequence[Any]) -> bool:
    return any(not isinstance(x, str) and _log2_bound(x) > MAX_NUMBER_BITS for x in parsed)


_GOLD_CACHE: OrderedDict[str, tuple[list[Any], bool]] = OrderedDict()


def _parse_gold(gold: str) -> tuple[list[Any], bool]:
    hit = _GOLD_CACHE.get(gold)
    if hit is not None:
        _GOLD_CACHE.move_to_end(gold)
        return hit
    mv = _mv()
    parsed = mv["parse"]("\\boxed{" + gold + "}", extraction_config=mv["gold_cfg"], parsing_timeout=None)
    entry = (parsed, _too_big(parsed))
    if _DEADLINE["armed"] and _DEADLINE["fired"]:  # a library swallowed our interrupt: don't keep this parse
        raise _Deadline()
    _GOLD_CACHE[gold] = entry
    if len(_GOLD_CACHE) > _GOLD_CACHE_SIZE:
        _GOLD_CACHE.popitem(last=False)
    return entry


def _mv_equal(content: str, gold: str) -> tuple[bool, str]:
    """math-verify verdict for boxed ``content`` vs ``gold`` (no deadline: call via :func:`_verify_item`)."""
    mv = _mv()
    g, g_big = _parse_gold(gold)
    if not g:
        return False, "gold_unparsed"
    a = mv["parse"]("\\boxed{" + content + "}", extraction_config=mv["ans_cfg"], parsing_timeout=None)
    if not a:
        return False, "unparsed"
    if g_big or _too_big(a):
        return False, "too_big"
    return bool(mv["verify"](g, a, timeout_seconds=None)), "math_verify"


class _Deadline(BaseException):
    """Raised by our SIGALRM handler; a BaseException so library ``except Exception`` cannot eat it."""


# State of the (single, main-thread) in-process deadline. ``fired`` stays set once the signal has fired, so
# a result computed after some library swallowed the interrupt (bare ``except:``) is discarded as a timeout.
_DEADLINE = {"armed": False, "fired": False}


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _inside_import(frame: Any) -> bool:
    """Is the interrupted code executing a module import? Aborting an import half-way leaves a half-built
    module (and duplicate classes on re-import) behind, so the deadline never fires there."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _call_with_deadline(fn: Callable[[], Any], seconds: float) -> tuple[str, Any]:
    """Run ``fn()`` in the main thread under a SIGALRM deadline → ("ok", value) | ("timeout"|"error", None).

    Any previous SIGALRM handler and ITIMER_REAL timer are restored afterwards (remaining time adjusted).
    """
    state = _DEADLINE

    def _handler(signum, frame):
        if state["armed"]:
            state["fired"] = True
            if not _inside_import(frame):  # else: retry at the next re-fire, once the import has finished
                raise _Deadline()

    t0 = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, _handler)
    prev = (0.0, 0.0)
    state["armed"], state["fired"] = True, False
    try:
        try:
            prev = signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3), _REFIRE_S)
            value = fn()
        finally:
            state["armed"] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        return ("timeout", None) if state["fired"] else ("ok", value)
    except _Deadline:
        return "timeout", None
    except Exception:
        if state["fired"]:  # the interrupt surfaced as some other exception
            return "timeout", None
        logger.debug("reward: math-verify raised", exc_info=True)
        return "error", None
    finally:
        state["armed"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if prev[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, prev[0] - (time.monotonic() - t0)), prev[1])


def _reset_sympy_state() -> None:
    """After an asynchronous interrupt, make sure SymPy's global evaluate/distribute flags are back on."""
    try:
        from sympy.core.parameters import global_parameters

        global_parameters.evaluate = True
        global_parameters.distribute = True
    except Exception:  # pragma: no cover
        pass


_WARMUP = (
    ("1", "2"),
    ("\\frac{1}{2}", "0.5"),
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("x^{2}+2x+1", "(x+1)^2"),
    ("\\{1,2\\}", "(1,2)"),
    ("x^2 = 4", "x=2"),
    ("[1, 2)", "(1,2]"),
)
_WARMED = False


def warmup() -> None:
    """Run math-verify once over typical shapes with NO deadline, so that SymPy's and math-verify's lazy
    imports and one-time set-up never run under (and get cut by) an interrupt: an import aborted half-way can
    leave duplicate classes behind and silently turn later verdicts into False. Once per process."""
    global _WARMED
    if _WARMED:
        return
    _WARMED = True
    for content, gold in _WARMUP:
        try:
            _mv_equal(content, gold)
        except Exception:  # pragma: no cover
            logger.debug("reward: warm-up item failed", exc_info=True)


def _verify_item(content: str, gold: str, soft_s: float) -> tuple[bool, str]:
    """math-verify verdict under the soft deadline. Main thread only. Never raises."""
    if not _WARMED:
        warmup()
    try:
        status, value = _call_with_deadline(lambda: _mv_equal(content, gold), soft_s)
    except BaseException as exc:  # a late _Deadline or anything else: never propagate
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        status, value = "error", None
    if status == "ok":
        return value
    if status == "timeout":
        _reset_sympy_state()
    return False, status


# ----------------------------------------------------------------------------------------------------------
# Worker subprocesses
# ----------------------------------------------------------------------------------------------------------


def _set_cpu_backstop(seconds: float) -> None:
    """Let the kernel kill this worker (SIGXCPU) if one item burns ``seconds`` of CPU — covers the case where
    the parent died and can no longer kill a worker stuck in C code."""
    try:
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + seconds) + 1
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except Exception:  # pragma: no cover - best effort
        pass


def _worker_entry() -> None:
    """Main of a worker subprocess: ``python -c ... <read_fd> <write_fd> <soft_s> <cpu_backstop_s>``."""
    rfd, wfd, soft_s, backstop_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it closes us
    try:  # the CPU backstop (SIGXCPU) must not leave core files behind
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except Exception:  # pragma: no cover
        pass
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rconn, wconn = Connection(rfd, writable=False), Connection(wfd, readable=False)
    # Test-only hook: boxed content equal to this value blocks SIGALRM and sleeps, imitating a hang in C code
    # that no signal can interrupt, so the tests can exercise the parent's kill-and-replace path.
    hang_for_tests = os.environ.get("HACPO_REWARD_HANG_FOR_TESTS") or None
    warmup()
    try:
        wconn.send(("ready", os.getpid()))
    except OSError:  # parent already gone
        return
    while True:
        try:
            chunk = rconn.recv()
        except (EOFError, OSError):
            break
        if chunk is None:
            break
        for idx, content, gold in chunk:
            _set_cpu_backstop(backstop_s)
            if content == hang_for_tests:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(3600)
            ok, method = _verify_item(content, gold, soft_s)
            try:
                wconn.send((idx, ok, method))
            except (BrokenPipeError, OSError):
                return


class _Worker:
    __slots__ = ("proc", "rconn", "wconn", "ready", "inflight", "item_t0", "started")

    def __init__(self, proc: subprocess.Popen, rconn: Connection, wconn: Connection):
        self.proc, self.rconn, self.wconn = proc, rconn, wconn
        self.ready = False
        self.inflight: deque[int] = deque()
        self.item_t0 = 0.0
        self.started = time.monotonic()


_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER_CODE = (
    f"import sys; sys.path.insert(0, {_PKG_ROOT!r}); from hacpo.reward import _worker_entry; _worker_entry()"
)
_LIVE_POOLS: weakref.WeakSet[_Pool] = weakref.WeakSet()


class _Pool:
    """N worker subprocesses; per-item hard deadline with kill-and-replace. Not thread-safe (Scorer locks)."""

    def __init__(self, workers: int, timeout_s: float, soft_s: float):
        self.timeout_s, self.soft_s = timeout_s, soft_s
        self.kills = 0
        self.crashes = 0
        self._start_failures = 0
        self._workers: list[_Worker] = []
        self._closed = False
        _LIVE_POOLS.add(self)
        for _ in range(workers):
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        try:
            backstop = max(10.0, 5.0 * self.timeout_s)
            argv = [sys.executable, "-c", _WORKER_CODE, str(p2c_r), str(c2p_w)]
            argv += [repr(self.soft_s), repr(backstop)]
            proc = subprocess.Popen(
                argv,
                pass_fds=(p2c_r, c2p_w),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
                os.close(fd)
            raise
        os.close(p2c_r)
        os.close(c2p_w)
        return _Worker(proc, Connection(c2p_r, writable=False), Connection(p2c_w, readable=False))

    def _discard(self, w: _Worker) -> None:
        for conn in (w.rconn, w.wconn):
            try:
                conn.close()
            except OSError:
                pass
        if w.proc.poll() is None:
            try:
                w.proc.kill()
            except OSError:  # pragma: no cover
                pass
        try:
            w.proc.wait(timeout=5)
        except Exception:  # pragma: no cover
            pass

    def _replace(self, w: _Worker) -> None:
        self._discard(w)
        self._workers[self._workers.index(w)] = self._spawn()

    def _fail_worker(self, w: _Worker, results: list, queue: deque[int], method: str, crashes: dict) -> int:
        """Worker died or overran: it is replaced and the rest of its chunk requeued. An overrun item
        scores 0; a crashed one is retried once on a fresh worker (the crash may not be its fault)."""
        done = 0
        if not w.ready:
            self._start_failures += 1
            if self._start_failures > 3:
                raise RuntimeError("hacpo.reward: worker processes keep failing to start")
        elif w.inflight:
            idx = w.inflight.popleft()
            queue.extendleft(reversed(w.inflight))
            w.inflight.clear()
            crashes[idx] = crashes.get(idx, 0) + (method == "crashed")
            if method == "crashed" and crashes[idx] < 2:
                queue.appendleft(idx)
            else:
                results[idx] = (False, method)
                done = 1
        self._replace(w)
        return done

    def run(self, tasks: Sequence[tuple[str, str]]) -> list[tuple[bool, str]]:
        if self._closed:
            raise RuntimeError("hacpo.reward: pool is closed")
        results: list[Any] = [None] * len(tasks)
        # Same-gold items travel together, so each worker's gold-parse cache is hit instead of re-parsing.
        queue: deque[int] = deque(sorted(range(len(tasks)), key=lambda i: tasks[i][1]))
        remaining = len(tasks)
        crashes: dict[int, int] = {}
        try:
            while remaining:
                now = time.monotonic()
                idle = [w for w in self._workers if w.ready and not w.inflight]
                for w in idle:
                    if not queue:
                        break
                    size = max(1, min(_MAX_CHUNK, len(queue) // (2 * len(self._workers))))
                    chunk = [queue.popleft() for _ in range(min(size, len(queue)))]
                    w.inflight.extend(chunk)
                    w.item_t0 = now
                    try:
                        w.wconn.send([(i, *tasks[i]) for i in chunk])
                    except OSError:
                        w.inflight.clear()
                        queue.extendleft(reversed(chunk))
                        self.crashes += 1
                        self._fail_worker(w, results, queue, "crashed", crashes)
                waits = [w.item_t0 + self.timeout_s - now for w in self._workers if w.inflight]
                waits += [w.started + _WORKER_START_TIMEOUT_S - now for w in self._workers if not w.ready]
                by_conn = {w.rconn: w for w in self._workers}
                for conn in _conn_wait(list(by_conn), timeout=max(0.0, min(waits, default=1.0))):
                    w = by_conn[conn]
                    try:
                        while conn.poll():
                            msg = conn.recv()
                            if msg[0] == "ready":
                                w.ready = True
                                self._start_failures = 0
                                continue
                            idx, ok, method = msg
                            if w.inflight and w.inflight[0] == idx:
                                w.inflight.popleft()
                                results[idx] = (ok, method)
                                remaining -= 1
                            w.item_t0 = time.monotonic()
                    except (EOFError, OSError):
                        self.crashes += 1
                        remaining -= self._fail_worker(w, results, queue, "crashed", crashes)
                now = time.monotonic()
                for w in list(self._workers):
                    if w.inflight and now - w.item_t0 > self.timeout_s:
                        self.kills += 1
                        logger.warning(
                            "hacpo.reward: item exceeded %.1fs; worker %d killed", self.timeout_s, w.proc.pid
                        )
                        remaining -= self._fail_worker(w, results, queue, "killed", crashes)
                    elif not w.ready and now - w.started > _WORKER_START_TIMEOUT_S:
                        self._fail_worker(w, results, queue, "start_timeout", crashes)
        except BaseException:
            # Interrupted mid-batch (e.g. KeyboardInterrupt): busy workers would answer into the next batch.
            for w in list(self._workers):
                if w.inflight:
                    w.inflight.clear()
                    try:
                        self._replace(w)
                    except Exception:  # pragma: no cover
                        pass
            raise
        return results

    def wait_ready(self, timeout: float) -> bool:
        """Block until every worker has started (or ``timeout`` s passed); True if all are ready."""
        deadline = time.monotonic() + timeout
        while True:
            starting = {w.rconn: w for w in self._workers if not w.ready}
            left = deadline - time.monotonic()
            if not starting or left <= 0:
                return not starting
            for conn in _conn_wait(list(starting), timeout=left):
                w = starting[conn]
                try:
                    while conn.poll():
                        if conn.recv()[0] == "ready":
                            w.ready = True
                            self._start_failures = 0
                except (EOFError, OSError):
                    self._fail_worker(w, [], deque(), "crashed", {})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.wconn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._discard(w)
        self._workers.clear()


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception:  # pragma: no cover
            pass


# ----------------------------------------------------------------------------------------------------------
# Public batch API
# ----------------------------------------------------------------------------------------------------------


class Scorer:
    """Batch scorer. ``workers=0``: in-process (main thread; from another thread a private 1-worker pool is
    used automatically). ``workers>=1``: that many worker subprocesses, started in the constructor.

    ``timeout_s`` is the per-item wall-time budget: the signal deadline is ``0.75*timeout_s`` and pool workers
    are killed after ``timeout_s``. ``cache_size`` bounds an LRU of (boxed content, gold) → verdict for items
    that needed math-verify (0 disables it). Thread-safe (calls are serialised). Use as a context manager or
    call :meth:`close`; pools left open are closed at interpreter exit.
    """

    def __init__(self, workers: int = 0, timeout_s: float = 2.0, cache_size: int = _DEFAULT_CACHE):
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.soft_s = _SOFT_FRACTION * self.timeout_s
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[tuple[str, str], tuple[bool, str]] = OrderedDict()
        self._lock = threading.RLock()
        self._pool: _Pool | None = _Pool(workers, self.timeout_s, self.soft_s) if workers > 0 else None
        self._fallback: _Pool | None = None
        self._closed = False
        self.stats: dict[str, int] = {}

    # -- context manager ---------------------------------------------------------------------------------
    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for pool in (self._pool, self._fallback):
                if pool is not None:
                    pool.close()
            self._pool = self._fallback = None

    def __del__(self) -> None:  # best effort; atexit covers the rest
        try:
            for pool in (self._pool, self._fallback):
                if pool is not None:
                    pool.close()
        except Exception:
            pass

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until the pool's workers have started and warmed up (``workers=0`` in the main thread: warm
        math-verify up in this process). Optional: a first batch otherwise waits for the same thing. Returns
        True if all workers are ready within ``timeout`` seconds."""
        with self._lock:
            if self._pool is not None:
                return self._pool.wait_ready(timeout)
            if _in_main_thread():
                warmup()
            return True

    @property
    def pool_kills(self) -> int:
        """Items that overran ``timeout_s`` in a worker (worker killed and replaced)."""
        return sum(p.kills for p in (self._pool, self._fallback) if p is not None)

    # -- scoring -----------------------------------------------------------------------------------------
    def score(self, responses: Sequence[Any], golds: Sequence[Any]) -> list[float]:
        """0/1 reward per (response, gold) pair."""
        return [1.0 if d["correct"] else 0.0 for d in self.score_detailed(responses, golds)]

    def score_detailed(self, responses: Sequence[Any], golds: Sequence[Any]) -> list[dict[str, Any]]:
        """Per item ``{"extracted": str | None, "correct": bool, "method": str}`` (for evaluation audits).

        ``method`` says how the verdict was reached: ``no_box``, ``exact``, ``int``, ``math_verify``,
        ``too_long``, ``too_nested``, ``too_big``, ``timeout``, ``killed``, ``unparsed``, ...
        """
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        with self._lock:
            if self._closed:
                raise RuntimeError("Scorer is closed")
            out: list[dict[str, Any]] = []
            todo: dict[tuple[str, str], list[int]] = {}
            for i, (r, g) in enumerate(zip(responses, golds, strict=True)):
                extracted, decided, method, key = _prepare(r, g)
                out.append({"extracted": extracted, "correct": bool(decided), "method": method})
                if key is None:
                    self._count(method)
                    continue
                hit = self._cache.get(key) if self.cache_size > 0 else None
                if hit is not None:
                    self._cache.move_to_end(key)
                    out[i]["correct"], out[i]["method"] = hit
                    self._count("cache")
                    continue
                todo.setdefault(key, []).append(i)
            if todo:
                keys = list(todo)
                for key, (ok, method) in zip(keys, self._resolve(keys), strict=True):
                    self._count(method)
                    for i in todo[key]:
                        out[i]["correct"], out[i]["method"] = bool(ok), method
                    if self.cache_size > 0 and method in _CACHEABLE:
                        self._cache[key] = (bool(ok), method)
                        if len(self._cache) > self.cache_size:
                            self._cache.popitem(last=False)
            return out

    def _count(self, method: str) -> None:
        self.stats[method] = self.stats.get(method, 0) + 1

    def _resolve(self, keys: list[tuple[str, str]]) -> list[tuple[bool, str]]:
        if self._pool is not None:
            return self._pool.run(keys)
        if _in_main_thread():
            return [_verify_item(c, g, self.soft_s) for c, g in keys]
        if self._fallback is None:
            self._fallback = _Pool(1, self.timeout_s, self.soft_s)
        return self._fallback.run(keys)


_SHARED: dict[int, Scorer] = {}
_SHARED_LOCK = threading.Lock()


def _shared_scorer(workers: int) -> Scorer:
    with _SHARED_LOCK:
        s = _SHARED.get(workers)
        if s is None or s._closed:
            s = _SHARED[workers] = Scorer(workers=workers)
        return s


def score_detailed(response: Any, gold: Any) -> dict[str, Any]:
    """``{"extracted": last boxed string or None, "correct": bool, "method": str}``. Never raises."""
    try:
        return _shared_scorer(0).score_detailed([response], [gold])[0]
    except Exception:
        logger.warning("hacpo.reward: scoring failed", exc_info=True)
        return {"extracted": None, "correct": False, "method": "error"}


def score_one(response: Any, gold: Any) -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` equals ``gold`` per math-verify, else 0.0. Never raises.

    Uses a process-wide in-process scorer (with its cache) from the main thread, and a process-wide
    1-worker pool from other threads.
    """
    return 1.0 if score_detailed(response, gold)["correct"] else 0.0


def score_batch(responses: Sequence[Any], golds: Sequence[Any], workers: int = 0) -> list[float]:
    """Convenience: score a batch with a process-wide shared :class:`Scorer` for ``workers``."""
    return _shared_scorer(workers).score(responses, golds)
