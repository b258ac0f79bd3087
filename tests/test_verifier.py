"""A verifier of your own (hacpo.reward.custom): bounded, total, reported, and part of a run's identity."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from polling import wait_for

from hacpo.config import TrainConfig
from hacpo.reward import CustomReward, Scorer, VerifierError
from hacpo.reward.custom import VerifierRunner

FIXTURE = Path(__file__).parent / "fixtures" / "verifiers.py"


def scorer(name: str, workers: int = 1, timeout_s: float = 30.0, path: Path = FIXTURE, **kw) -> Scorer:
    return Scorer(workers=workers, timeout_s=timeout_s, reward={"file": str(path), "name": name}, **kw)


RESPONSES = ["answer: 3", "answer: 4", "answer: 5", "answer: 6"]
ANSWERS = ["3", "4", "0", "6"]


def test_a_verifier_gets_each_records_metadata_and_returns_its_numbers():
    with scorer("exact", workers=2) as s:
        meta = [{"credit": 0.5}, {}, {}, {"credit": 0.25}]  # partial credit within [0, 1]
        assert s.score(RESPONSES, ANSWERS, meta) == [0.5, 1.0, 0.0, 0.25]
        assert s.score(RESPONSES, ANSWERS) == [1.0, 1.0, 0.0, 1.0]  # no metadata: {} each
        assert s.verifier_failed == 0


@pytest.mark.parametrize(
    ("name", "trigger"),
    [("raises_on_boom", "boom"), ("nan_on_nan", "nan"), ("short_on_short", "short"),
     ("text_on_text", "text")],  # fmt: skip
)
def test_a_failing_item_alone_scores_0_and_is_logged_with_its_id(name, trigger, caplog):
    responses = [*RESPONSES, f"{trigger} answer: 7"]
    with scorer(name) as s, caplog.at_level(logging.WARNING, logger="hacpo.reward"):
        got = s.score(responses, [*ANSWERS, "7"], ids=["a", "b", "c", "d", "e"])
        assert got == [1.0, 1.0, 0.0, 1.0, 0.0]  # the batch failed; its items were retried one at a time
        assert s.verifier_failed == 1
        assert s.score(responses, [*ANSWERS, "7"]) == got  # later batches too, and the run goes on
        assert s.verifier_failed == 2
    assert any("on item e, scored 0" in r.getMessage() for r in caplog.records)


def test_a_hung_verifier_is_killed_at_its_deadline_and_only_its_item_scores_0():
    with scorer("hangs_on_hang", timeout_s=1.0, retry_budget_s=5.0) as s:  # the retry ends by its deadline
        got = s.score([*RESPONSES, "hang answer: 7"], [*ANSWERS, "7"])
        assert got == [1.0, 1.0, 0.0, 1.0, 0.0]
        assert s.verifier_failed == 1
        assert sum(p.kills for p in s.verifier.pools) == 2  # the batch, then the item alone
        assert s.score(RESPONSES, ANSWERS) == [1.0, 1.0, 0.0, 1.0]  # a fresh worker took over


def test_hanging_items_are_retried_in_parallel_so_k_of_them_cost_about_one_deadline(caplog):
    """Issue 43: a failed batch's items are spread over the retry workers, each under its own deadline:
    4 hanging items of a batch cost the batch's deadline plus about one more, not 4 more; each scores 0
    and is named, the others keep their rewards, and the counts say what happened."""
    import time

    responses = [*RESPONSES, "hang answer: 7", "hang answer: 8", "hang answer: 9", "hang answer: 10"]
    answers = [*ANSWERS, "7", "8", "9", "10"]
    with scorer("hangs_on_hang", timeout_s=2.0) as s, caplog.at_level(logging.WARNING, logger="hacpo.reward"):
        s.score(RESPONSES, ANSWERS)  # workers started and warm
        s.take_verifier_counts()
        t0 = time.monotonic()
        got = s.score(responses, answers, ids=[f"i{k}" for k in range(8)])
        took = time.monotonic() - t0
        counts = s.take_verifier_counts()
    assert got == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert took < 2 * 2.0 + 3.0, took  # serial retries would take 2 + 4 × 2 = 10 s
    assert counts["verifier/retried"] == 8 and counts["verifier/timed_out"] == 4
    assert counts["verifier/failed"] == 4 and counts["verifier/seconds"] >= 4.0
    named = [r.getMessage() for r in caplog.records if "scored 0" in r.getMessage()]
    assert all(any(f"item i{k}," in m for m in named) for k in range(4, 8))


def test_a_one_item_call_that_hangs_costs_one_deadline_not_two():
    """OpenRLHF scores one sample per call: a failed call of one item is already that item alone."""
    import time

    with scorer("hangs_on_hang", timeout_s=3.0) as s:
        s.score(["answer: 2"], ["2"])
        t0 = time.monotonic()
        assert s.score(["hang answer: 1"], ["1"]) == [0.0]
        assert time.monotonic() - t0 < 3.0 + 2.5  # one deadline and a loaded machine's slack, not two (6 s)
        assert s.take_verifier_counts()["verifier/timed_out"] == 1 and s.verifier_failed == 1


def test_a_steps_retries_stop_at_its_budget_and_the_rest_score_0():
    """A step's time on failed calls, first tries and retries, comes out of one budget
    (reward_retry_budget_s): once spent, items still unscored score 0 and are counted, and a later call of
    the step goes item by item under a tenth of the deadline (at least 1 s), so its well-behaved items are
    still scored; the next step has the whole budget again."""
    import time

    responses = ["hang answer: 1", "answer: 2"]
    # margins for a loaded machine (a worker replaced after a kill, on 2 busy cores, took 1.6 s), each below
    # what the call would take without the budget: 6 + 6 s for the first call, 6 s for the second
    with Scorer(workers=1, timeout_s=6.0, reward={"file": str(FIXTURE), "name": "hangs_on_hang"},
                retry_budget_s=8.0) as s:  # fmt: skip
        s.score(["answer: 2"], ["2"])
        s.new_step()
        t0 = time.monotonic()
        assert s.score(responses, ["1", "2"]) == [0.0, 1.0]  # the fast item was scored within the budget
        assert time.monotonic() - t0 < 6.0 + 2.0 + 2.5  # the first try's deadline, then the 2 s left
        counts = s.take_verifier_counts()
        assert counts["verifier/timed_out"] == 1
        t0 = time.monotonic()
        assert s.score(responses, ["1", "2"]) == [0.0, 1.0]  # budget spent: the good item is still scored
        assert time.monotonic() - t0 < 1.0 + 2.0  # item by item at once, with 1 s, not the 6-s deadline
        s.new_step()  # a new step: the whole budget again
        assert s.score(responses, ["1", "2"]) == [0.0, 1.0]


def test_a_misbehaving_verifier_costs_a_step_only_its_bad_items():
    """A verifier of your own that raises, hangs or scores NaN on a few items of every batch, in a step that
    scores two agents' items: only the bad items score 0. The first agent's batch fails, its items are
    scored one by one, a hanging one beside the queue; the step's later call goes item by item at once,
    so its good items are scored although the budget is spent (before: every item of that call scored 0)."""
    good = [f"answer: {k}" for k in range(6)]
    bad = ["hang answer: 1", "boom answer: 2", "nan answer: 3"]
    responses, answers = good + bad, [str(k) for k in range(6)] + ["1", "2", "3"]
    spec = CustomReward(file=str(FIXTURE), name="misbehaves")
    runner = VerifierRunner(spec, workers=1, timeout_s=2.0, retry_budget_s=2.5, retry_workers=2)
    try:
        runner.score(["answer: 1"], ["1"])
        runner.new_step()
        first = runner.score(responses, answers)
        second = runner.score(responses[::-1], answers[::-1])
    finally:
        for pool in runner.pools:
            pool.close()
    assert first == [1.0] * 6 + [0.0] * 3 and second == [0.0] * 3 + [1.0] * 6


def test_once_the_budget_is_spent_each_item_has_its_own_short_deadline():
    """Once a step's budget is spent, each item gets a tenth of the deadline (here 4 s) of its own, not the
    whole call together: a slow verifier (0.3 s an item, 48 items on 2 processes, about 7 s in all) loses no
    good item, and a hanging one costs its own short deadline beside them (before: the call's 4 s scored
    about half). Each item's 0.3 s is far inside its 4 s, so a loaded machine does not flake it."""
    import time

    n = 48
    good = [f"answer: {k}" for k in range(n)]
    responses, answers = [*good, "hang answer: 99"], [str(k) for k in range(n)] + ["99"]
    spec = CustomReward(file=str(FIXTURE), name="slow_hangs_on_hang")
    # budget 0: spent from the start, so the batch and then every item get the short deadline
    runner = VerifierRunner(spec, workers=1, timeout_s=40.0, retry_budget_s=0.0, retry_workers=2)
    try:
        for pool in runner.pools:
            pool.wait_ready(60.0)
        t0 = time.monotonic()
        got = runner.score(responses, answers, ids=[f"i{k}" for k in range(n + 1)])
        took = time.monotonic() - t0
        counts = runner.take_counts()
    finally:
        for pool in runner.pools:
            pool.close()
    assert runner.spent_deadline_s == 4.0
    assert got == [1.0] * n + [0.0], got
    assert counts["failed"] == 1 and counts["timed_out"] == 1
    assert took < 40.0, took  # a margin for a loaded machine: about 4 s (batch) + 48 × 0.3 / 2 s


