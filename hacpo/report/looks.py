"""One look of a sequential scorecard (``snakemake decide_<table>``, docs/statistics.md): the card at this
look's seeds and the record of every look so far, which says which rows stay open for the next block.

A row stays open while it is undecided and has fewer than the design's ``max`` seeds; a decided row keeps its
seeds and verdict from then on (its runs are never retrained). The record (``look<k>.json``) holds each
row's seeds and, per look, its seeds and verdict: what the next look adds seeds to, and what the card's
readers need to see how each verdict was reached.
"""

from __future__ import annotations

import json
from pathlib import Path

from hacpo.report import claims, stats
from hacpo.runio import atomic_write_text


def next_sizes(
    spec_rows: list[str], record: dict | None, start: int, block: int, most: int
) -> dict[str, int]:
    """Seeds per row at the next look: ``start`` for every row at the first; else the previous look's, with
    ``block`` more (at most ``most``) for each row still open."""
    if record is None:
        return dict.fromkeys(spec_rows, start)
    rows = record["rows"]
    return {k: min(most, rows[k]["n"] + block) if rows[k]["open"] else rows[k]["n"] for k in rows}


def may_grow(verdict: str, n: int, most: int) -> bool:
    """Whether the design gives a row more seeds: undecided and under ``most`` (the time budget aside)."""
    return verdict not in stats.DECIDED and n < most


def is_done(record: dict) -> bool:
    return not any(r["open"] for r in record["rows"].values())


def added_train_hours(spec: dict) -> float:
    """Training time of the runs the looks added (seeds past the first look's, this folder's only: another
    machine's are not trained here), hours: each run's ``profile.json`` wall time, counted once however many
    rows share it."""
    from hacpo.runio import Profile

    start, runs = spec["sequential"]["start"], set()
    for row in spec["rows"]:
        t = row["claim"]
        added = [u for u in (t.get("order") or [])[start:] if u not in t.get("origins", {})]
        runs |= {str(Path(f).parent) for u in added for f in t.get("runs", {}).get(u, [])}
    return sum(Profile.read(r).wall_s for r in sorted(runs)) / 3600


def close_when_spent(rows: dict[str, dict], spent_hours: float, max_hours: float | None) -> None:
    """Once the added seeds' training time reaches the cap, no row is open: the next look adds nothing. A
    block started under the cap is finished, so the time spent may pass it by up to one block."""
    if max_hours is not None and spent_hours >= max_hours:
        for r in rows.values():
            r["open"] = False


def write_look(spec: dict, look: int, out_json: str | Path, previous: str | Path | None) -> list[Path]:
    """The card of this look (``<out>.md``, ``.csv``, ``_seeds.csv``, ``.tex``, ``.rst``, ``.png`` beside
    ``out_json``) and its record, the history of every look included."""
    from hacpo.report.tables import write_table

    out = Path(out_json)
    prefix = out.with_suffix("")
    paths = write_table(spec, prefix, prefix)
    card = claims.scorecard(spec)
    most = spec["sequential"]["max"]
    history = json.loads(Path(previous).read_text())["looks"] if previous else []
    rows = {}
    for r in card.rows:
        rows[claims.row_key(r)] = {
            "seeds": r["seeds"].split(),
            "n": r["n_seeds"],
            "verdict": r["verdict"],
            "verdict_holm": r["verdict_holm"],
            "diff_mean": r["diff_mean"],
            "ci": [r["ci_low"], r["ci_high"]],
            "margin": r["margin"],
            "machines": r["machines"],
            "open": may_grow(r["verdict"], r["n_seeds"], most),
        }
    cap, spent = spec["sequential"].get("max_hours"), added_train_hours(spec)
    close_when_spent(rows, spent, cap)
    brief = {k: {"n": v["n"], "verdict": v["verdict"]} for k, v in rows.items()}
    history.append({"look": look, "headline": card.headline, "rows": brief, "added_train_hours": spent})
    record = {"table": spec.get("table"), "look": look, "design": spec["sequential"], "rows": rows,
              "looks": history, "added_train_hours": spent}  # fmt: skip
    record["done"] = is_done(record)
    md = prefix.with_name(prefix.name + ".md")
    atomic_write_text(md, md.read_text() + "\n" + looks_markdown(record))
    atomic_write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return [*paths, out]


def looks_markdown(record: dict) -> str:
    """Each row's seeds and verdict at every look, the table the card's readers check the rule against."""
    looks = record["looks"]
    head = ["row", *[f"look {x['look']}" for x in looks]]
    lines = ["## Looks", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in record["rows"]:
        cells = [key]
        for x in looks:
            r = x["rows"].get(key)
            cells.append(f"{r['verdict']} ({r['n']} seeds)" if r else "")
        lines.append("| " + " | ".join(cells) + " |")
    d, spent, cap = record["design"], record.get("added_train_hours", 0.0), record["design"].get("max_hours")
    if not record["done"]:
        state = "rows still open"
    elif any(may_grow(r["verdict"], r["n"], d["max"]) for r in record["rows"].values()):  # closed by the cap
        state = f"the time budget is spent ({spent:.2f} h of {cap:g} h): the rows still undecided stay so"
    else:
        state = "every row decided or at its budget"
    budget = f", training time of the added seeds capped at {cap:g} h" if cap is not None else ""
    lines += ["", f"Design: {d['start']} seeds, then {d['block']} more a look up to {d['max']} "
                  f"({d['spending']} α-spending{budget}); the added seeds' runs trained {spent:.2f} h; "
                  f"{state}."]  # fmt: skip
    return "\n".join(lines) + "\n"
