"""The specs that cross a workflow rule, declared once: the workflow builds them from the validated config
(:meth:`hacpo.pipeline.Pipeline.table`, :meth:`~hacpo.pipeline.Pipeline.figure`,
:meth:`~hacpo.pipeline.Pipeline.eval_settings`), the job reads them (:func:`hacpo.report.tables.build_table`,
:func:`hacpo.report.figures.write_figure`, :func:`hacpo.eval.evaluate_setting`). Both sides validate through
these models, so a key the other side does not know, or one a kind needs and lacks, fails naming its path
before any file is read. (A run's spec is :class:`hacpo.config.TrainConfig`.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hacpo.reward.custom import CustomReward

TableKind = Literal["accuracy", "hyperparams", "ratio_stats", "seeds", "runtime", "memory", "alpha", "claims"]
FigureKind = Literal["curves", "updates", "steps"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Column(_Spec):
    """A value column: ``key`` names it in each row's files; the rest says how to label and compare it."""

    key: str
    label: str | None = None
    metric: str | None = None  # eval kinds: the summary key (avg@k, pass@k, ...)
    paper: str | None = None  # the paper's column key (paper_results.csv)
    paper_method: str | None = None  # alpha: the column's method in the paper
    paper_model: str | None = None  # runtime, memory: the column's model in the paper
    method: str | None = None  # alpha: the column's method entry


class ClaimSource(_Spec):
    """One number a claim's side reads for one seed: ``key`` of a JSON file (an eval benchmark's file, a
    ``profile.json``), or the mean of ``key`` over a JSONL log's rows (of ``agent`` only, over the last
    ``tail`` fraction of them when given; null values skipped)."""

    file: str
    key: str
    agent: str | None = None
    tail: float | None = Field(None, gt=0, le=1)


class ClaimSide(_Spec):
    """One side of a claim: per seed, the sources whose ``combine`` is that seed's value (the benchmarks of
    an AVG, the agents of a mean row, the agents' single runs of a wall time), or one constant ``value`` (a
    threshold)."""

    label: str
    method: str | None = None
    seeds: dict[str, list[ClaimSource]] | None = None
    value: float | None = None
    combine: Literal["mean", "sum"] = "mean"
    center: float | None = None  # the seed's value becomes |value − center|
    paper: float | None = None  # the paper's value of this side, its printed numbers combined the same way
    paper_columns_mean: float | None = None  # AVG: the mean of the paper's benchmark columns instead

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.seeds is None) == (self.value is None):
            raise ValueError("a claim side has `seeds` (run files) or a constant `value`, not both")
        return self


class ClaimTest(_Spec):
    """One row of the scorecard: claim × pair × agent, sides a and b on the same seeds."""

    claim: str
    source: str
    quote: str | None = None
    direction: Literal[">", "<"]
    metric: str
    ratio: bool = False
    a: ClaimSide
    b: ClaimSide
    paper_table: str | None = None  # where the sides' paper values come from
    stated: float | None = None  # the paper's sentence, on the row it speaks of
    decide: str | None = None  # the command that trains the seeds a one-seed row lacks
    margin: float | None = None  # equivalence within ±margin (None: no equivalence verdict)
    runs: dict[str, list[str]] = {}  # per seed, the run.json of every run it reads: the machine of the pair
    origins: dict[str, str] = {}  # per seed read from another results folder (``<k>:<seed>``), that folder
    order: list[str] = []  # the seeds in look order (a spec's JSON sorts mapping keys: "1337" before "2")

    @model_validator(mode="after")
    def _a_reads_runs(self):
        if self.a.seeds is None:
            raise ValueError("side a reads run files (`seeds`)")
        missing = sorted(set(self.a.seeds) - set(self.b.seeds or self.a.seeds))
        if missing:
            raise ValueError(f"side b lacks seeds {missing} of side a: the test pairs them")
        return self


class TableRow(_Spec):
    """One row: its labels and paper keys, and the run files of its kind."""

    block: str | None = None
    block_label: str | None = None
    paper_block: str | None = None
    model: str | None = None
    model_label: str | None = None
    paper_model: str | None = None
    method: str | None = None
    label: str | None = None
    paper_method: str | None = None
    evals: dict[str, list[str]] | None = None  # accuracy, seeds, alpha: per column, one summary per seed
    values: dict[str, float | None] | None = None  # hyperparams
    stat: str | None = None  # ratio_stats: s_homo | s_hete of `agent`, from each seed's metrics.jsonl
    agent: str | None = None
    metrics: list[str] | None = None
    overall: list[str] | None = None  # runtime, memory: a joint run's profile.json per seed ...
    profiles: dict[str, list[str]] | None = None  # ... or each model's single-agent profiles per seed
    claim: ClaimTest | None = None  # claims: the row's paired test


