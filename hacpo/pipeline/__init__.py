"""Workflow config → runs, paths and rule parameters (pure Python, tested without Snakemake).

- the config's schema: :mod:`.config` (the top level, :class:`PipelineConfig`), its parts :mod:`.data_config`
  (datasets, benchmarks, eval settings), :mod:`.agents_config` (models, pairs, methods) and
  :mod:`.views_config` (tables, figures, scorecards), their cross-references :mod:`.view_checks`;
- what the Snakefile reads: :mod:`.targets` (:class:`Pipeline`: runs, files, rule parameters), :mod:`.runs`,
  the table and figure specs :mod:`.views` and :mod:`.claim_views`, the hooks :mod:`.hooks`;
- commands: :mod:`.cli` (``plan``, ``manifest``, ``rescore``, ``profiles``) and :mod:`.status`.
"""

import importlib

# Loaded on first use (PEP 562): `hacpo train` builds its parser with the workflow's subcommands
# (:mod:`.cli`, :mod:`.status`), which must not cost the schema's and the report's imports every process.
_EXPORTS = {
    "ConfigError": ".config",
    "PipelineConfig": ".config",
    "load_pipeline_config": ".config",
    "Pipeline": ".targets",
    "Run": ".targets",
    "Unrecorded": ".targets",
    "as_json": ".targets",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "Pipeline",
    "PipelineConfig",
    "Run",
    "Unrecorded",
    "as_json",
    "load_pipeline_config",
]
