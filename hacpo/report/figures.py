"""Figures from a JSON spec, one panel per agent, one seaborn line per method:

- ``kind: "curves"``: Figure 2 (HACPO vs GSPO vs GSPO×2) and Figure 3 (stepwise-clipping ablation), v2
  numbering: the in-training validation accuracy read from the runs' ``validation.jsonl`` files (one per seed,
  rows filtered by ``agent``) against the training step;
- ``kind: "steps"``: per-agent fields of the runs' ``metrics.jsonl`` (reward, the summed own-row advantage,
  the share of cross rows inside the stepwise clip, s_hete, …) against the step, a panel per agent and field;
- ``kind: "updates"``: the share of a learner's cross rows inside the stepwise clip [lo_m, 1] (those that can
  carry gradient) against the update m within a step, from the runs' ``updates.jsonl``: where the
  mini-batch order puts cross rows decides how many meet the tighter early bounds.

With several points per x (seeds; steps for ``updates``) seaborn draws the mean and a 95 % bootstrap band.
Writes ``<prefix>.png`` and the plotted points as ``<prefix>.csv``.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import pandas as pd

from hacpo.report.files import read_rows, required
from hacpo.runio import Metric, Update, Validation, atomic_write_bytes, atomic_write_text
from hacpo.specs import LINE_LOGS, FigureSpec, checked

FIG_COLUMNS = ["figure", "panel", "agent", "line", "method", "seed", "step", "value"]
UPDATE_COLUMNS = ["figure", "panel", "agent", "line", "method", "seed", "step", "update", "value"]


def _line_rows(spec: dict, files: str, agent_field: str):
    """(panel index, line, seed, where, row) for every row of every line's ``files`` of its panel's agent."""
    for pi, panel in enumerate(required(spec, "panels", "spec")):
        agent = panel.get("agent")
        for line in required(panel, "lines", f"panel {pi}"):
            where = f"panel {pi} ({panel.get('title', '')}), line {line.get('label', line.get('method'))!r}"
            a = line.get("agent", agent)
            if not required(line, files, where):
                raise ValueError(f"{where}: {files!r} is empty")
            for seed, path in enumerate(line[files]):
                got = [r for r in read_rows(path, where) if a is None or r.get(agent_field) == a]
                if not got:
                    raise ValueError(f"{where}: no rows for agent {a!r} in {str(path)!r}")
                for r in got:
                    yield pi, a, line, seed, f"{where}: {str(path)!r}", r


def _head(spec: dict, pi: int, agent, line: dict, seed: int) -> list:
    label = str(line.get("label", line.get("method")))
    return [spec.get("figure", ""), pi, agent, label, line.get("method", ""), seed]


def curves_data(spec: dict) -> pd.DataFrame:
    """The plotted points: one row per (panel, line, seed file, step)."""
    rows = []
    for pi, a, line, seed, where, r in _line_rows(spec, LINE_LOGS["curves"][0], Validation.AGENT):
        key = line.get("metric", spec.get("metric", Validation.ACC))
        if key not in r or Validation.STEP not in r:
            raise ValueError(f"{where} row lacks {Validation.STEP!r} or {key!r}: {r}")
        rows.append([*_head(spec, pi, a, line, seed), int(r[Validation.STEP]), float(r[key])])
    return pd.DataFrame(rows, columns=FIG_COLUMNS)


def updates_data(spec: dict) -> pd.DataFrame:
    """The plotted points: one row per (panel, line, seed file, step, update m) that had cross rows."""
    rows = []
    for pi, a, line, seed, where, r in _line_rows(spec, LINE_LOGS["updates"][0], Update.AGENT):
        if any(k not in r for k in (Update.STEP, Update.UPDATE, Update.CROSS_IN_BOUNDS)):
            raise ValueError(f"{where} row is not an update record (hacpo.runio.Update): {r}")
        if r[Update.CROSS_IN_BOUNDS] is not None:  # None: the update had no cross rows
            value = float(r[Update.CROSS_IN_BOUNDS])
            rows.append([*_head(spec, pi, a, line, seed), int(r[Update.STEP]), int(r[Update.UPDATE]), value])
    return pd.DataFrame(rows, columns=UPDATE_COLUMNS)


def steps_data(spec: dict) -> pd.DataFrame:
    """The plotted points: one row per (panel, line, seed file, step) whose ``metrics.jsonl`` row has the
    line's per-agent field (``<agent>/<metric>``; a GSPO run has no cross-row fields, a step without cross
    rows none of theirs)."""
    rows = []
    for pi, panel in enumerate(required(spec, "panels", "spec")):
        for line in required(panel, "lines", f"panel {pi}"):
            a = line.get("agent") or panel.get("agent")
            where = f"panel {pi} ({panel.get('title', '')}), line {line.get('label', line.get('method'))!r}"
            key = Metric.of(a, required(line, "metric", where))
            for seed, path in enumerate(required(line, "metrics", where)):
                for r in read_rows(path, where):
                    if r.get(key) is not None and not math.isnan(float(r[key])):
                        rows.append([*_head(spec, pi, a, line, seed), int(r[Metric.STEP]), float(r[key])])
    return pd.DataFrame(rows, columns=FIG_COLUMNS)


KINDS = {  # figure kind → (its points, the x column, the x label)
    "curves": (curves_data, "step", "Training steps"),
    "updates": (updates_data, "update", "Update m within a step"),
    "steps": (steps_data, "step", "Training steps"),
}


def _panel_grid(n: int, ncols: int, width: float, height: float):
    """A figure of ``n`` panels in rows of ``ncols`` (each ``width`` × ``height`` inches), and its axes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False).ravel()