def test_a_hanging_item_does_not_hold_up_the_items_queued_behind_it():
    """A pool with spares: once an item runs past ``stall_s``, a spare worker serves the queue beside it, so
    the items behind a hanging one are scored before its deadline (one worker alone would reach them only
    after it, and the call's budget would cut them off)."""
    from hacpo.reward.pool import Pool

    spec = CustomReward(file=str(FIXTURE), name="misbehaves")
    job = ("hacpo.reward.custom:verifier_job", spec.model_dump())
    # the pool sends items in the order of their golds: the hanging one first
    tasks = [(["hang answer: 0"], ["0"], [{}])] + [([f"answer: {k}"], [str(k)], [{}]) for k in range(1, 5)]
    for spares, expect in ((2, [(True, [1.0])] * 4), (0, [(False, "budget")] * 4)):
        pool = Pool(1, 4.0, 4.0, job=job, spares=spares, stall_s=0.2)
        try:
            pool.wait_ready(60.0)
            got = pool.run(tasks, budget_s=3.5)
        finally:
            pool.close()
        assert got[0] == (False, "budget") and got[1:] == expect, (spares, got)


def test_identical_items_are_verified_once_and_share_a_success_or_a_failure(tmp_path, monkeypatch):
    log = tmp_path / "calls.txt"
    monkeypatch.setenv("HACPO_TEST_VERIFIER_LOG", str(log))
    responses = ["answer: 3", "answer: 3", "answer: 4", "boom answer: 5", "boom answer: 5", "answer: 3"]
    answers = ["3", "3", "3", "5", "5", "3"]
    meta = [{}, {}, {}, {}, {}, {"credit": 0.25}]  # the last differs by its metadata: verified on its own
    with scorer("logs_items") as s:
        got = s.score(responses, answers, meta, ids=list("abcdef"))
        counts = s.take_verifier_counts()
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 0.25]
    seen = log.read_text().splitlines()
    # the batch of 4 distinct items, then each retried alone (the batch raised on "boom")
    assert len(seen) == 4 + 4 and seen.count("boom answer: 5") == 2
    assert counts["verifier/shared"] == 2 and counts["verifier/failed"] == 2  # both "boom" copies named


