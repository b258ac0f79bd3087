"""Paper tables and figures (v2 numbering) rendered from JSON specs built by the pipeline.

``write_table(spec, prefix)`` → ``prefix.{csv,md,tex}``;
``write_figure(spec, prefix)`` → ``prefix.{png,csv}``;
``paper_value(table, block, model, method, benchmark)`` → the paper's printed number. CLI: ``hacpo report``.
"""

import importlib

# Loaded on first use (PEP 562): every `hacpo` command builds its parser with `hacpo report`'s subcommand,
# which must not cost pandas and the tables' imports every process.
_EXPORTS = {
    "paper_value": "hacpo.report.paper",
    "paper_values": "hacpo.report.paper",
    **dict.fromkeys(("KINDS", "build_table", "to_csv", "to_latex", "to_markdown", "write_table"),
                    "hacpo.report.tables"),
}  # fmt: skip


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def write_figure(spec: dict, out_prefix):
    """Lazy wrapper (keeps matplotlib/seaborn/pandas out of table-only imports)."""
    from hacpo.report.figures import write_figure as _write

    return _write(spec, out_prefix)


__all__ = [
    "KINDS",
    "build_table",
    "paper_value",
    "paper_values",
    "to_csv",
    "to_latex",
    "to_markdown",
    "write_figure",
    "write_table",
]
