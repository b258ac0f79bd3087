"""Typed, validated run configuration (one training run: a method, its agents, a seed, hyper-parameters).

Everything is checked before any model is built: an unknown method, a missing checkpoint or data file,
an agent count that does not fit the method, δ passed where 1−δ is meant — each gives one clear message.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hacpo.agents.adapters import LoraSpec  # the run config's `adapter.lora`: defined with the adapters
from hacpo.algo import HACPO_KNOBS, SGT_KNOBS, VARIANT_KNOBS, LossSpec, Method, get_method
from hacpo.algo.losses import check_cross_clip_low, check_non_negative
from hacpo.engine_options import OpenRLHFOptions
from hacpo.reward.custom import CustomReward, reward_identity, reward_record
from hacpo.validation import did_you_mean, problem_lines

# α, 1−δ and δ_step, each validated by the one check the loss itself runs (errors name the config key).
Alpha = Annotated[float, AfterValidator(lambda v: check_non_negative(v, "alpha"))]
CrossClipLow = Annotated[float, AfterValidator(check_cross_clip_low)]
DeltaStep = Annotated[float, AfterValidator(lambda v: check_non_negative(v, "delta_step"))]


def option(default=..., *, group: str, help: str, runtime: bool = False, **constraints):
    """A :class:`TrainConfig` field with its meaning (``--help``, the JSON schema and the generated
    reference show it), its group in the reference, and whether it is a runtime option: one that changes how
    a run executes, never what it computes (logging, threads, devices, workers, memory knobs, the OpenRLHF
    engine's GPUs). A run's identity (``config_hash``) and the workflow's rerun trigger leave runtime options
    out, so changing one never retrains a run; an interrupted run resumes under the new values."""
    extra = {"group": group, "runtime": runtime}
    return Field(default, description=help, json_schema_extra=extra, **constraints)


# One switch for "as the authors ran it" versus "as the paper describes it": each preset
# sets every choice of the released code that changes numbers; a key given explicitly wins over its preset
# (allowed, and recorded: TrainConfig.preset_overrides).
FIDELITY: dict[str, dict[str, str]] = {
    # the paper's description: mixed mini-batches (the stepwise clip's motivation), the terminal EOS stripped
    # from shared text, identical tokenizers' ids reused, math-verify (equivalent forms count)
    "paper": dict(
        minibatch_order="mixed", cross_eos="strip", same_tokenizer="reuse_ids", reward="math_verify"
    ),
    # the released code (HACRL, a verl fork): rows by generating agent (balance_batch's sorted partitions),
    # the source's EOS decoded as text and re-encoded, responses re-encoded even between identical tokenizers,
    # verl's compute_score (last \boxed{}, Hendrycks strip_string, exact match)
    "as_released": dict(
        minibatch_order="agent_order", cross_eos="keep_text", same_tokenizer="reencode", reward="hendrycks"
    ),
}


def with_fidelity(options: dict) -> dict:
    """``options`` with its ``fidelity`` preset's values filled in where no key is given explicitly."""
    preset = options.get("fidelity", "paper")
    if preset not in FIDELITY:
        return dict(options)  # the schema rejects it, naming the choices
    return {**FIDELITY[preset], **options}


def preset_overrides(options: dict) -> dict[str, str]:
    """The keys of ``options`` (run-config keys) set against its ``fidelity`` preset, with their values."""
    preset = FIDELITY[options.get("fidelity", "paper")]
    return {k: options[k] for k, v in preset.items() if k in options and options[k] != v}


def describe_fidelity(options: dict) -> str:
    """How runs of ``options`` (run-config keys) train, for a caption: the preset and its choices (a
    single-agent method reads only the reward), naming the keys set against the preset."""
    resolved = with_fidelity(options)
    preset = resolved.get("fidelity", "paper")
    against = list(preset_overrides(resolved))
    said = ", ".join(f"{k} {resolved[k]}" for k in FIDELITY[preset])
    if against:
        return f"{preset} preset, {' and '.join(against)} set against it ({said})"
    return f"{preset} preset ({said})"


def split_runtime(options: dict) -> tuple[dict, dict]:
    """``options`` (run-config keys) → (what the run computes, its :data:`RUNTIME_OPTIONS`)."""
    spec = {k: v for k, v in options.items() if k not in RUNTIME_OPTIONS}
    return spec, {k: v for k, v in options.items() if k in RUNTIME_OPTIONS}


class WandbLogging(BaseModel):
    """Weights & Biases for every run of both engines (:class:`~hacpo.engines.core.trackers.WandbView`; an
    OpenRLHF single-agent run through OpenRLHF's own logger). The API key is read from ``WANDB_API_KEY`` only,
    never from a config, so it never lands in a run's files or a process list."""

    model_config = ConfigDict(extra="forbid")
    project: str = Field("hacpo", min_length=1, description="the W&B project the runs log to")
    group: str | None = Field(
        None, description="W&B's run group (e.g. the workflow's name): runs of one config side by side"
    )
    entity: str | None = Field(None, description="the W&B team or user (None: the API key's default entity)")
    mode: Literal["online", "offline"] = Field(
        "online",
        description=(
            "online: upload while training (needs `WANDB_API_KEY`); offline: files under `<run>/wandb`, "
            "uploaded later with `wandb sync`"
        ),
    )


class RunLogging(BaseModel):
    """Live curves while a run trains (a runtime option, never part of a run's identity):
    TensorBoard scalars in ``<run>/tensorboard`` and, when ``wandb`` is set, a W&B run, written by the run
    loop (:mod:`hacpo.engines.core.trackers`)."""

    model_config = ConfigDict(extra="forbid")
    tensorboard: bool = Field(True, description="TensorBoard scalars in `<run>/tensorboard`")
    wandb: WandbLogging | None = Field(
        None,
        description="a Weights & Biases run as well (None: none); needs `pip install 'hacpo[wandb]'`",
    )

    def check_environment(self) -> None:
        """What a run would only fail on after its models load: wandb missing, or no key for online mode."""
        if self.wandb is None:
            return
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ValueError(
                "logging.wandb is set but the wandb package is not installed: pip install 'hacpo[wandb]' "
                "(or remove logging.wandb)"
            )
        if self.wandb.mode == "online" and not os.environ.get("WANDB_API_KEY"):
            raise ValueError(
                "logging.wandb.mode is online but WANDB_API_KEY is not set: export it, or set "
                "logging.wandb.mode: offline (files under <run>/wandb, uploaded later with `wandb sync`)"
            )


class Adapter(BaseModel):
    """How an agent's weights train: ``{lora: {...}}`` an adapter over the frozen base, ``{}`` every weight
    (full fine-tuning). Part of a run's identity."""

    model_config = ConfigDict(extra="forbid")
    lora: LoraSpec | None = Field(
        None, description="a LoRA adapter over the frozen base (None: every weight trains)"
    )


class AgentRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "the agent's name (letters, digits, `_`, `.`, `-`): its checkpoints' folder and its prefix "
            "in the logs"
        ),
    )
    path: str = Field(
        description="a Hugging Face model directory (model, tokenizer with a chat template) or a checkpoint"
    )
    adapter: Adapter | None = Field(
        None,
        description="this agent's own adapter (None: the run's `adapter`); `{}` trains it fully in LoRA runs",
    )
    shared_base: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="a base held once by the agents naming it (local engine), each a LoRA adapter with its "
        "own optimizer, as on copies of their own; `path`: the base, or an adapter on it to start from",
    )
    lr: float | None = Field(None, gt=0, description="this agent's learning rate (None: the run's `lr`)")


