"""Render the paper's tables (v2 numbering) from a JSON spec: tidy CSV, Markdown and booktabs LaTeX.

One builder per spec ``kind`` (see ``KINDS``): ``accuracy`` (Tables 1, 2, 3, 9), ``hyperparams`` (Table 4),
``ratio_stats`` (Table 5), ``seeds`` (Table 6), ``runtime`` (Table 7), ``memory`` (Table 8) and ``alpha``
(the α ablation, v1 Table 4). A builder reads the engines' output files named in the spec and returns a
``Table``; ``write_table`` writes ``<prefix>.csv``, ``<prefix>.md`` and ``<prefix>.tex``.

Input paths in a spec are used as given (relative paths resolve against the current directory). Every
problem (missing file, missing key, unknown kind or metric) raises ``ValueError`` naming the file/key and row.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from statistics import mean, stdev

from hacpo.report import claims
from hacpo.report.files import read_json, read_rows
from hacpo.report.files import required as _req
from hacpo.report.paper import paper_value
from hacpo.report.render import (  # noqa: F401 (the table model and its renderings, read from here too)
    CSV_COLUMNS,
    Cell,
    Row,
    Table,
    tex_escape,
    to_csv,
    to_latex,
    to_markdown,
)
from hacpo.runio import Metric, atomic_write_bytes, atomic_write_text
from hacpo.specs import TableSpec, checked

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
            paper = paper_value(pt, row.get("paper_block"), row.get("paper_model"), paper_method_of(row, col),
                                paper_bench_of(col))
            cells.append(Cell(str(row.get("block", "")), str(row.get("model", "")), method_of(row, col), key,
                              ours, std, len(vals), paper))
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
    grid = _eval_grid(spec, lambda r, c: str(r.get("method", "")), lambda r, c: r.get("paper_method"),
                      lambda c: c.get("paper"))
    headers = [str(c.get("label", c["key"])) for c in spec["columns"]]
    items = []
    for row, cells, per_seed in grid:
        if spec.get("avg"):
            means = [c.ours for c in cells]
            avg = None if any(m is None for m in means) else mean(means)
            ns = {len(v) for v in per_seed}
            std = stdev([mean(s) for s in zip(*per_seed, strict=True)]) if avg is not None and len(ns) == 1 \
                and min(ns) > 1 else None
            paper = paper_value(spec.get("paper_table"), row.get("paper_block"), row.get("paper_model"),
                                row.get("paper_method"), "avg")
            cells.append(Cell(cells[0].block, cells[0].model, cells[0].method, "avg", avg, std,
                              min(ns) if avg is not None else 0, paper))
        items.append((row, [str(row.get("model_label", row.get("model", ""))),
                            str(row.get("label", row.get("method", "")))], cells))
    if spec.get("avg"):
        headers.append("AVG")
    notes = []
    figure = None
    if spec.get("figure"):  # each seed's AVG (or its one column) per agent and method
        points = [
            {"panel": f"{row.get('block_label') or row.get('block', '')}: {labels[0]}", "method": labels[1],
             "seed": i, "value": mean(vals) if len(vals) > 1 else vals[0]}
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
            vals += [float(r[key]) for r in read_rows(p, where) if r.get(key) is not None
                     and not math.isnan(float(r[key]))]
        if not vals:
            raise ValueError(f"{where}: no step has {key!r} in {[str(p) for p in paths]}")
        stats = {"mean": mean(vals), "max": max(vals), "min": min(vals), "range": max(vals) - min(vals)}
        cells = []
        for col in cols:
            k = _req(col, "key", "spec column")
            if k not in stats:
                raise ValueError(f"spec column {k!r}: unknown statistic (known: {sorted(stats)})")
            paper = paper_value(pt, row.get("paper_block"), row.get("paper_model"), row.get("paper_method"),
                                f"{stat}_{k}")
            cells.append(Cell(str(row.get("block", "")), str(row.get("model", agent)),
                              str(row.get("method", row.get("paper_method") or "hacpo")), f"{stat}_{k}",
                              stats[k], None, len(paths), paper, fmt=".5f"))
        items.append((row, [str(row.get("label", stat))], cells))
    notes = ["Per-step value: mean sequence importance ratio of the step; stats over all steps and seeds."]
    return Table(spec, ["ratio"], [str(c.get("label", c["key"])) for c in cols], _group(items), notes)


def seeds_table(spec: dict) -> Table:
    """Table 6: accuracy per seed and a mean ± std column across seeds (ours only)."""
    grid = _eval_grid(spec, lambda r, c: str(r.get("method", "")), lambda r, c: r.get("paper_method"),
                      lambda c: c.get("paper"))
    items = []
    for row, cells, _ in grid:
        vals = [c.ours for c in cells if c.ours is not None]
        m, s = _mean_std(vals)
        cells.append(Cell(cells[0].block, cells[0].model, cells[0].method, "mean", m, s, len(vals)))
        items.append((row, [str(row.get("model_label", row.get("model", ""))),
                            str(row.get("label", row.get("method", "")))], cells))
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
            p_total = papers["total"] if papers["total"] is not None else \
                (sum(ps) if None not in ps else None)
            cells.append(Cell(blk, "total", method, "total", None if None in ms else sum(ms), None,
                              min(per_model[c["key"]][2] for c in model_cols), p_total, **kw))
        items.append((method, row, cells))
    ref = spec.get("reference_method", "gspo")
    _relative(items, ref, f"rel_{ref}_total", "runtime table")
    headers = [f"{c.get('label', c['key'])} [s]" for c in model_cols] + \
        [f"{total_col.get('label', 'total')} [s]", f"relative to {ref.upper()} total"]
    notes = ["Ours: wall-clock seconds (mean ± std over seeds); paper: minutes. Only the relative column is "
             "comparable across scales."]
    return Table(spec, ["method"], headers, _group([(r, [str(r.get("label", m))], c) for m, r, c in items]),
                 notes)


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
        pct = [100 * p["peak_gpu_mem_mb"] / p["gpu_total_mb"] for p in profs] \
            if gpu and all(p.get("gpu_total_mb") for p in profs) else None
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
        c_mb = Cell(blk, model, method, f"{column}_mb", m, s, len(mb), paper, comparable=False, fmt=".0f",
                    unit=f" MB {src}", pfmt=".1f", punit="%", prefix=prefix)
        if pct is None:
            return c_mb, (m, src)
        csv_only.append(c_mb)
        return Cell(blk, model, method, column, *_mean_std(pct), len(pct), paper, fmt=".1f", unit="%",
                    prefix=f"{prefix}{m:.0f} MB {src}, "), (m, src)

    basis = {}
    for row, method, per_model, overall, papers, pov in rows:
        blk = str(row.get("block", spec.get("paper_block") or ""))
        got = [None if per_model.get(k) is None else cell(blk, k, method, k, per_model[k], papers[k])
               for k in (c["key"] for c in model_cols)]
        cells: list[Cell | None] = [g and g[0] for g in got]
        if "overall" in row:
            total, basis[method] = cell(blk, "overall", method, "total", overall, pov, prefix="overall ")
        else:  # the peak (max MB) over the models' runs; the paper's likewise
            ps = [papers[c["key"]] for c in model_cols]
            p_total = papers["total"] if papers["total"] is not None else \
                (max(ps) if ps and None not in ps else None)
            complete = got and all(g and g[1][0] is not None for g in got)
            top = max(got, key=lambda g: g[1][0]) if complete else None
            basis[method] = top[1] if top else (None, "")
            total = replace(top[0], model="total", column="total", paper=p_total) if top else \
                Cell(blk, "total", method, "total", None, paper=p_total, fmt=".1f", punit="%")
        cells.append(total)
        items.append((method, row, cells))
    ref = spec.get("reference_method", "gspo")
    _relative(items, ref, f"rel_{ref}", "memory table", basis)
    headers = [str(c.get("label", c["key"])) for c in model_cols] + \
        [f"{total_col.get('label', 'total')} (peak)", f"relative to {ref.upper()}"]
    notes = ["Ours: peak GPU memory (MB, and % of the device when known) or, without a GPU, peak process RSS "
             "(MB); paper: % of GPU memory. Total = max over the models' runs, or the joint job; the "
             "relative column compares our peak MB (ours) and the paper's % (paper)."]
    return Table(spec, ["method"], headers, _group([(r, [str(r.get("label", m))], c) for m, r, c in items]),
                 notes, csv_only)


KINDS = {"accuracy": accuracy_table, "hyperparams": hyperparams_table, "ratio_stats": ratio_stats_table,
         "seeds": seeds_table, "alpha": alpha_table, "runtime": runtime_table, "memory": memory_table,
         "claims": claims.claims_table}


def build_table(spec: dict) -> Table:
    """Dispatch on ``spec["kind"]``, the spec validated first (:class:`hacpo.specs.TableSpec`)."""
    kind = _req(spec, "kind", "spec")
    if kind not in KINDS:
        raise ValueError(f"spec: unknown table kind {kind!r} (known: {sorted(KINDS)})")
    return KINDS[kind](checked(TableSpec, spec))


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


__all__ = ["KINDS", "Cell", "Table", "build_table", "tex_escape", "to_csv", "to_latex", "to_markdown",
           "write_table"]
