"""A verifier of your own, as a config entry: ``reward: {function: "pkg.module:name"}`` or
``reward: {file: path/to/verify.py, name: fn}``, beside the built-in ``math_verify`` and ``hendrycks``.

The contract (the batch form of verl's ``custom_reward_function`` and TRL's ``reward_funcs``)::

    def fn(responses: list[str], answers: list[str], metadata: list[dict]) -> list[float]

one call per batch; ``metadata[i]`` is record ``i``'s own extra fields (its ``metadata`` object). Rewards
are finite numbers in [0, 1] (1 a right answer, 0 a wrong one, partial credit between), because HACPO reads
them as success rates (its capability estimate, spec §3.1, and its advantage's special cases, §3.2). A
verifier on another scale declares it, ``reward: {file: …, name: …, range: [lo, hi]}``, and every value
is mapped onto [0, 1] by ``(r − lo) / (hi − lo)`` (:func:`unit_rewards`) before anything reads it: training,
validation and evaluation, on both engines, see and log the mapped value, and ``run.json`` records the
mapping (:func:`reward_record`). A value outside the declared range, or outside [0, 1] with none declared,
stops the run at that step with a :class:`RewardRangeError` naming the item's id, its value and
``reward.range``.

Bounded and total, as math-verify is (:mod:`hacpo.reward.pool`): the verifier runs only in worker processes,
each call under a hard deadline (a run's ``reward_timeout_s``, default 30 s; a hung worker is killed and
replaced). A batch that raises, overruns, or returns the wrong count, a NaN, an infinity or a non-number is
retried one item per call, in parallel and under the step's retry budget (:class:`VerifierRunner`), so
only the failing items score 0; each is counted (:attr:`VerifierRunner.failed`) and logged with its id, and
the run goes on. Identical items are verified once. A verifier that cannot be imported, or fails on every
item of its first batch, stops the run before any update with a :class:`VerifierError` naming the config
key.

Identity (:meth:`CustomReward.identity`): the target and the SHA-256 of its source file, so editing the
verifier retrains exactly the runs that use it; the deadline (``reward_timeout_s``) and the worker count
(``scorer_workers``) are runtime options.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import math
import numbers
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .pool import Pool

logger = logging.getLogger("hacpo.reward")


class VerifierError(ValueError):
    """The configured verifier cannot run at all: not importable, or it failed on a whole first batch."""


class RewardRangeError(VerifierError):
    """The verifier returned a value outside its range (declared, or [0, 1]): the run stops there."""


class CustomReward(BaseModel):
    """``{function: "pkg.module:name"}`` or ``{file: PATH, name: NAME}``. ``sha256``, when given (the
    workflow records it as it plans a run), must still be the source's: a verifier edited after planning
    fails the run instead of scoring it with other code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    function: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description='the verifier as `"pkg.module:name"`, importable from the Python path (or give `file`)',
    )
    file: str | None = Field(
        None, description="a Python file that defines the verifier, with `name` (or give `function`)"
    )
    name: str | None = Field(None, pattern=r"^[A-Za-z_]\w*$", description="the function in `file` to call")
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description=(
            "the SHA-256 of the verifier's source file when the run was planned (the workflow fills it in); "
            "a source that no longer has it fails the run"
        ),
    )
    range: tuple[float, float] | None = Field(
        None,
        description=(
            "the verifier's reward scale `[lo, hi]` when it is not [0, 1] (e.g. `[-1, 1]`, or `[0, 2]` for "
            "partial credit up to 2): each value is mapped onto [0, 1] as `(r - lo) / (hi - lo)`, the value "
            "training, validation, evaluation and the metrics use; a value outside it stops the run. "
            "None: rewards must lie in [0, 1]"
        ),
    )

    @model_validator(mode="after")
    def _one_form(self):
        if self.range is not None:
            lo, hi = self.range
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"reward.range {list(self.range)}: give finite [lo, hi] with lo < hi")
        if (self.function is None) == (self.file is None):
            raise ValueError('give `function: "pkg.module:name"` or `file: path/to/verify.py` with `name:`')
        if self.file is not None and self.name is None:
            raise ValueError(f"`file: {self.file}` needs `name:`, the function to call in it")
        if self.function is not None and self.name is not None:
            raise ValueError(
                '`name:` goes with `file:`; `function:` names it after the colon ("pkg.mod:name")'
            )
        return self

    @property
    def target(self) -> str:
        return self.function if self.function is not None else f"{self.file}:{self.name}"

    @property
    def key(self) -> str:
        """The config key that names it, for errors."""
        return "reward.function" if self.function is not None else "reward.file"

    def source_file(self) -> Path:
        """The file that defines the verifier (a module's own file: what it imports is not hashed)."""
        if self.file is not None:
            return Path(self.file)
        module = self.function.partition(":")[0]
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as err:
            raise VerifierError(
                f"reward.function {self.function!r}: cannot find module {module!r}: {err}"
            ) from err
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise VerifierError(
                f"reward.function {self.function!r}: no module {module!r} on the Python path "
                "(install its package, or use `file: path/to/verify.py` with `name:`)"
            )
        return Path(spec.origin)

    def identity(self) -> dict[str, str]:
        """What a run's identity records of its verifier: the target and its source file's SHA-256."""
        path = self.source_file()
        if not path.is_file():
            raise VerifierError(f"reward.file {self.file!r} does not exist")
        out = {"verifier": self.target, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        if self.range is not None:  # a declared scale changes what the algorithm sees
            out["range"] = list(self.range)
        return out

    def planned(self) -> dict[str, str]:
        """The entry with its source's hash filled in (the workflow's train spec: a rerun trigger)."""
        return {**self.model_dump(mode="json", exclude_none=True), "sha256": self.identity()["sha256"]}

    def check_unchanged(self) -> None:
        """:class:`VerifierError` when ``sha256`` is given and the source no longer has it."""
        if self.sha256 is not None and self.identity()["sha256"] != self.sha256:
            raise VerifierError(
                f"reward: {self.source_file()} changed after this run was planned "
                f"(sha256 {self.sha256[:12]}…); plan again (rerun snakemake): the runs using it retrain"
            )


LABEL_PREFIX = "hacpo-verifier:"
"""Marks an OpenRLHF label that carries a record's answer, metadata and id (:func:`encode_label`)."""


def encode_label(answer: str, metadata: dict, rid: str) -> str:
    """The OpenRLHF engine's label for a verifier of your own: OpenRLHF hands the reward function one label
    string per sample (``data.label_key``), so the record's metadata and id travel inside it."""
    return LABEL_PREFIX + json.dumps({"answer": answer, "metadata": metadata, "id": rid}, ensure_ascii=False)


def decode_label(label: str) -> tuple[str, dict, str | None]:
    """``(answer, metadata, id)`` of an :func:`encode_label` label; a plain label is the answer alone."""
    if not label.startswith(LABEL_PREFIX):
        return label, {}, None
    d = json.loads(label[len(LABEL_PREFIX) :])
    return d["answer"], d["metadata"], d["id"]


def reward_identity(reward: str | dict | CustomReward) -> str | dict[str, str]:
    """What a run's identity records of its ``reward``: a built-in's name, or a verifier's
    :meth:`CustomReward.identity` (its target and its source's hash)."""
    if isinstance(reward, str):
        return reward
    return (reward if isinstance(reward, CustomReward) else CustomReward(**reward)).identity()


CORRECT_AT = 1.0
"""The reward at which a sample counts as correct (pass@k, an audit's ``correct``): full credit."""


def is_correct(reward: float) -> bool:
    """A sample's binary verdict: its reward (on [0, 1]) is full credit, ≥ :data:`CORRECT_AT`."""
    return reward >= CORRECT_AT


def unit_rewards(raw: Sequence[float | None], ids: Sequence[str], spec: CustomReward) -> list[float]:
    """The verifier's values on [0, 1]: ``(r − lo) / (hi − lo)`` for a declared ``range: [lo, hi]``, as they
    are for none; ``None`` (an item the verifier failed on) is 0, the bottom of the scale. A value outside
    the range raises :class:`RewardRangeError` naming the first such item (its id and value), how many there
    are, and ``reward.range``, the key that declares a scale."""
    lo, hi = spec.range if spec.range is not None else (0.0, 1.0)
    bad = [i for i, r in enumerate(raw) if r is not None and not lo <= r <= hi]
    if bad:
        i, more = bad[0], f" (and {len(bad) - 1} more in this batch)" if len(bad) > 1 else ""
        if spec.range is None:
            fix = (
                "HACPO reads rewards as success rates in [0, 1]: declare the verifier's scale as "
                "`reward.range: [lo, hi]` (e.g. [0, 2] or [-1, 1]) and hacpo maps it onto [0, 1], "
                "or make the verifier return values in [0, 1]"
            )
            where = "outside [0, 1]"
        else:
            fix = "fix the verifier, or declare its true scale in `reward.range`"
            where = f"outside its declared reward.range [{lo:g}, {hi:g}]"
        what = f"the verifier {spec.target!r} gave item {ids[i]} the reward {raw[i]!r}"
        raise RewardRangeError(f"reward: {what}, {where}{more}: {fix}")
    return [0.0 if r is None else (r - lo) / (hi - lo) for r in raw]


def reward_record(reward: str | CustomReward) -> dict:
    """What ``run.json`` (``details.reward``) says of a run's reward: its name or verifier, its scale and the
    map onto [0, 1] that training, validation and the metrics use (the identity for a scale of [0, 1])."""
    if isinstance(reward, str):
        return {"reward": reward, "range": [0.0, 1.0], "declared": False, "to_unit": "r"}
    lo, hi = reward.range if reward.range is not None else (0.0, 1.0)
    shifted = "r" if lo == 0 else f"(r - {lo:g})" if lo > 0 else f"(r + {-lo:g})"
    to_unit = shifted if hi - lo == 1 else f"{shifted} / {hi - lo:g}"
    declared = reward.range is not None
    return {"reward": reward.target, "range": [lo, hi], "declared": declared, "to_unit": to_unit}


def load_verifier(spec: CustomReward):
    """Import the verifier and return the function; :class:`VerifierError` names the key and the error."""
    key = spec.key
    try:
        if spec.function is not None:
            module_name, _, name = spec.function.partition(":")
            module = importlib.import_module(module_name)
        else:
            name = spec.name
            path = Path(spec.file).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {spec.file}")
            unique = "hacpo_verifier_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
            module = sys.modules.get(unique)
            if module is None:
                mod_spec = importlib.util.spec_from_file_location(unique, path)
                module = importlib.util.module_from_spec(mod_spec)
                mod_spec.loader.exec_module(module)
                sys.modules[unique] = module
        fn = getattr(module, name, None)
        if not callable(fn):
            raise AttributeError(f"{module.__name__} has no function {name!r}")
    except Exception as err:  # anything the user's module raises on import
        raise VerifierError(
            f"{key}: cannot load the verifier {spec.target!r}: {type(err).__name__}: {err}"
        ) from err
    return fn


def check_rewards(values: Any, n: int) -> list[float]:
    """The verifier's output as ``n`` finite floats, or ValueError saying what is wrong with it."""
    if hasattr(values, "tolist"):  # a numpy array or a torch tensor
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"returned {type(values).__name__}, not a list of {n} numbers")
    if len(values) != n:
        raise ValueError(f"returned {len(values)} rewards for {n} responses")
    out = []
    for i, v in enumerate(values):
        if not isinstance(v, numbers.Real):
            raise ValueError(f"reward {i} is {type(v).__name__} {v!r}, not a number")
        if not math.isfinite(float(v)):
            raise ValueError(f"reward {i} is {float(v)}")
        out.append(float(v))
    return out


