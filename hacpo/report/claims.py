"""The claims scorecard: each claim of the paper tested on paired seeds, from a ``claims`` table spec
(:class:`hacpo.specs.ClaimTest` rows, built by
:meth:`hacpo.pipeline.claim_views.ClaimViews._table_claims`).

Per row it reads each side's value for every seed from the run files the spec names, pairs them by seed,
and applies :mod:`hacpo.report.stats` (docs/statistics.md). :func:`scorecard` returns the rows, the
long per-seed records (every verdict can be recomputed from them alone), the headline and the notes;
:func:`forest_plot` draws them, and :func:`claims_table` builds the table every output is written from.
"""

from __future__ import annotations

import collections
import io
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from hacpo.provenance import machine_type
from hacpo.report import stats
from hacpo.report.files import read_json, read_rows
from hacpo.report.render import Row, Table, csv_text
from hacpo.runio import RunRecord

UNRECORDED = "machine not recorded"  # the stratum of runs written before run.json named its machine

SEED_COLUMNS = ["claim", "pair", "agent", "seed", "a", "b", "direction", "metric", "ratio", "center",
                "a_value", "b_value", "diff", "machine", "origin", "margin", "look"]  # fmt: skip
CLAIM_COLUMNS = [
    "claim", "pair", "agent", "a", "b", "direction", "metric", "ratio", "n_seeds", "diff_mean", "ci_low",
    "ci_high", "verdict", "paper_diff", "source", "seeds", "diff_sd", "p_value", "p_holm", "verdict_holm",
    "prob_improvement", "poi_low", "poi_high", "seeds_needed", "paper_table", "paper_stated", "decide",
    "margin", "p_equivalent", "p_holm_equivalent", "machines", "look", "looks", "power",
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


def row_key(row: dict) -> str:
    """A scorecard row's name in a sequential look's record: ``claim/pair/agent``."""
    return f"{row['claim']}/{row['pair']}/{row['agent']}"


def unit_machine(runs: list[str], where: str, read: dict[str, str | None] | None = None) -> str:
    """The machine type of one seed's runs (their ``run.json``): the stratum its paired difference belongs
    to. Both sides of a pair must come from one machine: a difference across two machines' kernels would mix
    the machine's effect into the method's. ``read``: run.json path → its machine type, filled as read (a
    run serves many rows of a card: each is read once)."""
    read = {} if read is None else read
    kinds = set()
    for path in runs:
        if path not in read:
            record = RunRecord.read(Path(path).parent)
            kind = machine_type(record.machine) if record is not None and record.machine else UNRECORDED
            read[path] = None if record is None else kind
        if read[path] is not None:
            kinds.add(read[path])
    if len(kinds) > 1:
        raise ValueError(
            f"{where}: its runs come from different machines ({sorted(kinds)}); a seed's sides "
            "must be trained on one machine type (each machine its own results folder)"
        )
    return kinds.pop() if kinds else UNRECORDED


def design_of(sequential: dict | None, counts: dict[str, int], home: str) -> stats.Design:
    """The row's design: one look at its seeds, or the sequential design its table declares, seeds added on
    ``home`` (this results folder's machine), the other machines' seeds pooled at every look."""
    if not sequential:
        return stats.Design.fixed(counts)
    others = {m: n for m, n in counts.items() if m != home}
    q = sequential
    return stats.Design.sequential(q["start"], q["block"], q["max"], q["spending"], home, others)


def scorecard(spec: dict) -> Scorecard:
    """Every row's paired test, the family's correction over the tested rows, the headline and the notes."""
    rows, seed_rows, tests, notes = [], [], [], []
    sequential, machine_read = spec.get("sequential"), {}
    for row in spec["rows"]:
        t = row["claim"]
        where = f"claim {t['claim']!r} ({row.get('block')}, {row.get('model')})"
        units = t.get("order") or list(t["a"]["seeds"])  # look order: the table's seeds, then each block's
        a, b = side_values(t["a"], units, where), side_values(t["b"], units, where)
        diffs = [_effect(a[u], b[u], t.get("ratio", False)) for u in units]
        runs = t.get("runs", {})
        machines = [unit_machine(runs.get(u, []), f"{where}, seed {u}", machine_read) for u in units]
        counts = dict(collections.Counter(machines))
        design = design_of(sequential, counts, home=machines[0])  # this folder's seeds come first
        test = stats.paired_test(
            diffs, t["direction"], margin=t.get("margin"), strata=machines, design=design
        )
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
            base | {"seed": _seed(u), "center": t["a"].get("center"), "a_value": a[u], "b_value": b[u],
                    "diff": d, "machine": m, "origin": t.get("origins", {}).get(u, ""),
                    "margin": t.get("margin"), "look": _look_of(design, machines, i)}
            for i, (u, d, m) in enumerate(zip(units, diffs, machines, strict=True))
        ]  # fmt: skip
        paired = t["b"].get("value") is None  # a method on each side: rliable's probability of improvement
        poi = (
            stats.probability_of_improvement([a[u] for u in units], [b[u] for u in units], t["direction"])
            if paired and test.n > 1
            else None
        )
        poi_ci = (
            stats.poi_interval([a[u] for u in units], [b[u] for u in units], t["direction"])
            if poi is not None
            else None
        )
        paper = _paper_effect(t)
        rows.append(base | {
            "n_seeds": test.n, "seeds": " ".join(units), "diff_mean": test.mean, "diff_sd": test.sd,
            "ci_low": test.ci_low, "ci_high": test.ci_high, "p_value": test.p_value, "verdict": test.verdict,
            "prob_improvement": poi, "poi_low": poi_ci and poi_ci[0], "poi_high": poi_ci and poi_ci[1],
            "seeds_needed": stats.seeds_needed(test.mean, test.sd) if test.verdict == "undecided" else None,
            "paper_diff": paper, "paper_table": t.get("paper_table"), "paper_stated": t.get("stated"),
            "source": t["source"], "decide": t.get("decide"), "agent_label": row.get("model_label"),
            "margin": test.margin, "p_equivalent": test.p_equivalent,
            "machines": "; ".join(f"{m}: {n}" for m, n in counts.items()),
            "look": test.look + 1, "looks": len(design.looks),
            "power": _power_to_decide(design, test, t["direction"]) if sequential else None,
        })  # fmt: skip
        if t.get("stated") is not None:
            notes.append(_stated_note(t, paper, _paper_effect(t, "paper_columns_mean")))
    adjusted = stats.holm_disjoint([t.p_value for t in tests], [t.p_equivalent for t in tests])
    for row, test, p, q in zip(rows, tests, *adjusted, strict=True):
        row["p_holm"], row["p_holm_equivalent"] = p, q
        row["verdict_holm"] = stats.holm_verdict(test, p, p_holm_equivalent=q)
    return Scorecard(rows, seed_rows, headline(rows), [n for n in notes if n])


