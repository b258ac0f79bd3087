"""Render the paper's tables (v2 numbering) from a JSON spec: tidy CSV, Markdown and booktabs LaTeX.

One builder per spec ``kind`` (see ``KINDS``): ``accuracy`` (Tables 1, 2, 3, 9), ``hyperparams`` (Table 4),
``ratio_stats`` (Table 5), ``seeds`` (Table 6), ``runtime`` (Table 7), ``memory`` (Table 8) and ``alpha``
(the α ablation, v1 Table 4). A builder reads the engines' output files named in the spec and returns a
``Table``; ``write_table`` writes ``<prefix>.csv``, ``<prefix>.md`` and ``<prefix>.tex``.

Input paths in a spec are used as given (relative paths resolve against the current directory). Every
problem (missing file, missing key, unknown kind or metric) raises ``ValueError`` naming the file/key and row.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import mean, stdev

from hacpo.report import claims
from hacpo.report.files import read_json, read_rows
from hacpo.report.files import required as _req
from hacpo.report.paper import paper_value
from hacpo.runio import Metric, atomic_write_bytes, atomic_write_text
from hacpo.specs import TableSpec, checked

CSV_COLUMNS = ["table", "block", "model", "method", "column", "ours", "ours_std", "n_seeds", "paper", "delta"]


@dataclass
class Cell:
    """One number of a table: ours (mean over seeds, sample std) beside the paper's printed value."""

    block: str
    model: str
    method: str
    column: str
    ours: float | None
    ours_std: float | None = None
    n_seeds: int | None = None
    paper: float | None = None
    comparable: bool = True  # ours and paper share units, so ours − paper is meaningful
    fmt: str = ".3f"
    pfmt: str | None = None  # paper format (default: fmt)
    unit: str = ""  # display suffixes for ours / paper
    punit: str = ""
    prefix: str = ""  # e.g. "overall "
    extra: str = ""  # e.g. bracketed HACPO − GSPO×2 difference

    def delta(self, paper_delta: bool) -> float | None:
        if paper_delta and self.comparable and self.ours is not None and self.paper is not None:
            return self.ours - self.paper
        return None

    def text(self, paper_delta: bool) -> str:
        s = "—" if self.ours is None else f"{self.prefix}{self.ours:{self.fmt}}"
        if self.ours is not None:
            s += (f" ± {self.ours_std:{self.fmt}}" if self.ours_std is not None else "") + self.unit
        s += self.extra
        d = self.delta(paper_delta)
        if d is not None:
            s += f" (Δ {d:+{self.fmt}})"
        elif self.paper is not None:
            s += f" (paper {self.paper:{self.pfmt or self.fmt}}{self.punit})"
        return s


Row = tuple[list[str], list[Cell | None]]  # label cells, value cells (None: blank)


@dataclass
class Table:
    spec: dict
    labels: list[str]  # headers of the label columns
    headers: list[str]  # headers of the value columns
    groups: list[tuple[str, list[Row]]]  # (block label, rows), in spec order
    notes: list[str] = field(default_factory=list)
    csv_only: list[Cell] = field(default_factory=list)  # cells in the CSV but not displayed
    headline: str = ""  # a line right under the title (the scorecard's count of verdicts)
    csv_text: str | None = None  # a kind with its own CSV columns (claims) instead of one row per cell
    extras: dict[str, str] = field(default_factory=dict)  # more files: suffix of the prefix → text
    figure: Callable[[], bytes] | None = None  # the table's own figure (PNG), written beside the figures

    @property
    def cells(self) -> list[Cell]:
        shown = [c for _, rows in self.groups for _, cells in rows for c in cells if c is not None]
        return shown + self.csv_only


# ---------------------------------------------------------------------------------------------- helpers


