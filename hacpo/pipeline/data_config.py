"""The data of a workflow config: its datasets (synthetic, a registry's, or a user's own file or Hub
dataset), the benchmarks a checkpoint is scored on and the eval settings that score it, and the SFT data of
warmed models. Part of the schema of :mod:`hacpo.pipeline.config`, which checks the cross-references."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hacpo.data.own import FieldMap, HubDataset
from hacpo.eval.run import Decoding
from hacpo.reward.custom import CustomReward

from .schema import Id
from .schema import Strict as _Strict


class Synthetic(_Strict):
    """Arithmetic problems generated here (:mod:`hacpo.data.synthetic`): each family's problems are split into
    disjoint train, dev and test lists that depend only on ``seed`` and the family; every size is per family.
    Entries with the same ``families``, ``seed``, ``n_test`` and ``n_dev`` but another ``split`` are disjoint
    parts of one draw."""

    families: list[str] = Field(
        ["add2"],
        description="the problem families, concatenated in the order given: `add2`, `add3`, `sub2`, `mul1`, "
        "`chain3`, `frac`, `word`",
    )
    seed: int = Field(0, description="the draw's seed; a family's splits depend only on it and the family")
    split: Literal["train", "dev", "test"] = Field(
        ..., description="which of the three splits this file holds"
    )
    n_test: int = Field(1000, ge=1, description="test problems per family")
    n_dev: int = Field(200, ge=1, description="dev problems per family")
    n_train: int | None = Field(
        None,
        description="train problems per family; null: every remaining problem of an enumerable family "
        "(`add2`, `sub2`, `mul1`, `frac`), 20,000 of a sampled one (`add3`, `chain3`, `word`)",
    )

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

    synthetic: Synthetic | None = Field(None, description="arithmetic problems generated here")
    registry: str | None = Field(
        None,
        description="a dataset of `hacpo.data.registry` (e.g. `math500`, `gsm8k`) at its pinned Hub "
        "revision; its records get the paper's prompt (docs/datasets.md)",
    )
    local: str | None = Field(
        None,
        description="a JSONL, Parquet or CSV file of your own (by its extension); every field not mapped by "
        "`fields` becomes the record's `metadata`, which a verifier of your own receives",
    )
    hub: HubDataset | None = Field(
        None,
        description="a Hub dataset of your own at a pinned commit, read once into the data cache",
    )
    fields: FieldMap | None = Field(
        None,
        description="`local:` and `hub:` only: which of the file's fields are the problem, the answer and "
        "the id; unset: fields named `problem`, `answer` (and `id`)",
    )
    file: str | None = Field(
        None,
        description="`registry:` only: a local copy of the dataset, read before the cache and the Hub",
    )
    check_count: bool = Field(
        True,
        description="`registry:` only: check the dataset's canonical record count (before `limit`); false "
        "for a `file` that is a deliberate subset",
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="`registry:`, `local:` and `hub:` only: keep the first N records (a fixed subset, e.g. "
        "GSM8K[:30]); unset: all",
    )

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


class Benchmark(_Strict):
    """One benchmark column of the tables: a dataset, how answers are drawn and scored, and what is
    reported."""

    dataset: Id = Field(..., description="the `datasets` entry it evaluates on")
    label: str | None = Field(None, description="its column heading in tables; unset: the benchmark's key")
    metric: str = Field(
        "avg@1",
        pattern=r"^(avg|pass)@\d+$",
        description="what tables report: `avg@k` (the mean reward over k samples per problem: accuracy, "
        "partial credit its share) or `pass@k` (unbiased pass@k, a sample correct at full credit, reward 1); "
        "k at most `sampling.k`",
    )
    # the evaluation's own type: one check of greedy/k/temperature/top_p
    sampling: Decoding = Field(
        Decoding(),
        description="how answers are drawn: `{greedy, k, temperature, top_p}`; greedy gives one answer per "
        "problem (k = 1), `greedy: false` samples k",
    )
    paper: str | None = Field(
        None,
        description="the paper's key for this benchmark (`math500`, `math`, `gsm8k`, `aime2025`, `amc23`, "
        "`minerva`, `olympiad`), for the paper's values beside ours; unset: none",
    )
    also_pass_at: list[int] = Field(
        [],
        description="extra unbiased pass@k values (1 ≤ k ≤ `sampling.k`) in every summary, e.g. `[30]` for "
        'AIME\'s "best@30" reading',
    )
    reward: Literal["math_verify", "hendrycks"] | CustomReward = Field(
        "math_verify",
        description="the scorer: `math_verify`, `hendrycks`, or a verifier of your own "
        '(`{function: "pkg.module:name"}` or `{file: PATH, name: NAME}`; an edit re-evaluates)',
    )
    note: str | None = Field(None, description="a note printed under every table that shows the benchmark")

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
    """How checkpoints are evaluated: one evaluation job is one checkpoint under one setting, over the
    setting's benchmarks. ``scorer_workers`` and ``batch_tokens`` (and ``openrlhf.eval``) are runtime options:
    changing them reruns no evaluation."""

    max_new_tokens: int = Field(ge=1, description="the most tokens generated per answer")
    prompt_style: Literal["compact", "paper"] = Field(
        "compact",
        description="how a problem is put: `compact` (the bare problem, e.g. `12+34=`) or `paper` (the "
        "problem, then the paper's instruction to think step by step and box the answer)",
    )
    benchmarks: list[Id] | Literal["all"] = Field(
        "all", description="the `benchmarks` it evaluates: `all`, or a list of their keys"
    )
    # 0 is cheapest for short toy answers, which mostly take math-verify's integer fast path
    scorer_workers: int = Field(
        0,
        ge=0,
        description="math-verify worker processes (hard per-item timeouts); 0: scored in the job's own "
        "process (signal timeouts), cheapest for short answers",
    )
    # local engine only (vLLM sizes its own batches and runs the checkpoint's dtype): `hacpo eval
    # --batch-tokens` and `--precision`
    batch_tokens: int | None = Field(
        None,
        ge=1,
        description="`engine: local` only: prompt plus new tokens generated at once (the KV cache's size); "
        "unset: 256 problems per batch",
    )
    precision: Literal["fp32", "bf16", "auto"] | None = Field(
        None,
        description="`engine: local` only: the weights' and KV cache's precision (`auto`: bf16 where the CPU "
        "runs it natively or on CUDA); unset: fp32",
    )

    LOCAL_ONLY: ClassVar[tuple[str, ...]] = ("batch_tokens", "precision")  # passed to the local generator


class SftData(_Strict):
    """The data of the warm-ups (``warmup:`` and ``warm:`` models)."""

    train: Id = Field(..., description="the `datasets` entry the warm-ups train on")
    dev: Id = Field(
        ..., description="the `datasets` entry whose first problems give a warm-up's dev accuracy"
    )