def _power_to_decide(design: stats.Design, test: stats.PairedTest, direction: str) -> float | None:
    """An undecided row's chance that the design decides it by its last look, were the true difference the
    observed one (simulated; the power the issue of adding seeds is about)."""
    if test.verdict != "undecided" or not test.sd:
        return None
    rates = stats.verdict_rates(design, test.mean, test.sd, direction, test.margin, reps=400, seed=0)
    return 1.0 - rates["undecided"]


def _seed(unit: str) -> int:
    return int(unit.rpartition(":")[2])


def _look_of(design: stats.Design, machines: list[str], i: int) -> int:
    """The look (1-based) at which the i-th seed joined its row."""
    stratum, rank = machines[i], machines[: i + 1].count(machines[i])
    col = design.strata.index(stratum)
    return next(k + 1 for k, look in enumerate(design.looks) if look[col] >= rank)


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
    """One line: how many rows hold, are reversed, equivalent, undecided, on one seed; and Holm's count."""
    count = {v: sum(r["verdict"] == v for r in rows) for v in stats.VERDICTS}
    tested = len(rows) - count["one seed"]
    holm = {v: sum(r["verdict_holm"] == v for r in rows) for v in stats.DECIDED}
    claims = len({r["claim"] for r in rows})
    return (
        f"{count['holds']} of {len(rows)} claim tests hold at this scale, {count['reversed']} reversed, "
        f"{count['equivalent']} equivalent, {count['undecided']} undecided, {count['one seed']} on one seed "
        f"({claims} claims, a test per pair and agent; with Holm's correction over the {tested} tested: "
        f"{holm['holds']} hold, {holm['reversed']} reversed, {holm['equivalent']} equivalent)."
    )


