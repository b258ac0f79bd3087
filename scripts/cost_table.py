"""What a workflow config cost: rows from Snakemake's own benchmark files, and docs/performance.md's figures
rendered from docs/measurements.yaml, where each measured figure is written once.

    python scripts/cost_table.py results/config results/real-claims   # a Markdown row per results folder
    python scripts/cost_table.py --record results/rehearsal [--wall "68 min 13 s"]   # into the data file
    python scripts/cost_table.py --render                              # the page's table and marked figures

Per folder: the jobs Snakemake benchmarked, their summed wall time (the time on one core after another; a
run with `-c2` takes about half), the largest peak memory of one job (Snakemake's PSS, or a run's own peak
RSS from its profile.json where the warm worker ran the job), the folder's size on disk, and the machine
(this one's CPU). ``--record`` writes the folder's jobs, peak memory and disk (and a wall time you measured)
into docs/measurements.yaml with this machine and today's date, atomically; ``--render`` rewrites the cost
table between ``<!-- measurements:begin cost-table -->`` and ``<!-- measurements:end -->`` and every figure
marked ``<!-- m:ID -->…<!-- /m -->`` (``m:ID:machine``, ``m:ID:date``: its machine, its date) in
docs/performance.md from the data file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import tempfile
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hacpo.provenance import machine, machine_type  # noqa: E402

DATA = ROOT / "docs" / "measurements.yaml"
PAGE = ROOT / "docs" / "performance.md"
TABLE = re.compile(r"(<!-- measurements:begin cost-table -->\n).*?(<!-- measurements:end -->)", re.S)
FIGURE = re.compile(r"<!-- m:([\w.-]+)(?::(machine|date))? -->(.*?)<!-- /m -->")
COLUMNS = {"wall time": "wall time", "peak memory of a job": "memory", "disk": "disk"}


def folder_cost(folder: Path) -> dict:
    """Jobs, summed job seconds, the peak memory of one job (MB) and the disk (GB) of one results folder."""
    rows = []
    for tsv in sorted((folder / "benchmarks").rglob("*.tsv")):
        with open(tsv) as f:
            rows += list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ValueError(
            f"{folder}: no Snakemake benchmark files under {folder / 'benchmarks'}; run the workflow first"
        )

    def peak(r: dict) -> float:
        for key in ("max_pss", "max_rss"):
            if r.get(key) not in (None, "", "-", "NA"):
                return float(r[key])
        return 0.0

    # a job the warm worker ran in a forked child is measured by its client alone: take each run's own peak
    # (profile.json) too
    runs = [
        json.loads(p.read_text()).get("peak_rss_mb") or 0.0 for p in folder.glob("runs/*/*/*/*/profile.json")
    ]
    disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return {"jobs": len(rows), "job_s": sum(float(r["s"]) for r in rows),
            "peak_mb": max([*map(peak, rows), *runs]), "disk_gb": disk / 1e9}  # fmt: skip


def _cells(folder: Path) -> dict:
    c = folder_cost(folder)
    hours, rest = divmod(round(c["job_s"]), 3600)
    wall = f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
    memory, disk = f"{c['peak_mb'] / 1000:.1f} GB", f"{c['disk_gb']:.1f} GB"
    return {"jobs": str(c["jobs"]), "job time (summed)": wall, "peak memory of a job": memory, "disk": disk}


def row(folder: Path) -> str:
    c = _cells(folder)
    when = f"{machine_type(machine())}, {date.today().isoformat()}"
    cells = [f"`{folder.name}`", *c.values(), when]
    return "| " + " | ".join(cells) + " |"


def load(path: Path = DATA) -> dict:
    data = yaml.safe_load(path.read_text())
    ids = [m["id"] for m in data["measurements"]]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path}: an id is written twice: {sorted({i for i in ids if ids.count(i) > 1})}")
    return data


def record(folder: Path, config: str, wall: str | None, path: Path = DATA) -> list[str]:
    """Write the folder's jobs, peak memory and disk (and ``wall``) as the config's entries, replacing the
    ones of the same id; the file is replaced at once, so a reader never sees half of it."""
    data, cells = load(path), _cells(folder)
    if config not in data["configs"]:
        raise ValueError(f"{config}: not a row of {path}'s configs; pass --config <name>.yaml")
    stem, when, where = config.removesuffix(".yaml"), date.today().isoformat(), machine_type(machine())
    cmd = f"python scripts/cost_table.py --record {folder}"
    new = {f"{stem}.jobs": ("jobs", cells["jobs"]), f"{stem}.memory": ("peak memory of a job",
           cells["peak memory of a job"]), f"{stem}.disk": ("disk", cells["disk"])}  # fmt: skip
    if wall:
        new[f"{stem}.wall"] = ("wall time", wall)
    entries = {m["id"]: m for m in data["measurements"]}
    for key, (quantity, value) in new.items():
        entry = {"id": key, "config": config, "quantity": quantity, "value": value, "command": cmd,
                 "machine": where, "date": when}  # fmt: skip
        if key in entries:
            entries[key].clear()
            entries[key].update(entry)
        else:
            data["measurements"].append(entry)
    old = path.read_text()
    header = old[: old.index("\nconfigs:") + 1] if "\nconfigs:" in old else ""  # the comments above the data
    write_atomic(path, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=116))
    return list(new)


def write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def _first(data: dict, config: str, quantity: str) -> dict | None:
    found = (m for m in data["measurements"] if m["config"] == config and m["quantity"] == quantity)
    return next(found, None)


def cost_table(data: dict) -> str:
    """The cost table: a row per config of the data file, the first entry of each quantity, its machine."""
    lines = ["| config | what it runs | wall time | peak memory (a job) | disk | GPUs | measured |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for config, about in data["configs"].items():
        cells, sources = [], {}
        runs = about["runs"]
        if jobs := _first(data, config, "jobs"):
            runs += f", {jobs['value']} jobs"
        for quantity, column in COLUMNS.items():
            m = _first(data, config, quantity)
            if m is None or m["value"] is None:
                cells.append("not measured")
                continue
            cells.append(m["value"] + (f" ({m['note']})" if m.get("note") else ""))
            sources.setdefault(f"{m['machine']}, {m['date']}", []).append(column)
        if len(sources) > 1:
            measured = "; ".join(f"{', '.join(cols)}: {where}" for where, cols in sources.items())
        else:
            measured = next(iter(sources), "not measured")
        name = about.get("name", f"`{config}`")
        lines.append("| " + " | ".join([name, runs, *cells, about["gpus"], measured]) + " |")
    lines += ["", "A config's figures live in [measurements.yaml](measurements.yaml), each with the command "
              "that measured it; not measured: run the config, then `python scripts/cost_table.py --record "
              "results/<name>` records its jobs, peak memory and disk, and `--render` rewrites this table."]
    return "\n".join(lines) + "\n"


def render(text: str, data: dict) -> str:
    """``text`` (docs/performance.md) with its cost table and marked figures made from ``data``."""
    if not TABLE.search(text):
        raise ValueError(f"{PAGE}: no <!-- measurements:begin cost-table --> … <!-- measurements:end -->")
    entries = {m["id"]: m for m in data["measurements"]}
    unknown = sorted({key for key, *_ in FIGURE.findall(text) if key not in entries})
    if unknown:
        raise ValueError(f"{PAGE}: figures marked with ids {DATA.name} lacks: {unknown}; add them there")

    def figure(m: re.Match) -> str:
        key, field = m.group(1), m.group(2)
        marker = f"<!-- m:{key}{':' + field if field else ''} -->"
        return f"{marker}{entries[key][field or 'value']}<!-- /m -->"

    text = TABLE.sub(lambda m: m.group(1) + cost_table(data) + m.group(2), text)
    return FIGURE.sub(figure, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", help="results folders (results/<config name>)")
    ap.add_argument("--render", action="store_true", help="rewrite docs/performance.md from the data file")
    ap.add_argument("--record", action="store_true", help="record each folder into docs/measurements.yaml")
    ap.add_argument("--config", help="the config a recorded folder ran (default: <folder name>.yaml)")
    ap.add_argument("--wall", help='the wall time of the command you measured, e.g. "8 min 23 s"')
    args = ap.parse_args(argv)
    try:
        if args.record:
            for folder in map(Path, args.folders):
                print("recorded", ", ".join(record(folder, args.config or f"{folder.name}.yaml", args.wall)))
        if args.render:
            write_atomic(PAGE, render(PAGE.read_text(), load()))
            print(f"rendered {PAGE.relative_to(ROOT)}")
        if args.record or args.render:
            return 0
        if not args.folders:
            ap.error("name a results folder, or pass --render or --record")
        print("| results folder | jobs | job time (summed) | peak memory of a job | disk | machine, date |")
        print("|---|---|---|---|---|---|")
        for folder in args.folders:
            print(row(Path(folder)))
    except ValueError as err:
        print(f"cost_table: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
