"""The views of a workflow config: its tables (the paper's, in its numbering), its figures and its
scorecards of the paper's claims (docs/statistics.md), with their margins and sequential budgets. The
cross-references between a view and the rest of the config are checked in :mod:`.view_checks`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .schema import Id
from .schema import Strict as _Strict


class _View(_Strict):
    """What every table and figure has, and the names it refers to (each kind says which of its keys name a
    pair, a method or an eval setting: what :class:`~.view_checks.ViewChecks` resolves against the config)."""

    title: str | None = Field(
        None,
        description="The caption's title; unset: the paper's own for the names `table1`…`table9`, "
        "`alpha_ablation`, `figure2` and `figure3`, the scorecard's for `kind: claims`, else the name.",
    )
    default: bool = Field(
        True,
        description="`false`: built only when named (`snakemake <name>`); the default target neither builds "
        "it nor trains runs for it.",
    )

    def pair_refs(self) -> dict[str, str]:
        """Key path (under the view) → the pair it names."""
        return {}

    def method_refs(self) -> dict[str, str]:
        """Key path → the method it names; "base" (the untrained models) only in a ``methods`` list."""
        return {}

    def eval_refs(self) -> tuple[str, list[str]] | None:
        """The eval setting the view reads and the benchmarks it names there ([] for all), or None."""
        return None


def _listed(key: str, names) -> dict[str, str]:
    return {f"{key}.{i}": n for i, n in enumerate(names or [])}


# Meanings that several views share word for word.
_SEEDS = "The seeds whose runs it reads (trained if missing); unset: the config's `seeds`."
_EVAL = "The eval setting (a key of `eval_settings`) whose evaluations it reads."
_BENCHMARK = "The benchmark of that eval setting it shows."


class _Table(_View):
    note: str | None = Field(
        None, description="Text added to the caption, before `report.note` and the table's own notes."
    )


class AccuracyTable(_Table):
    kind: Literal["accuracy"] = Field(
        description="`accuracy`: benchmark accuracy per agent and method, a block per pair, with an AVG "
        "column when it shows several benchmarks (the paper's Tables 1, 2, 3 and 9)."
    )
    pairs: list[Id] = Field(
        min_length=1, description="The pairs whose agents are its rows, a block per pair."
    )
    methods: list[Id] = Field(
        min_length=1,
        description="The methods, a row each per agent; `base`: the untrained model (evaluated once).",
    )
    eval: Id = Field(description=_EVAL)
    benchmarks: list[Id] | Literal["all"] = Field(
        "all", description="The benchmarks of that eval setting to show, a column each; `all`: every one."
    )
    compare_to: Id | None = Field(
        None,
        description="Another method of `methods`: its Markdown and LaTeX add, in brackets, HACPO − that "
        "method (ours) to the `hacpo` rows.",
    )
    seeds: list[int] | None = Field(None, description=_SEEDS)
    figure: bool = Field(
        False,
        description="Also draw it (`figures/<name>.png`): per agent, each method's mean ± std over seeds "
        "and every seed's value (of the AVG, or of its one benchmark).",
    )

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods) | ({"compare_to": self.compare_to} if self.compare_to else {})

    def eval_refs(self) -> tuple[str, list[str]]:
        return self.eval, [] if self.benchmarks == "all" else list(self.benchmarks)


class HyperTable(_Table):
    kind: Literal["hyperparams"] = Field(
        description="`hyperparams`: each pair's HACPO α, 1−δ and δ_step (`pairs.<pair>.hacpo`) beside the "
        "paper's (Table 4)."
    )
    pairs: list[Id] = Field(min_length=1, description="The pairs, a row each.")

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)


class RatioTable(_Table):
    kind: Literal["ratio_stats"] = Field(
        description="`ratio_stats`: the mean, max, min and range over all steps (seeds pooled) of one "
        "agent's s_homo and s_hete, its mean sequence ratio on its own and on cross rows (Table 5)."
    )
    pair: Id = Field(description="The pair whose joint runs it reads.")
    agent: Id = Field(description="The agent of `pair` whose ratios it shows.")
    method: Id = Field(
        "hacpo", description="The method whose runs it reads; one that trains on its peers' (cross) rows."
    )
    seeds: list[int] | None = Field(None, description=_SEEDS)

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return {"method": self.method}


class SeedTable(_Table):
    kind: Literal["seeds"] = Field(
        description="`seeds`: one benchmark's accuracy per agent and method, a column per seed (Table 6)."
    )
    pair: Id = Field(description="The pair whose agents are its rows.")
    methods: list[Id] = Field(min_length=1, description="The methods, a row each per agent.")
    seeds: list[int] = Field(min_length=1, description="The seeds, a column each (trained if missing).")
    eval: Id = Field(description=_EVAL)
    benchmark: Id = Field(description=_BENCHMARK)

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)

    def eval_refs(self) -> tuple[str, list[str]]:
        return self.eval, [self.benchmark]


class ProfileTable(_Table):
    kind: Literal["runtime", "memory"] = Field(
        description="`runtime`: wall-clock seconds per agent and in total (Table 7); `memory`: peak GPU "
        "memory, or process RSS without a GPU (Table 8). Both end with a column relative to `gspo`."
    )
    pair: Id = Field(description="The pair whose agents are its columns.")
    methods: list[Id] = Field(
        min_length=1, description="The methods, a row each; include `gspo`, the relative column's reference."
    )
    seeds: list[int] | None = Field(None, description=_SEEDS)

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)


class AlphaTable(_Table):
    kind: Literal["alpha"] = Field(
        description="`alpha`: one benchmark's accuracy per agent under each HACPO α (the α ablation)."
    )
    pairs: list[Id] = Field(min_length=1, description="The pairs whose agents are its rows.")
    alphas: list[float] = Field(
        min_length=1,
        description="The α values, a column each: `hacpo` with `alpha` overridden (method "
        "`hacpo_alpha<α>` unless the config defines one); the pair's own α reuses its HACPO run.",
    )
    eval: Id = Field(description=_EVAL)
    benchmark: Id = Field(description=_BENCHMARK)
    seeds: list[int] | None = Field(None, description=_SEEDS)

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)

    def eval_refs(self) -> tuple[str, list[str]]:
        return self.eval, [self.benchmark]


# What a claim can measure besides an eval benchmark (docs/statistics.md, "What a claim measures").
CLAIM_METRICS = {
    "avg": "the mean over the eval setting's benchmarks (the AVG column)",
    "val_last_third": "mean in-training validation accuracy over the last third of validation points",
    "wall_time": "the run's wall-clock seconds (single-agent methods: summed over the pair's agents)",
    "s_homo": "the mean over steps of the agent's s_homo_mean (Table 5)",
    "s_hete": "the mean over steps of the agent's s_hete_mean (Table 5)",
}
# The practical margin m of an equivalence verdict, per metric (docs/statistics.md): a difference whose
# interval lies inside ±m is "equivalent". Accuracies: 0.02 (6 of 300 problems); wall time (a ratio): 5 %.
# Statistics of one run (s_homo, s_hete) are compared with a threshold and have none.
DEFAULT_MARGINS = {"wall_time": 0.05, "s_homo": None, "s_hete": None}
ACCURACY_MARGIN = 0.02
PAPER_TABLES = ("table1", "table2", "table3", "table5", "table6", "table7", "table8", "table9",
                "alpha_ablation")  # fmt: skip


class ClaimPaper(_Strict):
    """Where the paper's own effect comes from: its printed tables (``paper_results.csv``), tried in order
    for each pair's block, and what its sentence states, when it states a number."""

    tables: list[Literal[PAPER_TABLES]] = Field(  # type: ignore[valid-type]
        [],
        description="The paper's printed tables to take its effect from, in order: the first that prints "
        "the row's numbers gives it; empty: the row shows no paper effect.",
    )
    stated: float | None = Field(
        None,
        description='The effect the claim\'s sentence states (0.036 for "+3.6 %"); a note checks it against '
        "the paper's tables.",
    )


