"""hacpo.report: paper tables (CSV/Markdown/LaTeX) and figures rendered from specs over fabricated files."""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import pytest

from hacpo.report import build_table, paper_value, to_latex, to_markdown, write_table
from hacpo.report.cli import add_cli, load_spec
from hacpo.report.tables import tex_escape

PAIR = "Qwen3-1.7B-Base+Qwen3-4B-Base"
SD = math.sqrt(0.02)  # sample std of two values 0.2 apart


def _json(path: Path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _jsonl(path: Path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _summary(tmp: Path, name: str, **metrics) -> str:
    return _json(
        tmp / f"{name}.json", {"benchmark": name.split("-")[0], "n_problems": 10, "sampling": {}, **metrics}
    )


def _csv(path: Path) -> dict[tuple[str, str, str], dict]:
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == [
        "table",
        "block",
        "model",
        "method",
        "column",
        "ours",
        "ours_std",
        "n_seeds",
        "paper",
        "delta",
    ]
    return {(r["model"], r["method"], r["column"]): r for r in rows}


def _run(argv: list[str]) -> int:
    """What the main CLI does with the registered handlers: ValueError → exit 2."""
    p = argparse.ArgumentParser(prog="hacpo")
    add_cli(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except ValueError:
        return 2


def accuracy_spec(tmp: Path, paper_delta: bool = True) -> dict:
    s = lambda n, **m: _summary(tmp, n, **m)  # noqa: E731
    evals_h = {
        "math500": [s("math500-h0", **{"avg@1": 0.4}), s("math500-h1", **{"avg@1": 0.6})],
        "aime2025": [s("aime-h0", **{"avg@32": 0.1}), s("aime-h1", **{"avg@32": 0.3})],
    }
    evals_g = {"math500": [s("math500-g0", **{"avg@1": 0.3})], "aime2025": [s("aime-g0", **{"avg@32": 0.1})]}
    row = {
        "block": "size",
        "block_label": "small + big (size_pair)",
        "paper_block": PAIR,
        "model": "small",
        "paper_model": "Qwen3-1.7B-Base",
    }
    return {
        "table": "table1",
        "kind": "accuracy",
        "title": "Table 1 — main results",
        "paper_table": "table1",
        "paper_delta": paper_delta,
        "note": "Toy scale.",
        "avg": True,
        "compare_to": "gspo_x2",
        "columns": [
            {"key": "math500", "label": "MATH_500 %", "paper": "math500", "metric": "avg@1"},
            {"key": "aime2025", "label": "AIME2025", "paper": "aime2025", "metric": "avg@32"},
        ],
        "rows": [
            {**row, "method": "hacpo", "label": "HACPO", "paper_method": "hacpo", "evals": evals_h},
            {**row, "method": "gspo_x2", "label": "GSPO×2", "paper_method": "gspo_x2", "evals": evals_g},
        ],
    }


def test_paper_lookup():
    assert paper_value("table1", PAIR, "Qwen3-1.7B-Base", "hacpo", "math500") == 0.69
    assert paper_value("table7", PAIR, "total", "gspo", "runtime_minutes") == 249
    assert paper_value("table1", PAIR, "Qwen3-1.7B-Base", None, "math500") is None
    assert paper_value("table1", PAIR, "Qwen3-1.7B-Base", "hacpo", "nope") is None


def test_accuracy_table_with_delta(tmp_path):
    paths = write_table(accuracy_spec(tmp_path), tmp_path / "out" / "table1")
    assert [p.name for p in paths] == ["table1.csv", "table1.md", "table1.tex"]
    cells = _csv(paths[0])
    h = cells[("small", "hacpo", "math500")]
    assert float(h["ours"]) == pytest.approx(0.5) and float(h["ours_std"]) == pytest.approx(SD)
    assert h["n_seeds"] == "2" and float(h["paper"]) == 0.69 and float(h["delta"]) == pytest.approx(-0.19)
    avg = cells[("small", "hacpo", "avg")]  # mean of 0.5 and 0.2; per-seed AVGs 0.25, 0.45
    assert float(avg["ours"]) == pytest.approx(0.35) and float(avg["ours_std"]) == pytest.approx(SD)
    assert float(avg["paper"]) == 0.493 and float(avg["delta"]) == pytest.approx(0.35 - 0.493)
    g = cells[("small", "gspo_x2", "avg")]
    assert float(g["ours"]) == pytest.approx(0.2) and g["ours_std"] == "" and float(g["paper"]) == 0.475
    assert cells[("small", "gspo_x2", "aime2025")]["paper"] == "0.177"
    md = paths[1].read_text()
    assert md.startswith("# Table 1 — main results")
    assert "**small + big (size_pair)**" in md and "Toy scale." in md
    assert "| small | HACPO | 0.500 ± 0.141 [+0.200] (Δ -0.190) |" in md
    assert "| small | GSPO×2 | 0.300 (Δ -0.364) | 0.100 (Δ -0.077) | 0.200 (Δ -0.275) |" in md
    tex = paths[2].read_text()
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"\begin{tabular}{llrrr}" in tex
    assert r"MATH\_500 \%" in tex and r"size\_pair" in tex and r"GSPO$\times$2" in tex
    assert r"0.500 $\pm$ 0.141 [+0.200] ($\Delta$ -0.190)" in tex


def test_accuracy_table_reference_only(tmp_path):
    paths = write_table(accuracy_spec(tmp_path, paper_delta=False), tmp_path / "t")
    cells = _csv(paths[0])
    assert all(c["delta"] == "" for c in cells.values())
    assert float(cells[("small", "hacpo", "math500")]["paper"]) == 0.69
    assert "0.500 ± 0.141 [+0.200] (paper 0.690)" in paths[1].read_text()
    assert "Δ" not in paths[1].read_text() and r"\Delta" not in paths[2].read_text()


def test_hyperparams_table(tmp_path):
    spec = {
        "table": "table4",
        "kind": "hyperparams",
        "paper_table": "table4",
        "paper_delta": True,
        "columns": [
            {"key": "alpha", "label": "α", "paper": "alpha"},
            {"key": "one_minus_delta", "label": "1−δ", "paper": "one_minus_delta"},
            {"key": "delta_step", "label": "δ_step", "paper": "delta_step"},
        ],
        "rows": [
            {
                "block": "size",
                "block_label": "small + big",
                "paper_block": PAIR,
                "values": {"alpha": 1.0, "one_minus_delta": 0.8, "delta_step": 0.05},
            }
        ],
    }
    paths = write_table(spec, tmp_path / "table4")
    cells = _csv(paths[0])
    ds = cells[("pair", "hacpo", "delta_step")]
    assert (
        float(ds["ours"]) == 0.05
        and float(ds["paper"]) == 0.025
        and float(ds["delta"]) == pytest.approx(0.025)
    )
    assert float(cells[("pair", "hacpo", "alpha")]["delta"]) == 0
    assert "| small + big | 1 (Δ +0) | 0.8 (Δ +0) | 0.05 (Δ +0.025) |" in paths[1].read_text()
    assert r"$\alpha$ & 1$-$$\delta$ & $\delta$\_step" in paths[2].read_text()


def test_ratio_stats_table(tmp_path):
    m0 = _jsonl(
        tmp_path / "s0/metrics.jsonl",
        [
            {"step": 1, "small/s_homo_mean": 1.0, "small/s_hete_mean": 0.8},
            {"step": 2, "small/s_homo_mean": 1.2},  # no cross rows this step
            {"step": 3, "small/s_homo_mean": 1.1, "small/s_hete_mean": None, "big/s_homo_mean": 7.0},
        ],
    )
    m1 = _jsonl(
        tmp_path / "s1/metrics.jsonl", [{"step": 1, "small/s_homo_mean": 0.9, "small/s_hete_mean": 0.9}]
    )
    base = {
        "block": "size",
        "paper_block": PAIR,
        "paper_model": "Qwen3-1.7B-Base",
        "paper_method": "hacpo",
        "agent": "small",
        "metrics": [m0, m1],
    }
    spec = {
        "table": "table5",
        "kind": "ratio_stats",
        "paper_table": "table5",
        "paper_delta": False,
        "rows": [
            {**base, "label": "s_homo (own samples)", "stat": "s_homo"},
            {**base, "label": "s_hete (cross samples)", "stat": "s_hete"},
        ],
    }
    paths = write_table(spec, tmp_path / "table5")
    cells = _csv(paths[0])
    homo = {k[2]: float(v["ours"]) for k, v in cells.items() if k[2].startswith("s_homo")}
    assert homo == pytest.approx(
        {"s_homo_mean": 1.05, "s_homo_max": 1.2, "s_homo_min": 0.9, "s_homo_range": 0.3}
    )
    hete = cells[("small", "hacpo", "s_hete_range")]
    assert float(hete["ours"]) == pytest.approx(0.1) and float(hete["paper"]) == 0.07417
    assert cells[("small", "hacpo", "s_homo_mean")]["paper"] == "1.00002"
    assert (
        "| s_hete (cross samples) | 0.85000 (paper 0.89550) | 0.90000 (paper 0.93615) |"
        in paths[1].read_text()
    )
    spec["rows"][0]["agent"] = "ghost"
    with pytest.raises(ValueError, match="ghost/s_homo_mean"):
        build_table(spec)


def test_seeds_table(tmp_path):
    ev = {str(s): [_summary(tmp_path, f"m-{s}", **{"avg@1": v})] for s, v in ((0, 0.5), (1, 0.7))}
    spec = {
        "table": "table6",
        "kind": "seeds",
        "paper_table": "table6",
        "paper_delta": True,
        "columns": [
            {"key": "0", "label": "seed 0", "paper": "acc_seed0", "metric": "avg@1"},
            {"key": "1", "label": "seed 1", "paper": "acc_seed1", "metric": "avg@1"},
        ],
        "rows": [
            {
                "block": "size",
                "paper_block": PAIR,
                "model": "small",
                "paper_model": "Qwen3-1.7B-Base",
                "method": "hacpo",
                "label": "HACPO",
                "paper_method": "hacpo",
                "evals": ev,
            }
        ],
    }
    paths = write_table(spec, tmp_path / "table6")
    cells = _csv(paths[0])
    assert float(cells[("small", "hacpo", "0")]["paper"]) == 0.656
    assert float(cells[("small", "hacpo", "1")]["delta"]) == pytest.approx(0.7 - 0.656)
    mean = cells[("small", "hacpo", "mean")]
    assert float(mean["ours"]) == pytest.approx(0.6) and float(mean["ours_std"]) == pytest.approx(SD)
    assert mean["paper"] == "" and mean["delta"] == ""
    assert "| 0.600 ± 0.141 |" in paths[1].read_text()


def test_alpha_table(tmp_path):
    ev = {str(a): [_summary(tmp_path, f"a-{a}", **{"avg@1": v})] for a, v in ((0, 0.6), (1, 0.7))}
    spec = {
        "table": "alpha_ablation",
        "kind": "alpha",
        "paper_table": "alpha_ablation",
        "paper_delta": False,
        "columns": [
            {"key": str(a), "label": f"α = {a}", "paper_method": f"hacpo_alpha{a}", "metric": "avg@1"}
            for a in (0, 1)
        ],
        "rows": [
            {
                "block": "size",
                "block_label": "small + big",
                "paper_block": PAIR,
                "model": "small",
                "paper_model": "Qwen3-1.7B-Base",
                "evals": ev,
            }
        ],
    }
    paths = write_table(spec, tmp_path / "alpha")
    cells = _csv(paths[0])
    assert float(cells[("small", "hacpo_alpha0", "0")]["paper"]) == 0.63
    assert float(cells[("small", "hacpo_alpha1", "1")]["ours"]) == 0.7
    assert "| small | 0.600 (paper 0.630) | 0.700 (paper 0.664) |" in paths[1].read_text()


def _profile(tmp: Path, name: str, wall=1.0, rss=400.0, gpu=None, total=None) -> str:
    return _json(
        tmp / "prof" / f"{name}.json",
        {
            "wall_s": wall,
            "peak_rss_mb": rss,
            "peak_gpu_mem_mb": gpu,
            "gpu_total_mb": total,
            "steps": 3,
            "phase_s": {},
        },
    )


def _profile_spec(kind: str, rows: list[dict]) -> dict:
    return {
        "table": {"runtime": "table7", "memory": "table8"}[kind],
        "kind": kind,
        "paper_delta": True,
        "paper_table": {"runtime": "table7", "memory": "table8"}[kind],
        "paper_block": PAIR,
        "columns": [
            {"key": "small", "label": "small", "paper_model": "Qwen3-1.7B-Base"},
            {"key": "big", "label": "big", "paper_model": "Qwen3-4B-Base"},
            {"key": "total", "label": "total", "paper_model": "total"},
        ],
        "rows": rows,
    }


def test_runtime_table(tmp_path):
    p = lambda n, w: _profile(tmp_path, n, wall=w)  # noqa: E731
    rows = [
        {
            "method": "gspo",
            "label": "GSPO",
            "paper_method": "gspo",
            "profiles": {"small": [p("g-s0", 10), p("g-s1", 20)], "big": [p("g-b0", 30)]},
        },
        {
            "method": "gspo_x2",
            "label": "GSPO×2",
            "paper_method": "gspo_x2",
            "profiles": {"small": [p("x-s0", 20)], "big": [p("x-b0", 40)]},
        },
        {"method": "hacpo", "label": "HACPO", "paper_method": "hacpo", "overall": [p("h0", 54)]},
    ]
    paths = write_table(_profile_spec("runtime", rows), tmp_path / "table7")
    cells = _csv(paths[0])
    small = cells[("small", "gspo", "small")]
    assert float(small["ours"]) == 15 and float(small["ours_std"]) == pytest.approx(math.sqrt(50))
    assert float(small["paper"]) == 91 and small["delta"] == ""  # seconds vs minutes: no delta
    assert float(cells[("total", "gspo", "total")]["ours"]) == 45
    assert float(cells[("total", "gspo", "total")]["paper"]) == 249
    assert float(cells[("overall", "hacpo", "total")]["paper"]) == 331
    rel = {k[1]: v for k, v in cells.items() if k[2] == "rel_gspo_total"}
    assert {m: float(r["ours"]) for m, r in rel.items()} == pytest.approx(
        {"gspo": 1, "gspo_x2": 60 / 45, "hacpo": 1.2}
    )
    assert float(rel["hacpo"]["paper"]) == pytest.approx(331 / 249)
    assert float(rel["hacpo"]["delta"]) == pytest.approx(1.2 - 331 / 249)
    md = paths[1].read_text()
    assert "| HACPO | — | — | overall 54.0 s (paper 331 min) | 1.20 (Δ -0.13) |" in md
    assert "| GSPO | 15.0 ± 7.1 s (paper 91 min) | 30.0 s (paper 158 min) | 45.0 s (paper 249 min) |" in md


def test_memory_table(tmp_path):
    rows = [
        {
            "method": "gspo",
            "label": "GSPO",
            "paper_method": "gspo",
            "profiles": {
                "small": [_profile(tmp_path, "gs", gpu=800, total=1000)],
                "big": [_profile(tmp_path, "gb", gpu=900, total=1000)],
            },
        },
        {
            "method": "hacpo",
            "label": "HACPO",
            "paper_method": "hacpo",
            "overall": [_profile(tmp_path, "h", gpu=950, total=1000)],
        },
    ]
    paths = write_table(_profile_spec("memory", rows), tmp_path / "table8")
    cells = _csv(paths[0])
    s = cells[("small", "gspo", "small")]
    assert float(s["ours"]) == 80 and float(s["paper"]) == 76.8 and float(s["delta"]) == pytest.approx(3.2)
    assert float(cells[("small", "gspo", "small_mb")]["ours"]) == 800
    assert float(cells[("total", "gspo", "total")]["ours"]) == 90  # peak over the two runs
    rel = cells[("overall", "hacpo", "rel_gspo")]
    assert float(rel["ours"]) == pytest.approx(95 / 90) and float(rel["paper"]) == pytest.approx(86.0 / 82.7)
    assert "overall 950 MB GPU, 95.0% (Δ +9.0)" in paths[1].read_text()
    # no GPU: peak RSS in MB, the paper % shown as reference only
    rows[0]["profiles"]["small"] = [_profile(tmp_path, "cpu", rss=398.6)]
    md = to_markdown(build_table(_profile_spec("memory", rows)))
    assert "399 MB RSS (paper 76.8%)" in md
    assert r"399 MB RSS (paper 76.8\%)" in to_latex(build_table(_profile_spec("memory", rows)))


def test_errors_name_the_problem(tmp_path):
    spec = accuracy_spec(tmp_path)
    missing = str(tmp_path / "nowhere" / "seed9.json")
    spec["rows"][1]["evals"]["math500"] = [missing]
    with pytest.raises(ValueError, match=r"seed9\.json.*does not exist") as err:
        build_table(spec)
    assert "gspo_x2" in str(err.value) or "GSPO×2" in str(err.value)
    spec = accuracy_spec(tmp_path)
    spec["columns"][0]["metric"] = "pass@64"
    with pytest.raises(ValueError, match=r"'pass@64' not in .*math500-h0\.json.*avg@1"):
        build_table(spec)
    with pytest.raises(ValueError, match="unknown table kind 'bogus'"):
        build_table({**spec, "kind": "bogus"})
    spec = accuracy_spec(tmp_path)
    del spec["rows"][0]["evals"]["aime2025"]
    with pytest.raises(ValueError, match="no entry for column 'aime2025'"):
        build_table(spec)
    with pytest.raises(ValueError, match="--spec: file .* does not exist"):
        load_spec("@" + str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_spec("{oops")


def test_cli_spec_file_and_exit_code(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(accuracy_spec(tmp_path)))
    out = tmp_path / "results" / "tables" / "table1"
    assert _run(["report", "table", "--spec", f"@{spec}", "--out-prefix", str(out)]) == 0
    assert (out.parent / "table1.md").read_text().startswith("# Table 1")
    bad = accuracy_spec(tmp_path)
    bad["rows"][0]["evals"]["math500"] = ["missing.json"]
    assert _run(["report", "table", "--spec", json.dumps(bad), "--out-prefix", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x.csv").exists()


def test_tex_escape():
    assert tex_escape("a_b 50% GSPO×2 − x & #") == r"a\_b 50\% GSPO$\times$2 $-$ x \& \#"


def test_figure_curves(tmp_path):
    def val(name, accs):
        rows = [
            {"acc": a, "agent": ag, "n": 100, "step": 3 * i}
            for i, a in enumerate(accs)
            for ag in ("small", "big")
        ]
        return _jsonl(
            tmp_path / name / "validation.jsonl",
            [{**r, "acc": r["acc"] + (r["agent"] == "big")} for r in rows],
        )

    spec = {
        "figure": "figure2",
        "kind": "curves",
        "title": "Figure 2",
        "y_label": "greedy accuracy",
        "panels": [
            {
                "title": f"{a} (size pair)",
                "agent": a,
                "lines": [
                    {
                        "label": "HACPO",
                        "method": "hacpo",
                        "validations": [val("h0", [0.1, 0.3]), val("h1", [0.2, 0.5])],
                    },
                    {"label": "GSPO", "method": "gspo", "validations": [val("g0", [0.1, 0.2])]},
                ],
            }
            for a in ("small", "big")
        ],
    }
    spec_file = tmp_path / "fig.json"
    spec_file.write_text(json.dumps(spec))
    out = tmp_path / "figures" / "figure2"
    assert _run(["report", "figure", "--spec", f"@{spec_file}", "--out-prefix", str(out)]) == 0
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert len(rows) == 2 * (2 * 2 + 2)  # panels × (2 seeds × 2 steps + 1 seed × 2 steps)
    small_h1 = [
        float(r["value"]) for r in rows if r["agent"] == "small" and r["line"] == "HACPO" and r["seed"] == "1"
    ]
    assert small_h1 == [0.2, 0.5]
    assert {float(r["value"]) for r in rows if r["agent"] == "big" and r["step"] == "0"} == {1.1, 1.2}
    spec["kind"] = "bars"
    assert _run(["report", "figure", "--spec", json.dumps(spec), "--out-prefix", str(out)]) == 2


def test_figure_updates_plots_the_share_of_cross_rows_inside_the_clip_per_update(tmp_path):
    """kind: updates (issue 25): one point per (seed, step, update m) that had cross rows, x = m; updates
    without cross rows (share None) are not points; a line's agent filters the learner."""
    from hacpo.runio import Update

    def log(name, shares):
        rows = [
            Update.row(step, agent, m, own_rows=8 - 4 * bool(share), cross_rows=4 * bool(share),
                       cross_lo=0.8 + 0.025 * m, cross_in_bounds_frac=share, kl_term=True)
            for step in (0, 1) for agent in ("small", "big") for m, share in enumerate(shares)
        ]  # fmt: skip
        return _jsonl(tmp_path / name / "updates.jsonl", rows)

    spec = {
        "figure": "clip_by_update",
        "kind": "updates",
        "y_label": "cross rows inside [lo_m, 1] (share)",
        "panels": [
            {
                "title": "small",
                "agent": "small",
                "lines": [
                    {"label": "HACPO", "method": "hacpo", "updates": [log("a", [None, 0.5, 0.75, 1.0])]},
                    {"label": "HACPO (agent order)", "method": "hacpo_agent_order",
                     "updates": [log("b", [0.25, 0.5, None, None])]},
                ],
            }
        ],
    }  # fmt: skip
    out = tmp_path / "figures" / "clip_by_update"
    assert _run(["report", "figure", "--spec", json.dumps(spec), "--out-prefix", str(out)]) == 0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert len(rows) == 2 * 3 + 2 * 2  # steps × updates with cross rows, per line
    hacpo = [(r["step"], r["update"], float(r["value"])) for r in rows if r["method"] == "hacpo"]
    assert hacpo[:3] == [("0", "1", 0.5), ("0", "2", 0.75), ("0", "3", 1.0)]
    spec["panels"][0]["lines"][0]["updates"] = [log("c", [None] * 4)]
    spec["panels"][0]["lines"] = spec["panels"][0]["lines"][:1]
    assert _run(["report", "figure", "--spec", json.dumps(spec), "--out-prefix", str(out)]) == 2  # no points


def test_figure_steps_plots_an_agents_metrics_fields_per_step(tmp_path):
    """kind: steps (issue 44): each panel reads one per-agent field (``<agent>/<metric>``) of the lines'
    metrics.jsonl per step; rows without it (a step without cross rows, NaN) are not points; the panel's
    own y label is used."""
    def log(name, values):
        rows = [{"step": i, "weak/own_adv_sum": v, "weak/reward": 0.25, "strong/own_adv_sum": 9.0}
                for i, v in enumerate(values)]  # fmt: skip
        return _jsonl(tmp_path / name / "metrics.jsonl", rows)

    a, b = log("a", [-1.5, None, 2.0]), log("b", [0.5, float("nan"), 1.0])
    line = {"label": "HACPO", "method": "hacpo", "metric": "own_adv_sum", "metrics": [a, b]}
    panel = {"title": "weak: own_adv_sum", "agent": "weak", "y_label": "own_adv_sum", "lines": [line]}
    spec = {"figure": "weak_steps", "kind": "steps", "y_label": "per step", "panels": [panel]}
    out = tmp_path / "figures" / "weak_steps"
    assert _run(["report", "figure", "--spec", json.dumps(spec), "--out-prefix", str(out)]) == 0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    rows = [(r["seed"], r["step"], float(r["value"])) for r in csv.DictReader(out.with_suffix(".csv").open())]
    assert rows == [("0", "0", -1.5), ("0", "2", 2.0), ("1", "0", 0.5), ("1", "2", 1.0)]
    figure = {"kind": "steps", "panels": [{"lines": [{"metric": "reward", "validations": ["x.jsonl"]}]}]}
    with pytest.raises(ValueError, match=r"panels\.0\.lines\.0: a 'steps' figure's line needs 'metrics'"):
        from hacpo.report.figures import write_figure

        write_figure(figure, tmp_path / "x")


def test_specs_are_checked_against_the_contract_before_any_file_is_read(tmp_path):
    """hacpo.specs: the workflow builds and the report reads the same models; a key one side does not
    know, or one a kind needs and lacks, fails naming its path."""
    from hacpo.report.figures import write_figure
    from hacpo.report.tables import build_table

    spec = {
        "kind": "accuracy",
        "columns": [{"key": "b", "metric": "avg@1"}],
        "rows": [{"model": "m", "evals": {"b": [str(tmp_path / "missing.json")]}, "modle_label": "M"}],
    }
    with pytest.raises(ValueError, match=r"rows\.0\.modle_label: Extra inputs are not permitted"):
        build_table(spec)
    spec["rows"] = [{"model": "m"}]
    with pytest.raises(ValueError, match=r"rows\.0: a 'accuracy' table's row needs evals"):
        build_table(spec)
    figure = {"kind": "updates", "panels": [{"lines": [{"validations": ["x.jsonl"]}]}]}
    with pytest.raises(ValueError, match=r"panels\.0\.lines\.0: a 'updates' figure's line needs 'updates'"):
        write_figure(figure, tmp_path / "f")
