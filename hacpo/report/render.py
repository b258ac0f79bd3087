"""A built table (:class:`Table` of :class:`Cell` s, the paper's value beside ours) and its three renderings:
tidy CSV, Markdown and booktabs LaTeX. The builders are :mod:`hacpo.report.tables` (one per table kind) and
:mod:`hacpo.report.claims` (the scorecard)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass, field

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
        w.writerow([name, c.block, c.model, c.method, c.column, _num(c.ours), _num(c.ours_std),
                    "" if c.n_seeds is None else c.n_seeds, _num(c.paper), _num(c.delta(pd_))])
    return buf.getvalue()


def _caption(table: Table) -> list[str]:
    spec = table.spec
    out = [spec["note"]] if spec.get("note") else []
    out += table.notes
    if spec.get("paper_table") and any(c.paper is not None for c in table.cells):  # a task of your own: none
        out.append(f"Paper: {spec['paper_table']}. " + (
            "(Δ x) = ours − paper." if spec.get("paper_delta") else
            "(paper x) = the paper's value, for reference only (different scale; no delta)."))
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


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "×": r"$\times$", "−": "$-$",
        "±": r"$\pm$", "Δ": r"$\Delta$", "α": r"$\alpha$", "δ": r"$\delta$", "ω": r"$\omega$", "—": "---",
        "≥": r"$\geq$", "≤": r"$\leq$"}


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
    lines += [r"\begin{tabular}{" + "l" * len(table.labels) + "r" * len(table.headers) + "}", r"\toprule",
              " & ".join(tex_escape(h) for h in head) + r" \\", r"\midrule"]
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


def csv_text(rows: list[dict], columns: list[str]) -> str:
    """Rows of named values as CSV with these columns (a kind with columns of its own: the scorecard)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                k: ("" if r.get(k) is None else format(r[k], ".10g") if isinstance(r[k], float) else r[k])
                for k in columns
            }
        )
    return buf.getvalue()
