"""The claims scorecard (issue 30): each claim of the paper tested on paired seeds, from a ``claims`` table
spec (:class:`hacpo.specs.ClaimTest` rows, built by :meth:`hacpo.pipeline.views.Views._table_claims`).

Per row it reads each side's value for every seed from the run files the spec names, pairs them by seed,
and applies :mod:`hacpo.report.stats` (docs/statistics.md). :func:`scorecard` returns the rows, the
long per-seed records (every verdict can be recomputed from them alone), the headline and the notes;
:func:`forest_plot` draws them. The table builder (:func:`hacpo.report.tables.claims_table`) renders them.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from hacpo.report import stats
from hacpo.report.files import read_json, read_rows

SEED_COLUMNS = ["claim", "pair", "agent", "seed", "a", "b", "direction", "metric", "ratio", "center",
                "a_value", "b_value", "diff"]  # fmt: skip
CLAIM_COLUMNS = [
    "claim", "pair", "agent", "a", "b", "direction", "metric", "ratio", "n_seeds", "diff_mean", "ci_low",
    "ci_high", "verdict", "paper_diff", "source", "seeds", "diff_sd", "p_value", "p_holm", "verdict_holm",
    "prob_improvement", "poi_low", "poi_high", "seeds_needed", "paper_table", "paper_stated", "decide",
]  # fmt: skip
STATED_TOLERANCE = 0.0005  # a sentence's "+3.6 %" agrees with a table effect within half its last digit


@dataclass
class Scorecard:
    rows: list[dict]  # CLAIM_COLUMNS, one per claim × pair × agent
    seeds: list[dict]  # SEED_COLUMNS, one per row and seed
    headline: str
    notes: list[str] = field(default_factory=list)


def _number(src: dict, where: str) -> float:
    """The value of one :class:`hacpo.specs.ClaimSource`."""
    path, key = Path(src["file"]), src["key"]
    if path.suffix == ".jsonl":
        rows = read_rows(path, where)
        if src.get("agent") is not None:
            rows = [r for r in rows if r.get("agent") == src["agent"]]
        vals = [float(r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))]
        if src.get("tail") is not None:
            vals = vals[len(vals) - math.ceil(src["tail"] * len(vals)) :]
        if not vals:
            raise ValueError(
                f"{where}: no row of {str(path)!r} has {key!r}"
                + (f" for agent {src['agent']!r}" if src.get("agent") else "")
            )
        return sum(vals) / len(vals)
    data = read_json(path, where)
    if not isinstance(data, dict) or not isinstance(data.get(key), int | float):
        raise ValueError(f"{where}: {str(path)!r} has no number under {key!r}")
    return float(data[key])


def side_values(side: dict, seeds: list[str], where: str) -> dict[str, float]:
    """Each seed's value of one side: its sources combined (mean or sum), |value − center| if centred."""
    out = {}
    for s in seeds:
        if side.get("value") is not None:
            v = float(side["value"])
        else:
            got = [_number(src, f"{where}, {side['label']}, seed {s}") for src in side["seeds"][s]]
            v = sum(got) if side.get("combine") == "sum" else sum(got) / len(got)
        out[s] = abs(v - side["center"]) if side.get("center") is not None else v
    return out


def _effect(a: float, b: float, ratio: bool) -> float:
    if ratio:
        if b == 0:
            raise ValueError("a ratio claim's side b is 0")
        return a / b - 1
    return a - b


def _paper_effect(test: dict, key: str = "paper") -> float | None:
    a, b = test["a"].get(key), test["b"].get(key if test["b"].get("seeds") else "paper")
    if a is None or b is None:
        return None
    if test["a"].get("center") is not None:
        a = abs(a - test["a"]["center"])
    return _effect(a, b, test.get("ratio", False))


