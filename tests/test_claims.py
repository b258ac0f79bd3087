"""The claims scorecard (issue 30): its statistics against hand-computed cases, malformed claims refused with
their key path, the runs the DAG plans for it, and the report built from run files."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from hacpo.pipeline import Pipeline
from hacpo.pipeline.config import ConfigError
from hacpo.pipeline.runs import Run
from hacpo.report import stats
from hacpo.report.tables import write_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
CI = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())


# ------------------------------------------------------------------------------------------ statistics
def test_one_seed_gives_the_sign_only():
    t = stats.paired_test([0.03], ">")
    assert (t.n, t.mean, t.sd, t.ci_low, t.ci_high, t.p_value, t.verdict) == (
        1,
        0.03,
        None,
        None,
        None,
        None,
        "one seed",
    )
    assert stats.seeds_needed(t.mean, t.sd) is None  # no spread measured: nothing to size


def test_two_and_three_seeds_by_hand():
    # n = 2: t(0.975, 1) = 12.7062047; half-width = 12.7062047 · sd / √2 with sd = 0.0141421356
    t = stats.paired_test([0.02, 0.04], ">")
    assert t.mean == pytest.approx(0.03) and t.sd == pytest.approx(0.0141421356)
    assert (t.ci_low, t.ci_high) == pytest.approx((0.03 - 0.127062047, 0.03 + 0.127062047))
    assert t.verdict == "undecided"
    # n = 3: t(0.975, 2) = 4.30265273; d = 0.05, 0.06, 0.07 (sd 0.01): 0.06 ± 0.0248413771
    t = stats.paired_test([0.05, 0.06, 0.07], ">")
    assert (t.ci_low, t.ci_high) == pytest.approx((0.0351586229, 0.0848413771))
    assert t.verdict == "holds" and t.p_value < 0.05
    assert stats.paired_test([0.05, 0.06, 0.07], "<").verdict == "reversed"  # the paper claimed a − b < 0
    assert stats.paired_test([-0.10, -0.12, -0.11], "<").verdict == "holds"
    assert stats.paired_test([-0.10, -0.12, -0.11], ">").verdict == "reversed"
    wide = stats.paired_test([1, 2, 3], ">")  # 2 ± 4.30265273 / √3
    assert (wide.ci_low, wide.ci_high) == pytest.approx((-0.4841377118, 4.4841377118))
    assert wide.verdict == "undecided"


def test_zero_spread_and_ties():
    same = stats.paired_test([0.05, 0.05, 0.05], ">")  # no spread: the interval is the point
    assert (same.ci_low, same.ci_high, same.sd, same.p_value, same.verdict) == (0.05, 0.05, 0.0, 0.0, "holds")
    assert stats.paired_test([0.05] * 3, "<").verdict == "reversed"
    ties = stats.paired_test([0.0, 0.0], ">")  # an interval that is zero reaches zero
    assert (ties.ci_low, ties.ci_high, ties.p_value, ties.verdict) == (0.0, 0.0, 1.0, "undecided")
    assert stats.seeds_needed(ties.mean, ties.sd) is None  # no effect: no number of seeds decides it
    assert stats.seeds_needed(0.05, 0.0) == 2


def test_the_detectable_effect_is_where_the_seeds_needed_reach_n():
    """The power statement of a design of n paired seeds (issue 44): the standardized effect detected with
    80 % power; G*Power's one-sample t-test gives d = 1.68 at n = 5 and 0.99 at n = 10 (two-sided, 5 %)."""
    assert stats.detectable_effect(5) == pytest.approx(1.68, abs=0.01)
    assert stats.detectable_effect(10) == pytest.approx(0.99, abs=0.01)
    for n in (3, 5, 8):
        d = stats.detectable_effect(n)
        assert stats.seeds_needed(d * 1.001, 1.0) == n and stats.seeds_needed(d * 0.99, 1.0) > n
    with pytest.raises(ValueError, match="at least 2 seeds"):
        stats.detectable_effect(1)


def test_bad_differences_are_refused():
    for bad in ([], [float("nan"), 1.0]):
        with pytest.raises(ValueError, match="finite differences"):
            stats.paired_test(bad, ">")
    with pytest.raises(ValueError, match="direction"):
        stats.paired_test([1.0, 2.0], ">=")


