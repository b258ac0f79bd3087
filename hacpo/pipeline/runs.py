"""One training run of the workflow and its files under the config's results folder (single-agent: ``group``
= model; joint: ``group`` = pair)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Run:
    """One training run: single-agent (``group`` = model) or joint (``group`` = pair), under ``root`` (the
    config's results folder, :attr:`hacpo.pipeline.Pipeline.results`)."""

    kind: str
    group: str
    method: str
    seed: int
    root: str

    @property
    def dir(self) -> str:
        return f"{self.root}/runs/{self.kind}/{self.group}/{self.method}/seed{self.seed}"

    @property
    def done(self) -> str:
        return f"{self.dir}/done.json"

    @property
    def profile(self) -> str:
        """The run's own time split and peak memory (written when it finishes)."""
        return f"{self.dir}/profile.json"

    @property
    def benchmark(self) -> str:
        """Snakemake's benchmark TSV of the training job (host wall time, RSS)."""
        return f"{self.root}/benchmarks/train/{self.kind}/{self.group}/{self.method}/seed{self.seed}.tsv"