def _mean_std(vals: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1; None for fewer than two values)."""
    if not vals:
        return None, None
    return mean(vals), (stdev(vals) if len(vals) > 1 else None)


def _where(row: dict, i: int) -> str:
    name = row.get("label") or row.get("method") or ""
    return f"row {i} ({' / '.join(str(x) for x in (row.get('block'), row.get('model'), name) if x)})"


def _group(items: list[tuple[dict, list[str], list[Cell | None]]]) -> list[tuple[str, list[Row]]]:
    groups: dict[str, list[Row]] = {}
    for row, labels, cells in items:
        groups.setdefault(str(row.get("block_label") or row.get("block") or ""), []).append((labels, cells))
    return list(groups.items())


def _eval_metric(paths, metric: str, where: str) -> list[float]:
    """``summary[metric]`` of each eval summary JSON (one file per seed)."""
    vals = []
    for p in paths or []:
        s = read_json(p, where)
        if metric not in s:
            avail = sorted(k for k, v in s.items() if isinstance(v, int | float) and not isinstance(v, bool))
            raise ValueError(f"{where}: metric {metric!r} not in {str(p)!r}; available keys: {avail}")
        vals.append(float(s[metric]))
    return vals


def _eval_grid(spec: dict, method_of, paper_method_of, paper_bench_of):
    """Cells of the eval-summary kinds: per row and column, mean ± std over the listed files (seeds)."""
    cols, pt = _req(spec, "columns", "spec"), spec.get("paper_table")
    if not cols:
        raise ValueError("spec: 'columns' is empty")
    out = []
    for i, row in enumerate(_req(spec, "rows", "spec")):
        where, evals = _where(row, i), _req(row, "evals", _where(row, i))
        cells, per_seed = [], []
        for col in cols:
            key = str(_req(col, "key", "spec column"))
            if key not in evals:
                raise ValueError(f"{where}: 'evals' has no entry for column {key!r} (use [] for a blank)")
            metric = _req(col, "metric", f"spec column {key!r}")
            vals = _eval_metric(evals[key], metric, f"{where}, column {key!r}")
            ours, std = _mean_std(vals)
            paper = paper_value(
                pt,
                row.get("paper_block"),
                row.get("paper_model"),
                paper_method_of(row, col),
                paper_bench_of(col),
            )
            cells.append(
                Cell(
                    str(row.get("block", "")),
                    str(row.get("model", "")),
                    method_of(row, col),
                    key,
                    ours,
                    std,
                    len(vals),
                    paper,
                )
            )
            per_seed.append(vals)
        out.append((row, cells, per_seed))
    return out


# ---------------------------------------------------------------------------------------------- kinds


def accuracy_table(spec: dict) -> Table:
    """Tables 1, 2, 3 and 9: benchmark accuracy per model × method, grouped by pair, plus an AVG column.

    AVG = unweighted mean of the benchmark columns (blank if one is blank); its std is over per-seed AVGs
    (the i-th file of every column is taken as seed i). ``compare_to`` (v2 Table 1 caption): bracketed
    HACPO − <compare_to> differences (ours) in the hacpo rows of the Markdown/LaTeX.
    """
    grid = _eval_grid(
        spec,
        lambda r, c: str(r.get("method", "")),
        lambda r, c: r.get("paper_method"),
        lambda c: c.get("paper"),
    )
    headers = [str(c.get("label", c["key"])) for c in spec["columns"]]
    items = []
    for row, cells, per_seed in grid:
        if spec.get("avg"):
            means = [c.ours for c in cells]
            avg = None if any(m is None for m in means) else mean(means)
            ns = {len(v) for v in per_seed}
            std = (
                stdev([mean(s) for s in zip(*per_seed, strict=True)])
                if avg is not None and len(ns) == 1 and min(ns) > 1
                else None
            )
            paper = paper_value(
                spec.get("paper_table"),
                row.get("paper_block"),
                row.get("paper_model"),
                row.get("paper_method"),
                "avg",
            )
            cells.append(
                Cell(
                    cells[0].block,
                    cells[0].model,
                    cells[0].method,
                    "avg",
                    avg,
                    std,
                    min(ns) if avg is not None else 0,
                    paper,
                )
            )
        items.append(
            (
                row,
                [
                    str(row.get("model_label", row.get("model", ""))),
                    str(row.get("label", row.get("method", ""))),
                ],
                cells,
            )
        )
    if spec.get("avg"):
        headers.append("AVG")
    notes = []
    figure = None
    if spec.get("figure"):  # each seed's AVG (or its one column) per agent and method
        points = [
            {
                "panel": f"{row.get('block_label') or row.get('block', '')}: {labels[0]}",
                "method": labels[1],
                "seed": i,
                "value": mean(vals) if len(vals) > 1 else vals[0],
            }
            for (row, labels, _), (_, _, per_seed) in zip(items, grid, strict=True)
            for i, vals in enumerate(zip(*per_seed, strict=True))
        ]
        y = "AVG accuracy" if spec.get("avg") else headers[0]

        def figure() -> bytes:
            import pandas as pd

            from hacpo.report.figures import seeds_figure

            return seeds_figure(pd.DataFrame(points), str(spec.get("title", "")), y)

    ref = spec.get("compare_to")
    if ref:
        by_key = {(r.get("block"), r.get("model"), r.get("method")): cells for r, _, cells in items}
        for row, _, cells in items:
            other = by_key.get((row.get("block"), row.get("model"), ref))
            if row.get("method") == "hacpo" and other:
                for c, o in zip(cells, other, strict=True):
                    if c.ours is not None and o.ours is not None:
                        c.extra = f" [{c.ours - o.ours:+.3f}]"
        name = next((r.get("label", ref) for r, _, _ in items if r.get("method") == ref), ref)
        notes.append(f"[x] = HACPO − {name} (ours, same model and pair).")
    return Table(spec, ["model", "method"], headers, _group(items), notes, figure=figure)


def hyperparams_table(spec: dict) -> Table:
    """Table 4: HACPO hyper-parameters (α, 1−δ, δ_step) per pair, beside the paper's."""
    cols, pt = _req(spec, "columns", "spec"), spec.get("paper_table")
    items = []
    for i, row in enumerate(_req(spec, "rows", "spec")):
        values = _req(row, "values", _where(row, i))
        cells = []
        for col in cols:
            key = _req(col, "key", "spec column")
            v = _req(values, key, f"{_where(row, i)} 'values'")
            paper = paper_value(pt, row.get("paper_block"), "pair", "hacpo", col.get("paper"))
            ours = None if v is None else float(v)
            cells.append(Cell(str(row.get("block", "")), "pair", "hacpo", key, ours, paper=paper, fmt="g"))
        items.append(({}, [str(row.get("block_label", row.get("block", "")))], cells))
    return Table(spec, ["pair"], [str(c.get("label", c["key"])) for c in cols], _group(items))


