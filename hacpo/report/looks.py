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


def is_done(record: dict) -> bool:
    return not any(r["open"] for r in record["rows"].values())


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
            "open": r["verdict"] not in stats.DECIDED and r["n_seeds"] < most,
        }
    brief = {k: {"n": v["n"], "verdict": v["verdict"]} for k, v in rows.items()}
    history.append({"look": look, "headline": card.headline, "rows": brief})
    record = {"table": spec.get("table"), "look": look, "design": spec["sequential"], "rows": rows,
              "looks": history}  # fmt: skip
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
    d = record["design"]
    state = "every row decided or at its budget" if record["done"] else "rows still open"
    lines += ["", f"Design: {d['start']} seeds, then {d['block']} more a look up to {d['max']} "
                  f"({d['spending']} α-spending); {state}."]  # fmt: skip
    return "\n".join(lines) + "\n"
