"""The joint driver's own pieces against the real openrlhf 0.11.2 (the whole driver runs for real in
test_real_stack.py and the rehearsal): OpenRLHF's parser on every joint run of the paper, the controller's
construction from OpenRLHF's classes, resume pinning, prompt ids, rows dealt over data-parallel ranks and the
ranks' metrics merged, the engine calls around a weight sync (vLLM's own sleep state machine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import on_this_machine, require, toy_joint_config  # noqa: E402

require("openrlhf", "vllm")
on_this_machine()


from hacpo.config import TrainConfig  # noqa: E402
from hacpo.engines.openrlhf.joint.driver import parse_args  # noqa: E402
from hacpo.engines.openrlhf.joint.state import pin_resume_step  # noqa: E402


def _cfg(tmp_path, small_agent, other_agent, toy_data, out: str) -> TrainConfig:
    return toy_joint_config(
        {"llama": small_agent, "qwen": other_agent}, toy_data, tmp_path / out, val_size=8, val_every=2,
        steps=4, max_new_tokens=16, checkpoint_every=2, keep_checkpoints=1, lr=1e-3,
        openrlhf={"gpus_per_node": 1, "micro_train_batch_size": 4, "max_prompt_tokens": 48},
    )  # fmt: skip


def test_pin_resume_step(tmp_path):
    agents = [tmp_path / "a", tmp_path / "b"]
    for ckpt, tags in zip(agents, (["global_step2", "global_step4"], ["global_step2"]), strict=True):
        for tag in tags:
            (ckpt / "_actor" / tag).mkdir(parents=True)
        (ckpt / "_actor" / "latest").write_text(tags[-1])
    pin_resume_step(agents, 2)  # agent a saved step 4 before the kill, the controller's state is at 2
    assert [(c / "_actor" / "latest").read_text() for c in agents] == ["global_step2", "global_step2"]
    with pytest.raises(RuntimeError, match="lacks the DeepSpeed checkpoint global_step4"):
        pin_resume_step(agents, 4)
    pin_resume_step(agents, 0)  # no controller state: nothing an agent saved may be loaded
    assert not any((c / "_actor").exists() for c in agents)


def test_every_joint_run_of_the_paper_is_accepted_per_agent_by_openrlhf(tmp_path):
    """All 30 joint runs of config/paper.yaml (the paper's 27 and Naive's other reading on the three Table 1
    pairs): each agent's arguments pass OpenRLHF's own parser and checks
    (driver.parse_args) and build its DeepspeedStrategy, with its model, files and GSPO's own term."""
    import yaml
    from openrlhf.utils import get_strategy

    from hacpo.engines.openrlhf.command import Layout, joint_agent_args, reward_file
    from hacpo.pipeline import Pipeline

    root = Path(__file__).resolve().parents[2]
    pipe = Pipeline(yaml.safe_load((root / "config" / "paper.yaml").read_text()))
    joints = [r for r in pipe.runs if r.kind == "joint"]
    assert len(joints) == 30
    for run in joints:
        cfg = TrainConfig.model_validate(pipe.train_config(run))
        layout = Layout(tmp_path / run.dir)
        for k, agent in enumerate(cfg.agents):
            args = parse_args(joint_agent_args(cfg, cfg.openrlhf, layout, k))
            assert type(get_strategy(args)).__name__ == "DeepspeedStrategy"
            assert args.actor.model_name_or_path == agent.path and args.actor.num_gpus_per_node == 8
            assert args.data.prompt_dataset == str(layout.agent(agent.name).prompts.resolve())
            assert args.ckpt.path == str(layout.agent(agent.name).ckpt.resolve())
            assert args.actor.policy_loss_type == "gspo" and list(args.actor.eps_clip_low_high) == [
                3e-4,
                4e-4,
            ]
            assert args.rollout.n_samples_per_prompt == 8 and args.train.batch_size == 512
            assert args.algo.kl.use_loss and args.algo.kl.init_coef == 0.001
            assert args.reward.remote_url == [str(reward_file())] and not args.train.dynamic_batch_enable


# ------------------------------------------------------------------------- the driver's own code paths
def _tiny_joint(tmp_path, small_agent, other_agent, toy_data, **over) -> tuple[TrainConfig, dict]:
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import write_inputs, write_joint_spec

    cfg = _cfg(tmp_path, small_agent, other_agent, toy_data, "driver")
    cfg = cfg.model_copy(update=over)
    layout = Layout(Path(cfg.out_dir))
    layout.root.mkdir(parents=True, exist_ok=True)
    write_inputs(cfg, layout)
    write_joint_spec(cfg, cfg.openrlhf, layout)
    return cfg, json.loads(layout.joint_spec.read_text())