def ratio_stats_table(spec: dict) -> Table:
    """Table 5: mean/max/min/range over all steps (seeds pooled) of the per-step ``<agent>/<stat>_mean``.

    Steps where the key is absent or null (e.g. no cross rows) are skipped; no steps at all is an error.
    """
    cols = spec.get("columns") or [{"key": k, "label": k} for k in ("mean", "max", "min", "range")]
    pt, items = spec.get("paper_table"), []
    for i, row in enumerate(_req(spec, "rows", "spec")):
        where = _where(row, i)
        stat, agent = _req(row, "stat", where), _req(row, "agent", where)
        key, vals, paths = Metric.of(agent, f"{stat}_mean"), [], _req(row, "metrics", where)
        for p in paths:
            vals += [
                float(r[key])
                for r in read_rows(p, where)
                if r.get(key) is not None and not math.isnan(float(r[key]))
            ]
        if not vals:
            raise ValueError(f"{where}: no step has {key!r} in {[str(p) for p in paths]}")
        stats = {"mean": mean(vals), "max": max(vals), "min": min(vals), "range": max(vals) - min(vals)}
        cells = []
        for col in cols:
            k = _req(col, "key", "spec column")
            if k not in stats:
                raise ValueError(f"spec column {k!r}: unknown statistic (known: {sorted(stats)})")
            paper = paper_value(
                pt, row.get("paper_block"), row.get("paper_model"), row.get("paper_method"), f"{stat}_{k}"
            )
            cells.append(
                Cell(
                    str(row.get("block", "")),
                    str(row.get("model", agent)),
                    str(row.get("method", row.get("paper_method") or "hacpo")),
                    f"{stat}_{k}",
                    stats[k],
                    None,
                    len(paths),
                    paper,
                    fmt=".5f",
                )
            )
        items.append((row, [str(row.get("label", stat))], cells))
    notes = ["Per-step value: mean sequence importance ratio of the step; stats over all steps and seeds."]
    return Table(spec, ["ratio"], [str(c.get("label", c["key"])) for c in cols], _group(items), notes)