class Claim(_Strict):
    """One claim of the paper, tested on paired seeds (docs/statistics.md): a − b in ``direction``, where a
    and b are methods on the same pair, agent and seed, or b is a ``threshold``."""

    source: str = Field(
        description='Where the paper makes the claim ("Table 1", "abstract (v2)"); the scorecard shows it.'
    )
    quote: str | None = Field(None, description="The paper's wording of the claim, for reference.")
    a: Id = Field(description="Side a: a method, or `base` (the untrained model: evaluation metrics only).")
    b: Id | None = Field(None, description="Side b, a method; give either `b` or `threshold`, not both.")
    threshold: float | None = Field(
        None,
        description="A number to compare a with instead of `b`; needed for `s_homo` and `s_hete`, refused "
        "with `ratio`.",
    )
    center: float | None = Field(
        None, description="Threshold claims only: compare |a − center| with `threshold` (s_homo ≈ 1)."
    )
    direction: Literal[">", "<"] = Field(
        description="`>` or `<`: the sign the paper states for a − b (or a − `threshold`)."
    )
    metric: str = Field(
        description="What is compared: a benchmark of the eval setting, `avg`, `val_last_third`, "
        "`wall_time`, `s_homo` or `s_hete`."
    )
    ratio: bool = Field(
        False, description="Compare a / b − 1 with 0 instead of a − b (wall time); two-method claims only."
    )
    tables: list[Id] = Field(
        [],
        description="Config tables or figures whose pairs and eval setting it takes when it names no "
        "`pairs` or `eval`, so a pair added to them gets the claim.",
    )
    pairs: list[Id] | None = Field(
        None, description="The pairs it is tested on; unset: those of its `tables`."
    )
    agents: list[Id] | None = Field(
        None,
        description="The agents it is tested on in each pair; unset: every agent. Not with `wall_time`, "
        "which is one number per pair.",
    )
    average: bool = Field(
        False,
        description="Also test each pair's mean over its agents and the mean over all its pairs' agents. "
        "Not with `wall_time`.",
    )
    eval: Id | None = Field(
        None,
        description="The eval setting of a benchmark or `avg` metric; unset: that of the first of its "
        "`tables` that has one.",
    )
    paper: ClaimPaper = Field(
        ClaimPaper(), description="Where the paper's own effect, shown beside ours, comes from."
    )
    margin: float | None = Field(
        None,
        ge=0,
        description='Its equivalence margin m (an interval inside ±m is "equivalent"); unset: the table\'s '
        "`margins` entry for its metric, else 0.02 for accuracies and 0.05 for `wall_time` (none for "
        "threshold claims); 0: none.",
    )

    @model_validator(mode="after")
    def _one_other_side(self):
        if (self.b is None) == (self.threshold is None):
            raise ValueError("give exactly one of `b:` (a method) or `threshold:` (a number)")
        if self.center is not None and self.threshold is None:
            raise ValueError("`center:` applies to threshold claims only")
        if self.ratio and self.threshold is not None:
            raise ValueError("`ratio: true` compares two methods; a threshold claim compares a − threshold")
        if self.metric in ("s_homo", "s_hete") and self.threshold is None:
            raise ValueError(f"metric {self.metric!r} is one run's statistic: compare it to a `threshold:`")
        return self


