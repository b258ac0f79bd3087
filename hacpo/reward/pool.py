"""Worker subprocesses: fresh interpreters that score math-verify items under a soft deadline, killed and
replaced by the parent past the hard one (the "Timeouts" section of :mod:`hacpo.reward`)."""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _conn_wait
from typing import Any

from .limits import _MAX_CHUNK, _WORKER_START_TIMEOUT_S
from .verify import verify_item, warmup

logger = logging.getLogger("hacpo.reward")


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


def math_verify_job(soft_s: float):
    """The default job: one math-verify verdict ``(correct, method)`` per ``(boxed content, gold)`` item."""
    # Test-only hook: boxed content equal to this value blocks SIGALRM and sleeps, imitating a hang in C code
    # that no signal can interrupt, so the tests can exercise the parent's kill-and-replace path.
    hang_for_tests = os.environ.get("HACPO_REWARD_HANG_FOR_TESTS") or None
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warmup()

    def job(content: str, gold: str) -> tuple[bool, str]:
        if content == hang_for_tests:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return verify_item(content, gold, soft_s)

    return job


def worker_entry() -> None:
    """Main of a worker subprocess: ``python -c ... <read_fd> <write_fd> <cpu_backstop_s> <job> <arg>``.

    ``job`` is ``module:factory``; ``factory(json.loads(arg))`` sets the worker up (imports, warm-up) and
    returns the function each item's arguments are passed to; its result tuple goes back to the parent."""
    rfd, wfd, backstop_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    module, _, factory = sys.argv[4].partition(":")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it closes us
    try:  # the CPU backstop (SIGXCPU) must not leave core files behind
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except Exception:  # pragma: no cover
        pass
    rconn, wconn = Connection(rfd, writable=False), Connection(wfd, readable=False)
    job = getattr(importlib.import_module(module), factory)(json.loads(sys.argv[5]))
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
        for idx, *args in chunk:
            _set_cpu_backstop(backstop_s)
            result = job(*args)
            try:
                wconn.send((idx, result))
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


_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORKER_CODE = (
    f"import sys; sys.path.insert(0, {_PKG_ROOT!r}); "
    "from hacpo.reward.pool import worker_entry; worker_entry()"
)
_LIVE_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