def scorecard(spec: dict) -> Scorecard:
    """Every row's paired test, Holm's correction over the tested rows, the headline and the notes."""
    rows, seed_rows, tests, notes = [], [], [], []
    for row in spec["rows"]:
        t = row["claim"]
        where = f"claim {t['claim']!r} ({row.get('block')}, {row.get('model')})"
        seeds = sorted(t["a"]["seeds"], key=int)
        a, b = side_values(t["a"], seeds, where), side_values(t["b"], seeds, where)
        diffs = [_effect(a[s], b[s], t.get("ratio", False)) for s in seeds]
        test = stats.paired_test(diffs, t["direction"])
        tests.append(test)
        base = {
            "claim": t["claim"],
            "pair": row.get("block"),
            "agent": row.get("model"),
            "a": t["a"]["label"],
            "b": t["b"]["label"],
            "direction": t["direction"],
            "metric": t["metric"],
            "ratio": bool(t.get("ratio", False)),
        }
        seed_rows += [
            base
            | {"seed": int(s), "center": t["a"].get("center"), "a_value": a[s], "b_value": b[s], "diff": d}
            for s, d in zip(seeds, diffs, strict=True)
        ]
        paired = t["b"].get("value") is None  # a method on each side: rliable's probability of improvement
        poi = (
            stats.probability_of_improvement([a[s] for s in seeds], [b[s] for s in seeds], t["direction"])
            if paired and test.n > 1
            else None
        )
        poi_ci = (
            stats.poi_interval([a[s] for s in seeds], [b[s] for s in seeds], t["direction"])
            if poi is not None
            else None
        )
        paper = _paper_effect(t)
        rows.append(base | {
            "n_seeds": test.n, "seeds": " ".join(seeds), "diff_mean": test.mean, "diff_sd": test.sd,
            "ci_low": test.ci_low, "ci_high": test.ci_high, "p_value": test.p_value, "verdict": test.verdict,
            "prob_improvement": poi, "poi_low": poi_ci and poi_ci[0], "poi_high": poi_ci and poi_ci[1],
            "seeds_needed": stats.seeds_needed(test.mean, test.sd) if test.verdict == "undecided" else None,
            "paper_diff": paper, "paper_table": t.get("paper_table"), "paper_stated": t.get("stated"),
            "source": t["source"], "decide": t.get("decide"), "agent_label": row.get("model_label"),
        })  # fmt: skip
        if t.get("stated") is not None:
            notes.append(_stated_note(t, paper, _paper_effect(t, "paper_columns_mean")))
    for row, test, p in zip(rows, tests, stats.holm([t.p_value for t in tests]), strict=True):
        row["p_holm"], row["verdict_holm"] = p, stats.holm_verdict(test, p)
    return Scorecard(rows, seed_rows, headline(rows), [n for n in notes if n])


def _pts(x: float) -> str:
    return f"{100 * x:+.2f} pts"


def _stated_note(t: dict, tables: float | None, columns: float | None) -> str:
    """What the scorecard says where the paper's sentence and its tables disagree (or agree)."""
    stated, where = t["stated"], f"{t['claim']} ({t['source']})"
    if tables is None:
        return f"{where}: the paper states {_pts(stated)}; no printed table value to check it against here."
    said = f"{where}: the paper states {_pts(stated)}; its {t.get('paper_table')} gives {_pts(tables)}"
    if columns is not None and abs(columns - tables) > 1e-9:
        said += f" from the printed AVG column and {_pts(columns)} from the mean of its benchmark columns"
    agree = [x for x in (tables, columns) if x is not None and abs(x - stated) <= STATED_TOLERANCE]
    if agree:
        return (
            said
            + " (the sentence matches "
            + ("the benchmark columns' mean" if tables not in agree else "the table")
            + ")."
        )
    return said + ": the sentence and the tables disagree."


def headline(rows: list[dict]) -> str:
    """One line: how many rows hold, are reversed, undecided, on one seed; and Holm's count."""
    count = {v: sum(r["verdict"] == v for r in rows) for v in stats.VERDICTS}
    tested = len(rows) - count["one seed"]
    holm = {v: sum(r["verdict_holm"] == v for r in rows) for v in ("holds", "reversed")}
    claims = len({r["claim"] for r in rows})
    return (
        f"{count['holds']} of {len(rows)} claim tests hold at this scale, {count['reversed']} reversed, "
        f"{count['undecided']} undecided, {count['one seed']} on one seed ({claims} claims, a test per "
        f"pair and agent; with Holm's correction over the {tested} tested: {holm['holds']} hold, "
        f"{holm['reversed']} reversed)."
    )


# ---------------------------------------------------------------------------------------------- output