# ---------------------------------------------------------------------------------------------- output


def claims_table(spec: dict) -> Table:
    """The scorecard: one row per claim × pair × agent with its paired difference over seeds,
    95 % t interval, verdict, Holm's verdict, rliable's probability of improvement and the paper's effect
    (:mod:`hacpo.report.claims`, docs/statistics.md). Its CSV has the claims columns
    (:data:`~hacpo.report.CLAIM_COLUMNS`); ``<prefix>_seeds.csv`` holds every seed's values,
    ``<prefix>.rst`` the report's front page, and the forest plot goes beside the figures."""
    card = scorecard(spec)
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
            comparison(r),
            r["metric"],
            r["seeds"],
            interval(r),
            margin(r),
            verdict(r),
            r["verdict_holm"],
            poi,
            fmt(r["paper_diff"]),
            to_decide(r),
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
        csv_text=csv_text(card.rows, CLAIM_COLUMNS),
        extras={
            "_seeds.csv": csv_text(card.seeds, SEED_COLUMNS),
            ".rst": to_rst(card, title),
        },
        figure=lambda: forest_plot(card, title),
    )


def fmt_(x) -> str:
    return fmt(x, ".2f")


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


def margin(row: dict) -> str:
    """``±0.020`` (ratio claims: ``±5 %``); empty where the claim tests no equivalence."""
    m = row.get("margin")
    if not m:
        return ""
    return f"±{100 * m:.0f} %" if row["ratio"] else f"±{m:.3f}"


def verdict(row: dict) -> str:
    """The verdict, and the look that reached it where seeds were added in looks (``holds (look 2 of 6)``)."""
    v = row["verdict"]
    looks = row.get("looks") or 1
    return f"{v} (look {row['look']} of {looks})" if looks > 1 and v in stats.DECIDED else v


def to_decide(row: dict) -> str:
    """What decides an undecided or one-seed row: the seeds a fixed design would need for 80 % power at the
    observed effect, to be added under a sequential budget (looking again with a fixed-n interval would
    inflate the error rate)."""
    if row["verdict"] == "one seed":
        return row.get("decide") or ""
    if row["verdict"] == "undecided" and row.get("power") is not None:
        return f"{100 * row['power']:.0f} % power to decide by the budget's last look"
    if row["verdict"] == "undecided":
        n = row["seeds_needed"]
        if not n:
            return "no number of seeds (no effect); a margin would make it equivalent"
        return f"≈ {n} seeds (80 % power), added under a sequential budget"
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
        "margin",
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
            margin(r),
            verdict(r),
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
    from matplotlib.patches import Patch

    colours = {"holds": "#2a9d44", "reversed": "#c0392b", "equivalent": "#2874a6", "undecided": "#7f8c8d",
               "one seed": "#34495e"}  # fmt: skip
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
        for m in {r["margin"] for r in rows if r.get("margin")}:  # the equivalence band ±m
            ax.axvspan(-m, m, color=colours["equivalent"], alpha=0.08, lw=0)
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
    handles.append(Patch(color=colours["equivalent"], alpha=0.15, label="±margin"))
    fig.legend(handles=handles, loc="outside lower center", ncols=7, fontsize="small", frameon=False)
    fig.suptitle(title + "\n" + textwrap.fill(card.headline, 120), fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()