def test_a_verifier_failing_on_a_whole_first_batch_stops_the_run_naming_the_key():
    first = "reward: .*every item of the first"
    with scorer("always_raises") as s, pytest.raises(VerifierError, match=first):
        s.score(RESPONSES, ANSWERS)
    with scorer("raises_on_boom") as s:  # after a good first batch, a bad one is scored 0 and reported
        s.score(RESPONSES, ANSWERS)
        assert s.score(["boom"] * 2, ["1", "2"]) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("declared", "raw", "unit"),
    [
        (None, [0.0, 0.25, 1.0], [0.0, 0.25, 1.0]),  # [0, 1]: as they are, partial credit too
        ((-1, 1), [-1.0, 0.0, 1.0, 0.5], [0.0, 0.5, 1.0, 0.75]),
        ((0, 2), [0.0, 1.0, 2.0], [0.0, 0.5, 1.0]),
        ((1, 5), [1.0, 2.0, 5.0], [0.0, 0.25, 1.0]),
    ],
)
def test_a_declared_range_is_mapped_onto_0_1(declared, raw, unit):
    from hacpo.reward.custom import unit_rewards

    spec = CustomReward(file="v.py", name="f", range=declared)
    ids = [str(i) for i in range(len(raw))]
    assert unit_rewards(raw, ids, spec) == pytest.approx(unit)
    assert unit_rewards([None], ["x"], spec) == [0.0]  # an item the verifier failed on: the bottom


@pytest.mark.parametrize(
    ("declared", "credit", "message"),
    [
        (None, 2.0, r"item d the reward 2\.0, outside \[0, 1\]: .*declare .*`reward\.range: \[lo, hi\]`"),
        (None, -1.0, r"item d the reward -1\.0, outside \[0, 1\]"),
        ((0, 2), 3.0, r"item d the reward 3\.0, outside its declared reward\.range \[0, 2\]"),
    ],
)
def test_a_reward_outside_its_range_stops_scoring_naming_the_item_its_value_and_the_key(
    declared, credit, message
):
    from hacpo.reward import RewardRangeError

    reward = {"file": str(FIXTURE), "name": "exact", "range": declared}
    with Scorer(workers=1, reward=reward) as s, pytest.raises(RewardRangeError, match=message):
        s.score(RESPONSES, ANSWERS, [{}, {}, {}, {"credit": credit}], ids=list("abcd"))


