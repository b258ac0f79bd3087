"""Claims that decide (docs/statistics.md): equivalence within a margin (TOST), seeds of several machines as
strata (the blocked t), seeds added in looks under a group-sequential design whose error rate is shown by
simulation, and the family's correction over a row's two disjoint hypotheses."""

from __future__ import annotations

import copy
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps
from statsmodels.stats.weightstats import DescrStatsW

from hacpo.pipeline import Pipeline, as_json
from hacpo.pipeline.config import ConfigError
from hacpo.pipeline.hooks import check_results_from
from hacpo.report import claims, looks, stats
from hacpo.runio import RunRecord

ROOT = Path(__file__).resolve().parents[1]
CI = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
ALPHA = 1 - stats.LEVEL


# ------------------------------------------------------------------------------------------ equivalence
@pytest.mark.parametrize("seed", range(6))
def test_equivalence_is_tost_at_half_alpha_each_side_as_statsmodels_computes_it(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(rng.uniform(-0.02, 0.02), rng.uniform(0.002, 0.02), rng.integers(3, 9))
    t = stats.paired_test(d, ">", margin=0.02)
    tost_p = DescrStatsW(d).ttost_mean(-0.02, 0.02)[0]  # statsmodels: max of the two one-sided p-values
    assert t.p_equivalent == pytest.approx(min(1.0, 2 * tost_p), rel=1e-9)
    ci = sps.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (t.ci_low, t.ci_high) == pytest.approx((ci.low, ci.high))
    inside = -0.02 < ci.low and ci.high < 0.02
    assert (t.verdict == "equivalent") == (inside and ci.low <= 0 <= ci.high)
    assert (t.p_equivalent < ALPHA) == inside


def test_the_four_verdicts_partition_by_the_interval():
    assert stats.paired_test([0.001, -0.002, 0.003, 0.0, 0.001], ">", margin=0.02).verdict == "equivalent"
    assert stats.paired_test([0.001, -0.002, 0.003, 0.0, 0.001], ">").verdict == "undecided"  # no margin
    assert stats.paired_test([0.03, -0.02, 0.05, 0.0, 0.01], ">", margin=0.02).verdict == "undecided"
    small = stats.paired_test([0.010, 0.011, 0.012, 0.010, 0.011], ">", margin=0.02)
    assert small.verdict == "holds"  # a real effect below the margin: it holds (and lies inside ±m)
    tie = stats.paired_test([0.0, 0.0, 0.0], ">", margin=0.02)
    assert (tie.ci_low, tie.ci_high, tie.p_equivalent, tie.verdict) == (0.0, 0.0, 0.0, "equivalent")
    at_margin = stats.paired_test([0.02, 0.02], ">", margin=0.02)
    assert at_margin.verdict == "holds" and at_margin.p_equivalent == 1.0
    with pytest.raises(ValueError, match="non-negative"):
        stats.paired_test([0.1, 0.2], ">", margin=-0.1)


# ------------------------------------------------------------------------------------------ strata
def test_seeds_of_two_machines_are_a_blocked_t_test_by_hand():
    epyc, xeon = np.array([0.03, 0.05, 0.02, 0.04, 0.06]), np.array([0.01, -0.01, 0.02, 0.00])
    d = np.concatenate([epyc, xeon])
    t = stats.paired_test(d, ">", strata=["epyc"] * 5 + ["xeon"] * 4)
    ss = ((epyc - epyc.mean()) ** 2).sum() + ((xeon - xeon.mean()) ** 2).sum()
    se = math.sqrt(ss / (9 - 2) / 9)  # pooled within-machine spread, N − M = 7 degrees of freedom
    half = sps.t.ppf(0.975, 7) * se
    assert t.mean == pytest.approx(d.mean()) and (t.ci_low, t.ci_high) == pytest.approx(
        (d.mean() - half, d.mean() + half)
    )
    assert t.p_value == pytest.approx(2 * sps.t.sf(d.mean() / se, 7)) and t.strata == {"epyc": 5, "xeon": 4}
    # a machine's shift moves no interval width: the spread is taken within each machine
    shifted = stats.paired_test(np.concatenate([epyc, xeon + 1.0]), ">", strata=["epyc"] * 5 + ["xeon"] * 4)
    assert shifted.ci_high - shifted.ci_low == pytest.approx(t.ci_high - t.ci_low)
    one = stats.paired_test(d, ">")  # one machine: the ordinary one-sample t
    ci = sps.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (one.ci_low, one.ci_high) == pytest.approx((ci.low, ci.high))


def _run_json(run_dir: Path, cpu: str) -> str:
    RunRecord("complete", 8, "h", {}, "local", machine={"cpu": cpu, "flags": ["avx2"]}).write(run_dir)
    return str(run_dir / "run.json")


def test_a_seed_is_paired_within_one_machine_and_its_machine_named(tmp_path):
    a, b, c = (_run_json(tmp_path / x, cpu) for x, cpu in (("a", "EPYC"), ("b", "EPYC"), ("c", "Xeon")))
    assert claims.unit_machine([a, b], "seed 0") == "EPYC [avx2]"
    assert claims.unit_machine([], "seed 0") == claims.UNRECORDED
    with pytest.raises(ValueError, match="seed 0: its runs come from different machines"):
        claims.unit_machine([a, c], "seed 0")


# ------------------------------------------------------------------------------------------ the family
def _closed_test(p_dir, p_eq):
    """Brute force: every intersection of at most one hypothesis a row, each tested by Bonferroni."""
    hyps = [(i, p) for i, p in enumerate(p_dir)] + [(i, q) for i, q in enumerate(p_eq) if q is not None]
    names = list(range(len(hyps)))
    adjusted = []
    for h in names:
        worst = hyps[h][1]
        for size in range(1, len(hyps) + 1):
            for subset in itertools.combinations(names, size):
                rows = [hyps[j][0] for j in subset]
                if h in subset and len(set(rows)) == len(rows):
                    worst = max(worst, size * min(hyps[j][1] for j in subset))
        adjusted.append(min(1.0, worst))
    return adjusted


@pytest.mark.parametrize("seed", range(5))
def test_the_familys_correction_is_the_closed_test_and_holm_without_margins(seed):
    rng = np.random.default_rng(seed)
    p_dir = list(rng.uniform(0, 0.2, 4) ** 2)
    p_eq = [
        float(q) if keep else None for q, keep in zip(rng.uniform(0, 0.3, 4) ** 2, [1, 1, 0, 1], strict=True)
    ]
    direction, equivalence = stats.holm_disjoint(p_dir, p_eq)
    brute = _closed_test(p_dir, p_eq)
    assert direction + [q for q in equivalence if q is not None] == pytest.approx(brute)
    # no margins: exactly Holm's step-down
    order = np.argsort(p_dir)
    holm = np.maximum.accumulate([(4 - r) * p_dir[i] for r, i in enumerate(order)])
    expected = np.empty(4)
    expected[order] = np.minimum(1, holm)
    assert stats.holm(p_dir) == pytest.approx(list(expected))


# ------------------------------------------------------------------------------------------ sequential
def test_a_design_has_the_looks_its_budget_allows_and_refuses_others():
    d = stats.Design.sequential(5, 2, 15)
    assert [sum(x) for x in d.looks] == [5, 7, 9, 11, 13, 15]
    assert [sum(x) for x in stats.Design.sequential(5, 4, 15).looks] == [5, 9, 13, 15]
    c = [d.boundary(k) for k in range(6)]
    fixed = [sps.t.ppf(0.975, n - 1) for n in (5, 7, 9, 11, 13, 15)]
    assert all(b > f for b, f in zip(c, fixed, strict=True))  # each look pays for the others
    first = 0.05 * math.log(1 + (math.e - 1) * 5 / 15)  # Pocock's spending at a third of the seeds
    assert c[0] == pytest.approx(sps.t.ppf(1 - first / 2, 4), rel=0.02)  # the first look alone: exact t
    assert d.p_value(0, c[0]) == pytest.approx(0.05, rel=0.02) and d.p_value(3, c[3]) == pytest.approx(
        0.05, rel=0.02
    )
    with pytest.raises(ValueError, match="not a look of the design"):
        stats.paired_test(np.zeros(6), ">", design=d)
    pooled = stats.Design.sequential(5, 2, 9, stratum="epyc", others={"xeon": 5})
    assert pooled.looks == ((5, 5), (7, 5), (9, 5)) and pooled.df(0) == 8


@pytest.mark.parametrize("spending", stats.SPENDING)
def test_the_sequential_rule_keeps_its_error_rates_by_simulation(spending):
    """No difference: a false holds or reversed at most α (within three Monte-Carlo errors) over the looks
    the default budget allows (5 seeds, then 2 a look up to 15); a difference of exactly the margin: a false
    equivalent at most α. Testing each look with the fixed design's interval instead inflates it."""
    design = stats.Design.sequential(5, 2, 15, spending)
    reps, bound = 3000, ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 3000)
    null = stats.verdict_rates(design, 0.0, 1.0, ">", margin=0.5, reps=reps, seed=1)
    assert null["holds"] + null["reversed"] <= bound, null
    edge = stats.verdict_rates(design, 0.5, 1.0, ">", margin=0.5, reps=reps, seed=2)
    assert edge["equivalent"] <= bound, edge
    # the same paths, each look tested with the fixed design's t interval, stopping at the first decision
    rng, naive = np.random.default_rng(1), 0
    for _ in range(reps):
        d = rng.normal(0, 1, 15)
        naive += any(stats.paired_test(d[:n], ">").verdict != "undecided" for n in (5, 7, 9, 11, 13, 15))
    assert naive / reps > 0.1  # ≈ 0.14: the error rate the sequential boundaries prevent