def test_controller_builds_from_real_openrlhf_pieces(tmp_path, small_agent, other_agent, toy_data):
    """HacpoController's own __init__ on CPU: OpenRLHF's BasePPOTrainer (KL controller), get_tokenizer per
    agent, an OpenRLHFStack per agent (SamplesGenerator, RemoteExperienceMaker) and the JointLoop, whose run
    loop writes TensorBoard (OpenRLHF's loggers stay off: one event directory per run)."""
    from openrlhf.utils import get_strategy

    from hacpo.engines.openrlhf.joint import driver
    from hacpo.engines.openrlhf.joint.stack import OpenRLHFStack

    cfg, spec = _tiny_joint(tmp_path, small_agent, other_agent, toy_data)
    parts = []
    for a in cfg.agents:
        args = parse_args(spec["argv"][a.name])
        parts.append(
            dict(name=a.name, strategy=get_strategy(args), engines=[], actor=None, ref=None, args=args)
        )
    controller = driver.HacpoController(spec, parts)
    stacks = controller.loop.stacks
    assert [s.name for s in stacks] == ["llama", "qwen"] and all(isinstance(s, OpenRLHFStack) for s in stacks)
    assert stacks[0].tokenizer.eos_token == "</s>" and stacks[1].tokenizer.eos_token == "<|endoftext|>"
    assert stacks[1].maker.strategy.args.actor.model_name_or_path == str(other_agent)
    assert len(controller.loop.problems) > 0 and len(controller.loop.val) == 8
    # the run loop writes the curves (the local engine's tags): OpenRLHF's own loggers get nothing to write to
    assert controller.tensorboard_logger is None and controller.wandb_logger is None
    assert [type(v).__name__ for v in controller.loop.loop.views] == ["TensorBoardView"]


def test_balanced_chunks_share_own_and_cross_rows_over_ranks():
    from types import SimpleNamespace

    from hacpo.engines.openrlhf.joint.rows import IS_SELF
    from hacpo.engines.openrlhf.joint.stack import balanced_chunks

    rows = [SimpleNamespace(info={IS_SELF: torch.tensor(float(i < 8))}, i=i) for i in range(24)]
    chunks = balanced_chunks(rows, 4)
    assert [len(c) for c in chunks] == [6] * 4
    assert [sum(float(r.info[IS_SELF]) for r in c) for c in chunks] == [2] * 4
    assert sorted(r.i for c in chunks for r in c) == list(range(24))
    with pytest.raises(ValueError, match="do not split evenly over 5"):
        balanced_chunks(rows, 5)


def test_prompt_ids_from_prompt_texts():
    from hacpo.engines.openrlhf.joint.controller import assign_prompt_ids

    rows = [SimpleNamespace(prompts=[t]) for t in ["b", "a", "b", "a", "c", "c", "c", "c"]]
    # "c" appears twice in the batch (pids 2 and 3): its rows are shared out two each, in arrival order
    assert assign_prompt_ids(rows, ["a", "b", "c", "c"], 2) == [1, 0, 1, 0, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="fewer than 2 samples"):
        assign_prompt_ids(rows[:-1], ["a", "b", "c", "c"], 2)
    with pytest.raises(ValueError, match="not in this step's batch"):
        assign_prompt_ids(rows + [SimpleNamespace(prompts=["z"])], ["a", "b", "c", "c"], 2)
    with pytest.raises(ValueError, match="more than 2 samples"):
        assign_prompt_ids(rows + [SimpleNamespace(prompts=["a"])], ["a", "b", "c", "c"], 2)


def test_joint_method_needs_two_agents():
    from hacpo.algo import get_method
    from hacpo.engines.openrlhf.joint.controller import JointStep

    with pytest.raises(ValueError, match="at least 2 agents"):
        method = get_method("hacpo")
        JointStep([SimpleNamespace(name="solo")], method, method.loss_spec(), 4, max_new_tokens=8, max_len=64)