def test_a_declared_range_is_scored_mapped_and_part_of_the_runs_identity(tmp_path):
    reward = {"file": str(FIXTURE), "name": "exact", "range": [0, 2]}
    with Scorer(workers=1, reward=reward) as s:
        assert s.score(RESPONSES, ANSWERS, [{"credit": 2}, {}, {}, {"credit": 0.5}]) == [1.0, 0.5, 0.0, 0.25]
    entry = {"file": str(FIXTURE), "name": "exact"}
    assert _cfg(tmp_path, entry).config_hash() != _cfg(tmp_path, reward).config_hash()
    assert "range" not in _cfg(tmp_path, entry).run_spec()["reward"]  # undeclared: runs keep their identity
    assert CustomReward(**reward).planned()["range"] == [0.0, 2.0]  # the workflow's train spec, as JSON
    from hacpo.engines.openrlhf.runner import _record

    record = _record(_cfg(tmp_path, reward), "running", 0, []).details["reward"]  # the OpenRLHF run.json
    assert record["range"] == [0.0, 2.0] and record["to_unit"] == "r / 2" and record["declared"]
    for bad in ([1, 1], [2, 0], [0, float("inf")]):
        with pytest.raises(ValueError, match="reward.range"):
            CustomReward(**entry, range=bad)


CREDIT_2 = """
import re

def two_for_a_box(responses, answers, metadata):  # partial credit up to 2: 2 a right box, 1 a wrong one
    boxed = [re.findall(r"\\\\boxed\\{([^}]*)\\}", r) for r in responses]
    return [2.0 if b and b[-1] == a else 1.0 if b else 0.0 for b, a in zip(boxed, answers)]

def always_2(responses, answers, metadata):
    return [2.0] * len(responses)
"""


def test_the_local_engine_refuses_a_reward_of_2_at_its_first_step_and_trains_it_declared(
    tmp_path, toy_data, small_agent, other_agent
):
    """A verifier returning 2.0 without a declared range stops the run at its first step, before any update,
    naming the item, the value and `reward.range`; declared `range: [0, 2]`, HACPO trains on the mapped
    [0, 1] values, logs them, and run.json records the mapping."""
    import psutil
    from toy_runs import toy_train_config

    from hacpo.engines.local.trainer import train
    from hacpo.reward import RewardRangeError
    from hacpo.runio import RunRecord, read_jsonl

    verify = tmp_path / "verify.py"
    verify.write_text(CREDIT_2)
    agents = [("a", small_agent), ("b", other_agent)]
    cfg = toy_train_config(tmp_path / "refused", agents, "hacpo", data=toy_data, steps=1,
                           reward={"file": str(verify), "name": "always_2"})  # fmt: skip
    refused = r"gave item \S+ the reward 2\.0, outside \[0, 1\].*reward\.range"
    with pytest.raises(RewardRangeError, match=refused):
        train(cfg)
    assert not (tmp_path / "refused" / "hacpo" / "metrics.jsonl").exists() or not list(
        read_jsonl(tmp_path / "refused" / "hacpo" / "metrics.jsonl")
    )  # no step was logged
    workers = [p for p in psutil.Process().children(recursive=True) if "always_2" in " ".join(p.cmdline())]
    assert not psutil.wait_procs(workers, timeout=15)[1], "the verifier's workers outlived the stopped run"
    reward = {"file": str(verify), "name": "two_for_a_box", "range": [0, 2]}
    cfg = toy_train_config(tmp_path, agents, "hacpo", data=toy_data, steps=1, reward=reward)
    run = train(cfg)
    assert run.status == "complete"
    record = RunRecord.read(cfg.out_dir).details["reward"]
    assert record == {"reward": f"{verify}:two_for_a_box", "range": [0.0, 2.0], "declared": True,
                      "to_unit": "r / 2"}  # fmt: skip
    rows = list(read_jsonl(tmp_path / "hacpo" / "metrics.jsonl"))
    assert rows and all(0.5 <= r[f"{a}/reward"] <= 1.0 for r in rows for a in "ab")  # every toy answer boxed


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"file": "no/such/verify.py", "name": "f"}, r"reward.file: .*no file"),
        ({"file": str(FIXTURE), "name": "missing"}, r"reward.file: .*has no function 'missing'"),
        ({"file": str(FIXTURE), "name": "not_callable"}, r"has no function 'not_callable'"),
        ({"function": "no_such_module_xyz:f"}, r"reward.function: .*No module named 'no_such_module_xyz'"),
    ],
)
def test_a_verifier_that_cannot_be_loaded_fails_before_any_worker(reward, message):
    with pytest.raises(VerifierError, match=message):
        Scorer(workers=1, reward=reward)


