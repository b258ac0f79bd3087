"""HACPO's joint runs on OpenRLHF: n ≥ 2 agents, each an :class:`AgentStack` that generates, scores and
trains its own model (its vLLM engines and DeepSpeed actor/reference groups, :mod:`.stack`).

The step and the run loop are the engine-independent ones (:func:`hacpo.engines.core.train_step`,
:class:`hacpo.engines.core.RunLoop`), the local engine's too; :class:`JointStep` is their engine here:

1. the same prompt batch for every agent, each rendered with the agent's own chat template; G samples
   each (:meth:`AgentStack.generate`), grouped by an explicit prompt id (:func:`assign_prompt_ids`);
2. (core) the capability window takes every agent's step accuracy; ω for this step (§3.1);
3. every agent's old and reference log-probs on its own samples, all before any update
   (:meth:`AgentStack.score`), which fix the ratio denominators (:func:`.rows.mark_own`);
4. per learner: own rows + every other agent's rows in its token space (:func:`.rows.cross_rows`),
   capability-aware advantages (:func:`.rows.assign_advantages`);
5. the learners' updates one after the other (:meth:`AgentStack.train`), then every agent's weights to its
   engines (:meth:`AgentStack.sync`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from hacpo.agents.prompting import prompt_text
from hacpo.algo import CapabilityTracker, LossSpec
from hacpo.algo.methods import Method
from hacpo.config import TrainConfig
from hacpo.data.synthetic import Problem, as_problem
from hacpo.engines import core
from hacpo.engines.core import AgentRollouts, RunLoop
from hacpo.engines.phases import Phases
from hacpo.reward.custom import VERIFIER_COUNTS
from hacpo.runio import Metric

from . import rows as R
from .state import read_state, write_state


class AgentStack(Protocol):
    """What the controller needs of one agent (its model, engines and optimizer live behind it)."""

    name: str
    tokenizer: object

    def generate(self, prompts: list[str], labels: list[str], n: int, seed: int | None = None) -> list:
        """``n`` samples per prompt text as single-row ``Experience``s with reward and ``prompts`` set
        (any order: rows are matched to prompts by their text); ``seed`` fixes the samples."""

    def score(self, rows: list) -> list:
        """The same rows with ``action_log_probs`` (this agent's pre-update policy) and, for the KL,
        ``base_action_log_probs`` (its reference), as OpenRLHF's ``make_experience`` attaches them."""

    def train(self, rows: list, step: int) -> list[dict]:
        """One learner's updates on its rows (own + cross) at the run's ``step`` (which seeds the
        mini-batch order); returns each update's loss metrics over every data-parallel rank, in order."""

    def sync(self) -> None:
        """Send the updated weights to the agent's generation engines."""

    def evaluate(self, prompts: list[str], labels: list[str]) -> list[float]:
        """Greedy pass@1 reward per prompt (in-training validation)."""

    def save_checkpoint(self, step: int) -> None:
        """Everything needed to resume at ``step`` (optimizer included) plus a Hugging Face copy; never of
        weights holding NaN/inf (:class:`~hacpo.engines.core.nonfinite.NonFiniteWeights` instead)."""

    def save_model(self) -> None:
        """The final Hugging Face model."""


def assign_prompt_ids(rows: Sequence, texts: Sequence[str], n: int) -> list[int]:
    """Prompt id (index into ``texts``) of every row, from the prompt text each row carries.

    Rows may come back in any order. Two prompt ids with the same text (a problem drawn twice) share
    their rows out in arrival order, ``n`` each. Anything else (a missing or extra sample) is an error.
    """
    by_text: dict[str, list[int]] = defaultdict(list)
    for pid, text in enumerate(texts):
        by_text[text].append(pid)
    seen: dict[str, int] = defaultdict(int)
    out = []
    for row in rows:
        text = row.prompts[0]
        if text not in by_text:
            raise ValueError(f"a generated row's prompt is not in this step's batch: {text[:80]!r}")
        slot = seen[text]
        seen[text] += 1
        pids = by_text[text]
        if slot >= n * len(pids):
            raise ValueError(f"more than {n} samples for a prompt of this step: {text[:80]!r}")
        out.append(pids[slot // n])
    missing = [t for t, pids in by_text.items() if seen[t] != n * len(pids)]
    if missing:
        raise ValueError(f"{len(missing)} prompt(s) got fewer than {n} samples, e.g. {missing[0][:80]!r}")
    return out


@dataclass
class JointStep:
    """The per-step procedure over ``stacks`` (agent order = the config's agent order)."""

    stacks: list[AgentStack]
    method: Method
    spec: LossSpec  # the run's loss (update records: lo_m)
    group_size: int  # G per agent (× the method's rollout multiplier)
    max_new_tokens: int
    max_len: int
    prompt_style: str = "paper"
    cross_eos: str = "strip"
    same_tokenizer: str = "reuse_ids"  # reencode: identical tokenizers' responses decoded and re-encoded too
    capability_window: int = 5
    omega_warmup_steps: int = 0
    seed: int = 0  # the run's seed: with the step and the agent, each step's rollout seeds
    phase: Phases = field(default_factory=Phases)
    tracker: CapabilityTracker = None
    extras: dict = field(default_factory=dict)  # this step's extra metrics (step_extras)

    def __post_init__(self):
        if len(self.stacks) < 2 and self.method.joint:
            raise ValueError(f"method {self.method.name!r} learns from other agents: give at least 2 agents")
        if self.tracker is None:
            self.tracker = CapabilityTracker(
                len(self.stacks), window=self.capability_window, warmup_steps=self.omega_warmup_steps
            )

    def run(self, step: int, problems: Sequence[Problem]) -> core.StepResult:
        """One step (:func:`hacpo.engines.core.train_step`, this object its engine); its log rows."""
        names = [s.name for s in self.stacks]
        samples = self.group_size * self.method.rollout_multiplier
        return core.train_step(
            self,
            names,
            step,
            problems,
            samples=samples,
            tracker=self.tracker,
            phase=self.phase,
            spec=self.spec,
        )

    # -- the StepEngine
    def rollout(self, k: int, step: int, problems: Sequence[Problem], g: int) -> AgentRollouts:
        stack = self.stacks[k]
        texts = [prompt_text(stack.tokenizer, p, self.prompt_style) for p in problems]
        with self.phase("generate"):
            labels, seed = [p.answer for p in problems], rollout_seed(self.seed, step, k)
            rows = stack.generate(texts, labels, g, seed=seed)
        rewards = torch.stack([r.rewards.reshape(()).float() for r in rows])
        tokens = torch.tensor([float(r.action_mask.sum()) for r in rows])
        for key in VERIFIER_COUNTS:  # a verifier of your own: each row carries its share of its batch's count
            name = f"verifier_{key}"
            got = [float(r.info[name].reshape(-1)[0]) for r in rows if name in r.info]
            if got:
                self.extras[f"verifier/{key}"] = self.extras.get(f"verifier/{key}", 0.0) + sum(got)
        return AgentRollouts(rewards, tokens, (rows, assign_prompt_ids(rows, texts, g)))

    def before_updates(self, rolls: list[AgentRollouts]) -> None:
        with self.phase("logprobs"):  # every agent's old log-probs before any update (§5 stage 2)
            for k, (stack, roll) in enumerate(zip(self.stacks, rolls, strict=True)):
                rows, pids = roll.rows
                scored = stack.score(rows)
                R.mark_own(scored, k, pids)
                roll.rows = (scored, pids)
                gap = R.engine_gap(scored)  # the weight sync's check: vLLM's log-probs = the actor's
                self.extras.update({Metric.of(stack.name, key): v for key, v in gap.items()})

    def learner_rows(self, k: int, rolls: list[AgentRollouts], omegas: torch.Tensor, problems) -> list:
        return self.rows_for(k, [r.rows[0] for r in rolls], omegas)

    def update(self, k: int, rows: list, step: int, problems) -> list[dict]:
        return self.stacks[k].train(rows, step)

    def sync(self) -> None:
        for stack in self.stacks:
            stack.sync()

    def step_extras(self) -> dict[str, float]:
        """Each agent's vLLM-vs-actor log-prob gap on its rollouts (:func:`.rows.engine_gap`) and a verifier's
        counts (``verifier/<count>``: the agents' rollouts summed, from the reward file); memory is the job's
        MemorySampler's (profile.json)."""
        extras, self.extras = self.extras, {}
        return extras

    def rows_for(self, k: int, own: list[list], omegas: torch.Tensor) -> list:
        """Learner k's rows: its own, plus (joint methods) every other agent's in k's token space, as the
        method's sharing rule keeps them (:func:`.rows.assign_advantages`)."""
        learner = self.stacks[k]
        rows = list(own[k])
        if self.method.joint:
            prompts = R.learner_prompts(own[k])
            cross = []
            for j, source in enumerate(self.stacks):
                if j != k:
                    cross += R.cross_rows(
                        own[j], source.tokenizer, learner.tokenizer, prompts, float(omegas[j, k]),
                        self.max_new_tokens, self.max_len, self.cross_eos,
                        source_stops=getattr(source, "stop_ids", None), same_tokenizer=self.same_tokenizer,
                    )  # fmt: skip
            if self.method.cross_old_from_learner and cross:
                scored = learner.score([R.rollout_form(r) for r in cross])  # before any update (§5 order)
                R.learner_old_logp(cross, scored)
            rows += cross
        return R.assign_advantages(rows, k, len(self.stacks), omegas, self.method)


def rollout_seed(seed: int, step: int, agent: int) -> int:
    """The base sampling seed of one agent's rollouts at one step (vLLM seeds are 64-bit)."""
    return (seed * 1_000_003 + step * 1_009 + agent) * 1_000_000 % 2**62


class JointLoop:
    """A joint run's steps around :class:`JointStep`, through the run loop both engines share
    (:class:`hacpo.engines.core.RunLoop`: the local engine's prompt batches, validation points, the logs'
    resume contract). A checkpoint is every agent's, then the controller's state (step, capability window)
    written last, so a kill resumes from the newest step every agent saved."""

    def __init__(self, cfg: TrainConfig, stacks: list[AgentStack], state_file: Path, on_row=None):
        from hacpo.engines.core.schedule import read_problems

        self.cfg, self.stacks, self.state_file, self.on_row = cfg, stacks, Path(state_file), on_row
        self.problems = [as_problem(p) for p in read_problems(cfg.train_file)]
        val = read_problems(cfg.val_file)[: cfg.val_size] if cfg.val_file and cfg.val_size else []
        self.val = [as_problem(p) for p in val]
        self.step = JointStep(
            stacks, cfg.resolved_method(), cfg.loss_spec(), group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            max_len=cfg.openrlhf.max_prompt_tokens + cfg.max_new_tokens if cfg.openrlhf else 10**9,
            prompt_style=cfg.prompt_style, cross_eos=cfg.cross_eos, same_tokenizer=cfg.same_tokenizer,
            capability_window=cfg.capability_window,
            omega_warmup_steps=cfg.omega_warmup_steps, seed=cfg.seed,
        )  # fmt: skip
        self.loop = RunLoop(cfg, [s.name for s in stacks], val_size=len(self.val))

    def start(self) -> int:
        """The step to start from (the controller state's); ω's window restored; the logs cut back to it and
        the validation at it run where due."""
        state = read_state(self.state_file)
        start = state["step"]
        if start:
            self.step.tracker.load_state_dict(state["tracker"])
        self.loop.resume(start, self.validate)
        return start

    def run(self) -> int:
        from hacpo.engines.core.schedule import batch_for_step

        cfg = self.cfg

        def train_step(step: int) -> core.StepResult:
            idx = batch_for_step(len(self.problems), cfg.prompts_per_step, step, cfg.seed)
            return self.step.run(step, [self.problems[i] for i in idx])

        def save_checkpoint(done: int) -> None:
            for stack in self.stacks:
                stack.save_checkpoint(done)
            write_state(self.state_file, done, self.step.tracker.state_dict())  # last: the step is resumable

        self.loop.run(self.start(), train_step, self.validate, save_checkpoint, on_row=self.on_row)
        for stack in self.stacks:
            stack.save_model()
        return cfg.steps

    def validate(self, step: int) -> list[float]:
        """Greedy accuracy of every agent on the validation problems (the run loop logs it)."""
        labels = [p.answer for p in self.val]
        accs = []
        for stack in self.stacks:
            texts = [prompt_text(stack.tokenizer, p, self.cfg.prompt_style) for p in self.val]
            rewards = stack.evaluate(texts, labels)
            accs.append(sum(rewards) / len(rewards))
        return accs