def seeds_table(spec: dict) -> Table:
    """Table 6: accuracy per seed and a mean ± std column across seeds (ours only)."""
    grid = _eval_grid(
        spec,
        lambda r, c: str(r.get("method", "")),
        lambda r, c: r.get("paper_method"),
        lambda c: c.get("paper"),
    )
    items = []
    for row, cells, _ in grid:
        vals = [c.ours for c in cells if c.ours is not None]
        m, s = _mean_std(vals)
        cells.append(Cell(cells[0].block, cells[0].model, cells[0].method, "mean", m, s, len(vals)))
        items.append(
            (
                row,
                [
                    str(row.get("model_label", row.get("model", ""))),
                    str(row.get("label", row.get("method", ""))),
                ],
                cells,
            )
        )
    headers = [str(c.get("label", c["key"])) for c in spec["columns"]] + ["mean ± std"]
    return Table(spec, ["model", "method"], headers, _group(items))


def alpha_table(spec: dict) -> Table:
    """α ablation (v1 Table 4): accuracy per model for α = 0..3; the paper method comes from the column."""

    def method(r, c):
        return str(c.get("method") or c.get("paper_method") or f"hacpo_alpha{c['key']}")

    grid = _eval_grid(spec, method, lambda r, c: c.get("paper_method"), lambda c: c.get("paper", "acc"))
    items = [(row, [str(row.get("model_label", row.get("model", "")))], cells) for row, cells, _ in grid]
    return Table(spec, ["model"], [str(c.get("label", c["key"])) for c in spec["columns"]], _group(items))


def _profile_rows(spec: dict, value_of, bench: str):
    """Shared walk of Tables 7/8: per row, per model column, ``value_of(profiles, where)`` over seed files."""
    cols, pt, pb = _req(spec, "columns", "spec"), spec.get("paper_table"), spec.get("paper_block")
    model_cols = [c for c in cols if c.get("key") != "total"]
    total_col = next((c for c in cols if c.get("key") == "total"), {"key": "total", "paper_model": "total"})
    out = []
    for i, row in enumerate(_req(spec, "rows", "spec")):
        where, pm, method = _where(row, i), row.get("paper_method"), str(_req(row, "method", _where(row, i)))
        if "overall" in row:
            per_model = {}
            overall = value_of(row["overall"], f"{where}, overall")
            pov = paper_value(pt, pb, "overall", pm, bench)
        else:
            profiles = _req(row, "profiles", where)
            per_model = {}
            for c in model_cols:
                if c["key"] not in profiles:
                    raise ValueError(f"{where}: 'profiles' has no entry for column {c['key']!r}")
                per_model[c["key"]] = value_of(profiles[c["key"]], f"{where}, column {c['key']!r}")
            overall, pov = None, None
        papers = {c["key"]: paper_value(pt, pb, c.get("paper_model"), pm, bench) for c in model_cols}
        papers["total"] = paper_value(pt, pb, total_col.get("paper_model"), pm, bench)
        out.append((row, method, per_model, overall, papers, pov))
    return model_cols, total_col, out