def test_an_import_error_inside_the_file_is_named(tmp_path):
    bad = tmp_path / "verify.py"
    bad.write_text("import not_installed_anywhere\n\ndef f(r, a, m):\n    return [0.0] * len(r)\n")
    with pytest.raises(VerifierError, match="not_installed_anywhere"):
        Scorer(workers=1, reward={"file": str(bad), "name": "f"})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "give `function:"),
        ({"file": "v.py"}, "needs `name:`"),
        ({"function": "pkg.mod"}, "pattern"),
        ({"function": "pkg.mod:f", "name": "g"}, "goes with `file:`"),
        ({"function": "pkg.mod:f", "timeout_s": 3}, "Extra inputs"),  # a runtime option: reward_timeout_s
        ({"function": "pkg.mod:f", "sha256": "abc"}, "pattern"),
    ],
)
def test_a_verifier_entry_is_checked(entry, message):
    with pytest.raises(ValueError, match=message):
        CustomReward(**entry)


def test_a_function_in_an_installed_module_works_too():
    with Scorer(workers=1, reward={"function": "hacpo.reward.hendrycks:hendrycks_score"}) as s:
        with pytest.raises(VerifierError):  # hendrycks_score takes one item, not a batch: every item fails
            s.score(["\\boxed{3}"], ["3"])


def _cfg(tmp_path, reward, **over) -> TrainConfig:
    return TrainConfig(
        method="grpo", train_file="t.jsonl", out_dir=str(tmp_path / "run"),
        agents=[{"name": "a", "path": "p"}], reward=reward, **over,
    )  # fmt: skip


def test_the_verifiers_source_is_part_of_the_runs_identity_and_its_timeout_is_not(tmp_path):
    path = tmp_path / "verify.py"
    shutil.copy(FIXTURE, path)
    entry = {"file": str(path), "name": "exact"}
    base = _cfg(tmp_path, entry).config_hash()
    assert _cfg(tmp_path, entry, reward_timeout_s=5).config_hash() == base  # runtime only
    assert _cfg(tmp_path, entry, scorer_workers=4).config_hash() == base
    assert _cfg(tmp_path, {**entry, "name": "raises_on_boom"}).config_hash() != base
    planned = CustomReward(**entry).planned()
    assert _cfg(tmp_path, planned).config_hash() == base  # the workflow's recorded hash is not another run
    path.write_text(path.read_text() + "\n# an edit\n")
    assert _cfg(tmp_path, entry).config_hash() != base  # editing the verifier retrains its runs
    with pytest.raises(VerifierError, match="changed after this run was planned"):
        Scorer(workers=1, reward=planned)  # a job planned before the edit does not score with the new code
    assert _cfg(tmp_path, "math_verify").config_hash() != _cfg(tmp_path, "hendrycks").config_hash()
    assert _cfg(tmp_path, entry).run_spec()["reward"]["verifier"] == f"{path}:exact"


def test_the_workflow_plans_a_verifiers_runs_by_its_source(tmp_path):
    """A `training.reward` verifier in a workflow config: its hash is in each train job's spec (the rerun
    trigger), its deadline and workers are in the runtime options (never a rerun)."""
    import yaml

    from hacpo.pipeline import Pipeline

    path = tmp_path / "verify.py"
    shutil.copy(FIXTURE, path)
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "ci.yaml").read_text())
    cfg["training"] |= {"reward": {"file": str(path), "name": "exact"}, "reward_timeout_s": 5}
    pipe = Pipeline(cfg)
    run = pipe.runs[0]
    spec, runtime = pipe.train_spec(run), pipe.train_runtime(run)
    assert spec["reward"] == CustomReward(file=str(path), name="exact").planned()
    assert set(spec["reward"]) == {"file", "name", "sha256"}
    assert runtime["reward_timeout_s"] == 5 and "reward_timeout_s" not in spec
    TrainConfig(**spec, **runtime)  # the job's own config reads it back
    path.write_text(path.read_text() + "\n# an edit\n")
    edited = Pipeline(cfg).train_spec(run)
    assert edited != spec  # Snakemake's params trigger: the runs retrain
    assert Pipeline({**cfg, "training": {**cfg["training"], "reward_timeout_s": 9}}).train_spec(run) == edited


VERIFY_BY_METADATA = '''
import json, os, re

def by_target(responses, answers, metadata):
    with open(os.environ["VERIFIER_LOG"], "a") as f:
        f.write(json.dumps(metadata) + "\\n")
    boxed = [re.findall(r"\\\\boxed\\{([^}]*)\\}", r) for r in responses]
    return [1.0 if b and b[-1] == m["target"] else 0.0 for b, m in zip(boxed, metadata)]
'''


