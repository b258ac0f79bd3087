"""The layout the docs promise (docs/guide/workflow.md) exists in a fresh clone: every top-level folder and
file is tracked, so `git clone` makes it (results/ holds only its README and the project's packed runs; git
ignores everything the pipeline writes there)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ["workflow", "config", "hacpo", "envs", "results", "tests", "Snakefile", "pyproject.toml", "docs",
          "mkdocs.yml", "LICENSE", "CITATION.cff", "README.md"]


@pytest.mark.skipif(not (ROOT / ".git").exists() or not shutil.which("git"), reason="needs the git checkout")
def test_a_clean_clone_has_every_top_level_part_of_the_layout():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    tops = {line.split("/", 1)[0] for line in tracked.stdout.splitlines()}
    assert set(LAYOUT) <= tops, sorted(set(LAYOUT) - tops)
    assert "results/README.md" in tracked.stdout.splitlines()
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/config/tables/table1.md"], cwd=ROOT)
    assert ignored.returncode == 0  # what the workflow writes stays out of git
