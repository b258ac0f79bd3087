"""``hacpo report table|figure --spec SPEC --out-prefix PREFIX``: render a paper table or figure.

SPEC is a JSON string or ``@path/to/spec.json``. Bad specs and missing inputs raise ``ValueError``
(the main CLI turns it into exit status 2).
"""

from __future__ import annotations

from hacpo.runio import json_arg


def load_spec(text: str) -> dict:
    """Parse a spec given inline (JSON) or as ``@file``."""
    return json_arg(text, "--spec")


def cmd_table(args) -> int:
    from hacpo.report.tables import write_table

    for p in write_table(load_spec(args.spec), args.out_prefix, args.figure_prefix):
        print(p)
    return 0


def cmd_figure(args) -> int:
    from hacpo.report.figures import write_figure

    for p in write_figure(load_spec(args.spec), args.out_prefix):
        print(p)
    return 0


def add_cli(subparsers) -> None:
    """Register ``report`` with the actions ``table`` and ``figure`` on the main CLI's subparsers."""
    r = subparsers.add_parser("report", help="render a paper table (CSV/Markdown/LaTeX) or figure (PNG/CSV)")
    actions = r.add_subparsers(dest="report_action", required=True)
    for name, func, out in (
        ("table", cmd_table, "results/config/tables/table1"),
        ("figure", cmd_figure, "results/config/figures/figure2"),
    ):
        a = actions.add_parser(name, help=f"render a {name} from a JSON spec")
        a.add_argument("--spec", required=True, help="JSON string or @path/to/spec.json")
        a.add_argument("--out-prefix", required=True, help=f"output path without extension, e.g. {out}")
        if name == "table":
            a.add_argument(
                "--figure-prefix",
                help="a table kind's own figure (claims: the forest plot), "
                "without extension, e.g. results/config/figures/claims",
            )
        a.set_defaults(func=func)