def verifier_job(spec: dict):
    """Worker side (:func:`hacpo.reward.pool.worker_entry`): load the verifier once, then per call
    ``(responses, answers, metadata) → (True, rewards) | (False, what went wrong)``; never raises."""
    fn = load_verifier(CustomReward(**spec))

    def job(responses: list[str], answers: list[str], metadata: list[dict]) -> tuple[bool, Any]:
        try:
            return True, check_rewards(fn(list(responses), list(answers), list(metadata)), len(responses))
        except Exception as err:  # the user's code: anything may come out
            return False, f"{type(err).__name__}: {err}"

    return job


# Processes that retry a failed batch's items in parallel, at most one a CPU: a slow item that computes
# must not be slowed past its deadline by others beside it
RETRY_WORKERS = min(8, os.cpu_count() or 1)
# A retried item still running after RETRY_STALL_S and waiting (off the CPU: hanging, or a slow verifier
# that waits on a solver or a service) gets a spare process beside it (up to RETRY_SPARES at once) serving
# the queue, so the good items are scored while the hanging ones wait out their deadline together
RETRY_SPARES, RETRY_STALL_S = 32, 0.25


class VerifierRunner:
    """Scores batches with a :class:`CustomReward` in ``workers`` (≥ 1) processes, each call under
    ``timeout_s`` (module docstring).

    Items with the same response, answer and metadata are verified once and share the result, a failure as
    well as a success (rollouts of one prompt often repeat an answer). A failed batch's items are retried
    one per call, spread over :data:`RETRY_WORKERS` processes, each under its own deadline, a hanging one
    set aside with a spare process serving the queue beside it, so that k hanging items cost about one
    deadline, not k, and every well-behaved item is scored. Once a batch failed, the step's later calls go
    item by item from the start (the batch call stays the fast path while batches succeed). A step's time
    on calls that failed comes out of ``retry_budget_s`` (default two deadlines; :meth:`new_step` renews
    it): once it is spent, each item still unscored gets ``spent_deadline_s`` of its own (a tenth of the
    deadline, at least 1 s), up to :data:`RETRY_WORKERS` + :data:`RETRY_SPARES` at once, and one that
    overruns it scores 0, counted and named like every other failure. A well-behaved item that takes less
    is scored however many others hang; a hanging one costs one short deadline, in parallel.
    :meth:`take_counts` gives what a step spent (seconds, retried, timed-out, shared, failed items)."""

    def __init__(
        self,
        spec: CustomReward,
        workers: int = 1,
        timeout_s: float = 30.0,
        retry_budget_s: float | None = None,
        retry_workers: int = RETRY_WORKERS,
    ):
        spec.check_unchanged()
        load_verifier(spec)  # fails here, in the parent, naming the key, before any worker or update
        self.spec = spec
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self.job = ("hacpo.reward.custom:verifier_job", spec.model_dump())
        self.pool = Pool(self.workers, timeout_s, timeout_s, job=self.job)
        self.retry_workers = max(1, retry_workers)
        self._retry_pool: Pool | None = None  # started at the first failed batch, kept for the run
        self.retry_budget_s = step_budget(timeout_s, retry_budget_s)
        self.budget_left = self.retry_budget_s
        self.spent_deadline_s = min(timeout_s, max(1.0, 0.1 * timeout_s))  # a first try's, once it is spent
        self.failed = 0  # items scored 0 because the verifier failed on them (all batches so far)
        self.batch_ok = True  # False once a batch failed this step: later calls go item by item
        self.counts = dict.fromkeys(VERIFIER_COUNTS, 0.0)  # since the last take_counts
        self._first = True

    @property
    def pools(self) -> list[Pool]:
        return [p for p in (self.pool, self._retry_pool) if p is not None]

    def new_step(self) -> None:
        """A new step (or validation): the retry budget is whole again, and batches are tried first."""
        self.budget_left = self.retry_budget_s
        self.batch_ok = True

    def take_counts(self) -> dict[str, float]:
        """What the verifier spent since the last call (:data:`VERIFIER_COUNTS`), then zeroed."""
        out, self.counts = self.counts, dict.fromkeys(VERIFIER_COUNTS, 0.0)
        return out

    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        metadata: Sequence[dict] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[float]:
        n = len(responses)
        metadata = list(metadata) if metadata is not None else [{} for _ in range(n)]
        ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(n)]
        if not (len(answers) == len(metadata) == len(ids) == n):
            raise ValueError(
                f"{n} responses but {len(answers)} answers, {len(metadata)} metadata, {len(ids)} ids"
            )
        if n == 0:
            return []
        t0 = time.monotonic()
        # each distinct (response, answer, metadata) once; its result is every copy's
        unique: dict[tuple, int] = {}
        of = [unique.setdefault(_item_key(responses[i], answers[i], metadata[i]), i) for i in range(n)]
        firsts = sorted(set(of))
        values, errors = self._score_unique(firsts, responses, answers, metadata, ids)
        self.counts["shared"] += n - len(firsts)
        failed = [i for i in range(n) if of[i] in errors]
        self.failed += len(failed)
        self.counts["failed"] += len(failed)
        self.counts["seconds"] += time.monotonic() - t0
        if self._first and len(failed) == n:
            example = next(iter(errors.values()))
            raise VerifierError(
                f"reward: the verifier {self.spec.target!r} failed on every item of the first "
                f"batch ({n}), e.g. item {ids[0]}: {example}"
            )
        self._first = False
        for i in failed:
            why = errors[of[i]]
            logger.warning("verifier %s failed on item %s, scored 0: %s", self.spec.target, ids[i], why)
        raw = [None if of[i] in errors else float(values[of[i]]) for i in range(n)]
        return unit_rewards(raw, ids, self.spec)  # on [0, 1]; a failed item 0

    def _score_unique(self, items, responses, answers, metadata, ids) -> tuple[dict, dict]:
        """``items`` (indices of distinct items) → (values, errors) by index: batch calls, one per worker,
        then the items of failed batches retried in parallel under the step's budget."""
        values: dict[int, float] = {}
        retry: list[int] = []
        errors: dict[int, str] = {}
        if not self.batch_ok:  # a batch failed this step: item by item from the start, no batch deadline
            return self._score_singly(list(items), responses, answers, metadata, values, errors)
        size = -(-len(items) // self.workers)  # one call per worker
        parts = [items[s : s + size] for s in range(0, len(items), size)]
        calls = [
            ([responses[i] for i in p], [answers[i] for i in p], [metadata[i] for i in p]) for p in parts
        ]
        t0 = time.monotonic()
        # the budget spent, this step's verifier is misbehaving: a first try gets a short deadline too
        first = self.pool.run(calls, budget_s=None if self.budget_left > 0 else self.spent_deadline_s)
        if not all(ok for ok, _ in first):  # time on calls that failed is the budget's, first tries too
            self.budget_left -= time.monotonic() - t0
            self.batch_ok = False
        for part, (ok, got) in zip(parts, first, strict=True):
            if ok:
                values.update(zip(part, got, strict=True))
            elif len(part) == 1:  # already the item alone (OpenRLHF calls once per sample): no retry
                errors[part[0]] = self._why(got)
            else:
                logger.warning(
                    "verifier %s failed on a batch of %d (%s); retrying its items one by one in parallel",
                    self.spec.target,
                    len(part),
                    got,
                )
                retry += part
        if not retry:
            return values, errors
        return self._score_singly(retry, responses, answers, metadata, values, errors)

    def _score_singly(self, retry, responses, answers, metadata, values, errors) -> tuple[dict, dict]:
        """Each item on its own call, in parallel, each under its deadline, a hanging one beside the queue
        (the retry pool's spares), while the step's budget lasts; once it is spent, each item under
        ``spent_deadline_s`` of its own: a well-behaved item faster than that is scored either way."""
        self.counts["retried"] += len(retry)
        if self._retry_pool is None:  # its start (once a run) is not retry time: the budget starts after it
            self._retry_pool = Pool(self.retry_workers, self.timeout_s, self.timeout_s, job=self.job,
                                    spares=RETRY_SPARES, stall_s=RETRY_STALL_S)  # fmt: skip
        self._retry_pool.wait_ready(60.0)  # a worker replaced after a hang starts outside the budget
        singles = [([responses[i]], [answers[i]], [metadata[i]]) for i in retry]
        t0 = time.monotonic()
        results = self._retry_pool.run(singles, budget_s=max(self.budget_left, 0.0),
                                       then_s=self.spent_deadline_s)  # fmt: skip
        self.budget_left -= time.monotonic() - t0
        for i, (ok, got) in zip(retry, results, strict=True):
            if ok:
                values[i] = got[0]
            else:
                errors[i] = self._why(got)
        return values, errors

    def _why(self, got: str) -> str:
        """A failed call's reason as logged; a timeout (the deadline's or the budget's) is counted."""
        if got == "killed":
            self.counts["timed_out"] += 1
            return f"no answer within the deadline ({self.timeout_s:g} s)"
        if got == "spent":
            self.counts["timed_out"] += 1
            return (f"no answer within {self.spent_deadline_s:g} s, an item's deadline once the step's "
                    f"retry budget ({self.retry_budget_s:g} s) is spent")  # fmt: skip
        if got == "budget":
            self.counts["timed_out"] += 1
            return (f"unscored when the step's retry budget ({self.retry_budget_s:g} s) was spent "
                    f"(a first try then gets {self.spent_deadline_s:g} s)")  # fmt: skip
        return got


def step_budget(timeout_s: float, budget_s: float | None) -> float:
    """A step's time for a verifier's failed calls (``reward_retry_budget_s``): ``budget_s``, else two
    deadlines."""
    return 2 * timeout_s if budget_s is None else budget_s


# Per-step counts of a verifier (metrics ``verifier/<name>``): its seconds, items retried one by one, items
# that got no answer in time (deadline or budget), items that shared another's result, items scored 0
VERIFIER_COUNTS = ("seconds", "retried", "timed_out", "shared", "failed")


def _item_key(response: str, answer: str, metadata: dict) -> tuple:
    return (response, answer, json.dumps(metadata, sort_keys=True, default=str))
