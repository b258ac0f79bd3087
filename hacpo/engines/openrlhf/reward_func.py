"""The training reward inside OpenRLHF: the file passed as ``--reward.remote_url``.

OpenRLHF loads this file by path in every vLLM rollout actor (``SingleTurnAgentExecutor``) and calls
``reward_func([query], [prompt], [label])`` once per sample from a worker thread (``asyncio.to_thread``), many
at a time. ``query`` is prompt + response decoded with the special tokens kept, ``prompt`` the templated
prompt text of the prompt file, ``label`` the gold answer.

Three promises, each tested against OpenRLHF's own loader and executor:

- **the local engine's reward**: the response is the query after the prompt, with trailing end-of-sequence
  markers dropped (the local engine stops at EOS), scored by :class:`hacpo.reward.Scorer` (last ``\\boxed{}``,
  math-verify; or the run's ``reward: hendrycks``, the released code's exact match, or a verifier of your own
  (:mod:`hacpo.reward.custom`, as JSON), from ``HACPO_REWARD``; such a verifier's labels carry each record's
  answer, metadata and id, :func:`hacpo.reward.custom.encode_label`);
- **bounded**: math-verify's signal deadlines do not work in threads, so items are verified in worker
  processes (``HACPO_REWARD_WORKERS``, default 2 per rollout actor) that are killed after ``timeout_s``;
- **total**: OpenRLHF swallows a raising reward function and fails much later in unrelated code, so every
  failure scores 0 and is counted in ``extra_logs["reward_error"]``;
- **concurrent calls scored together**: a call waits a few milliseconds for the other samples in
  flight and an engine's calls are scored as one batch (:class:`_Batcher`), so a verifier of your own runs as
  on the local engine: identical items once, a failed batch's items retried in parallel, a retry budget per
  rollout phase (``HACPO_REWARD_STEP_GAP_S`` without calls starts a new one), instead of one sample at a time
  behind a lock, where every item of a hanging prompt waited out its own deadline in turn. Each sample's
  ``extra_logs`` carry its share of its batch's verifier counts (``verifier_<count>``), which the joint
  driver sums into the step's ``verifier/<count>`` metrics;
- **a verifier that cannot work stops the run before any update**: OpenRLHF calls the reward once per
  sample, so a verifier of your own failing on every item of the first batch shows here as the first
  ``HACPO_VERIFIER_FIRST_BATCH`` calls of this engine all failing with no success before them
  (:class:`hacpo.reward.custom.VerifierError` from every one). The engine then writes the error to
  ``HACPO_VERIFIER_STOP`` and holds that call, so that the step's rollouts never complete and no update
  runs; the runner, which watches that file, stops the job and fails the run naming the key and the error
  (:func:`.runner.launch_subprocess`). A reward outside the verifier's range (``reward.range``, else
  [0, 1]) stops the run the same way at its first call, at any step.

With ``HACPO_ROLLOUT_LOG`` set (the runner sets it), every scored sample appends one line
``{"prompt": <sha1 of the prompt text, 16 hex>, "reward": r}`` to that file, from every engine: the record
of which prompts were trained, in the order they were (``runner.check_trained_order``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time

import torch

logger = logging.getLogger("hacpo.reward.openrlhf")

_TRAILING_SPECIALS = re.compile(r"(?:\s*(?:<\|[^<>|]{1,64}\|>|</s>|<eos>|<\|eot_id\|>))+\s*\Z")
_scorer = None
_scorer_lock = threading.Lock()
_first_batch = {"failed": 0, "passed": False}  # this engine's calls before its first verifier success


def _get_scorer():
    global _scorer
    with _scorer_lock:
        if _scorer is None:
            from hacpo.reward import Scorer

            workers = int(os.environ.get("HACPO_REWARD_WORKERS", "2"))
            timeout = os.environ.get("HACPO_REWARD_TIMEOUT_S")  # unset: the reward's own default
            reward = os.environ.get("HACPO_REWARD", "math_verify")  # the run's `reward` (the runner sets it)
            if reward.startswith("{"):  # a verifier of your own (hacpo.reward.custom), as JSON
                reward = json.loads(reward)
            budget = os.environ.get("HACPO_REWARD_RETRY_BUDGET_S")  # unset: two deadlines
            _scorer = Scorer(workers=max(1, workers), timeout_s=timeout and float(timeout), reward=reward,
                             retry_budget_s=budget and float(budget))  # fmt: skip
        return _scorer


class _Batcher:
    """One engine's reward calls (OpenRLHF's worker threads, a sample each) scored in batches by one thread:
    a batch gathers the calls that arrive until ``quiet_s`` passes without one (``max_wait_s`` at most), then
    goes to the scorer at once. A batch that starts ``step_gap_s`` after the last one ended opens a new
    rollout phase: the scorer's retry budget is whole again (:meth:`hacpo.reward.Scorer.new_step`)."""

    def __init__(self, scorer, quiet_s: float = 0.05, max_wait_s: float = 1.0, step_gap_s: float = 5.0):
        self.scorer, self.quiet_s, self.max_wait_s, self.step_gap_s = scorer, quiet_s, max_wait_s, step_gap_s
        self._pending: list[tuple[list, dict, threading.Event]] = []
        self._cond = threading.Condition()
        self._last_end = -float("inf")
        threading.Thread(target=self._loop, name="hacpo-reward-batcher", daemon=True).start()

    def score(self, responses, answers, metadata, ids) -> tuple[list | None, dict, BaseException | None]:
        """This call's rewards, its share of the batch's verifier counts, and what the batch raised (then no
        rewards)."""
        slot, done = {}, threading.Event()
        with self._cond:
            self._pending.append(([responses, answers, metadata, ids], slot, done))
            self._cond.notify()
        done.wait()
        return slot.get("rewards"), slot["counts"], slot.get("error")

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                t0, seen = time.monotonic(), -1
                while len(self._pending) != seen and time.monotonic() - t0 < self.max_wait_s:
                    seen = len(self._pending)  # the other samples in flight join this batch
                    self._cond.wait(self.quiet_s)
                batch, self._pending = self._pending, []
            if time.monotonic() - self._last_end >= self.step_gap_s:
                self.scorer.new_step()
            columns = [[x for call, _, _ in batch for x in call[c]] for c in range(4)]
            rewards = error = None
            try:
                rewards = self.scorer.score(*columns)
            except BaseException as err:  # noqa: BLE001 -- each call gets it (reward_func scores 0)
                error = err
            total = len(columns[0]) or 1
            share = {k.replace("/", "_"): v / total for k, v in self.scorer.take_verifier_counts().items()}
            at = 0
            for call, slot, _ in batch:
                n = len(call[0])
                slot.update(counts={k: v * n for k, v in share.items()}, error=error)
                if rewards is not None:
                    slot["rewards"] = rewards[at : at + n]
                at += n
            self._last_end = time.monotonic()
            for _, _, done in batch:
                done.set()