def test_seeds_needed_is_the_t_tests_sample_size_for_80_percent_power():
    # textbook one-sample t-test sizes (two-sided 5 %, power 0.8): d = 1 → 10, d = 0.5 → 34, d = 0.8 → 15
    assert stats.seeds_needed(1.0, 1.0) == 10
    assert stats.seeds_needed(0.5, 1.0) == stats.seeds_needed(-0.5, 1.0) == 34
    assert stats.seeds_needed(0.8, 1.0) == 15
    assert stats.seeds_needed(1e-6, 1.0) is None  # beyond MAX_SEEDS


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 → 3·0.01, max(0.03, 2·0.03), max(0.06, 1·0.04); None is not in the family
    assert stats.holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
    assert stats.holm([None]) == [None] and stats.holm([0.5, 0.9]) == [1.0, 1.0]
    held = stats.paired_test([0.05, 0.06, 0.07], ">")
    assert stats.holm_verdict(held, 0.04) == "holds" and stats.holm_verdict(held, 0.06) == "undecided"
    assert stats.holm_verdict(stats.paired_test([0.1], ">"), None) == "one seed"


def test_probability_of_improvement_is_rlibales_mann_whitney_statistic():
    a, b = [0.4, 0.5], [0.3, 0.5]  # pairs: 0.4>0.3, 0.4<0.5, 0.5>0.3, 0.5=0.5 → (1 + 0 + 1 + ½) / 4
    assert stats.probability_of_improvement(a, b, ">") == 0.625
    assert stats.probability_of_improvement(a, b, "<") == 0.375
    assert stats.probability_of_improvement([1, 2, 3], [1, 2, 3], ">") == 0.5
    x, y = [0.41, 0.38, 0.44, 0.36, 0.39], [0.35, 0.36, 0.34, 0.40, 0.35]
    u = sps.mannwhitneyu(x, y, alternative="greater").statistic
    assert stats.probability_of_improvement(x, y, ">") == pytest.approx(u / 25)
    low, high = stats.poi_interval(x, y, ">")
    assert 0 <= low <= stats.probability_of_improvement(x, y, ">") <= high <= 1
    assert stats.poi_interval(x, y, ">") == (low, high)  # seeded: the same interval every time
    assert stats.poi_interval([0.4], y, ">") is None


# ------------------------------------------------------------------------------------------ config
def _with_claim(claim: dict, base: dict = CI) -> dict:
    cfg = copy.deepcopy(base)
    cfg["tables"]["card"] = {"kind": "claims", "claims": {"c": claim}}
    return cfg


GOOD = {
    "source": "Table 1",
    "a": "hacpo",
    "b": "gspo",
    "direction": ">",
    "metric": "avg",
    "tables": ["table1"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"a": "nope"}, "tables.card.claims.c.a: 'nope' is not a known method"),
        ({"threshold": 1.0}, "give exactly one of `b:` (a method) or `threshold:`"),
        (
            {"metric": "math500"},
            "tables.card.claims.c.metric: 'math500' is not a benchmark or a claim metric",
        ),
        ({"agents": ["big"]}, "tables.card.claims.c.agents.0: 'big' is not a known agent of pair 'mixed'"),
        ({"tables": ["table99"]}, "tables.card.claims.c.tables.0: 'table99' is not a known table or figure"),
        ({"pairs": ["nope"]}, "tables.card.claims.c.pairs.0: 'nope' is not a known pair"),
        ({"tables": [], "pairs": None}, "tables.card.claims.c: no pairs"),
        ({"tables": [], "pairs": ["mixed"]}, "tables.card.claims.c.eval: metric 'avg' needs an eval setting"),
        ({"direction": ">="}, "direction"),
        ({"b": None, "metric": "s_hete", "threshold": 1.0, "a": "gspo"}, "'gspo' trains on no peer rows"),
        ({"metric": "s_homo"}, "compare it to a `threshold:`"),
        ({"metric": "wall_time", "average": True}, "wall time is one number per pair and seed"),
        ({"paper": {"tables": ["table42"]}}, "paper.tables.0"),
    ],
)
def test_a_malformed_claim_is_refused_naming_its_key(change, message):
    with pytest.raises(ConfigError) as err:
        Pipeline(_with_claim({**GOOD, **change}))
    assert message in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ the DAG