def fmt(x, spec: str = "+.3f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def interval(row: dict) -> str:
    """``+0.043 [+0.010, +0.076]`` (one seed: the difference alone)."""
    if row["ci_low"] is None:
        return fmt(row["diff_mean"])
    return f"{fmt(row['diff_mean'])} [{fmt(row['ci_low'])}, {fmt(row['ci_high'])}]"


def comparison(row: dict) -> str:
    """``a − b > 0`` (``a / b − 1`` for ratios); a label with a minus of its own in parentheses."""

    def side(x) -> str:
        return f"({x})" if " − " in x and not x.startswith("abs(") else x

    a, b = side(str(row["a"])), side(str(row["b"]))
    lhs = f"{a} / {b} − 1" if row["ratio"] else f"{a} − {b}"
    return f"{lhs} {row['direction']} 0"


def to_decide(row: dict) -> str:
    """What decides an undecided or one-seed row."""
    if row["verdict"] == "one seed":
        return row.get("decide") or ""
    if row["verdict"] == "undecided":
        n = row["seeds_needed"]
        return f"≈ {n} seeds (80 % power)" if n else "no number of seeds (no effect)"
    return ""


def to_rst(card: Scorecard, title: str) -> str:
    """The report's front page: the headline and the scorecard as a csv-table (reStructuredText)."""

    def q(x) -> str:  # a csv-table cell: inline markup (|, *, `, \\) escaped, quotes doubled
        text = "".join("\\" + ch if ch in "\\|*`" else ch for ch in str(x))
        return '"' + text.replace('"', '""') + '"'

    head = [
        "claim",
        "pair",
        "agent",
        "comparison",
        "metric",
        "seeds",
        "difference [95 % CI]",
        "verdict",
        "paper",
    ]
    lines = [
        title,
        "-" * len(title),
        "",
        f"**{card.headline}**",
        "",
        ".. csv-table::",
        "   :header: " + ", ".join(q(h) for h in head),
        "",
    ]
    for r in card.rows:
        cells = [
            r["claim"],
            r["pair"],
            r["agent_label"] or r["agent"],
            comparison(r),
            r["metric"],
            r["n_seeds"],
            interval(r),
            r["verdict"],
            fmt(r["paper_diff"]),
        ]
        lines.append("   " + ", ".join(q(c) for c in cells))
    return "\n".join([*lines, "", *card.notes, ""])


def forest_plot(card: Scorecard, title: str) -> bytes:
    """Each row's mean difference with its 95 % interval, the paper's effect as a hollow diamond, zero
    marked; one panel per claim (its own x scale), rows coloured by verdict. PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    colours = {"holds": "#2a9d44", "reversed": "#c0392b", "undecided": "#7f8c8d", "one seed": "#34495e"}
    claims = list(dict.fromkeys(r["claim"] for r in card.rows))
    sizes = [sum(r["claim"] == c for r in card.rows) for c in claims]
    fig = Figure(figsize=(8.5, 1.0 + sum(0.32 * n + 0.75 for n in sizes)), layout="constrained")
    axes = fig.subplots(
        len(claims), 1, squeeze=False, gridspec_kw={"height_ratios": [n + 1.6 for n in sizes]}
    )
    for ax, claim in zip(axes[:, 0], claims, strict=True):
        rows = [r for r in card.rows if r["claim"] == claim]
        for y, r in enumerate(reversed(rows)):
            c = colours[r["verdict"]]
            if r["ci_low"] is not None:
                ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=c, lw=2)
            ax.plot(r["diff_mean"], y, "o", color=c, mfc=c if r["n_seeds"] > 1 else "white", ms=6)
            if r["paper_diff"] is not None:
                ax.plot(r["paper_diff"], y, "D", mfc="none", mec="black", ms=6)
        ax.axvline(0, color="black", lw=0.8, ls="--")
        ax.set_yticks(
            range(len(rows)),
            [f"{r['pair']} · {r['agent_label'] or r['agent']} (n={r['n_seeds']})" for r in reversed(rows)],
            fontsize="small",
        )
        ax.set_ylim(-0.7, len(rows) - 0.3)
        r0 = rows[0]
        ax.set_title(
            f"{claim}: {comparison(r0)} on {r0['metric']} — {r0['source']}", fontsize="small", loc="left"
        )
        ax.tick_params(axis="x", labelsize="small")
    handles = [
        Line2D([], [], color=c, marker="o", mfc="white" if v == "one seed" else c,
               lw=0 if v == "one seed" else 2, label=v)
        for v, c in colours.items()
    ]  # fmt: skip
    handles.append(Line2D([], [], color="black", marker="D", mfc="none", lw=0, label="paper's effect"))
    fig.legend(handles=handles, loc="outside lower center", ncols=5, fontsize="small", frameon=False)
    fig.suptitle(title + "\n" + textwrap.fill(card.headline, 120), fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def csv_text(rows: list[dict], columns: list[str]) -> str:
    import csv

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
