"""The batch API: :class:`Scorer` (in-process or pooled, cached) and the one-item helpers."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .custom import CustomReward, VerifierRunner, is_correct
from .fastpath import prepare
from .hendrycks import hendrycks_detailed
from .limits import _CACHEABLE, _DEFAULT_CACHE, _SOFT_FRACTION
from .pool import Pool
from .verify import in_main_thread, verify_item, warmup

logger = logging.getLogger("hacpo.reward")

REWARDS = ("math_verify", "hendrycks")
"""Reward choices of :class:`Scorer`: ``math_verify`` (default; see :mod:`hacpo.reward`) or ``hendrycks``
(the authors' as-released verl reward: Hendrycks normalisation + exact string match,
:mod:`~hacpo.reward.hendrycks`)."""


MATH_VERIFY_TIMEOUT_S = 2.0  # one math-verify item
VERIFIER_TIMEOUT_S = 30.0  # one call of a custom verifier (a batch, or one item on retry)


class Scorer:
    """Batch scorer. ``workers=0``: in-process (main thread; from another thread a private 1-worker pool is
    used automatically). ``workers>=1``: that many worker subprocesses, started in the constructor.

    ``timeout_s`` is the per-item wall-time budget (default :data:`MATH_VERIFY_TIMEOUT_S`): the signal
    deadline is ``0.75*timeout_s`` and pool workers are killed after ``timeout_s``; for a custom verifier, the
    deadline of one call (default :data:`VERIFIER_TIMEOUT_S`). ``cache_size`` bounds an LRU of (boxed content,
    gold) → verdict for items that needed math-verify (0 disables it). Thread-safe (calls are serialised). Use
    as a context manager or call :meth:`close`; pools left open are closed at interpreter exit.

    ``reward`` (one of :data:`REWARDS`): ``"hendrycks"`` scores with
    :func:`~hacpo.reward.hendrycks.hendrycks_score` in the calling process (pure string code: no pool is
    started whatever ``workers`` says, no deadline, no cache). A :class:`~hacpo.reward.custom.CustomReward`
    (or its dict) runs that verifier in ``max(1, workers)`` processes under ``timeout_s``
    (:mod:`hacpo.reward.custom`): rewards are its numbers, and :meth:`score` passes it each item's metadata;
    ``retry_budget_s`` bounds a step's time on failed calls, first tries and retries (default two deadlines).
    """

    def __init__(
        self,
        workers: int = 0,
        timeout_s: float | None = None,
        cache_size: int = _DEFAULT_CACHE,
        *,
        reward: str | CustomReward | dict = "math_verify",
        retry_budget_s: float | None = None,
    ):
        if isinstance(reward, dict):
            reward = CustomReward(**reward)
        custom = isinstance(reward, CustomReward)
        if not custom and reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}; got {reward!r}")
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        if timeout_s is None:
            timeout_s = VERIFIER_TIMEOUT_S if custom else MATH_VERIFY_TIMEOUT_S
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.verifier = (
            VerifierRunner(reward, workers, float(timeout_s), retry_budget_s) if custom else None
        )
        self.workers = workers
        self.reward = reward
        self.timeout_s = float(timeout_s)
        self.soft_s = _SOFT_FRACTION * self.timeout_s
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[tuple[str, str], tuple[bool, str]] = OrderedDict()
        self._lock = threading.RLock()
        use_pool = workers > 0 and reward == "math_verify"  # a custom verifier has its own
        self._pool: Pool | None = Pool(workers, self.timeout_s, self.soft_s) if use_pool else None
        self._fallback: Pool | None = None
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
            self._close_pools()
            self._pool = self._fallback = None

    def _close_pools(self) -> None:
        for pool in (self._pool, self._fallback, *(self.verifier.pools if self.verifier else ())):
            if pool is not None:
                pool.close()

    def __del__(self) -> None:  # best effort; atexit covers the rest
        try:
            self._close_pools()
        except Exception:
            pass

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until the pool's workers have started and warmed up (``workers=0`` in the main thread: warm
        math-verify up in this process). Optional: a first batch otherwise waits for the same thing. Returns
        True if all workers are ready within ``timeout`` seconds."""
        with self._lock:
            if self.verifier is not None:
                return self.verifier.pool.wait_ready(timeout)
            if self._pool is not None:
                return self._pool.wait_ready(timeout)
            if self.reward == "hendrycks":
                return True
            if in_main_thread():
                warmup()
            return True

    @property
    def pool_kills(self) -> int:
        """Items that overran ``timeout_s`` in a worker (worker killed and replaced)."""
        return sum(p.kills for p in (self._pool, self._fallback) if p is not None)

    # -- scoring -----------------------------------------------------------------------------------------
    def score(
        self,
        responses: Sequence[Any],
        golds: Sequence[Any],
        metadata: Sequence[dict] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[float]:
        """Reward per (response, gold) pair: 0/1, or a custom verifier's numbers (which alone reads each
        item's ``metadata``; ``ids`` name the items its failures are logged with)."""
        if self.verifier is not None:
            with self._lock:
                if self._closed:
                    raise RuntimeError("Scorer is closed")
                return self.verifier.score(responses, golds, metadata, ids)
        return [1.0 if d["correct"] else 0.0 for d in self.score_detailed(responses, golds)]

    def new_step(self) -> None:
        """A step (or a validation) begins: a custom verifier's retry budget is whole again."""
        if self.verifier is not None:
            self.verifier.new_step()

    def take_verifier_counts(self) -> dict[str, float]:
        """A custom verifier's counts since the last call (``verifier/<name>`` metrics); {} otherwise."""
        if self.verifier is None:
            return {}
        return {f"verifier/{k}": v for k, v in self.verifier.take_counts().items()}

    @property
    def verifier_failed(self) -> int:
        """Items a custom verifier failed on (scored 0) so far; 0 for the built-in rewards."""
        return self.verifier.failed if self.verifier is not None else 0

    def score_detailed(
        self,
        responses: Sequence[Any],
        golds: Sequence[Any],
        metadata: Sequence[dict] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Per item ``{"extracted": str | None, "correct": bool, "method": str}`` (for evaluation audits).
        ``metadata`` and ``ids``: as in :meth:`score` (a custom verifier's alone).

        ``method`` says how the verdict was reached: ``no_box``, ``exact``, ``int``, ``math_verify``,
        ``too_long``, ``too_nested``, ``too_big``, ``timeout``, ``killed``, ``unparsed``, ... With
        ``reward="hendrycks"``: ``hendrycks``, ``hendrycks_raw``, ``no_box``, ``bad_input``.
        """
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        if self.verifier is not None:
            values = self.score(responses, golds, metadata, ids)
            return [
                {"extracted": None, "correct": is_correct(v), "method": "verifier", "reward": v}
                for v in values
            ]
        with self._lock:
            if self._closed:
                raise RuntimeError("Scorer is closed")
            if self.reward == "hendrycks":
                verdicts = [hendrycks_detailed(r, g) for r, g in zip(responses, golds, strict=True)]
                for d in verdicts:
                    self._count(d["method"])
                return verdicts
            out: list[dict[str, Any]] = []
            todo: dict[tuple[str, str], list[int]] = {}
            for i, (r, g) in enumerate(zip(responses, golds, strict=True)):
                extracted, decided, method, key = prepare(r, g)
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
        if in_main_thread():
            return [verify_item(c, g, self.soft_s) for c, g in keys]
        if self._fallback is None:
            self._fallback = Pool(1, self.timeout_s, self.soft_s)
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