def _without_scorecards(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["tables"] = {k: t for k, t in cfg["tables"].items() if t["kind"] != "claims"}
    return cfg


def test_the_default_scorecard_trains_nothing_and_decides_where_runs_have_seeds():
    with_card, without = Pipeline(DEFAULT), Pipeline(_without_scorecards(DEFAULT))
    assert with_card.runs == without.runs  # 57 runs either way: it reads what the other tables train
    _, spec = with_card.table("claims")
    seeds = {
        (r["label"], r["block"], r["model"]): sorted(map(int, r["claim"]["a"]["seeds"])) for r in spec["rows"]
    }
    five = {k for k, v in seeds.items() if v == [0, 1, 42, 1337, 3407]}
    # Table 6's five seeds (HACPO, GSPO and GSPO×2 on the size pair) give every claim on them an interval
    assert five == {
        ("hacpo_beats_gspo", "size", "small"),
        ("hacpo_beats_gspo", "size", "big"),
        *(("hacpo_beats_gspo_x2", "size", a) for a in ("small", "big", "mean")),
        *(("curves_above_gspo_x2", "size", a) for a in ("small", "big")),
        *((c, "size", a) for c in ("s_homo_near_one", "s_hete_below_one") for a in ("small", "big")),
        ("faster_than_gspo_x2", "size", "all agents"),
    }
    assert all(v == [42] for k, v in seeds.items() if k not in five)
    decide = {r["claim"]["decide"] for r in spec["rows"] if len(r["claim"]["a"]["seeds"]) == 1}
    assert decide == {"snakemake claims_full"}


def _claim_runs(cfg: dict, claims: dict, seeds: list[int]) -> set[Run]:
    """The runs a scorecard needs, derived here from the claims' own words."""
    out = set()
    for c in claims.values():
        tables = [cfg["tables"].get(n) or cfg["figures"][n] for n in c.get("tables", [])]
        pairs = c.get("pairs") or [p for t in tables for p in t.get("pairs", [t.get("pair")])]
        for method in (m for m in (c["a"], c.get("b")) if m and m != "base"):
            joint = method.startswith(("hacpo", "naive", "xgrpo", "sgt"))
            for pair in pairs:
                for s in seeds:
                    if joint:
                        out.add(Run("joint", pair, method, s, "results/config"))
                    else:
                        agents = cfg["pairs"][pair]["agents"]
                        out |= {Run("single", a, method, s, "results/config") for a in agents}
    return out


def test_the_full_scorecard_plans_exactly_the_runs_its_claims_need():
    full = DEFAULT["tables"]["claims_full"]
    cfg = copy.deepcopy(DEFAULT)  # every other table and figure only when named: the runs are the card's
    for view in [*cfg["tables"].values(), *cfg["figures"].values()]:
        view["default"] = view is cfg["tables"]["claims_full"]
    assert set(Pipeline(cfg).runs) == _claim_runs(DEFAULT, full["claims"], full["seeds"])
    added = _claim_runs(DEFAULT, full["claims"], full["seeds"]) - set(Pipeline(DEFAULT).runs)
    # what `snakemake claims_full` trains after the default command: 84 for the paper's claims, 20 for HACPO
    # against XGRPO and SGT (two rules × the size and model pairs × five seeds)
    assert len(added) == 104


# ------------------------------------------------------------------------------------------ the report
def _eval(tmp: Path, name: str, acc: float) -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"avg@1": acc}))
    return str(path)


def _row(tmp: Path, claim: str, direction: str, a: list[float], b: list[float], **extra) -> dict:
    def side(label, vals):
        return {"label": label, "method": label.lower(),
                "seeds": {str(s): [{"file": _eval(tmp, f"{claim}-{label}-{s}", v), "key": "avg@1"}]
                          for s, v in enumerate(vals)}}  # fmt: skip

    test = {
        "claim": claim,
        "source": "Table 1",
        "direction": direction,
        "metric": "toy",
        "a": side("A", a),
        "b": side("B", b),
        **extra,
    }
    return {"block": "size", "model": "small", "label": claim, "claim": test}