class Sequential(_Strict):
    """Seeds added in blocks where a claim is still open (``snakemake decide_<table>``, docs/statistics.md):
    the table's ``seeds`` are the first look; each further look adds ``block`` seeds to the rows still
    undecided, up to ``max`` seeds a row. The intervals are the group-sequential design's, whose boundaries
    ``spending`` spreads α over the planned looks, so the error rate holds for every look taken."""

    block: int = Field(2, ge=1, description="seeds added to each open row at a look")
    max: int = Field(ge=1, description="the most seeds a row gets; a row at it is closed, decided or not")
    spending: Literal["pocock", "obrien_fleming"] = Field(
        "pocock", description="the Lan–DeMets α-spending function over the planned looks"
    )
    added_seeds: list[int] | None = Field(
        None, description="the seeds added, in order (default: the smallest non-negative integers not used)"
    )
    max_hours: float | None = Field(
        None,
        gt=0,
        description="a cap on the added seeds' training time, hours (their runs' profile wall time, summed); "
        "once a look finds it spent no row gets more seeds; stopping early keeps the error rate",
    )


class ClaimsTable(_Table):
    """The scorecard: each claim on paired seeds, with an interval and a verdict (docs/statistics.md).
    ``seeds`` unset: each row uses the seeds the default target's runs already have (at least the config's
    first); set: every row trains and evaluates those seeds."""

    kind: Literal["claims"] = Field(
        description="`claims`: the scorecard of the paper's claims, each tested on paired seeds."
    )
    claims: dict[Id, Claim] = Field(min_length=1, description="The claims, by id.")
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="Unset: each row uses the seeds the default target's runs already have, training "
        "nothing; set: every row trains and evaluates these (the first look of `sequential`).",
    )
    margins: dict[str, Annotated[float, Field(ge=0)]] = Field(
        {},
        description="Per metric, the equivalence margin instead of the default (0.02 for accuracies, 0.05 "
        "for `wall_time`; 0: none); a claim's own `margin` comes first.",
    )
    sequential: Sequential | None = Field(
        None,
        description="`snakemake decide_<name>` adds seeds, a block a look, to the rows still undecided; "
        "needs `seeds`.",
    )
    results_from: list[str] = Field(
        [],
        description="Other machines' results folders of this same config: their runs of the same seeds "
        "join each row, a stratum per machine.",
    )

    @model_validator(mode="after")
    def _sequential_needs_seeds(self):
        if self.sequential is None:
            return self
        if not self.seeds:
            raise ValueError("`sequential:` adds seeds to the table's `seeds:` (its first look): set them")
        if self.sequential.max < len(self.seeds):
            raise ValueError(
                f"sequential.max ({self.sequential.max}) is below the first look's {len(self.seeds)} seeds"
            )
        added = self.sequential.added_seeds
        if added is not None and (set(added) & set(self.seeds) or len(set(added)) != len(added)):
            raise ValueError("sequential.added_seeds must be new seeds, each once")
        if added is not None and len(added) < self.sequential.max - len(self.seeds):
            need = self.sequential.max - len(self.seeds)
            raise ValueError(
                f"sequential.added_seeds lists {len(added)} seeds; max {self.sequential.max} needs {need}"
            )
        return self

    def margin(self, c: Claim) -> float | None:
        """A claim's equivalence margin: its own, the table's for its metric, or the metric's default."""
        if c.margin is not None:
            return c.margin or None
        if c.metric in self.margins:
            return self.margins[c.metric] or None
        return DEFAULT_MARGINS.get(c.metric, ACCURACY_MARGIN) if c.threshold is None else None

    def seed_order(self) -> list[int]:
        """Every seed a row may get, in look order: the table's, then the added ones."""
        seeds = list(self.seeds or [])
        if self.sequential is None:
            return seeds
        added = self.sequential.added_seeds
        if added is None:
            added = [n for n in range(self.sequential.max + len(seeds)) if n not in seeds]
        return seeds + added[: self.sequential.max - len(seeds)]

    def look_sizes(self) -> list[int]:
        """The seeds a row has at each look: ``seeds``, then ``block`` more, up to ``max``."""
        if self.sequential is None:
            return [len(self.seeds or [])]
        start, q = len(self.seeds), self.sequential
        return list(range(start, q.max, q.block)) + [q.max]


