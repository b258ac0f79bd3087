"""Verifiable rewards: the last ``\\boxed{...}`` of a response vs the gold answer, judged by math-verify or
the paper's exact match (:mod:`.hendrycks`), or by a verifier of your own (:mod:`.custom`).

Used both as the RL training reward and for benchmark scoring, so it must be correct, fast and *bounded*:
no input (megabyte strings, exponent towers, 5000-deep nesting, null bytes ...) may take more than about
``timeout_s`` (default 2 s) of wall time per item, and nothing here raises on bad input.

Modules: :mod:`~hacpo.reward.extract` (step 1), :mod:`~hacpo.reward.fastpath` (step 2),
:mod:`~hacpo.reward.verify` (step 3, deadline), :mod:`~hacpo.reward.pool` (worker processes),
:mod:`~hacpo.reward.scorer` (the batch API), :mod:`~hacpo.reward.limits`.

Public API
----------
- :func:`extract_boxed` — content of the last ``\\boxed{}``/``\\fbox{}``, linear time.
- :func:`score_one` / :func:`score_detailed` — one item (never raise).
- :class:`Scorer` / :func:`score_batch` — batches, in-process (``workers=0``) or in a process pool.
- :data:`REWARDS` — the reward choices of :class:`Scorer` (``reward=``): ``math_verify`` (default, the
  pipeline below) or ``hendrycks``, the authors' as-released verl reward (Hendrycks-MATH normalisation +
  exact string match, :mod:`~hacpo.reward.hendrycks`; one item: :func:`hendrycks_score`).

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

Workers are fresh interpreters (``python -c`` running :func:`~hacpo.reward.pool.worker_entry`, talking
pickled messages over two pipes) rather than ``multiprocessing`` processes: ``spawn`` and ``forkserver``
both re-import the parent's ``__main__`` in every child (≈1.1 s per worker when the trainer's main imports
torch, measured), whereas a bare interpreter with math-verify is ready in ≈0.35 s, does not inherit
CUDA/torch state, and is cheap to replace after a kill. Fast-path items and cache hits never reach the pool;
identical (content, gold) pairs within a batch are scored once.
"""

from __future__ import annotations

from .custom import CustomReward, RewardRangeError, VerifierError
from .extract import extract_boxed
from .hendrycks import hendrycks_score
from .limits import MAX_ANSWER_CHARS, MAX_NESTING, MAX_NUMBER_BITS
from .scorer import REWARDS, Scorer, score_batch, score_detailed, score_one
from .verify import warmup

__all__ = [
    "CustomReward",
    "RewardRangeError",
    "VerifierError",
    "MAX_ANSWER_CHARS",
    "MAX_NESTING",
    "MAX_NUMBER_BITS",
    "REWARDS",
    "Scorer",
    "extract_boxed",
    "hendrycks_score",
    "score_batch",
    "score_detailed",
    "score_one",
    "warmup",
]
