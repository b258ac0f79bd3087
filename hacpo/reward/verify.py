"""math-verify with a size guard, under one signal deadline per item (pipeline step 3 and the
"Timeouts" section of :mod:`hacpo.reward`)."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .limits import _GOLD_CACHE_SIZE, _REFIRE_S, MAX_NUMBER_BITS

logger = logging.getLogger("hacpo.reward")

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
    """math-verify verdict for boxed ``content`` vs ``gold`` (no deadline: call via :func:`verify_item`)."""
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


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_REPORTING = ("traceback.py", "linecache.py")  # formatting an error report (an unraisable hook's work)


def _unsafe_to_interrupt(frame: Any) -> bool:
    """Is the interrupted code where the deadline must not be raised? There it waits for its next re-fire:
    - a module import: aborted half-way it leaves a half-built module (and duplicate classes on re-import);
    - a finalizer (``__del__``, run by the garbage collector inside any code): Python swallows an exception
      raised there ("Exception ignored in"), and hands it to ``sys.unraisablehook``;
    - a traceback being formatted (that hook's work): the re-fire would break the report itself."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib") or code.co_name == "__del__":
            return True
        if code.co_filename.endswith(_REPORTING):
            return True
        frame = frame.f_back
    return False


def call_with_deadline(fn: Callable[[], Any], seconds: float) -> tuple[str, Any]:
    """Run ``fn()`` in the main thread under a SIGALRM deadline → ("ok", value) | ("timeout"|"error", None).

    Any previous SIGALRM handler and ITIMER_REAL timer are restored afterwards (remaining time adjusted).
    """
    state = _DEADLINE

    def _handler(signum, frame):
        if state["armed"]:
            state["fired"] = True
            if not _unsafe_to_interrupt(frame):  # else: retry at the next re-fire, once out of there
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


def verify_item(content: str, gold: str, soft_s: float) -> tuple[bool, str]:
    """math-verify verdict under the soft deadline. Main thread only. Never raises."""
    if not _WARMED:
        warmup()
    try:
        status, value = call_with_deadline(lambda: _mv_equal(content, gold), soft_s)
    except BaseException as exc:  # a late _Deadline or anything else: never propagate
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        status, value = "error", None
    if status == "ok":
        return value
    if status == "timeout":
        _reset_sympy_state()
    return False, status