class TrainConfig(BaseModel):
    """One training run. Defaults are the CPU toy regime (docs/results.md, "The paper's tables at toy
    scale"); the paper's values are in ``config/paper.yaml``."""

    model_config = ConfigDict(extra="forbid")

    # ------------------------------------------------------------------------------------------ the run
    method: str = option(
        ..., group="run", help="the method (`hacpo methods` lists them): gspo, hacpo, naive, …"
    )
    agents: list[AgentRef] = option(
        ..., group="run", help="the agents: one for a single-agent method, two or more for a joint one"
    )
    train_file: str = option(..., group="run", help="training problems, JSONL of id, problem, answer")
    out_dir: str = option(..., group="run", help="the run directory (run.json, logs, checkpoints)")
    val_file: str | None = option(None, group="run", help="validation problems (None: no validation)")
    seed: int = option(
        42, group="run", help="the seed of the prompt order, the sampling and the initialisation"
    )

    # ------------------------------------------------------------------------------------------ a step
    steps: int = option(30, group="step", help="training steps", ge=1)
    prompts_per_step: int = option(
        16, group="step", help="B: prompts per step, the same for every agent", ge=1
    )
    group_size: int = option(8, group="step", help="G: rollouts per prompt per agent (×2 for gspo_x2)", ge=1)
    minibatch_size: int = option(64, group="step", help="sequences per optimizer update", ge=1)
    lr: float = option(3e-5, group="step", help="AdamW's learning rate", gt=0)
    betas: tuple[float, float] = option((0.9, 0.99), group="step", help="AdamW's betas")
    weight_decay: float = option(0.01, group="step", help="AdamW's weight decay", ge=0)
    grad_clip: float = option(1.0, group="step", help="the gradient norm's clip", gt=0)
    nonfinite_max_skips: int = option(
        3,
        group="step",
        help=(
            "an update whose loss or gradient norm is NaN/inf is skipped (never applied) and counted "
            "(`<agent>/nonfinite/skipped`); this many in a row of one agent stop the run before its next "
            "checkpoint, naming the checkpoint to resume from"
        ),
        ge=1,
        runtime=True,
    )
    kl_beta: float = option(1e-3, group="step", help="β of the k3 KL to the reference, on own rows", ge=0)
    adapter: Adapter | None = option(
        None,
        group="step",
        help=(
            "full fine-tuning (None) or an adapter for every agent ({lora: {rank, alpha, "
            "dropout, target_modules}}); an agent's own `adapter` wins; with LoRA the KL "
            "reference is the base with the adapter off"
        ),
    )

    # ------------------------------------------------------------------------------------------ HACPO
    alpha: Alpha | None = option(
        None, group="hacpo", help="exponential importance sampling α (§3.4; None: 1); HACPO losses only"
    )
    cross_clip_low: CrossClipLow | None = option(
        None,
        group="hacpo",
        help="the stepwise clip's lower bound 1−δ, not δ (§3.5; None: 0.8); HACPO losses only",
    )
    delta_step: DeltaStep | None = option(
        None,
        group="hacpo",
        help="the stepwise clip's increment δ_step per update (§3.5; None: 0.025); HACPO losses only",
    )
    rescue_advantage: float | None = option(
        None, group="hacpo", help="SGT's advantage of a rescued peer success (None: 1); SGT only", gt=0
    )
    capability_window: int = option(5, group="hacpo", help="steps in the capability estimate P̂ (§3.1)", ge=1)
    omega_warmup_steps: int = option(
        0, group="hacpo", help="steps with ω = 1 before the capability window has data", ge=0
    )

    # ------------------------------------------------------------------------------------------ fidelity
    fidelity: Literal["paper", "as_released"] = option(
        "paper",
        group="fidelity",
        help=(
            "the preset of the four choices below: as the paper describes it, or as the "
            "authors' code ran it; an explicit key wins"
        ),
    )
    minibatch_order: Literal["mixed", "self_first", "agent_order"] = option(
        "mixed",
        group="fidelity",
        help=(
            "the order of a learner's rows through its updates (hacpo.engines.core.order); "
            "agent_order: by generating agent, then prompt, as the released code"
        ),
    )
    cross_eos: Literal["strip", "keep_text"] = option(
        "strip", group="fidelity", help="the source's EOS in shared text (hacpo.agents.retokenize)"
    )
    same_tokenizer: Literal["reuse_ids", "reencode"] = option(
        "reuse_ids",
        group="fidelity",
        help=(
            "identical tokenizers: reuse the source's ids, or decode and re-encode as between different ones"
        ),
    )
    reward: Literal["math_verify", "hendrycks"] | CustomReward = option(
        "math_verify",
        group="fidelity",
        help=(
            "the training and validation reward, or a verifier of your own "
            '({function: "pkg.module:name"} or {file: PATH, name: NAME}; rewards in [0, 1], or add '
            "range: [lo, hi] to map another scale onto [0, 1])"
        ),
    )
    gspo_updates_x2_mode: Literal["epochs", "half_minibatch"] | None = option(
        None,
        group="fidelity",
        help="GSPO-updates×2's reading: two epochs, or half-size mini-batches (None: epochs)",
    )
    naive_cross_ratio: Literal["source", "self_old"] | None = option(
        None,
        group="fidelity",
        help=(
            "Naive's cross ratio against the learner's own old log-prob (self_old) or the "
            "source's (filled in from the registry)"
        ),
    )

    # ------------------------------------------------------------------------------------------ sampling
    prompt_style: Literal["compact", "paper"] = option(
        "compact", group="sampling", help="the prompt: compact, or the paper's instruction"
    )
    max_new_tokens: int = option(13, group="sampling", help="the longest answer sampled", ge=1)
    temperature: float = option(
        1.0, group="sampling", help="the sampling temperature (the policy is the tempered one)", gt=0
    )
    top_p: float = option(1.0, group="sampling", help="nucleus sampling's p", gt=0, le=1)
    old_logp: Literal["auto", "sampler", "forward"] = option(
        "auto",
        group="sampling",
        help=(
            "π_old: the sampler's log-probs (exact at T = 1, top_p = 1 on fp32 CPU kernels) "
            "or a trainer forward; auto: the sampler's where exact"
        ),
    )
    skip_dead_rows: bool = option(
        True,
        group="sampling",
        help="no backward for rows without a gradient (flat clamp; A = 0 without KL): exact",
    )

    # ------------------------------------------------------------------------------------------ validation
    val_every: int = option(
        10, group="validation", help="steps between validations (0: before and after training only)", ge=0
    )
    val_size: int = option(1000, group="validation", help="validation problems used", ge=0)
    checkpoint_every: int = option(
        10, group="validation", help="steps between checkpoints (0: the final one only)", ge=0
    )
    keep_checkpoints: int = option(2, group="validation", help="checkpoints kept", ge=1)
    final_checkpoint: Literal["full", "weights"] = option(
        "full",
        group="validation",
        runtime=True,
        help=(
            "what a completed run keeps (local engine): its kept checkpoints with trainer "
            "state, or the final weights only"
        ),
    )

    # ------------------------------------------------------------------------------------------ execution
    threads: int = option(1, group="execution", runtime=True, help="torch threads", ge=1)
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", group="execution", runtime=True, help="where the local engine trains"
    )
    precision: Literal["fp32", "bf16", "auto"] = option(
        "fp32",
        group="execution",
        help=(
            "bf16: autocast around every forward with fp32 master weights (part of the "
            "identity when not fp32); auto: bf16 where the hardware computes it natively "
            "(hacpo.hardware), recorded in run.json"
        ),
    )
    gradient_checkpointing: bool = option(
        False,
        group="execution",
        runtime=True,
        help=(
            "recompute activations in the backward (a plain forward per row instead of shared prompt caches)"
        ),
    )
    micro_batch_tokens: int | None = option(
        None,
        group="execution",
        runtime=True,
        help=(
            "micro-batches of at most this many padded tokens, gradients accumulated (None: "
            "the whole mini-batch); no-grad passes use the same budget"
        ),
        ge=1,
    )
    generation_batch_tokens: int | None = option(
        None,
        group="execution",
        runtime=True,
        help="validation generation in batches of this many prompt + new tokens (None: 512 problems a batch)",
        ge=1,
    )
    scorer_workers: int = option(
        0, group="execution", runtime=True, help="reward worker processes (0: in the trainer's process)", ge=0
    )
    reward_timeout_s: float | None = option(
        None,
        group="execution",
        runtime=True,
        help="the reward's hard deadline: one math-verify item (None: 2 s) or one verifier call (None: 30 s)",
        gt=0,
    )
    reward_retry_budget_s: float | None = option(
        None,
        group="execution",
        runtime=True,
        help=(
            "a verifier's time on failed calls within a step (None: two deadlines). Once spent, each item "
            "still unscored gets a tenth of the deadline (at least 1 s) of its own: one faster is still "
            "scored, one slower scores 0. Items run k at once: one a CPU (at most 8), and up to 32 more "
            "beside items that wait rather than compute. Worst case, a step's scoring takes this budget (or "
            "one deadline, if longer) plus a tenth of the deadline for every k items then unscored (k = 34 "
            "on 2 CPUs when hanging items wait, 2 when they spin), and about 0.2 s of CPU to replace each "
            "process that overran"
        ),
        ge=0,
    )
    progress: bool = option(False, group="execution", runtime=True, help="a progress bar")
    openrlhf: OpenRLHFOptions | None = option(
        None,
        group="execution",
        runtime=True,
        help="the OpenRLHF engine's GPUs, memory modes and logging (hacpo.engine_options)",
    )
    logging: RunLogging = option(
        RunLogging(), group="execution", runtime=True, help="live curves: TensorBoard, Weights & Biases"
    )

    @model_validator(mode="before")
    @classmethod
    def _fidelity_preset(cls, data):
        return with_fidelity(data) if isinstance(data, dict) else data

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        get_method(v)  # raises ValueError naming the known methods
        return v

    @model_validator(mode="after")
    def _agents_fit_method(self):
        base = get_method(self.method)
        unread = [
            k
            for k in (*HACPO_KNOBS, *SGT_KNOBS, *VARIANT_KNOBS)
            if getattr(self, k) is not None and not base.reads(k)
        ]
        if unread:
            why = (
                "α, 1−δ and δ_step apply to HACPO losses only"
                if set(unread) & set(HACPO_KNOBS)
                else "rescue_advantage applies to SGT only"
                if set(unread) & set(SGT_KNOBS)
                else "each variant knob applies to one method; see `hacpo methods`"
            )
            raise ValueError(
                f"method {self.method!r} does not read {', '.join(unread)}: remove "
                f"{'it' if len(unread) == 1 else 'them'} ({why})"
            )
        if base.reads("naive_cross_ratio") and self.naive_cross_ratio is None:
            # Naive's default reading changed (source → self_old, spec §2.5, 2026-12-01): a Naive run names
            # its reading, so its identity (config_hash) tells the two computations apart
            self.naive_cross_ratio = base.naive_cross_ratio
        method = self.resolved_method()
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agent names must be unique, got {names}")
        if method.joint and len(self.agents) < 2:
            raise ValueError(
                f"method {self.method!r} is collaborative and needs ≥ 2 agents, got {len(names)}"
            )
        if not method.joint and len(self.agents) != 1:
            raise ValueError(f"method {self.method!r} trains a single agent; give exactly one, got {names}")
        for i, a in enumerate(self.agents):
            if a.shared_base is not None and self.agent_adapter(i) is None:
                raise ValueError(
                    f"agents.{i} ({a.name!r}): shared_base {a.shared_base!r} needs a LoRA adapter (the "
                    "shared base stays frozen): give the agent or the run `adapter: {lora: {rank: 8}}`, or "
                    "remove shared_base to train every weight of a copy of its own"
                )
        return self

    def validation_due(self, done: int) -> bool:
        """Validation runs before training, every ``val_every`` steps, and after the last step."""
        every = self.val_every
        return done == 0 or done == self.steps or bool(every and done % every == 0)

    def checkpoint_due(self, done: int) -> bool:
        """A checkpoint after every ``checkpoint_every`` steps and after the last one."""
        return bool(self.checkpoint_every and done % self.checkpoint_every == 0) or done == self.steps

    def agent_adapter(self, index: int) -> LoraSpec | None:
        """Agent ``index``'s LoRA adapter, None for full fine-tuning (its own choice, else the run's)."""
        chosen = self.agents[index].adapter or self.adapter
        return chosen.lora if chosen is not None else None

    def resolved_method(self) -> Method:
        """The registry method under this run's variant knobs and SGT's rescue advantage."""
        method = get_method(self.method).variant(
            gspo_updates_x2_mode=self.gspo_updates_x2_mode, naive_cross_ratio=self.naive_cross_ratio
        )
        if self.rescue_advantage is not None:
            method = replace(method, rescue_advantage=self.rescue_advantage)
        return method

    def loss_spec(self) -> LossSpec:
        hyper = {k: getattr(self, k) for k in HACPO_KNOBS if getattr(self, k) is not None}
        return self.resolved_method().loss_spec(kl_beta=self.kl_beta, **hyper)

    def preset_overrides(self) -> dict[str, str]:
        """The keys set against this run's ``fidelity`` preset, with their values."""
        return preset_overrides(self.model_dump(include={"fidelity", *FIDELITY[self.fidelity]}))

    def fidelity_record(self) -> dict:
        """What ``run.json`` details say of the preset: its name, its four values, the keys set against it."""
        return {
            "preset": self.fidelity,
            **{k: getattr(self, k) for k in FIDELITY[self.fidelity]},
            "overrides": self.preset_overrides(),
        }

    def reward_record(self) -> dict:
        """What ``run.json`` details say of the reward: its name or verifier, its scale (``reward.range``)
        and the map onto [0, 1] that training, validation and the metrics use
        (:func:`hacpo.reward.custom.unit_rewards`)."""
        return reward_record(self.reward)

    def run_spec(self) -> dict:
        """What the run computes: every option except :data:`RUNTIME_OPTIONS`, defaults filled in. The
        preset's name is left out (its four values are in); options newer than a run keep its identity at
        their defaults."""
        keep = self.model_dump(exclude={*RUNTIME_OPTIONS, "fidelity"})
        newer = {"precision": "fp32", "same_tokenizer": "reuse_ids", "reward": "math_verify"}
        newer["rescue_advantage"] = None
        for key, default in newer.items():
            if keep[key] == default:
                del keep[key]
        # what each agent trains (its own adapter, else the run's; full fine-tuning: nothing, the identity
        # of runs older than adapters), so a run-level adapter an agent overrides changes nothing
        del keep["adapter"]
        for i, agent in enumerate(keep["agents"]):
            lora = self.agent_adapter(i)
            agent.pop("adapter")
            if lora is not None:  # "sampler": LoRA runs before the CPU decoder applied the adapter retrain
                agent["adapter"] = {"lora": lora.model_dump(), "sampler": "adapter"}
            agent.pop("shared_base")  # memory, not maths (tests/test_shared_base.py): not the identity
            if agent["lr"] is None:  # the run's: runs older than per-agent rates keep their identity
                agent.pop("lr")
        if "reward" in keep:  # a verifier: its source's hash, not its timeout (a runtime option)
            keep["reward"] = reward_identity(self.reward)
        return keep

    def config_hash(self) -> str:
        """Identity of a run's maths, the hash of :meth:`run_spec`: equal hashes resume (or, complete, reuse)
        each other; runtime options are left out."""
        return hashlib.sha256(json.dumps(self.run_spec(), sort_keys=True).encode()).hexdigest()[:16]

    def check_paths(self) -> None:
        """Existence checks, separate from schema validation so configs can be validated anywhere."""
        if problems := self.path_problems():
            raise ValueError("; ".join(problems))

    def path_problems(self) -> list[str]:
        """What :meth:`check_paths` finds missing, each with its fix."""
        problems = []
        make = "make it with `hacpo data` (synthetic) or `hacpo prepare-data` (MATH, benchmarks)"
        if not Path(self.train_file).is_file():
            problems.append(f"train_file {self.train_file!r} does not exist: {make}")
        if self.val_file and not Path(self.val_file).is_file():
            problems.append(f"val_file {self.val_file!r} does not exist: {make}")
        for i, a in enumerate(self.agents):
            start = (Path(a.path) / "adapter_config.json").is_file()  # a starting adapter: LoRA agents only
            if start and self.agent_adapter(i) is None:
                problems.append(
                    f"agent {a.name!r}: {a.path!r} is a LoRA adapter checkpoint: train it as one "
                    "(`adapter: {lora: …}`, its rank and targets), or every weight of its merged export "
                    "(`hacpo export --merge`)"
                )
            elif not start and not (Path(a.path) / "config.json").is_file():
                problems.append(
                    f"agent {a.name!r}: {a.path!r} is not a Hugging Face model directory (no config.json): "
                    f"download one (`huggingface-cli download ORG/MODEL --local-dir {a.path}`), build a toy "
                    "agent with `hacpo build-agent`, or point `path` at a checkpoint"
                )
        return problems