def _relative(items, ref: str, column: str, where: str, basis: dict | None = None) -> None:
    """Append to each row a cell ``total / total of the reference method`` for ours and for the paper.

    ``basis``: method → (our total, unit tag) when the displayed total is not the ratio's basis; rows whose
    tag differs from the reference's (e.g. GPU vs RSS memory) get no ratio.
    """
    basis = basis or {method: (cells[-1].ours, "") for method, _, cells in items}
    if ref not in basis:
        raise ValueError(f"{where}: no row with method {ref!r} to compare against (set 'reference_method')")
    (b_ours, b_tag), b_paper = basis[ref], next(c[-1].paper for m, _, c in items if m == ref)
    for method, _, cells in items:
        t, (o, tag) = cells[-1], basis[method]
        ours = o / b_ours if b_ours and o is not None and tag == b_tag else None
        paper = t.paper / b_paper if b_paper and t.paper is not None else None
        cells.append(Cell(t.block, t.model, method, column, ours, None, t.n_seeds, paper, fmt=".2f"))


def runtime_table(spec: dict) -> Table:
    """Table 7: wall-clock time per model and in total (ours in seconds, paper in minutes).

    Single-agent methods: total = sum of the per-model means; joint methods (row key ``overall``): one job.
    The column "relative to GSPO total" is the comparable number across scales (ours and paper alike).
    """

    def value_of(paths, where):
        vals = [float(_req(read_json(p, where), "wall_s", f"{where}, {p}")) for p in paths or []]
        return *_mean_std(vals), len(vals)

    bench = spec.get("paper_benchmark", "runtime_minutes")
    model_cols, total_col, rows = _profile_rows(spec, value_of, bench)
    kw = dict(comparable=False, fmt=".1f", unit=" s", pfmt="g", punit=" min")
    items = []
    for row, method, per_model, overall, papers, pov in rows:
        blk = str(row.get("block", spec.get("paper_block") or ""))
        cells: list[Cell | None] = []
        for c in model_cols:
            v, k = per_model.get(c["key"]), c["key"]
            cells.append(None if v is None else Cell(blk, k, method, k, *v, papers[k], **kw))
        if "overall" in row:
            cells.append(Cell(blk, "overall", method, "total", *overall, pov, prefix="overall ", **kw))
        else:
            ms = [per_model[c["key"]][0] for c in model_cols]
            ps = [papers[c["key"]] for c in model_cols]
            p_total = (
                papers["total"] if papers["total"] is not None else (sum(ps) if None not in ps else None)
            )
            cells.append(
                Cell(
                    blk,
                    "total",
                    method,
                    "total",
                    None if None in ms else sum(ms),
                    None,
                    min(per_model[c["key"]][2] for c in model_cols),
                    p_total,
                    **kw,
                )
            )
        items.append((method, row, cells))
    ref = spec.get("reference_method", "gspo")
    _relative(items, ref, f"rel_{ref}_total", "runtime table")
    headers = [f"{c.get('label', c['key'])} [s]" for c in model_cols] + [
        f"{total_col.get('label', 'total')} [s]",
        f"relative to {ref.upper()} total",
    ]
    notes = [
        "Ours: wall-clock seconds (mean ± std over seeds); paper: minutes. Only the relative column is "
        "comparable across scales."
    ]
    return Table(
        spec, ["method"], headers, _group([(r, [str(r.get("label", m))], c) for m, r, c in items]), notes
    )