# What each kind needs of its rows (and whether it needs columns).
_ROW_NEEDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "accuracy": (("evals",), True),
    "seeds": (("evals",), True),
    "alpha": (("evals",), True),
    "hyperparams": (("values",), True),
    "ratio_stats": (("stat", "agent", "metrics"), False),
    "runtime": (("method",), True),
    "memory": (("method",), True),
    "claims": (("claim",), False),
}


class TableSpec(_Spec):
    table: str = ""
    kind: TableKind
    title: str = ""
    paper_table: str | None = None  # the paper's table these rows stand beside (paper_results.csv)
    paper_delta: bool = False
    note: str = ""
    columns: list[Column] | None = None
    rows: list[TableRow] = Field(min_length=1)
    avg: bool = False  # accuracy: an AVG column over the benchmarks
    compare_to: str | None = None  # accuracy: bracketed HACPO − <method> differences
    figure: bool = False  # accuracy: also draw each method's seeds per agent (write_table's figure)
    # claims: seeds added in looks (start, block, max, spending); None: one look at every row's seeds
    sequential: dict | None = None
    benchmark: str | None = None  # seeds, alpha: the one benchmark shown
    paper_block: str | None = None  # runtime, memory: the pair's paper block

    @model_validator(mode="after")
    def _kind_has_what_it_reads(self):
        needs, columns = _ROW_NEEDS[self.kind]
        if columns and not self.columns:
            raise ValueError(f"a {self.kind!r} table needs 'columns'")
        for i, row in enumerate(self.rows):
            missing = [k for k in needs if getattr(row, k) is None]
            if self.kind in ("runtime", "memory") and row.overall is None and row.profiles is None:
                missing.append("overall or profiles")
            if missing:
                raise ValueError(f"rows.{i}: a {self.kind!r} table's row needs {', '.join(missing)}")
        return self


# Figure kind → the key under which a line lists its runs' logs, and that log's file in a run directory.
LINE_LOGS: dict[str, tuple[str, str]] = {
    "curves": ("validations", "validation.jsonl"),
    "updates": ("updates", "updates.jsonl"),
    "steps": ("metrics", "metrics.jsonl"),
}


class FigureLine(_Spec):
    label: str | None = None
    method: str = ""
    agent: str | None = None  # default: the panel's
    metric: str | None = None  # curves: the validation field (default acc); steps: the agent's field
    validations: list[str] | None = None  # curves: each seed's validation.jsonl
    updates: list[str] | None = None  # updates: each seed's updates.jsonl
    metrics: list[str] | None = None  # steps: each seed's metrics.jsonl


class FigurePanel(_Spec):
    title: str = ""
    agent: str | None = None
    y_label: str | None = None  # default: the figure's
    lines: list[FigureLine] = Field(min_length=1)


class FigureSpec(_Spec):
    figure: str = ""
    kind: FigureKind
    title: str | None = None
    y_label: str | None = None
    note: str | None = None
    metric: str | None = None
    panels: list[FigurePanel] = Field(min_length=1)

    @model_validator(mode="after")
    def _lines_name_their_files(self):
        files = LINE_LOGS[self.kind][0]
        for p, panel in enumerate(self.panels):
            for i, line in enumerate(panel.lines):
                if not getattr(line, files):
                    raise ValueError(f"panels.{p}.lines.{i}: a {self.kind!r} figure's line needs {files!r}")
        return self


class BenchmarkJob(_Spec):
    """One benchmark of an evaluation job: its file, how answers are drawn (:class:`hacpo.eval.run.Decoding`),
    the metric reported."""

    file: str
    metric: str | None = None  # default avg@k
    pass_ks: list[int] = []  # extra unbiased pass@k in the summary
    greedy: bool = True
    k: int = Field(1, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    reward: Literal["math_verify", "hendrycks"] | CustomReward = "math_verify"  # hacpo.reward.custom


class EvalJob(_Spec):
    """What one evaluation job computes (``hacpo eval --settings``): every benchmark of a setting."""

    max_new_tokens: int = Field(ge=1)
    prompt_style: Literal["compact", "paper"] = "compact"
    precision: Literal["fp32", "bf16", "auto"] | None = None  # engine local only
    benchmarks: dict[str, BenchmarkJob] = Field(min_length=1)


class EvalRuntime(_Spec):
    """How it runs (``hacpo eval --runtime``): never part of what it computes."""

    scorer_workers: int = Field(0, ge=0)
    batch_tokens: int | None = Field(None, ge=1)  # engine local: prompt + new tokens generated at once
    vllm: dict = {}  # engine vllm: hacpo.eval.vllm.VLLMGenerator options


def checked(model: type[_Spec], spec: dict) -> dict:
    """``spec`` validated as ``model`` (ValueError naming each bad key path), as the plain dict the builders
    read: as given (a key left out stays out)."""
    try:
        return model.model_validate(spec).model_dump(exclude_unset=True)
    except ValidationError as err:
        lines = [f"  {'.'.join(str(x) for x in e['loc']) or 'spec'}: {e['msg']}" for e in err.errors()]
        raise ValueError(f"invalid {model.__name__}:\n" + "\n".join(lines)) from None