def format_validation_error(err: ValidationError) -> str:
    lines = [f"  {loc or '(config)'}: {msg}" for loc, msg in problem_lines(TrainConfig, err)]
    return "invalid run config:\n" + "\n".join(lines)


def load_train_config(path_or_dict, unset=(), **overrides) -> TrainConfig:
    """Load a YAML/JSON file (or a dict, or inline JSON text), apply overrides (None: not given), remove the
    keys in ``unset`` (their defaults apply), validate.

    Raises ValueError listing every problem."""
    if isinstance(path_or_dict, dict):
        data = dict(path_or_dict)
    elif isinstance(path_or_dict, str) and path_or_dict.lstrip().startswith("{"):
        data = json.loads(path_or_dict)  # inline JSON, as the workflow's train rules pass it
    else:
        with open(path_or_dict) as f:
            data = yaml.safe_load(f) or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    for key in unset:
        if _field_name(key) is None:
            hint = did_you_mean(TrainConfig, (key,))
            raise ValueError(f"{key}: not a run config key, nothing to unset{hint}")
        data = {k: v for k, v in data.items() if _field_name(k) != _field_name(key)}
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        raise ValueError(format_validation_error(err)) from None


def _field_name(key: str) -> str | None:
    """The TrainConfig field that ``key`` (a field's name or alias) sets, or None."""
    return next((n for n, f in TrainConfig.model_fields.items() if key in (n, f.alias)), None)


def _runtime_options() -> tuple[str, ...]:
    return tuple(n for n, f in TrainConfig.model_fields.items() if (f.json_schema_extra or {}).get("runtime"))


# The runtime options, from the fields' tags (:func:`option`): never part of a run's identity
RUNTIME_OPTIONS = _runtime_options()