def test_the_power_at_an_effect_grows_with_it():
    design = stats.Design.sequential(5, 2, 15)
    weak, strong = (stats.verdict_rates(design, m, 1.0, ">", reps=600, seed=3)["holds"] for m in (0.5, 1.2))
    assert 0.2 < weak < strong and strong > 0.9


def test_each_look_adds_a_block_to_the_open_rows_only():
    assert looks.next_sizes(["a", "b"], None, 5, 2, 9) == {"a": 5, "b": 5}
    record = {
        "rows": {"a": {"n": 7, "open": True}, "b": {"n": 5, "open": False}, "c": {"n": 8, "open": True}}
    }
    assert looks.next_sizes(["a", "b", "c"], record, 5, 2, 9) == {"a": 9, "b": 5, "c": 9}
    assert not looks.is_done(record) and looks.is_done({"rows": {"b": {"n": 5, "open": False}}})


# ------------------------------------------------------------------------------------------ config
def _table(**change) -> dict:
    cfg = copy.deepcopy(CI)
    cfg["tables"]["claims_sequential"] |= change
    return cfg


def test_a_time_budget_counts_the_added_seeds_runs_once_and_closes_every_row_when_spent(tmp_path):
    from hacpo.runio import Profile

    def run(name: str, wall_s: float) -> str:
        d = tmp_path / name
        d.mkdir()
        Profile("local", wall_s, 8, {}, 0.0, 0.0, 100.0).write(d)
        return str(d / "run.json")

    first, shared, own, other = run("s0", 5000.0), run("s2", 1800.0), run("s2b", 900.0), run("x2", 7200.0)
    spec = {
        "sequential": {"start": 1, "block": 1, "max": 3, "spending": "pocock", "max_hours": 1.0},
        "rows": [
            {"claim": {"order": ["0", "2", "0:2"], "origins": {"0:2": "xeon"},
                       "runs": {"0": [first], "2": [shared, own], "0:2": [other]}}},
            {"claim": {"order": ["0", "2"], "runs": {"0": [first], "2": [shared]}}},
        ],
    }  # fmt: skip
    # seed 2's two runs, the shared one once; not the first look's seed, not another machine's
    assert looks.added_train_hours(spec) == pytest.approx((1800 + 900) / 3600)
    rows = {"a": {"open": True, "n": 2}, "b": {"open": False, "n": 3}}
    looks.close_when_spent(rows, 0.75, 1.0)
    assert rows["a"]["open"]
    looks.close_when_spent(rows, 0.75, None)
    assert rows["a"]["open"]
    looks.close_when_spent(rows, 1.0, 1.0)
    assert not rows["a"]["open"] and not rows["b"]["open"]
    record = {
        "design": spec["sequential"], "done": True, "added_train_hours": 1.02,
        "rows": {"a": {"n": 2, "verdict": "undecided"}, "b": {"n": 3, "verdict": "holds"}},
        "looks": [{"look": 1, "rows": {"a": {"n": 2, "verdict": "undecided"}}}],
    }  # fmt: skip
    text = looks.looks_markdown(record)
    assert "time budget is spent (1.02 h of 1 h)" in text and "capped at 1 h" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seeds": None}, "`sequential:` adds seeds to the table's `seeds:`"),
        ({"sequential": {"block": 1, "max": 1}}, "sequential.max (1) is below the first look's 2 seeds"),
        ({"sequential": {"max": 4, "added_seeds": [1, 5]}}, "must be new seeds"),
        ({"sequential": {"max": 5, "added_seeds": [5]}}, "lists 1 seeds; max 5 needs 3"),
        ({"sequential": {"max": 4, "spending": "haybittle"}}, "spending"),
        ({"margins": {"avg": -0.1}}, "margins"),
        ({"sequential": {"max": 4, "max_hours": 0}}, "max_hours"),
    ],
)
def test_a_malformed_sequential_table_is_refused_naming_its_key(change, message):
    with pytest.raises(ConfigError) as err:
        Pipeline(_table(**change))
    assert "tables.claims_sequential" in str(err.value) and message in str(err.value), str(err.value)


