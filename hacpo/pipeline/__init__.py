"""Workflow config → runs, paths and rule parameters (pure Python, tested without Snakemake)."""

from .config import ConfigError, PipelineConfig, load_pipeline_config
from .targets import Pipeline, Run, Unrecorded, as_json

__all__ = [
    "ConfigError",
    "Pipeline",
    "PipelineConfig",
    "Run",
    "Unrecorded",
    "as_json",
    "load_pipeline_config",
]