def test_the_local_engine_trains_joint_hacpo_with_a_verifier_and_each_records_metadata(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch
):
    import json

    from toy_runs import toy_train_config

    from hacpo.engines.local.trainer import train
    from hacpo.runio import read_jsonl

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        rows = [{**r, "metadata": {"target": r["answer"]}} for r in read_jsonl(toy_data / f"{split}.jsonl")]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    verify = tmp_path / "verify.py"
    verify.write_text(VERIFY_BY_METADATA)
    monkeypatch.setenv("VERIFIER_LOG", str(tmp_path / "calls.jsonl"))
    reward = {"file": str(verify), "name": "by_target"}
    cfg = toy_train_config(tmp_path, [("a", small_agent), ("b", other_agent)], "hacpo", data=data,
                           reward=reward, val_every=2, val_size=8)  # fmt: skip
    run = train(cfg)
    assert run.status == "complete"
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    seen = [m for call in calls for m in call]  # one line per batch call
    assert seen and all(set(m) == {"target"} for m in seen)  # each record's own metadata reached it
    rows = list(read_jsonl(tmp_path / "hacpo" / "metrics.jsonl"))
    # 2 steps × 2 agents × 16 rollouts and 2 validations × 2 agents × 8 problems, identical items once
    assert len(seen) <= 2 * 2 * 4 * 4 + 2 * 2 * 8
    assert all({"verifier/seconds", "verifier/shared", "verifier/retried"} <= set(r) for r in rows)
    assert any(r["a/reward"] > 0 for r in rows)  # the toy agents box right answers: the verifier says so
    assert all(r["verifier_failed"] == 0 for r in rows)


def test_a_verifier_reaches_openrlhfs_reward_function(tmp_path, toy_data, small_agent, monkeypatch):
    """The OpenRLHF engine: the prompt file's labels carry each record's answer, metadata and id; the reward
    file in the vLLM engines scores them with the verifier named in HACPO_REWARD (its file made absolute);
    a verifier that cannot be loaded stops the run before anything is launched."""
    import importlib.util
    import json

    from hacpo.engine_options import OpenRLHFOptions
    from hacpo.engines.openrlhf.command import Layout, reward_file
    from hacpo.engines.openrlhf.runner import reward_env, train, write_inputs
    from hacpo.reward.custom import decode_label

    data = tmp_path / "train.jsonl"
    head = [json.loads(line) for line in (toy_data / "train.jsonl").read_text().splitlines()[:4]]
    data.write_text("".join(json.dumps({**r, "metadata": {"credit": 0.5}}) + "\n" for r in head))
    shutil.copy(FIXTURE, tmp_path / "verify.py")
    monkeypatch.chdir(tmp_path)  # a relative verifier file, as a workflow config names it
    cfg = TrainConfig(method="gspo", agents=[{"name": "a", "path": str(small_agent)}], train_file=str(data),
                      out_dir=str(tmp_path / "run"), steps=1, prompts_per_step=4,
                      reward={"file": "verify.py", "name": "exact"}, reward_timeout_s=7)  # fmt: skip
    layout = Layout(tmp_path / "run")
    write_inputs(cfg, layout)
    rows = [json.loads(line) for line in layout.prompts.read_text().splitlines()]
    records = {r["id"]: r for r in map(json.loads, data.read_text().splitlines())}
    for row in rows:
        answer, metadata, rid = decode_label(row["answer"])
        assert (answer, metadata, rid) == (records[row["id"]]["answer"], {"credit": 0.5}, row["id"])
    env = reward_env(cfg)
    assert json.loads(env["HACPO_REWARD"]) == {"file": str(tmp_path / "verify.py"), "name": "exact"}
    assert env["HACPO_REWARD_TIMEOUT_S"] == "7.0"
    assert env["HACPO_REWARD_RETRY_BUDGET_S"] == "14.0"  # two deadlines; a joint step's over its agents:
    two = cfg.model_copy(update={"method": "hacpo", "agents": [*cfg.agents, cfg.agents[0].model_copy(
        update={"name": "b"})]})  # fmt: skip
    assert reward_env(two)["HACPO_REWARD_RETRY_BUDGET_S"] == "7.0"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("reward_func", reward_file())  # as OpenRLHF loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        prompt = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
        labels = [rows[0]["answer"], rows[1]["answer"]]
        queries = [prompt + f"answer: {decode_label(labels[0])[0]}<|im_end|>", prompt + "answer: nope"]
        out = module.reward_func(queries, [prompt, prompt], labels)
        assert out["rewards"].tolist() == [0.5, 0.0]  # the metadata's credit: it reached the verifier
        assert out["extra_logs"]["reward_error"].tolist() == [0.0]
    finally:
        if module._scorer is not None:
            module._scorer.close()
    broken = cfg.model_copy(update={"reward": CustomReward(file="verify.py", name="missing")})
    with pytest.raises(VerifierError, match="has no function 'missing'"):
        train(broken, OpenRLHFOptions(), launcher=lambda *a, **k: pytest.fail("launched"))


