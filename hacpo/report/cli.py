"""``hacpo report table|figure --spec SPEC --out-prefix PREFIX``: render a paper table or figure;
``hacpo report look --spec SPEC --look K --out LOOK.json [--previous PREV.json]``: one look of a sequential
scorecard (:mod:`hacpo.report.looks`).

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


def cmd_look(args) -> int:
    from hacpo.report.looks import write_look

    for p in write_look(load_spec(args.spec), args.look, args.out, args.previous):
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
    a = actions.add_parser("look", help="one look of a sequential scorecard: its card and the looks' record")
    a.add_argument("--spec", required=True, help="JSON string or @path/to/spec.json")
    a.add_argument("--look", type=int, required=True, help="this look's number, 1 for the first")
    a.add_argument("--out", required=True, help="the record, e.g. results/x/tables/claims_looks/look1.json")
    a.add_argument("--previous", help="the previous look's record (none at the first look)")
    a.set_defaults(func=cmd_look)
