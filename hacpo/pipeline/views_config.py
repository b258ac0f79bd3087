"""The views of a workflow config: its tables (the paper's, in its numbering), its figures and its
scorecards of the paper's claims (docs/statistics.md), with their margins and sequential budgets. The
cross-references between a view and the rest of the config are checked in :mod:`.config`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .schema import Id
from .schema import Strict as _Strict


class _View(_Strict):
    """What every table and figure has, and the names it refers to (each kind says which of its keys name a
    pair, a method or an eval setting: what :class:`ViewChecks` resolves against the config)."""

    title: str | None = None
    # False: built only when named (`snakemake <name>`), never by the default target (nor its runs)
    default: bool = True

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


class _Table(_View):
    note: str | None = None


class AccuracyTable(_Table):
    kind: Literal["accuracy"]
    pairs: list[Id] = Field(min_length=1)
    methods: list[Id] = Field(min_length=1)  # "base" = the untrained models
    eval: Id
    benchmarks: list[Id] | Literal["all"] = "all"
    compare_to: Id | None = None
    seeds: list[int] | None = None
    # also draw it (figures/<name>.png): per agent, each method's mean ± std over seeds and every seed's value
    # (the AVG over its benchmarks, or its one benchmark)
    figure: bool = False

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods) | ({"compare_to": self.compare_to} if self.compare_to else {})

    def eval_refs(self) -> tuple[str, list[str]]:
        return self.eval, [] if self.benchmarks == "all" else list(self.benchmarks)


class HyperTable(_Table):
    kind: Literal["hyperparams"]
    pairs: list[Id] = Field(min_length=1)

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)


class RatioTable(_Table):
    kind: Literal["ratio_stats"]
    pair: Id
    agent: Id
    method: Id = "hacpo"
    seeds: list[int] | None = None

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return {"method": self.method}


class SeedTable(_Table):
    kind: Literal["seeds"]
    pair: Id
    methods: list[Id] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    eval: Id
    benchmark: Id

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)

    def eval_refs(self) -> tuple[str, list[str]]:
        return self.eval, [self.benchmark]


class ProfileTable(_Table):
    kind: Literal["runtime", "memory"]
    pair: Id
    methods: list[Id] = Field(min_length=1)
    seeds: list[int] | None = None

    def pair_refs(self) -> dict[str, str]:
        return {"pair": self.pair}

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)


class AlphaTable(_Table):
    kind: Literal["alpha"]
    pairs: list[Id] = Field(min_length=1)
    alphas: list[float] = Field(min_length=1)
    eval: Id
    benchmark: Id
    seeds: list[int] | None = None

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

    tables: list[Literal[PAPER_TABLES]] = []  # type: ignore[valid-type]
    stated: float | None = None  # the effect the sentence states (0.036 for "+3.6 %")


class Claim(_Strict):
    """One claim of the paper, tested on paired seeds (docs/statistics.md): a − b in ``direction``, where a
    and b are methods on the same pair, agent and seed, or b is a ``threshold``."""

    source: str  # where the paper makes it: "Table 1", "abstract (v2)", ...
    quote: str | None = None
    a: Id  # a method (or "base")
    b: Id | None = None  # a method; or give `threshold`
    threshold: float | None = None
    center: float | None = None  # threshold claims: |a − center| against the threshold (s_homo ≈ 1)
    direction: Literal[">", "<"]
    metric: str  # a benchmark of the eval setting, or one of CLAIM_METRICS
    ratio: bool = False  # a / b − 1 instead of a − b (wall time)
    tables: list[Id] = []  # config tables or figures whose pairs and eval setting it takes when it names none
    pairs: list[Id] | None = None
    agents: list[Id] | None = None  # None: every agent of each pair
    average: bool = False  # also the mean over agents: per pair, and over all its pairs
    eval: Id | None = None
    paper: ClaimPaper = ClaimPaper()
    margin: float | None = Field(
        None, ge=0
    )  # equivalence within ±margin (None: the metric's default; 0: none)

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

    kind: Literal["claims"]
    claims: dict[Id, Claim] = Field(min_length=1)
    seeds: list[int] | None = Field(None, min_length=1)
    margins: dict[
        str, Annotated[float, Field(ge=0)]
    ] = {}  # per metric, the equivalence margin instead of DEFAULT_MARGINS'
    sequential: Sequential | None = None  # seeds added where a claim is still open: `snakemake decide_<name>`
    # other machines' results folders of this same config: their seeds join each row, a stratum per machine
    results_from: list[str] = []

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

    kind: Literal["curves"]
    pairs: list[Id] = Field(min_length=1)
    methods: list[Id] = Field(min_length=1)
    seeds: list[int] | None = None

    def pair_refs(self) -> dict[str, str]:
        return _listed("pairs", self.pairs)

    def method_refs(self) -> dict[str, str]:
        return _listed("methods", self.methods)


class UpdatesFigure(CurvesFigure):
    """The share of cross rows inside the stepwise clip against the update m (``updates.jsonl``): which
    cross rows can carry gradient under each method's mini-batch order. HACPO losses only."""

    kind: Literal["updates"]


