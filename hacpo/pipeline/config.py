"""The workflow config (``config/*.yaml``): typed, validated, cross-referenced — before any job runs.

One pydantic model is the schema (no second JSON schema to keep in sync): :class:`PipelineConfig` here,
over its parts in :mod:`.data_config`, :mod:`.agents_config` and :mod:`.views_config`, all importable from
here. Every error names its key path, e.g. ``tables.table1.pairs.2: unknown pair 'foo'; known: size,
state``. A new model combination is one ``pairs:`` entry (plus its models); tables list the pairs and
methods they show.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from hacpo.algo import get_method
from hacpo.config import LoraSpec, RunLogging
from hacpo.engine_options import OpenRLHFOptions
from hacpo.validation import problem_lines

from .agents_config import *  # noqa: F403 (the schema's parts, read from here too)
from .agents_config import CheckedTrainOverrides, MethodEntry, Model, Pair
from .data_config import *  # noqa: F403
from .data_config import Benchmark, Dataset, EvalSetting, SftData
from .schema import ID, Id  # noqa: F401 (ID: the pattern, for other modules)
from .schema import Strict as _Strict
from .view_checks import ViewChecks
from .views_config import *  # noqa: F403
from .views_config import Figure, Table


class ConfigError(ValueError):
    """A workflow config that cannot run; the message lists every problem with its key path."""


class ReportSettings(_Strict):
    paper_delta: bool = Field(
        False,
        description="print ours − paper beside each paper value; set it only where the config reproduces the "
        "paper's setting",
    )
    note: str = Field("", description="a note added under every table")


class Retention(_Strict):
    """What a results folder keeps of a run once it is trained (docs/guide/watching.md, "Disk"). A run keeps
    its records, logs, profile and evaluations always; its weights are only what its evaluations read."""

    weights: Literal["keep", "after_eval"] | None = Field(
        None,
        description="`after_eval`: a run's weights (checkpoints) are removed once every evaluation the "
        "config asks of it is written (a run no table evaluates: once trained); an evaluation asked later "
        "stops with the run named and how to train it again. `keep`: every run keeps them. Unset: "
        "`after_eval` where a model is a pretrained one (`hub:`, `source:`, `warm:`: 0.5 GB and more a run), "
        "`keep` where every model is a tiny `warmup:` agent (megabytes)",
    )


class PipelineConfig(ViewChecks, _Strict):
    engine: Literal["local", "openrlhf"] = Field(
        "local",
        description="`local` (HACPO's own engine: a CPU, or one GPU; tiny or small models) or `openrlhf` "
        "(GPUs: single-agent runs on OpenRLHF's trainer, joint runs on HACPO's driver over OpenRLHF, "
        "evaluation with vLLM)",
    )
    openrlhf: OpenRLHFOptions = Field(
        OpenRLHFOptions(),
        description="`engine: openrlhf` only: the OpenRLHF and vLLM options of every run and evaluation "
        "(a run's GPUs are its model's or pair's `gpus`); runtime options, never part of a run's identity",
    )
    seeds: list[int] = Field(
        min_length=1, description="the seeds of every table and figure that sets no `seeds` of its own"
    )
    train_data: Id = Field(..., description="the `datasets` entry RL training draws its prompts from")
    val_data: Id | None = Field(
        None,
        description="the `datasets` entry of in-training greedy validation (the training curves); unset: no "
        "validation",
    )
    sft: SftData | None = Field(
        None, description="the warm-ups' data; required where a model is `warmup:` or `warm:`"
    )
    datasets: dict[Id, Dataset] = Field(
        ..., description="the data files, by name: `<results>/data/<name>.jsonl`"
    )
    models: dict[Id, Model] = Field(..., description="the base agents, by name")
    pairs: dict[Id, Pair] = Field(..., description="the model combinations, by name; a new pair is one entry")
    methods: dict[Id, MethodEntry] = Field(
        {},
        description="named run recipes, a registry method with overrides; the name is a run's path part and "
        "a table key only. Registry methods need no entry; an α-ablation table adds its `hacpo_alpha<α>` "
        "ones",
    )
    training: CheckedTrainOverrides = Field(
        description="run-config keys for every run, each value checked before any job; a model's or pair's "
        "`train`, then the pair's `hacpo` (HACPO runs only), then a method entry's `train` override them. "
        "HACPO's `alpha`, `cross_clip_low`, `delta_step` are refused here"
    )
    benchmarks: dict[Id, Benchmark] = Field(..., description="the benchmarks, by name")
    eval_settings: dict[Id, EvalSetting] = Field(
        ..., description="the evaluation settings, by name; tables name the one their columns come from"
    )
    tables: dict[Id, Table] = Field({}, description="the tables, by name, each chosen by its `kind`")
    figures: dict[Id, Figure] = Field({}, description="the figures, by name, each chosen by its `kind`")
    report: ReportSettings = Field(
        ReportSettings(), description="how tables show the paper's values, and a note"
    )
    logging: RunLogging = Field(
        RunLogging(),
        description="every run's live curves (TensorBoard, W&B); a runtime option: changing it retrains "
        "nothing",
    )
    retention: Retention = Field(
        Retention(), description="what a run keeps once it is trained and evaluated: its weights or not"
    )
    results_dir: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="this config's results folder; unset: `results/<name of the (last) config file>`, so "
        "that two configs never share files",
    )

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
        return errs + self._shared_base_problems() + self._lora_warm_problems()

    def _shared_base_problems(self) -> list[str]:
        """A ``shared_base:`` model names a model with weights of its own, and trains a LoRA adapter."""
        errs, run_lora = [], (self.training.get("adapter") or {}).get("lora")
        for name, m in self.models.items():
            if m.shared_base is None:
                continue
            base = self.models.get(m.shared_base)
            if base is None or base.adapter_base is not None:
                own = ", ".join(k for k, v in self.models.items() if v.adapter_base is None)
                errs.append(
                    f"models.{name}.shared_base: {m.shared_base!r} is not a model of this config with "
                    f"weights of its own (`hub:`, `warmup:`, `source:` or `warm:`); those are: {own}"
                )
            lora = m.adapter.lora if m.adapter is not None else run_lora
            if lora is None:
                errs.append(
                    f"models.{name}.shared_base: a model on a shared base trains a LoRA adapter (the base "
                    "stays frozen): give it `adapter: {lora: {rank: 8}}` (or every run `training.adapter`)"
                )
            if self.engine != "local":
                errs.append(
                    f"models.{name}.shared_base: only the local engine holds one base for several agents "
                    f"(engine: {self.engine} loads each its own): give it the base's own source instead"
                )
        return errs

    def _lora_warm_problems(self) -> list[str]:
        """A LoRA warm-up (``warm: {lora: …}``) is an adapter: its runs go on training that adapter, so a
        LoRA its model entry or ``training.adapter`` declares must be the same one, and full fine-tuning of
        it is refused; only the local engine starts a run from an adapter."""
        errs, run_adapter = [], self.training.get("adapter")
        for name, m in self.models.items():
            if m.warm_lora is None:
                continue
            warmed = m.warm_lora.model_dump()
            declared = m.adapter.model_dump() if m.adapter is not None else run_adapter
            where = f"models.{name}.adapter" if m.adapter is not None else "training.adapter"
            if declared is not None and declared.get("lora") is None:
                errs.append(
                    f"{where}: models.{name} is a LoRA warm-up (an adapter, its base frozen) and cannot "
                    f"train every weight: give it `adapter: {{lora: {warmed}}}` or warm it without `lora:`"
                )
            elif declared is not None and LoraSpec.model_validate(declared["lora"]).model_dump() != warmed:
                errs.append(
                    f"{where}: models.{name}'s runs train its warm-up's adapter, "
                    f"{warmed}, not {declared['lora']}: make them the same"
                )
            if self.engine != "local":
                errs.append(
                    f"models.{name}.warm.lora: only the local engine starts a run from an adapter (engine: "
                    f"{self.engine}): warm it without `lora:`"
                )
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
        errs += [
            f"models.{name}.lr: the local engine's (engine: openrlhf trains every agent at the run's lr): "
            "set `lr` in the model's or the pair's `train:` instead"
            for name, m in self.models.items()
            if m.lr is not None
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
    @property
    def release_weights(self) -> bool:
        """Whether a run's weights go once its evaluations are written (:class:`Retention`, its default)."""
        if self.retention.weights is not None:
            return self.retention.weights == "after_eval"
        return any(m.warmup is None for m in self.models.values())

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
    for loc, msg in problem_lines(PipelineConfig, err):
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