def memory_table(spec: dict) -> Table:
    """Table 8: peak memory per model (ours in MB of GPU, else of process RSS; paper in % of the GPU).

    When the profile has ``gpu_total_mb`` the displayed cell is % of the device (comparable with the paper,
    so Δ applies); the MB value is in the CSV either way (column ``<key>_mb``). The total column is the peak
    over the models' runs (max) for single-agent methods, or the joint job (``overall``); the paper's is
    likewise the max of its per-model values. "relative to GSPO" = total / GSPO total.
    """

    def value_of(paths, where):
        profs = [read_json(p, where) for p in paths or []]
        gpu = bool(profs) and all(p.get("peak_gpu_mem_mb") is not None for p in profs)
        mb = [float(_req(p, "peak_gpu_mem_mb" if gpu else "peak_rss_mb", f"{where}, profile")) for p in profs]
        pct = (
            [100 * p["peak_gpu_mem_mb"] / p["gpu_total_mb"] for p in profs]
            if gpu and all(p.get("gpu_total_mb") for p in profs)
            else None
        )
        return mb, pct, "GPU" if gpu else "RSS"

    bench = spec.get("paper_benchmark", "gpu_memory_pct")
    model_cols, total_col, rows = _profile_rows(spec, value_of, bench)
    items, csv_only = [], []

    def cell(blk, model, method, column, v, paper, prefix=""):
        """The % cell when the device size is known (the MB cell then goes to the CSV only), else MB.

        Returns (shown cell, (mean MB, "GPU" | "RSS")).
        """
        mb, pct, src = v
        m, s = _mean_std(mb)
        c_mb = Cell(
            blk,
            model,
            method,
            f"{column}_mb",
            m,
            s,
            len(mb),
            paper,
            comparable=False,
            fmt=".0f",
            unit=f" MB {src}",
            pfmt=".1f",
            punit="%",
            prefix=prefix,
        )
        if pct is None:
            return c_mb, (m, src)
        csv_only.append(c_mb)
        return Cell(
            blk,
            model,
            method,
            column,
            *_mean_std(pct),
            len(pct),
            paper,
            fmt=".1f",
            unit="%",
            prefix=f"{prefix}{m:.0f} MB {src}, ",
        ), (m, src)

    basis = {}
    for row, method, per_model, overall, papers, pov in rows:
        blk = str(row.get("block", spec.get("paper_block") or ""))
        got = [
            None if per_model.get(k) is None else cell(blk, k, method, k, per_model[k], papers[k])
            for k in (c["key"] for c in model_cols)
        ]
        cells: list[Cell | None] = [g and g[0] for g in got]
        if "overall" in row:
            total, basis[method] = cell(blk, "overall", method, "total", overall, pov, prefix="overall ")
        else:  # the peak (max MB) over the models' runs; the paper's likewise
            ps = [papers[c["key"]] for c in model_cols]
            p_total = (
                papers["total"]
                if papers["total"] is not None
                else (max(ps) if ps and None not in ps else None)
            )
            complete = got and all(g and g[1][0] is not None for g in got)
            top = max(got, key=lambda g: g[1][0]) if complete else None
            basis[method] = top[1] if top else (None, "")
            total = (
                replace(top[0], model="total", column="total", paper=p_total)
                if top
                else Cell(blk, "total", method, "total", None, paper=p_total, fmt=".1f", punit="%")
            )
        cells.append(total)
        items.append((method, row, cells))
    ref = spec.get("reference_method", "gspo")
    _relative(items, ref, f"rel_{ref}", "memory table", basis)
    headers = [str(c.get("label", c["key"])) for c in model_cols] + [
        f"{total_col.get('label', 'total')} (peak)",
        f"relative to {ref.upper()}",
    ]
    notes = [
        "Ours: peak GPU memory (MB, and % of the device when known) or, without a GPU, peak process RSS "
        "(MB); paper: % of GPU memory. Total = max over the models' runs, or the joint job; the "
        "relative column compares our peak MB (ours) and the paper's % (paper)."
    ]
    return Table(
        spec,
        ["method"],
        headers,
        _group([(r, [str(r.get("label", m))], c) for m, r, c in items]),
        notes,
        csv_only,
    )