def test_scorecard_outputs_and_every_verdict_recomputed_from_the_seeds_csv(tmp_path):
    rows = [
        _row(tmp_path, "holds", ">", [0.50, 0.52, 0.55], [0.45, 0.46, 0.50]),
        _row(tmp_path, "reversed", ">", [0.40, 0.41, 0.42], [0.50, 0.52, 0.51]),
        _row(tmp_path, "undecided", ">", [0.50, 0.40], [0.45, 0.46]),
        _row(tmp_path, "single", "<", [0.30], [0.35], decide="snakemake claims_full"),
    ]
    rows[0]["claim"]["a"]["paper"], rows[0]["claim"]["b"]["paper"] = 0.69, 0.648
    threshold = _row(tmp_path, "thresh", "<", [0.9, 0.92, 0.88], [0, 0, 0])
    threshold["claim"]["b"] = {"label": "1", "value": 1.0, "paper": 1.0}
    threshold["claim"]["a"] |= {"paper": 0.8955}
    rows.append(threshold)
    ratio = _row(tmp_path, "ratio", "<", [331.0, 300.0, 320.0], [404.0, 410.0, 400.0], ratio=True)
    rows.append(ratio)
    spec = {"table": "card", "kind": "claims", "title": "Scorecard", "rows": rows}
    paths = write_table(spec, tmp_path / "out" / "card", tmp_path / "fig" / "card")
    assert [p.name for p in paths] == [
        "card.csv",
        "card.md",
        "card.tex",
        "card_seeds.csv",
        "card.rst",
        "card.png",
    ]

    card = pd.read_csv(tmp_path / "out" / "card.csv").set_index("claim")
    required = [
        "pair",
        "agent",
        "a",
        "b",
        "direction",
        "metric",
        "n_seeds",
        "diff_mean",
        "ci_low",
        "ci_high",
        "verdict",
        "paper_diff",
    ]
    assert set(required) <= set(card.columns)
    assert card["verdict"].to_dict() == {
        "holds": "holds",
        "reversed": "reversed",
        "undecided": "undecided",
        "single": "one seed",
        "thresh": "holds",
        "ratio": "holds",
    }
    assert card.loc["holds", "paper_diff"] == pytest.approx(0.042)
    assert card.loc["thresh", "paper_diff"] == pytest.approx(-0.1045)
    assert card.loc["ratio", "diff_mean"] == pytest.approx((331 / 404 + 300 / 410 + 320 / 400) / 3 - 1)
    assert card.loc["undecided", "seeds_needed"] > 2 and math.isnan(card.loc["single", "ci_low"])
    assert card.loc["single", "decide"] == "snakemake claims_full"

    # each verdict from the long per-seed file alone: paired differences → t interval → side of zero
    seeds = pd.read_csv(tmp_path / "out" / "card_seeds.csv")
    for claim, g in seeds.groupby("claim"):
        d = g["diff"].to_numpy()
        assert d == pytest.approx(
            g["a_value"] / g["b_value"] - 1 if g["ratio"].all() else g["a_value"] - g["b_value"]
        )
        row = card.loc[claim]
        assert len(d) == row["n_seeds"] and d.mean() == pytest.approx(row["diff_mean"])
        if len(d) > 1:
            ci = sps.ttest_1samp(d, 0).confidence_interval(0.95)
            assert (ci.low, ci.high) == pytest.approx((row["ci_low"], row["ci_high"]))
            sign = 1 if row["direction"] == ">" else -1
            lo, hi = sorted((sign * ci.low, sign * ci.high))
            assert row["verdict"] == ("holds" if lo > 0 else "reversed" if hi < 0 else "undecided")

    md = (tmp_path / "out" / "card.md").read_text()
    headline = (
        "3 of 6 claim tests hold at this scale, 1 reversed, 0 equivalent, 1 undecided, 1 on one seed (6 "
        "claims, a test per pair and agent; with Holm's correction over the 5 tested:"
    )
    assert md.splitlines()[2].startswith(f"**{headline}")
    assert headline in (tmp_path / "out" / "card.rst").read_text()
    assert (tmp_path / "fig" / "card.png").stat().st_size > 10_000


def test_a_missing_run_file_names_the_claim_and_file(tmp_path):
    row = _row(tmp_path, "gone", ">", [0.5, 0.6], [0.4, 0.5])
    Path(row["claim"]["b"]["seeds"]["1"][0]["file"]).unlink()
    with pytest.raises(ValueError, match=r"claim 'gone' \(size, small\), B, seed 1: file .* does not exist"):
        write_table({"table": "card", "kind": "claims", "rows": [row]}, tmp_path / "card", tmp_path / "fig")


def test_where_the_papers_sentence_and_tables_disagree_the_scorecard_says_so():
    _, spec = Pipeline(DEFAULT).table("claims")
    row = next(r for r in spec["rows"] if r["label"] == "hacpo_beats_gspo_x2" and r["block"] == "all")
    c = row["claim"]
    assert c["stated"] == 0.036 and c["paper_table"] == "table1"
    # the printed AVG column gives +3.33 points over the six Table 1 agents; its benchmark columns +3.59
    assert c["a"]["paper"] - c["b"]["paper"] == pytest.approx(0.03333, abs=1e-5)
    assert c["a"]["paper_columns_mean"] - c["b"]["paper_columns_mean"] == pytest.approx(0.03586, abs=1e-5)
    from hacpo.report.claims import _stated_note

    note = _stated_note(c, 0.03333, 0.03586)
    assert "+3.60 pts" in note and "+3.33 pts" in note and "+3.59 pts" in note
    assert note.endswith("(the sentence matches the benchmark columns' mean).")
    assert _stated_note(c, 0.0333, None).endswith("the sentence and the tables disagree.")
