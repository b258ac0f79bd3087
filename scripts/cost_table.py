"""What a workflow config cost, from Snakemake's own benchmark files: one Markdown row per results folder.

    python scripts/cost_table.py results/config results/real-claims

Per folder: the jobs Snakemake benchmarked, their summed wall time (the time on one core after another; a
run with `-c2` takes about half), the largest peak memory of one job (Snakemake's PSS, or a run's own peak
RSS from its profile.json where the warm worker ran the job), the folder's size on disk, and the machine
(this one's CPU). The table in docs/performance.md is made of such rows, each with its machine and date.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hacpo.provenance import machine, machine_type  # noqa: E402


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


def row(folder: Path) -> str:
    c = folder_cost(folder)
    hours, rest = divmod(round(c["job_s"]), 3600)
    wall = f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
    memory, disk = f"{c['peak_mb'] / 1000:.1f} GB", f"{c['disk_gb']:.1f} GB"
    when = f"{machine_type(machine())}, {date.today().isoformat()}"
    cells = [f"`{folder.name}`", str(c["jobs"]), wall, memory, disk, when]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="results folders (results/<config name>)")
    args = ap.parse_args(argv)
    print("| results folder | jobs | job time (summed) | peak memory of a job | disk | machine, date |")
    print("|---|---|---|---|---|---|")
    for folder in args.folders:
        try:
            print(row(Path(folder)))
        except ValueError as err:
            print(f"cost_table: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