def claims_table(spec: dict) -> Table:
    """The scorecard (issue 30): one row per claim × pair × agent with its paired difference over seeds,
    95 % t interval, verdict, Holm's verdict, rliable's probability of improvement and the paper's effect
    (:mod:`hacpo.report.claims`, docs/statistics.md). Its CSV has the claims columns
    (:data:`~hacpo.report.claims.CLAIM_COLUMNS`); ``<prefix>_seeds.csv`` holds every seed's values,
    ``<prefix>.rst`` the report's front page, and the forest plot goes beside the figures."""
    card = claims.scorecard(spec)
    labels = [
        "pair",
        "agent",
        "comparison",
        "metric",
        "seeds",
        "difference [95 % CI]",
        "margin",
        "verdict",
        "Holm",
        "P(a beats b) [95 % CI]",
        "paper",
        "to decide",
    ]
    groups: dict[str, list[Row]] = {}
    for r in card.rows:
        poi = (
            ""
            if r["prob_improvement"] is None
            else f"{r['prob_improvement']:.2f} [{fmt_(r['poi_low'])}, {fmt_(r['poi_high'])}]"
        )
        agent = str(r["agent_label"] or r["agent"])
        cells = [
            str(r["pair"]),
            agent,
            claims.comparison(r),
            r["metric"],
            r["seeds"],
            claims.interval(r),
            claims.margin(r),
            claims.verdict(r),
            r["verdict_holm"],
            poi,
            claims.fmt(r["paper_diff"]),
            claims.to_decide(r),
        ]
        groups.setdefault(f"{r['claim']} — {r['source']}", []).append((cells, []))
    notes = [
        *card.notes,
        "Per seed: d = a − b (ratio claims: a / b − 1) on the same pair, agent and seed; "
        "difference = mean of d over the seeds with its 95 % Student-t interval (seeds of several machines: "
        "the blocked t; seeds added in looks: the repeated interval of the sequential design); holds / "
        "reversed: the interval lies wholly on the paper's / the other side of 0; equivalent: wholly "
        "inside ±margin; undecided: it reaches 0 and a margin; one seed: no interval. Holm: the verdict "
        "with Holm's correction over all tested rows (family-wise 5 %). "
        "P(a beats b): rliable's probability of improvement with a 95 % bootstrap interval. paper: the "
        "paper's own effect from its printed tables. docs/statistics.md.",
    ]
    title = spec.get("title") or spec.get("table", "claims")
    return Table(
        spec,
        labels,
        [],
        list(groups.items()),
        notes,
        headline=card.headline,
        csv_text=claims.csv_text(card.rows, claims.CLAIM_COLUMNS),
        extras={
            "_seeds.csv": claims.csv_text(card.seeds, claims.SEED_COLUMNS),
            ".rst": claims.to_rst(card, title),
        },
        figure=lambda: claims.forest_plot(card, title),
    )


def fmt_(x) -> str:
    return claims.fmt(x, ".2f")


KINDS = {
    "accuracy": accuracy_table,
    "hyperparams": hyperparams_table,
    "ratio_stats": ratio_stats_table,
    "seeds": seeds_table,
    "alpha": alpha_table,
    "runtime": runtime_table,
    "memory": memory_table,
    "claims": claims_table,
}


def build_table(spec: dict) -> Table:
    """Dispatch on ``spec["kind"]``, the spec validated first (:class:`hacpo.specs.TableSpec`)."""
    kind = _req(spec, "kind", "spec")
    if kind not in KINDS:
        raise ValueError(f"spec: unknown table kind {kind!r} (known: {sorted(KINDS)})")
    return KINDS[kind](checked(TableSpec, spec))


# ---------------------------------------------------------------------------------------------- output


def _num(x) -> str:
    return "" if x is None else format(x, ".10g")


def to_csv(table: Table) -> str:
    """Long/tidy CSV: one row per cell, ``delta`` empty unless ``paper_delta`` and both values exist."""
    if table.csv_text is not None:
        return table.csv_text
    buf, name, pd_ = io.StringIO(), table.spec.get("table", ""), bool(table.spec.get("paper_delta"))
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for c in table.cells:
        w.writerow(
            [
                name,
                c.block,
                c.model,
                c.method,
                c.column,
                _num(c.ours),
                _num(c.ours_std),
                "" if c.n_seeds is None else c.n_seeds,
                _num(c.paper),
                _num(c.delta(pd_)),
            ]
        )
    return buf.getvalue()


