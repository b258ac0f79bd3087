"""The Snakefile resolves and lints (the full DAG of issue 4 will extend these checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]  # a core dependency, in the same environment as pytest


def test_dry_run_resolves_the_default_target(tmp_path):
    out = subprocess.run(
        [
            *SNAKEMAKE,
            "-n",
            "--snakefile",
            str(ROOT / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--quiet",
            "rules",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "train_joint" in out.stdout and "all" in out.stdout
