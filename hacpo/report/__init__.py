"""Paper tables and figures (v2 numbering) rendered from JSON specs built by the pipeline.

``write_table(spec, prefix)`` → ``prefix.{csv,md,tex}``;
``write_figure(spec, prefix)`` → ``prefix.{png,csv}``;
``paper_value(table, block, model, method, benchmark)`` → the paper's printed number. CLI: ``hacpo report``.
"""

from hacpo.report.paper import paper_value, paper_values
from hacpo.report.tables import KINDS, build_table, to_csv, to_latex, to_markdown, write_table


def write_figure(spec: dict, out_prefix):
    """Lazy wrapper (keeps matplotlib/seaborn/pandas out of table-only imports)."""
    from hacpo.report.figures import write_figure as _write

    return _write(spec, out_prefix)


__all__ = ["KINDS", "build_table", "paper_value", "paper_values", "to_csv", "to_latex", "to_markdown",
           "write_figure", "write_table"]