def _caption(table: Table) -> list[str]:
    spec = table.spec
    out = [spec["note"]] if spec.get("note") else []
    out += table.notes
    if spec.get("paper_table") and any(c.paper is not None for c in table.cells):  # a task of your own: none
        out.append(
            f"Paper: {spec['paper_table']}. "
            + (
                "(Δ x) = ours − paper."
                if spec.get("paper_delta")
                else "(paper x) = the paper's value, for reference only (different scale; no delta)."
            )
        )
    if table.csv_text is None:  # a kind with its own columns says what its numbers are itself
        out.append("Ours: mean over seeds ± sample std where several seeds exist.")
    return out


def to_markdown(table: Table) -> str:
    pd_, spec = bool(table.spec.get("paper_delta")), table.spec
    lines = [f"# {spec.get('title') or spec.get('table', 'table')}", ""]
    if table.headline:
        lines += [f"**{table.headline}**", ""]
    head = table.labels + table.headers
    for block, rows in table.groups:
        if block:
            lines += [f"**{block}**", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for labels, cells in rows:
            lines.append("| " + " | ".join(labels + [c.text(pd_) if c else "—" for c in cells]) + " |")
        lines.append("")
    return "\n".join(lines + [" ".join(_caption(table)), ""])


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "×": r"$\times$",
    "−": "$-$",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "α": r"$\alpha$",
    "δ": r"$\delta$",
    "ω": r"$\omega$",
    "—": "---",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}


def tex_escape(s: str) -> str:
    """Escape LaTeX specials and map the Unicode symbols used in labels (×, −, ±, Greek) to math mode."""
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def to_latex(table: Table) -> str:
    """A booktabs ``tabular`` (title and caption as leading comments); block labels as italic rows."""
    pd_, spec = bool(table.spec.get("paper_delta")), table.spec
    head = table.labels + table.headers
    n = len(head)
    lines = [f"% {spec.get('title') or spec.get('table', '')}".replace("\n", " ")]
    lines += [f"% {c}" for c in ([table.headline] if table.headline else []) + _caption(table)]
    lines += [
        r"\begin{tabular}{" + "l" * len(table.labels) + "r" * len(table.headers) + "}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in head) + r" \\",
        r"\midrule",
    ]
    for gi, (block, rows) in enumerate(table.groups):
        if gi:
            lines.append(r"\midrule")
        if block:
            lines.append(rf"\multicolumn{{{n}}}{{l}}{{\textit{{{tex_escape(block)}}}}} \\")
        for labels, cells in rows:
            vals = labels + [c.text(pd_) if c else "—" for c in cells]
            lines.append(" & ".join(tex_escape(v) for v in vals) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def write_table(spec: dict, out_prefix: str | Path, figure_prefix: str | Path | None = None) -> list[Path]:
    """Build the table and write ``<prefix>.csv``, ``.md`` and ``.tex`` (and a kind's extra files, and its
    own figure as ``<figure_prefix>.png``) atomically; returns the paths."""
    table = build_table(spec)
    prefix = Path(out_prefix)
    paths = [prefix.with_name(prefix.name + ext) for ext in (".csv", ".md", ".tex")]
    for path, render in zip(paths, (to_csv, to_markdown, to_latex), strict=True):
        atomic_write_text(path, render(table))
    for suffix, text in table.extras.items():
        paths.append(prefix.with_name(prefix.name + suffix))
        atomic_write_text(paths[-1], text)
    if table.figure is not None:
        if figure_prefix is None:
            raise ValueError(f"a {spec.get('kind')!r} table draws a figure: give --figure-prefix")
        png = Path(figure_prefix)
        paths.append(png.with_name(png.name + ".png"))
        atomic_write_bytes(paths[-1], table.figure())
    return paths


__all__ = [
    "KINDS",
    "Cell",
    "Table",
    "build_table",
    "tex_escape",
    "to_csv",
    "to_latex",
    "to_markdown",
    "write_table",
]