@pytest.mark.parametrize(
    ("kw", "message"), [({"timeout_s": 0}, "timeout_s must be > 0"), ({"workers": -1}, "workers")]
)
def test_a_verifiers_scorer_checks_its_options_like_the_built_ins(kw, message):
    with pytest.raises(ValueError, match=message):
        Scorer(reward={"file": str(FIXTURE), "name": "exact"}, **kw)


def _reward_file_module():
    """hacpo's reward file loaded by path, as OpenRLHF loads it in each vLLM engine (its own state)."""
    import importlib.util

    from hacpo.engines.openrlhf.command import reward_file

    spec = importlib.util.spec_from_file_location("reward_func", reward_file())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("first", ["always_raises", "raises_on_boom"])
def test_on_openrlhf_a_verifier_failing_the_first_batch_stops_the_engine_and_says_why(
    first, tmp_path, monkeypatch
):
    """OpenRLHF calls the reward file once per sample: the first HACPO_VERIFIER_FIRST_BATCH calls of an
    engine all failing write the stop file (the runner watches it) and hold the call, so the step's
    rollouts never complete. One success before that, and later failures only score 0."""
    import json
    import threading

    stop = tmp_path / "verifier_stop.json"
    monkeypatch.setenv("HACPO_REWARD", json.dumps({"file": str(FIXTURE), "name": first}))
    monkeypatch.setenv("HACPO_VERIFIER_FIRST_BATCH", "3")
    monkeypatch.setenv("HACPO_VERIFIER_STOP", str(stop))
    module = _reward_file_module()

    def call(text: str):
        return module.reward_func([f"q answer: {text}"], ["q"], ["3"])

    try:
        if first == "raises_on_boom":
            assert call("3")["rewards"].tolist() == [1.0]  # the verifier works on this engine's first item
        for _ in range(2):  # scored 0; before any success the reward file counts them as its errors
            out = call("boom")
            error = out["extra_logs"]["reward_error"].tolist()
            assert out["rewards"].tolist() == [0.0] and error == [float(first == "always_raises")]
        held = threading.Thread(target=call, args=("boom",), daemon=True)
        held.start()
        if first == "always_raises":
            wait_for(stop.exists, 20, "the reward file's stop file")
            held.join(timeout=0.5)
            assert held.is_alive(), "the third failing call must hold until the runner stops the job"
            report = json.loads(stop.read_text())
            assert report["failed"] == 3 and "this verifier is broken" in report["error"]
        else:
            held.join(timeout=20)
            assert not held.is_alive() and not stop.exists()
    finally:
        if module._scorer is not None:
            module._scorer.close()


def test_on_openrlhf_a_reward_outside_its_range_stops_the_engine_at_any_step(tmp_path, monkeypatch):
    """The reward file maps a declared range as the local engine does (the scorer's), and a value outside it
    writes the stop file at its first call, after successes too; the runner raises it, naming the item."""
    import json
    import sys
    import threading

    from hacpo.engines.openrlhf.runner import launch_subprocess
    from hacpo.reward import RewardRangeError
    from hacpo.reward.custom import encode_label

    stop = tmp_path / "verifier_stop.json"
    reward = {"file": str(FIXTURE), "name": "exact", "range": [-1, 1]}
    monkeypatch.setenv("HACPO_REWARD", json.dumps(reward))
    monkeypatch.setenv("HACPO_VERIFIER_STOP", str(stop))
    module = _reward_file_module()
    label = encode_label("3", {"credit": 3.0}, "p7")
    try:
        assert module.reward_func(["q answer: 3"], ["q"], ["3"])["rewards"].tolist() == [1.0]
        assert module.reward_func(["q answer: 4"], ["q"], ["3"])["rewards"].tolist() == [0.5]  # 0 → 0.5
        args = (["q answer: 3"], ["q"], [label])
        held = threading.Thread(target=module.reward_func, args=args, daemon=True)
        held.start()
        wait_for(stop.exists, 20, "the reward file's stop file")
        held.join(timeout=0.5)
        assert held.is_alive(), "the call must hold until the runner stops the job"
        report = json.loads(stop.read_text())
        assert report["kind"] == "range" and "item p7 the reward 3.0" in report["error"]
    finally:
        if module._scorer is not None:
            module._scorer.close()
    with pytest.raises(RewardRangeError, match="item p7 the reward 3.0"):
        launch_subprocess([sys.executable, "-c", "import time; time.sleep(600)"], {}, tmp_path / "log",
                          lambda: None, stop)  # fmt: skip