def _png(fig, unused_axes, title: str | None) -> bytes:
    """The figure as PNG bytes (120 dpi), its spare panels hidden and its title on top."""
    for ax in unused_axes:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()


def curves_figure(spec: dict, data: pd.DataFrame, x: str = "step", x_label: str = "Training steps") -> bytes:
    """A grid of panels (at most 3 columns), one seaborn line per method; PNG bytes."""
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    panels = spec["panels"]
    fig, axes = _panel_grid(len(panels), min(3, len(panels)), 4.2, 3.3)
    labels = list(dict.fromkeys(data.line))  # one colour per method across all panels
    palette = dict(zip(labels, sns.color_palette(n_colors=len(labels)), strict=True))
    for pi, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        d = data[data.panel == pi]
        band = ("ci", 95) if d.groupby(["line", x]).size().max() > 1 else None
        sns.lineplot(d, x=x, y="value", hue="line", palette=palette, errorbar=band, seed=0, marker="o",
                     markersize=3, ax=ax)
        y_label = panel.get("y_label") or spec.get("y_label", "accuracy")
        # a long "agent (pair): metric" title would run into its neighbour's: wrap it at the panel's width
        title = textwrap.fill(panel.get("title", ""), 40, break_on_hyphens=False)
        ax.set(title=title, xlabel=x_label, ylabel=y_label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and updates are counts
        ax.legend(title=None, fontsize="small")
    return _png(fig, axes[len(panels):], spec.get("title"))


def seeds_figure(data: pd.DataFrame, title: str = "", y_label: str = "accuracy") -> bytes:
    """A drawn table's figure (``figure: true``): a panel per agent of each pair, each method's mean ± sample
    std over seeds as a point with a bar, and every seed's value as a dot beside it. ``data``: one row per
    (panel, method, seed) with ``value``; PNG bytes."""
    import seaborn as sns

    panels = list(dict.fromkeys(data.panel))
    methods = list(dict.fromkeys(data.method))
    ncols = 2 if len(panels) in (2, 4) else min(3, len(panels))  # a pair's two agents side by side
    fig, axes = _panel_grid(len(panels), ncols, max(4.2, 0.9 * len(methods) + 1.5), 3.4)
    palette = dict(zip(methods, sns.color_palette(n_colors=len(methods)), strict=True))
    for ax, panel in zip(axes, panels, strict=False):
        d = data[data.panel == panel]
        sns.stripplot(d, x="method", y="value", hue="method", palette=palette, order=methods, alpha=0.45,
                      size=4, jitter=0.12, legend=False, ax=ax)
        sns.pointplot(d, x="method", y="value", hue="method", palette=palette, order=methods,
                      errorbar="sd", linestyle="none", markers="D", capsize=0.2, legend=False, ax=ax)
        ax.set(title=panel, xlabel="", ylabel=y_label)
        ax.tick_params(axis="x", labelrotation=30)
    return _png(fig, axes[len(panels):], title)


def write_figure(spec: dict, out_prefix: str | Path) -> list[Path]:
    """Write ``<prefix>.png`` and ``<prefix>.csv`` (the plotted points) atomically; returns the paths."""
    kind = required(spec, "kind", "spec")
    if kind not in KINDS:
        raise ValueError(f"spec: unknown figure kind {kind!r} (known: {sorted(KINDS)})")
    spec = checked(FigureSpec, spec)
    points, x, x_label = KINDS[kind]
    data = points(spec)
    if data.empty:
        raise ValueError(f"spec: figure {spec.get('figure', '')!r} has no points to plot")
    prefix = Path(out_prefix)
    png, csv = prefix.with_name(prefix.name + ".png"), prefix.with_name(prefix.name + ".csv")
    atomic_write_bytes(png, curves_figure(spec, data, x, x_label))
    atomic_write_text(csv, data.to_csv(index=False))
    return [png, csv]