def test_margins_default_per_metric_and_are_overridden_per_table_and_claim():
    cfg = Pipeline(CI).cfg
    card = cfg.tables["claims"]
    by_claim = {cid: card.margin(c) for cid, c in card.claims.items()}
    assert by_claim["hacpo_beats_gspo"] == 0.02 and by_claim["s_hete_below_one"] is None  # a threshold: none
    assert (
        cfg.tables["claims_sequential"].margin(cfg.tables["claims_sequential"].claims["hacpo_beats_gspo"])
        is None
    )
    wall = copy.deepcopy(CI)
    wall["tables"]["claims"]["claims"]["fast"] = {"source": "Table 7", "a": "hacpo", "b": "gspo",
                                                  "direction": "<", "ratio": True, "metric": "wall_time",
                                                  "tables": ["table7"]}  # fmt: skip
    wall["tables"]["claims"]["claims"]["naive_below_gspo"]["margin"] = 0.05
    t = Pipeline(wall).cfg.tables["claims"]
    assert t.margin(t.claims["fast"]) == 0.05 and t.margin(t.claims["naive_below_gspo"]) == 0.05
    assert t.seed_order() == []


def test_a_looks_seeds_keep_their_look_order_through_the_jobs_json():
    """A job's spec is key-sorted JSON, where seed "1337" sorts before "2": the rows carry their seeds' look
    order, so a look's prefix is the seeds it was taken at."""
    pipe = Pipeline(_table(seeds=[0, 1, 42], sequential={"block": 2, "max": 5}))
    keys = list(pipe.look_sizes("claims_sequential", None))
    spec = json.loads(as_json(pipe.claims_look("claims_sequential", dict.fromkeys(keys, 5))[1]))
    test = spec["rows"][0]["claim"]
    assert list(test["a"]["seeds"]) == ["0", "1", "2", "3", "42"]  # sorted as text by the JSON
    assert test["order"] == ["0", "1", "42", "2", "3"]