class Pool:
    """N worker subprocesses; per-item hard deadline with kill-and-replace. Not thread-safe (Scorer locks).

    With ``spares`` > 0, a worker whose item has run past ``stall_s`` no longer counts as serving the queue:
    a spare worker starts beside it (up to ``spares`` at once), so items queued behind a hanging one are
    scored meanwhile, and k hanging items cost about one deadline in parallel, not k in turn. Spares are
    discarded once the call is over."""

    def __init__(self, workers: int, timeout_s: float, soft_s: float, job: tuple[str, object] | None = None,
                 spares: int = 0, stall_s: float = 1.0):  # fmt: skip
        """``job``: ``("module:factory", json-able argument)`` run by each worker (:func:`worker_entry`);
        default math-verify under the soft deadline ``soft_s``."""
        self.timeout_s, self.soft_s = timeout_s, soft_s
        self.size, self.spares, self.stall_s = workers, spares, stall_s
        self.job = job or ("hacpo.reward.pool:math_verify_job", soft_s)
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
            argv = [sys.executable, "-c", _WORKER_CODE, str(p2c_r), str(c2p_w), repr(backstop)]
            argv += [self.job[0], json.dumps(self.job[1])]
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
        """A fresh worker in ``w``'s place; a spare (the pool above its size) is only discarded."""
        self._discard(w)
        if len(self._workers) > self.size:
            self._workers.remove(w)
        else:
            self._workers[self._workers.index(w)] = self._spawn()

    def _add_spares(self, queue: deque[int], now: float) -> None:
        """Start a spare for each stalled worker while items wait (at most ``spares`` beyond the size). A
        worker running on a CPU is slow, not stalled: a spare beside it would only slow it further."""
        if not (self.spares and queue):
            return
        stalled = sum(1 for w in self._workers
                      if w.inflight and now - w.item_t0 > self.stall_s and not _running(w))  # fmt: skip
        serving = len(self._workers) - stalled
        while serving < self.size and len(self._workers) < self.size + self.spares:
            self._workers.append(self._spawn())
            serving += 1

    def _trim_spares(self) -> None:
        """After a call: idle workers beyond the pool's size are discarded."""
        for w in [w for w in self._workers if not w.inflight][: max(0, len(self._workers) - self.size)]:
            self._discard(w)
            self._workers.remove(w)

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

    def run(self, tasks: Sequence[tuple], budget_s: float | None = None, then_s: float | None = None
            ) -> list[tuple]:  # fmt: skip
        """Each task's result: the job's tuple, or ``(False, "killed" | "crashed")`` for an item that overran
        ``timeout_s`` or crashed its worker twice. ``budget_s``: the call's wall time under ``timeout_s``;
        once it is spent, each item still running or queued gets ``then_s`` of its own, counted from its
        start (``(False, "spent")`` past it), or, with ``then_s=None``, ``(False, "budget")`` at once (their
        busy workers are replaced)."""
        if self._closed:
            raise RuntimeError("hacpo.reward: pool is closed")
        t_start = time.monotonic()
        results: list[Any] = [None] * len(tasks)
        # Same-gold items travel together, so each worker's gold-parse cache is hit instead of re-parsing.
        queue: deque[int] = deque(sorted(range(len(tasks)), key=lambda i: str(tasks[i][1])))
        remaining = len(tasks)
        crashes: dict[int, int] = {}
        deadline, overrun = self.timeout_s, "killed"
        try:
            while remaining:
                now = time.monotonic()
                if budget_s is not None and now - t_start >= budget_s:
                    if then_s is None:
                        self._spend(results, queue)
                        break
                    budget_s, deadline, overrun = None, min(then_s, self.timeout_s), "spent"
                idle = [w for w in self._workers if w.ready and not w.inflight]
                for w in idle:
                    if not queue:
                        break
                    # one item a send where hanging items are expected (spares): none waits behind another
                    size = (
                        1 if self.spares else max(1, min(_MAX_CHUNK, len(queue) // (2 * len(self._workers))))
                    )
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
                self._add_spares(queue, now)
                waits = [w.item_t0 + deadline - now for w in self._workers if w.inflight]
                if self.spares and queue:  # wake when an item starts to stall: a spare may be due
                    waits += [w.item_t0 + self.stall_s - now for w in self._workers
                              if w.inflight and now - w.item_t0 <= self.stall_s]  # fmt: skip
                if budget_s is not None:
                    waits.append(t_start + budget_s - now)
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
                            idx, result = msg
                            if w.inflight and w.inflight[0] == idx:
                                w.inflight.popleft()
                                results[idx] = result
                                remaining -= 1
                            w.item_t0 = time.monotonic()
                    except (EOFError, OSError):
                        self.crashes += 1
                        remaining -= self._fail_worker(w, results, queue, "crashed", crashes)
                now = time.monotonic()
                for w in list(self._workers):
                    if w.inflight and now - w.item_t0 > deadline:
                        self.kills += 1
                        logger.warning(
                            "hacpo.reward: item exceeded %.1fs; worker %d killed", deadline, w.proc.pid
                        )
                        remaining -= self._fail_worker(w, results, queue, overrun, crashes)
                    elif not w.ready and now - w.started > _WORKER_START_TIMEOUT_S:
                        self._fail_worker(w, results, queue, "start_timeout", crashes)
        except BaseException:
            # Interrupted mid-batch (e.g. KeyboardInterrupt): busy workers would answer into the next batch.
            self._replace_busy(best_effort=True)
            raise
        self._trim_spares()
        return results

    def _replace_busy(self, best_effort: bool = False) -> list[int]:
        """Replace every worker with items in flight (their answers would otherwise arrive in the next call);
        returns those items. ``best_effort``: a failing replacement is ignored (the call is being aborted)."""
        dropped = []
        for w in list(self._workers):
            if w.inflight:
                dropped += w.inflight
                w.inflight.clear()
                try:
                    self._replace(w)
                except Exception:  # pragma: no cover
                    if not best_effort:
                        raise
        return dropped

    def _spend(self, results: list, queue: deque[int]) -> None:
        """The budget is spent: each unfinished item, in flight or queued, gets ``(False, "budget")``."""
        for idx in [*self._replace_busy(), *queue]:
            results[idx] = (False, "budget")
        queue.clear()

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


def _running(w: _Worker) -> bool:
    """True when the worker's process is on (or waiting for) a CPU, state R: a slow item, not one waiting
    on something. Linux's /proc; False elsewhere (every stalled worker then gets a spare)."""
    try:
        with open(f"/proc/{w.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception:  # pragma: no cover
            pass
