"""Copy the workflow's figures that the README and the documentation embed into docs/figures/.

    python scripts/docs_figures.py            # every figure whose workflow has finished
    python scripts/docs_figures.py --check    # only say which are missing or stale, copy nothing

Each figure is a workflow output (FIGURES: its file, and the command that makes it from a fresh clone), so the
pictures in the docs are the ones the workflow draws, never edited by hand. A figure whose workflow has not
run is named with its command; the others are copied atomically. Exit status 1 when any is missing.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"
REAL = "HACPO_DATA_CACHE=<folder with gsm8k_test.jsonl, offline> snakemake -c2 --configfile config/real.yaml"

# docs/figures/<name> ← a workflow output, and the command that makes it (run from the repository root)
FIGURES: dict[str, tuple[str, str]] = {
    "figure2.png": ("results/config/figures/figure2.png", "snakemake"),
    "figure3.png": ("results/config/figures/figure3.png", "snakemake"),
    "clip_by_update.png": ("results/config/figures/clip_by_update.png", "snakemake"),
    "claims_full.png": ("results/config/figures/claims_full.png", "snakemake claims_full"),
    "sharing_rules.png": ("results/config/figures/sharing_rules.png", "snakemake sharing_rules"),
    "real_figure2.png": ("results/real/figures/figure2.png", REAL),
    "weak_steps.png": (
        "results/real-claims/figures/weak_steps.png",
        "snakemake -c2 --configfile config/real-claims.yaml config/real-claims-weak.yaml",
    ),
}


def copy_atomic(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.")
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make a private file of a published figure
    os.replace(tmp, dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="copy nothing; report missing and stale figures")
    args = parser.parse_args(argv)
    missing = []
    for name, (source, command) in FIGURES.items():
        src, dst = ROOT / source, OUT / name
        if not src.is_file():
            missing.append(f"  {name}: {source} does not exist; make it with `{command}`")
            continue
        same = dst.is_file() and filecmp.cmp(src, dst, shallow=False)
        if args.check:
            print(f"{name}: {'up to date' if same else 'differs from ' + source}")
        elif not same:
            copy_atomic(src, dst)
            print(f"{name} ← {source}")
    if missing:
        print("missing workflow outputs:\n" + "\n".join(missing), file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