def test_on_openrlhf_concurrent_calls_with_a_hanging_verifier_cost_about_two_deadlines(monkeypatch):
    """Issue 43 on OpenRLHF: its executor calls the reward file once per sample, many at a time. Before, each
    call waited its turn behind the scorer's lock, so the 6 samples of a hanging prompt took 6 deadlines in
    turn. Now the calls in flight are scored as one batch: the batch's deadline, then its items retried in
    parallel (8 retry workers: 6 hanging items leave two for the others): about two deadlines. Every
    sample's extra logs carry its share of the batch's counts, which sum to the 6 timed-out and failed
    items; the other samples are scored as usual."""
    import json
    import threading
    import time

    timeout = 4.0  # well above the retry workers' start (the budget counts it)
    monkeypatch.setenv("HACPO_REWARD", json.dumps({"file": str(FIXTURE), "name": "hangs_on_hang"}))
    monkeypatch.setenv("HACPO_REWARD_TIMEOUT_S", str(timeout))
    module = _reward_file_module()
    module._get_scorer().wait_ready()
    texts = [f"hang {i}" for i in range(6)] + [str(i % 2 + 2) for i in range(26)]  # gold "3": 13 right
    out: dict[int, dict] = {}

    def call(i: int) -> None:
        out[i] = module.reward_func([f"q answer: {texts[i]}"], ["q"], ["3"])

    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        wall = time.monotonic() - t0
        assert len(out) == len(texts)
        assert wall < 4 * timeout, wall  # serially behind the lock: 6 × 4 s = 24 s at least
        rewards = [float(out[i]["rewards"][0]) for i in range(len(texts))]
        assert rewards == [0.0] * 6 + [1.0 if t == "3" else 0.0 for t in texts[6:]]
        total = {k: sum(float(o["extra_logs"][f"verifier_{k}"][0]) for o in out.values())
                 for k in ("timed_out", "failed", "shared")}  # fmt: skip
        assert total["timed_out"] == pytest.approx(6) and total["failed"] == pytest.approx(6)
        assert total["shared"] == pytest.approx(24)  # "2" and "3", 13 copies each, scored once each
    finally:
        module._scorer.close()


def test_the_openrlhf_runner_stops_a_job_whose_engine_wrote_the_verifier_stop(tmp_path):
    """launch_subprocess: the stop file appears, the job (its whole process group) is stopped within
    seconds and the error is raised; without a stop file the job runs to its end."""
    import sys
    import time

    from hacpo.engines.openrlhf.runner import launch_subprocess

    stop = tmp_path / "verifier_stop.json"
    write = f"import json, time; json.dump({{'error': 'e1', 'failed': 4}}, open({str(stop)!r}, 'w'))"
    write += "; time.sleep(600)"
    t0 = time.monotonic()
    with pytest.raises(VerifierError, match="e1; so were the 3 items"):
        launch_subprocess([sys.executable, "-c", write], {}, tmp_path / "log", lambda: None, stop)
    assert time.monotonic() - t0 < 60
    stop.unlink()
    assert launch_subprocess([sys.executable, "-c", "pass"], {}, tmp_path / "log", lambda: None, stop) == 0


def test_the_first_batch_stop_is_set_for_a_fresh_run_with_a_verifier_only(tmp_path, small_agent):
    """The rule's size: the first step's samples one engine gets at least; none for built-in rewards or a
    resumed run (its first step passed); a previous launch's stop file is removed."""
    from hacpo.engine_options import OpenRLHFOptions
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import verifier_stop_env

    layout = Layout(tmp_path / "run")
    layout.root.mkdir(parents=True)
    layout.verifier_stop.write_text("{}")
    base = {"method": "gspo", "agents": [{"name": "a", "path": str(small_agent)}], "train_file": "x",
            "out_dir": str(tmp_path / "run"), "prompts_per_step": 4, "group_size": 8}  # fmt: skip
    custom = TrainConfig(**base, reward={"file": str(FIXTURE), "name": "exact"})
    env = verifier_stop_env(custom, OpenRLHFOptions(gpus_per_node=2), layout, start=0)
    assert env["HACPO_VERIFIER_FIRST_BATCH"] == "16" and not layout.verifier_stop.exists()  # 32 over 2
    assert env["HACPO_VERIFIER_STOP"] == str(layout.verifier_stop.resolve())
    resumed = verifier_stop_env(custom, OpenRLHFOptions(gpus_per_node=2), layout, start=1)
    assert resumed == {"HACPO_VERIFIER_STOP": env["HACPO_VERIFIER_STOP"]}  # a reward out of range still stops
    assert verifier_stop_env(TrainConfig(**base), OpenRLHFOptions(gpus_per_node=1), layout, start=0) == {}