Table = Annotated[
    AccuracyTable | HyperTable | RatioTable | SeedTable | ProfileTable | AlphaTable | ClaimsTable,
    Field(discriminator="kind"),
]


class CurvesFigure(_View):
    """Validation accuracy against the step, a line per method, a panel per agent of each pair."""

    kind: Literal["curves"] = Field(
        description="`curves`: greedy validation accuracy (on `val_data`) against the training step (the "
        "paper's Figures 2 and 3)."
    )
    pairs: list[Id] = Field(min_length=1, description="The pairs, a panel per agent of each.")
    methods: list[Id] = Field(
        min_length=1, description="The methods, a line each: the mean with a 95 % bootstrap band."
    )
    seeds: list[int] | None = Field(None, description=_SEEDS)

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)


class UpdatesFigure(CurvesFigure):
    """The share of cross rows inside the stepwise clip against the update m (``updates.jsonl``): which
    cross rows can carry gradient under each method's mini-batch order. HACPO losses only."""

    kind: Literal["updates"] = Field(
        description="`updates`: the share of cross rows inside the stepwise clip [lo_m, 1] at each update m "
        "(`updates.jsonl`); methods with a HACPO loss only."
    )


class StepsFigure(CurvesFigure):
    """Fields of the runs' ``metrics.jsonl`` against the step (the per-step logs): a panel per agent
    and field, a line per method, the mean over seeds with a 95 % band. ``metrics``: per-agent fields
    (``reward``, ``own_adv_sum``, ``cross_in_bounds_frac``, ``s_hete_mean``, …); ``agents``: only these."""

    kind: Literal["steps"] = Field(
        description="`steps`: per-agent fields of the runs' `metrics.jsonl` against the step, a panel per "
        "agent and field."
    )
    metrics: list[str] = Field(
        min_length=1,
        description="The fields to plot: `reward`, `own_adv_sum`, `cross_adv_sum`, `cross_in_bounds_frac`, "
        "`s_hete_mean`, …",
    )
    agents: list[Id] | None = Field(None, description="Only these agents' panels; unset: every agent.")


Figure = Annotated[CurvesFigure | UpdatesFigure | StepsFigure, Field(discriminator="kind")]