_batcher: _Batcher | None = None


def _get_batcher() -> _Batcher:
    global _batcher
    scorer = _get_scorer()
    with _scorer_lock:
        if _batcher is None:
            _batcher = _Batcher(scorer, step_gap_s=float(os.environ.get("HACPO_REWARD_STEP_GAP_S", "5")))
        return _batcher


def response_of(query: str, prompt: str) -> str:
    """The generated part of ``query`` (= prompt + response), without trailing end-of-sequence markers."""
    if query.startswith(prompt):
        text = query[len(prompt) :]
    else:  # decode(encode(prompt)) differs from the prompt text: cut after the prompt's last characters
        tail = prompt[-32:]
        cut = query.rfind(tail) if tail else -1
        text = query[cut + len(tail) :] if cut >= 0 else query
    return _TRAILING_SPECIALS.sub("", text)


def prompt_key(prompt: str) -> str:
    import hashlib

    return hashlib.sha1(prompt.encode()).hexdigest()[:16]


def _log_rollouts(prompts, rewards) -> None:
    path = os.environ.get("HACPO_ROLLOUT_LOG")
    if not path:
        return
    import json

    lines = "".join(
        json.dumps({"prompt": prompt_key(str(p)), "reward": float(r)}) + "\n"
        for p, r in zip(prompts, rewards, strict=True)
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one short write: atomic append
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)


def _first_batch_failed(err: BaseException | None) -> None:
    """Count this engine's first calls: a verifier failing on all of the first ``HACPO_VERIFIER_FIRST_BATCH``
    (module docstring) writes the stop file and holds this call until the runner stops the job. A reward
    outside the verifier's range (:class:`hacpo.reward.custom.RewardRangeError`) does so at its first call,
    at any step: its values would change HACPO's maths, not score 0."""
    from hacpo.reward.custom import RewardRangeError, VerifierError

    limit = int(os.environ.get("HACPO_VERIFIER_FIRST_BATCH", "0"))
    stop = os.environ.get("HACPO_VERIFIER_STOP")
    if isinstance(err, RewardRangeError) and stop:
        from hacpo.runio import atomic_write_json

        with _scorer_lock:
            atomic_write_json(stop, {"error": str(err), "failed": 1, "kind": "range", "pid": os.getpid()})
        logger.error("hacpo: %s; stopping the run", err)
        threading.Event().wait()  # held, as below
    with _scorer_lock:
        if _first_batch["passed"] or not (limit and stop):
            return
        if not isinstance(err, VerifierError):  # a success, or a failure that is not the verifier's
            _first_batch["passed"] = err is None
            return
        _first_batch["failed"] += 1
        if _first_batch["failed"] < limit:
            return
        from hacpo.runio import atomic_write_json

        atomic_write_json(stop, {"error": str(err), "failed": _first_batch["failed"], "pid": os.getpid()})
    logger.error("hacpo: the verifier failed on the first %d items of this engine; stopping the run", limit)
    threading.Event().wait()  # held: the step's rollouts cannot complete; the runner ends the job


def reward_func(queries, prompts, labels) -> dict:
    """0/1 reward per query; never raises."""
    n = len(queries) if isinstance(queries, (list, tuple)) else 0
    rewards = [0.0] * n
    error, failure, counts = 0.0, None, {}
    try:
        responses = [response_of(str(q), str(p)) for q, p in zip(queries, prompts, strict=True)]
        from hacpo.reward.custom import decode_label

        decoded = [decode_label(str(x)) for x in labels]  # a verifier's labels carry metadata and id
        scored, counts, failed = _get_batcher().score(responses, *([d[i] for d in decoded] for i in range(3)))
        if failed is not None:
            raise failed
        rewards = scored
    except BaseException as err:  # noqa: BLE001 -- a raise here would be swallowed by OpenRLHF, then fail later
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        logger.warning("hacpo reward_func failed; scoring 0", exc_info=True)
        error, failure = 1.0, err
    _first_batch_failed(failure)
    try:
        _log_rollouts(prompts, rewards)
    except Exception:  # noqa: BLE001 -- the record must never cost a reward
        logger.warning("hacpo reward_func could not append to HACPO_ROLLOUT_LOG", exc_info=True)
    values = torch.tensor(rewards, dtype=torch.float32)
    extra = {"reward_error": error, **counts}  # counts: this sample's share of its batch's verifier counts
    return {
        "rewards": values,
        "scores": values.clone(),
        "extra_logs": {k: torch.tensor([float(v)]) for k, v in extra.items()},
    }