def test_rank_metrics_are_merged_over_every_rank():
    """Each update's metrics are merged over every data-parallel rank's share of it (rank 0 alone was
    reported before): shares summed, means over the rows they cover, shared values from the first rank."""
    from hacpo.engines.openrlhf.joint.stack import merge_rank_updates

    shared = {"grad_norm": 2.0, "actor_lr": 1e-6}
    ranks = [
        [{"update": m, "loss": 1.0, "rows": 8, "own_rows": 8, "own_clip_frac": 0.5, **shared}
         for m in (0, 1)],
        [
            {"update": m, "loss": 3.0, "rows": 24, "own_rows": 4, "own_clip_frac": 0.0,
             "cross_in_bounds_frac": 0.25, **shared}
            for m in (0, 1)
        ],
    ]  # fmt: skip
    merged = merge_rank_updates(ranks)
    assert [u["update"] for u in merged] == [0, 1]
    u = merged[0]
    assert (u["loss"], u["rows"], u["own_rows"]) == (4.0, 32, 12)
    assert u["own_clip_frac"] == pytest.approx(0.5 * 8 / 12)  # over own rows
    assert u["cross_in_bounds_frac"] == 0.25  # only rank 1 had cross rows
    assert (u["grad_norm"], u["actor_lr"]) == (2.0, 1e-6)
    with pytest.raises(ValueError, match="different numbers of updates"):
        merge_rank_updates([ranks[0], ranks[1][:1]])


class _Executor:
    """vLLM's own executor sleep/wake state machine (``vllm.v1.executor.abstract.Executor.sleep`` and
    ``wake_up``, the real methods), with the worker RPCs recorded instead of sent to GPU workers."""

    def __init__(self):
        self.is_sleeping, self.sleeping_tags, self.rpcs = False, set(), []

    def collective_rpc(self, method, kwargs=None):
        self.rpcs.append((method, (kwargs or {}).get("tags")))


def _run_calls(executor, calls) -> None:
    from vllm.v1.executor.abstract import Executor

    for call in calls:
        if call == "broadcast":
            executor.rpcs.append(("broadcast", None))
            continue
        name, kwargs = call
        if name == "sleep":
            Executor.sleep(executor)
        else:  # OpenRLHF's RolloutRayActor.wake_up wakes tag by tag
            for tag in kwargs.get("tags") or ["weights", "kv_cache"]:
                Executor.wake_up(executor, tags=[tag])


def test_weight_sync_puts_a_sleeping_engine_back_to_sleep():
    """Agents sharing GPUs: an engine asleep before the sync is asleep after it. Waking only the weights
    leaves vLLM's executor asleep (the KV cache still sleeps), and ``sleep()`` then does nothing, so the old
    sequence (wake weights, broadcast, sleep) left every agent's weights on the GPU."""
    from hacpo.engines.openrlhf.joint.stack import sync_calls

    old = _Executor()
    Executor_sleep_first = [("sleep", {})]
    _run_calls(old, Executor_sleep_first + [("wake_up", {"tags": ["weights"]}), "broadcast", ("sleep", {})])
    assert [m for m, _ in old.rpcs].count("sleep") == 1  # the second sleep never reached the workers

    new = _Executor()
    _run_calls(new, Executor_sleep_first + sync_calls(sleep_mode=True, sleep_after=True))
    assert [m for m, _ in new.rpcs] == ["sleep", "wake_up", "broadcast", "wake_up", "sleep"]
    assert new.is_sleeping and new.sleeping_tags == {"weights", "kv_cache"}
    assert sync_calls(sleep_mode=False, sleep_after=True) == ["broadcast"]
    kept = _Executor()  # an agent on GPUs of its own stays awake after the sync
    _run_calls(kept, Executor_sleep_first + sync_calls(sleep_mode=True, sleep_after=False))
    assert kept.sleeping_tags == {"kv_cache"}


def test_engine_gap_compares_vllms_and_the_actors_log_probs_on_response_tokens():
    """The weight sync's running check (:func:`rows.engine_gap`, a metric of every joint step): |vLLM's
    sampled-token log-prob − the actor's| over response tokens only; nothing when vLLM gave none."""
    from hacpo.engines.openrlhf.joint.rows import engine_gap

    def row(vllm, actor, mask):
        return SimpleNamespace(
            rollout_log_probs=None if vllm is None else torch.tensor(vllm),
            action_log_probs=torch.tensor(actor), action_mask=torch.tensor(mask),
        )  # fmt: skip

    rows = [row([0.0, -1.0, -2.0], [-5.0, -1.1, -2.0], [0, 1, 1]), row([-0.5, -0.7], [-0.2, -0.7], [1, 1])]
    gap = engine_gap(rows)  # the prompt position (mask 0) differs by 5 and is ignored
    assert gap["engine_logp_gap_max"] == pytest.approx(0.3)
    assert gap["engine_logp_gap_mean"] == pytest.approx((0.1 + 0.0 + 0.3 + 0.0) / 4)
    assert engine_gap([*rows, row(None, [-1.0], [1])]) == {}
