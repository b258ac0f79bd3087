"""Workflow config → runs, paths and rule parameters (pure Python, tested without Snakemake).

- the config's schema: :mod:`.config` (the top level, :class:`PipelineConfig`), its parts :mod:`.data_config`
  (datasets, benchmarks, eval settings), :mod:`.agents_config` (models, pairs, methods) and
  :mod:`.views_config` (tables, figures, scorecards), their cross-references :mod:`.view_checks`;
- what the Snakefile reads: :mod:`.targets` (:class:`Pipeline`: runs, files, rule parameters), :mod:`.runs`,
  the table and figure specs :mod:`.views` and :mod:`.claim_views`, the hooks :mod:`.hooks`;
- commands: :mod:`.cli` (``plan``, ``manifest``, ``rescore``, ``profiles``) and :mod:`.status`.
"""

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
