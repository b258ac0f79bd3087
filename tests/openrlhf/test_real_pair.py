"""The real pretrained pair (SmolLM2-135M-Instruct × Gemma-3-270M) on the real stack's side (issue 36): the
imported directories load with OpenRLHF's transformers 5.15.0 and in vLLM 0.29 whatever transformers wrote
them, and vLLM and the local engine decode them with the same prompts, BOS, stop ids and length limit, and
give the same greedy answers (:mod:`hacpo.eval.agreement`; the full figures in docs/openrlhf.md)."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import require  # noqa: E402
from required import missing  # noqa: E402

require("openrlhf", "vllm")

from hacpo.data.synthetic import make_splits  # noqa: E402
from hacpo.eval.run import Sampling  # noqa: E402

SAMPLING = Sampling(max_new_tokens=32, prompt_style="paper")  # config/rehearsal-real.yaml's format


@pytest.fixture(scope="module")
def problems(shared_dir):
    """Held-out two-digit additions (the rehearsal's test family) and the first GSM8K test problems."""
    from hacpo.data.prepare import load_raw, normalise_rows
    from hacpo.data.registry import get

    adds = [p.to_dict() for p in make_splits(["add2"], seed=0, n_test=12, n_dev=10, n_train=0)["test"]]
    rows, _ = load_raw("gsm8k", cache_dir=shared_dir / "data", allow_download=False)
    return {"add2": adds, "gsm8k": normalise_rows(get("gsm8k"), rows[:6])}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def report(request, real_models, problems):
    from hacpo.eval.agreement import agreement

    path = real_models[request.param]
    out = agreement(str(path), problems, SAMPLING, reward="hendrycks", threads=2)
    gc.collect()  # the vLLM engine (its engine-core process) goes before the next model's
    return request.param, path, out


def test_the_imported_models_load_with_openrlhfs_transformers_and_in_vllm(report):
    """Both engines of the agreement test loaded the directory: transformers 5.15.0 (OpenRLHF's pin) and
    vLLM 0.29. The importer may have run under a newer transformers (CI: the main venv's, which imports
    first into the shared per-machine cache)."""
    import transformers
    import vllm

    name, path, out = report
    assert transformers.__version__ == "5.15.0" and vllm.__version__.startswith("0.29")
    written_by = json.loads((path / "config.json").read_text()).get("transformers_version")
    print(f"{name}: written by transformers {written_by}, read by {transformers.__version__} and vLLM")
    assert all(r["items"] > 0 for r in out.values())


def test_both_engines_decode_with_the_same_prompts_bos_stops_and_length(report):
    name, _, out = report
    for bench, r in out.items():
        local, vllm = r["setup"]["local"], r["setup"]["vllm"]
        assert r["same_prompts"], f"{name}/{bench}: the engines render other prompt ids"
        assert local["stop_ids"] == vllm["stop_ids"], f"{name}/{bench}: stop ids differ"
        assert local["first_ids"] == vllm["first_ids"]
        assert local["longest"] <= vllm["max_len"], "vLLM would cut a prompt + answer the local engine keeps"
    stops = {"smollm2": {2, 198, 1116}, "gemma3": {1, 107, 108}}[name]  # EOS/<|im_end|>, "\n", "\n\n"
    assert set(out["add2"]["setup"]["vllm"]["stop_ids"]) == stops
    first = out["add2"]["setup"]["vllm"]["first_ids"]
    # Gemma's prompts start with <bos> (id 2), once; SmolLM2's tokenizer adds none and its format starts none
    assert (first == [2]) == (name == "gemma3")


def test_greedy_answers_agree_between_vllm_and_the_local_engine(report):
    """fp32 on both engines: every answer identical on these items (40 of 40 per model in docs). A
    difference can only come from kernel rounding at a near-tie of the top two logits, so a few are
    tolerated; a systematic one (a stop id, a prompt, BOS) would show everywhere."""
    name, _, out = report
    for bench, r in out.items():
        assert r["identical_responses"] >= 0.8, f"{name}/{bench}: {r['differences']}"
        assert r["identical_rewards"] >= r["identical_responses"]


@pytest.fixture(scope="module")
def real_rehearsal() -> Path:
    """The joint HACPO run of config/rehearsal-real.yaml's rehearsal (CI: HACPO_REAL_REHEARSAL_DIR)."""
    where = os.environ.get("HACPO_REAL_REHEARSAL_DIR")
    if not where:
        missing(
            "HACPO_REQUIRE_REAL_STACK",
            "HACPO_REAL_REHEARSAL_DIR is not set",
            "set HACPO_REAL_REHEARSAL_DIR=results/rehearsal-real after `bash scripts/rehearse.sh "
            "--configfile config/rehearsal-real.yaml --gpus 1` (CI runs its joint part)",
        )
    run = Path(where) / "runs" / "joint" / "real" / "hacpo" / "seed0"
    assert (run / "run.json").is_file(), f"no joint run in {where}: the rehearsal did not run it"
    return run


def test_weight_sync_of_both_real_architectures(real_models, tmp_path, request):
    """After a weight sync each real model's vLLM engine holds its DeepSpeed actor's weights
    (:mod:`hacpo.engines.openrlhf.joint.sync_check`): the gap between vLLM's and the actor's log-probs of the
    same sampled tokens is rounding with the weights loaded and after the sync, and several times larger
    after an update that was not synced. Gemma-3 is the test of tied embeddings and of its sliding-window
    and global layers; SmolLM2 of a Llama with its own head. The real rehearsal's joint run checks it at its
    end (``openrlhf: {sync_check: true}``): its report is read when HACPO_REAL_REHEARSAL_DIR names one,
    else the check runs here (≈ 4 min)."""
    where = os.environ.get("HACPO_REAL_REHEARSAL_DIR")
    if where:
        run = request.getfixturevalue("real_rehearsal")
        report = json.loads((run / "openrlhf" / "sync_check.json").read_text())
    else:
        report = _sync_check_here(real_models, tmp_path)
    print(json.dumps(report, indent=1))
    assert set(report) == {"smollm2", "gemma3"}
    for name, r in report.items():
        assert r["updates"] >= 1
        assert r["holds"], f"{name}: the weight sync did not hold: {r}"
        gap = {k: r[k]["engine_logp_gap_mean"] for k in ("loaded", "stale", "synced")}
        assert gap["synced"] < 0.1 and gap["stale"] > 3 * gap["synced"], gap


def _sync_check_here(real_models, tmp_path) -> dict:
    from hacpo.config import TrainConfig
    from hacpo.data.synthetic import write_jsonl
    from hacpo.engines.openrlhf.runner import sync_check

    train = make_splits(["add2"], seed=0, n_test=4, n_dev=4, n_train=8)["train"]
    write_jsonl(tmp_path / "train.jsonl", train)
    cfg = TrainConfig.model_validate(
        {
            "method": "hacpo",
            "agents": [{"name": n, "path": str(p)} for n, p in real_models.items()],
            "train_file": str(tmp_path / "train.jsonl"),
            "out_dir": str(tmp_path / "run"),
            "steps": 1, "prompts_per_step": 2, "group_size": 4, "minibatch_size": 8,
            "max_new_tokens": 16, "prompt_style": "paper", "kl_beta": 0.0, "reward": "hendrycks",
            "lr": 1e-5,  # the check updates at its own lr (sync_check.CHECK_LR)
            "openrlhf": {
                "cpu": True, "gpus_per_node": 1, "max_prompt_tokens": 192, "micro_train_batch_size": 4,
                "micro_rollout_batch_size": 4, "gradient_checkpointing": True,
                "vllm_gpu_memory_utilization": 0.1,
            },
        }
    )  # fmt: skip
    return sync_check(cfg, cfg.openrlhf)


def test_the_real_pairs_joint_run_trained_both_models_on_each_others_rows(real_rehearsal):
    """The rehearsal's joint HACPO run on the real stack: complete, each learner's updates over its own rows
    and the other's, re-encoded into its tokenizer (BPE → SentencePiece and back), vLLM's log-probs equal to
    the actor's to rounding every step, the update's log-probs with Gemma-3's head in slices, and both agents
    evaluated by vLLM. Both real models moved: a non-zero gradient at a step where the pair's rewards were
    not all 0 (2 steps of 8 samples an agent at temperature 1 may score none: every advantage is then 0, as
    it must be), and in the weight-sync check's update of the same job (±1 advantages) in any case. With a KL
    term (the LoRA rehearsal's, issue 42) a step without reward still has the KL's gradient: the actor's
    bf16 update pass and its scoring pass round apart."""
    record = json.loads((real_rehearsal / "run.json").read_text())
    assert record["status"] == "complete"
    rows = [json.loads(line) for line in (real_rehearsal / "metrics.jsonl").read_text().splitlines()]
    updates = [json.loads(line) for line in (real_rehearsal / "updates.jsonl").read_text().splitlines()]
    check = json.loads((real_rehearsal / "openrlhf" / "sync_check.json").read_text())
    kl = record["config"]["kl_beta"]
    for agent in ("smollm2", "gemma3"):
        for r in rows:  # no reward anywhere in the pair: no advantage, no policy-gradient term
            if not any(r[f"{a}/reward"] > 0 for a in ("smollm2", "gemma3")):
                assert r[f"{agent}/adv_mean"] == 0 and r[f"{agent}/pg_loss"] == 0, f"{agent}: {r}"
                if kl == 0:  # and no gradient at all (with KL on, bf16 rounding between passes gives one)
                    assert r[f"{agent}/grad_norm"] == 0, f"{agent} at step {r['step']}: {r}"
        moved = max(r[f"{agent}/grad_norm"] for r in rows)
        print(f"{agent}: largest gradient norm in the run {moved}, in the sync check's update "
              f"{check[agent]['grad_norm']}")
        assert check[agent]["grad_norm"] > 0, f"{agent} never moved: {check[agent]}"
        mine = [u for u in updates if u["agent"] == agent]
        assert sum(u["cross_rows"] for u in mine) > 0 and sum(u["own_rows"] for u in mine) > 0
        assert all(r[f"{agent}/engine_logp_gap_mean"] < 0.1 for r in rows)
        summary = real_rehearsal.parents[4] / "eval" / "main" / "joint" / "real" / "hacpo" / "seed0" / agent
        assert (summary / "summary.json").is_file(), f"{agent} was not evaluated"
    log = (real_rehearsal / "openrlhf" / "train.log").read_text()
    assert "update log-probs of" in log and "by the head in slices (vocabulary 262144)" in log


def test_the_real_pairs_joint_run_trained_lora_adapters(real_rehearsal):
    """config/rehearsal-real.yaml trains LoRA adapters (issue 42): each final checkpoint is an adapter over
    its imported base (megabytes, no model weights), the KL reference was the actor with its adapter off (no
    reference model was started), and the merged weights synced into vLLM (the sync check above, and the
    engine gap at every step)."""
    from hacpo.agents import adapters
    from hacpo.config import TrainConfig

    record = json.loads((real_rehearsal / "run.json").read_text())
    run = TrainConfig.model_validate(record["config"])
    assert [run.agent_adapter(k).rank for k in range(2)] == [8, 8] and run.kl_beta > 0
    for agent, final in record["final_checkpoints"].items():
        final = Path(final)  # relative to the checkout the rehearsal ran in (the tests run there too)
        assert adapters.is_adapter(final), f"{agent}: {final} is not an adapter checkpoint"
        weights = Path(final) / "adapter_model.safetensors"
        assert weights.is_file() and weights.stat().st_size < 20 * 2**20, weights
        assert not (Path(final) / "model.safetensors").exists()
        assert (adapters.base_of(final) / "config.json").is_file()
    log = (real_rehearsal / "openrlhf" / "train.log").read_text()
    assert "reference log-probs by the actor with its LoRA adapter off" in log
