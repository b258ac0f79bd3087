"""Training-curve figures from a JSON spec (``kind: "curves"``): Figure 2 (HACPO vs GSPO vs GSPO×2) and
Figure 3 (stepwise-clipping ablation), v2 numbering.

Each panel plots, per line (method), the in-training validation accuracy of one agent read from the runs'
``validation.jsonl`` files (one per seed, rows filtered by ``agent``) against the training step. With several
seeds seaborn draws the mean and a 95 % bootstrap confidence band. Writes ``<prefix>.png`` and the plotted
points as ``<prefix>.csv``.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from hacpo.report.tables import _read_jsonl, _req
from hacpo.runio import Validation, atomic_write_bytes, atomic_write_text

FIG_COLUMNS = ["figure", "panel", "agent", "line", "method", "seed", "step", "value"]


def curves_data(spec: dict) -> pd.DataFrame:
    """The plotted points: one row per (panel, line, seed file, step)."""
    rows = []
    for pi, panel in enumerate(_req(spec, "panels", "spec")):
        agent = panel.get("agent")
        for line in _req(panel, "lines", f"panel {pi}"):
            where = f"panel {pi} ({panel.get('title', '')}), line {line.get('label', line.get('method'))!r}"
            a, key = line.get("agent", agent), line.get("metric", spec.get("metric", Validation.ACC))
            if not _req(line, "validations", where):
                raise ValueError(f"{where}: 'validations' is empty")
            for seed, path in enumerate(line["validations"]):
                got = [r for r in _read_jsonl(path, where) if a is None or r.get(Validation.AGENT) == a]
                if not got:
                    raise ValueError(f"{where}: no validation rows for agent {a!r} in {str(path)!r}")
                for r in got:
                    if key not in r or Validation.STEP not in r:
                        lacks = f"{Validation.STEP!r} or {key!r}"
                        raise ValueError(f"{where}: {str(path)!r} row lacks {lacks}: {r}")
                    rows.append([spec.get("figure", ""), pi, a, str(line.get("label", line.get("method"))),
                                 line.get("method", ""), seed, int(r[Validation.STEP]), float(r[key])])
    return pd.DataFrame(rows, columns=FIG_COLUMNS)


def curves_figure(spec: dict, data: pd.DataFrame) -> bytes:
    """A grid of panels (at most 3 columns), one seaborn line per method; PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns
    from matplotlib.figure import Figure

    panels = spec["panels"]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.3 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    labels = list(dict.fromkeys(data.line))  # one colour per method across all panels
    palette = dict(zip(labels, sns.color_palette(n_colors=len(labels)), strict=True))
    for pi, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        d = data[data.panel == pi]
        band = ("ci", 95) if d.groupby("line").seed.nunique().max() > 1 else None
        sns.lineplot(d, x="step", y="value", hue="line", palette=palette, errorbar=band, seed=0, marker="o",
                     markersize=3, ax=ax)
        ax.set(title=panel.get("title", ""), xlabel="Training steps", ylabel=spec.get("y_label", "accuracy"))
        ax.legend(title=None, fontsize="small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if spec.get("title"):
        fig.suptitle(spec["title"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()


def write_figure(spec: dict, out_prefix: str | Path) -> list[Path]:
    """Write ``<prefix>.png`` and ``<prefix>.csv`` (the plotted points) atomically; returns the paths."""
    kind = _req(spec, "kind", "spec")
    if kind != "curves":
        raise ValueError(f"spec: unknown figure kind {kind!r} (known: ['curves'])")
    if not spec.get("panels"):
        raise ValueError("spec: 'panels' is missing or empty")
    data = curves_data(spec)
    prefix = Path(out_prefix)
    png, csv = prefix.with_name(prefix.name + ".png"), prefix.with_name(prefix.name + ".csv")
    atomic_write_bytes(png, curves_figure(spec, data))
    atomic_write_text(csv, data.to_csv(index=False))
    return [png, csv]