class StepsFigure(CurvesFigure):
    """Fields of the runs' ``metrics.jsonl`` against the step (the per-step logs): a panel per agent
    and field, a line per method, the mean over seeds with a 95 % band. ``metrics``: per-agent fields
    (``reward``, ``own_adv_sum``, ``cross_in_bounds_frac``, ``s_hete_mean``, …); ``agents``: only these."""

    kind: Literal["steps"]
    metrics: list[str] = Field(min_length=1)
    agents: list[Id] | None = None


Figure = Annotated[CurvesFigure | UpdatesFigure | StepsFigure, Field(discriminator="kind")]


class ViewChecks:
    """The views' cross-references against the rest of the config (pairs, methods, eval settings,
    benchmarks), as key-path errors: a mixin of :class:`~hacpo.pipeline.config.PipelineConfig`, whose
    lookups (``_missing``, ``method_names``, ``registry_method``, ``benchmarks_of``) it uses."""

    def _views(self) -> list[tuple[str, object]]:
        """Tables and figures under their key paths (a name used by both is refused in _view_problems)."""
        return [
            *((f"tables.{k}", t) for k, t in self.tables.items()),
            *((f"figures.{k}", f) for k, f in self.figures.items()),
        ]

    def _view_problems(self, path: str, t) -> list[str]:
        need, errs, methods = self._missing, [], self.method_names()
        name = path.split(".", 1)[1]
        if path.startswith("figures.") and name in self.tables:
            errs.append(f"{path}: a table has this name too; rename one (each name is a snakemake target)")
        for where, p in t.pair_refs().items():
            errs += need(f"{path}.{where}", p, self.pairs, "pair")
        for where, m in t.method_refs().items():  # "base", the untrained models, only in a list of methods
            known = {*methods, "base"} if where.startswith("methods.") else methods
            errs += need(f"{path}.{where}", m, known, "method")
        if (refs := t.eval_refs()) is not None:
            setting, wanted = refs
            errs += need(f"{path}.eval", setting, self.eval_settings, "eval setting")
            allowed = set(self.benchmarks_of(setting)) if setting in self.eval_settings else set()
            for b in wanted:
                errs += need(f"{path}.benchmark", b, allowed, f"benchmark of eval setting {setting!r}")
        if isinstance(t, RatioTable):
            if t.pair in self.pairs:
                errs += need(f"{path}.agent", t.agent, self.pairs[t.pair].agents, f"agent of pair {t.pair!r}")
            if t.method in methods and not self.registry_method(t.method).cross_rows:
                errs.append(f"{path}.method: {t.method!r} trains on no peer rows, so it has no s_hete")
        if isinstance(t, ClaimsTable):
            for cid, c in t.claims.items():
                errs += self._claim_problems(f"{path}.claims.{cid}", c)
        if isinstance(t, UpdatesFigure):
            for i, m in enumerate(t.methods):
                if m in methods and self.registry_method(m).loss != "hacpo":
                    errs.append(f"{path}.methods.{i}: {m!r} has no stepwise clip (a HACPO loss has)")
        return errs

    def _claim_problems(self, path: str, c: Claim) -> list[str]:
        """A claim's names (methods, pairs, agents, tables, eval setting, metric) against the config."""
        need, errs, methods = self._missing, [], {*self.method_names(), "base"}
        for key in ("a", "b"):
            if getattr(c, key) is not None:
                errs += need(f"{path}.{key}", getattr(c, key), methods, "method")
        for i, name in enumerate(c.tables):
            errs += need(f"{path}.tables.{i}", name, {**self.tables, **self.figures}, "table or figure")
        for i, p in enumerate(c.pairs or []):
            errs += need(f"{path}.pairs.{i}", p, self.pairs, "pair")
        if errs:
            return errs
        pairs = self.claim_pairs(c)
        if not pairs:
            errs.append(f"{path}: no pairs: give `pairs:`, or `tables:` naming tables or figures with pairs")
        for i, agent in enumerate(c.agents or []):
            for p in pairs:
                errs += need(f"{path}.agents.{i}", agent, self.pairs[p].agents, f"agent of pair {p!r}")
        eval_metric = c.metric == "avg" or c.metric in self.benchmarks
        if not eval_metric and c.metric not in CLAIM_METRICS:
            known = ", ".join([*CLAIM_METRICS, *self.benchmarks])
            errs.append(f"{path}.metric: {c.metric!r} is not a benchmark or a claim metric; known: {known}")
        setting = self.claim_eval(c)
        if eval_metric:
            if setting is None:
                errs.append(
                    f"{path}.eval: metric {c.metric!r} needs an eval setting (`eval:`, or `tables:` "
                    "naming a table with one)"
                )
            elif setting not in self.eval_settings:
                errs += need(f"{path}.eval", setting, self.eval_settings, "eval setting")
            elif c.metric != "avg":
                errs += need(
                    f"{path}.metric",
                    c.metric,
                    self.benchmarks_of(setting),
                    f"benchmark of eval setting {setting!r}",
                )
        sides = [m for m in (c.a, c.b) if m is not None]
        if c.metric in ("s_homo", "s_hete") and not self.registry_method(c.a).cross_rows:
            errs.append(f"{path}.a: {c.a!r} trains on no peer rows, so it has no {c.metric}")
        if not eval_metric and "base" in sides:
            errs.append(f"{path}: 'base' (the untrained model) has evaluations only, not {c.metric!r}")
        if c.metric == "val_last_third" and self.val_data is None:
            errs.append(f"{path}.metric: 'val_last_third' needs in-training validation (`val_data:`)")
        if c.metric == "wall_time" and (c.agents or c.average):
            errs.append(f"{path}: wall time is one number per pair and seed: drop `agents:` / `average:`")
        return errs

    def claim_pairs(self, c: Claim) -> list[str]:
        """A claim's pairs: its own, else those of the tables it names (in order, each once), so that a pair
        added to such a table brings the claim with it."""
        if c.pairs:
            return list(c.pairs)
        out: dict[str, None] = {}
        for name in c.tables:
            t = self.tables.get(name) or self.figures[name]
            out.update(dict.fromkeys(t.pair_refs().values()))
        return list(out)

    def claim_eval(self, c: Claim) -> str | None:
        """A claim's eval setting: its own, else that of the first table it names that has one."""
        if c.eval:
            return c.eval
        views = [self.tables.get(n) or self.figures[n] for n in c.tables]
        return next((refs[0] for v in views if (refs := v.eval_refs()) is not None), None)