def test_the_added_seeds_are_the_smallest_unused_unless_listed():
    t = Pipeline(_table(seeds=[0, 1, 42], sequential={"block": 2, "max": 7})).cfg.tables["claims_sequential"]
    assert t.seed_order() == [0, 1, 42, 2, 3, 4, 5] and t.look_sizes() == [3, 5, 7]
    listed = _table(seeds=[0, 1], sequential={"block": 1, "max": 3, "added_seeds": [7, 9]})
    assert Pipeline(listed).cfg.tables["claims_sequential"].seed_order() == [0, 1, 7]


def test_a_look_plans_only_its_open_rows_seeds_and_another_machines_folder_joins_them(tmp_path):
    cfg = _table(results_from=[str(tmp_path / "xeon")])
    pipe = Pipeline(cfg)
    keys = [k for k in pipe.look_sizes("claims_sequential", None)]
    assert keys == ["hacpo_beats_gspo/mixed/llama", "hacpo_beats_gspo/mixed/qwen"]
    files, spec = pipe.claims_look("claims_sequential", {keys[0]: 3})
    assert [r["model"] for r in spec["rows"]] == ["llama"]  # the closed row is not at this look
    test = spec["rows"][0]["claim"]
    assert list(test["a"]["seeds"]) == ["0", "1", "2", "0:0", "0:1", "0:2"]
    assert test["origins"] == {f"0:{s}": str(tmp_path / "xeon") for s in (0, 1, 2)}
    assert all(f.startswith(str(tmp_path / "xeon")) for f in test["runs"]["0:2"]) and test["runs"]["2"]
    elsewhere = [f for f in files if f.startswith(str(tmp_path / "xeon"))]
    assert elsewhere and {f.replace(str(tmp_path / "xeon"), pipe.results) for f in elsewhere} <= set(files)
    assert spec["sequential"] == {"start": 2, "block": 1, "max": 3, "spending": "pocock", "max_hours": None}
    assert json.dumps(spec)  # a job's spec is JSON
    with pytest.raises(ValueError, match=r"tables.claims_sequential.results_from.0: .*xeon is not a hacpo"):
        check_results_from(pipe)  # before any job: the folder is not there yet
    (tmp_path / "xeon").mkdir()
    (tmp_path / "xeon" / "hacpo-results.json").write_text('{"configs": []}')
    check_results_from(pipe)
