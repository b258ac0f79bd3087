"""A joint run through ``hacpo.engines.openrlhf.runner.train`` (issue 11) on CPU, killed and resumed.

The runner does what it does on a cluster (joint.json with every agent's OpenRLHF arguments, prompt files,
run.json, checkpoint collection, profile.json); the launcher double plays the driver: it parses each agent's
arguments with OpenRLHF's own parser (:func:`driver.parse_args`), pins every agent to the controller's step
(:func:`driver.pin_resume_step`), loads DeepSpeed-layout states like ``--ckpt.load_enable``, and runs
:class:`JointLoop` over CPU agent stacks (cpu_stack.py). The first launch dies during step 3; the rerun
resumes from step 2 and ends with the metrics, validation and final weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openrlhf", reason="needs openrlhf==0.11.2: bash scripts/setup_openrlhf_cpu.sh")
sys.path.insert(0, str(Path(__file__).parent))
import gpu_only_modules  # noqa: E402

gpu_only_modules.install()

from cpu_stack import CpuStack  # noqa: E402

from hacpo.config import TrainConfig  # noqa: E402
from hacpo.engines.openrlhf.joint import controller as C  # noqa: E402
from hacpo.engines.openrlhf.joint.driver import parse_args, pin_resume_step  # noqa: E402


class Killed(Exception):
    pass


class DriverDouble:
    """Plays ``python -m hacpo.engines.openrlhf.joint.driver joint.json`` in this process, on CPU."""

    def __init__(self, die_in_step: int | None = None):
        self.die_in_step, self.launches = die_in_step, 0

    def __call__(self, argv, env, log: Path) -> int:
        self.launches += 1
        assert argv[1:3] == ["-m", "hacpo.engines.openrlhf.joint.driver"]
        spec = json.loads(Path(argv[3]).read_text())
        cfg = TrainConfig.model_validate(spec["config"])
        args = [parse_args(spec["argv"][a.name]) for a in cfg.agents]  # OpenRLHF's own parser and checks
        state = C.read_state(Path(spec["state"]))
        pin_resume_step([a.ckpt.path for a in args], state["step"])
        stacks = []
        for k, (agent, a) in enumerate(zip(cfg.agents, args, strict=True)):
            assert Path(a.data.prompt_dataset).is_file() and a.actor.model_name_or_path == agent.path
            micro = a.train.micro_batch_size
            stack = CpuStack(agent.name, Path(agent.path), [], cfg.loss_spec(), seed=k, micro=micro,
                             gas=a.train.batch_size // micro, ckpt=Path(a.ckpt.path))  # fmt: skip
            Path(a.ckpt.path).mkdir(parents=True, exist_ok=True)
            assert stack.load_latest() == state["step"]
            stacks.append(stack)
        loop = C.JointLoop(cfg, stacks, Path(spec["state"]))
        if self.die_in_step is not None:
            run_step = loop.step.run

            def dying(step, problems):
                if step == self.die_in_step:
                    self.die_in_step = None
                    raise Killed
                return run_step(step, problems)

            loop.step.run = dying
        try:
            loop.run()
        except Killed:
            return -9
        return 0


def _cfg(tmp_path, small_agent, other_agent, toy_data, out: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "method": "hacpo",
            "agents": [
                {"name": "llama", "path": str(small_agent)},
                {"name": "qwen", "path": str(other_agent)},
            ],
            "train_file": str(toy_data / "train.jsonl"),
            "val_file": str(toy_data / "dev.jsonl"),
            "val_size": 8,
            "val_every": 2,
            "out_dir": str(tmp_path / out),
            "steps": 4,
            "prompts_per_step": 4,
            "group_size": 4,
            "minibatch_size": 8,  # 2 agents × 4 prompts × 4 = 32 rows per learner: 4 updates of 8
            "max_new_tokens": 16,
            "checkpoint_every": 2,
            "keep_checkpoints": 1,
            "lr": 1e-3,
            "openrlhf": {"gpus_per_node": 1, "micro_train_batch_size": 4, "max_prompt_tokens": 48},
        }
    )


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_joint_run_contract_kill_and_resume(tmp_path, small_agent, other_agent, toy_data):
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import RunRecord, read_jsonl

    cfg = _cfg(tmp_path, small_agent, other_agent, toy_data, "killed")
    double = DriverDouble(die_in_step=2)
    with pytest.raises(RuntimeError, match="exited with status -9"):
        train(cfg, cfg.openrlhf, launcher=double)
    out = Path(cfg.out_dir)
    rec = RunRecord.read(out)
    assert rec.status == "running" and rec.step == 2 and rec.engine == "openrlhf"
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1]
    assert sorted({p.name for p in (out / "checkpoints" / "llama").iterdir()}) == ["step-2"]
    spec = json.loads((out / "openrlhf" / "joint.json").read_text())
    assert set(spec["argv"]) == {"llama", "qwen"} and spec["shared_gpus"] is True

    done = train(cfg, cfg.openrlhf, launcher=double)
    assert double.launches == 2 and done.status == "complete" and done.step == 4
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    val = read_jsonl(out / "validation.jsonl")
    assert sorted((r["step"], r["agent"]) for r in val) == [
        (s, a) for s in (0, 2, 4) for a in ("llama", "qwen")
    ]
    for agent in ("llama", "qwen"):
        assert sorted(p.name for p in (out / "checkpoints" / agent).iterdir()) == ["step-4"]  # keep 1 + final
        assert done.final_checkpoints[agent] == str(out / "checkpoints" / agent / "step-4")
    profile = json.loads((out / "profile.json").read_text())
    assert profile["engine"] == "openrlhf" and profile["steps"] == 4 and profile["phase_s"]["update"] > 0
    assert set(profile["phase_s"]) == {"generate", "logprobs", "retokenize", "update", "sync", "validate"}
    assert profile["phase_s"]["validate"] > 0
    assert rows[0]["llama/cross_in_bounds_frac"] >= 0 and len(rows[0]["omega"]) == 2
    assert train(cfg, cfg.openrlhf, launcher=double).status == "complete" and double.launches == 2  # no redo

    # the same run without a kill: same metrics (bar timings), validation and final weights
    ref_cfg = _cfg(tmp_path, small_agent, other_agent, toy_data, "uninterrupted")
    train(ref_cfg, ref_cfg.openrlhf, launcher=DriverDouble())
    ref = Path(ref_cfg.out_dir)
    assert _comparable(read_jsonl(ref / "metrics.jsonl")) == _comparable(rows)
    assert read_jsonl(ref / "validation.jsonl") == val
    from safetensors.torch import load_file

    for agent in ("llama", "qwen"):
        a = load_file(out / "checkpoints" / agent / "step-4" / "model.safetensors")
        b = load_file(ref / "checkpoints" / agent / "step-4" / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)


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
    """All 27 joint runs of config/paper.yaml: each agent's arguments pass OpenRLHF's own parser and checks
    (driver.parse_args) and build its DeepspeedStrategy, with its model, files and GSPO's own term."""
    import yaml
    from openrlhf.utils import get_strategy

    from hacpo.engines.openrlhf.command import Layout, joint_agent_args, reward_file
    from hacpo.pipeline import Pipeline

    root = Path(__file__).resolve().parents[2]
    pipe = Pipeline(yaml.safe_load((root / "config" / "paper.yaml").read_text()))
    joints = [r for r in pipe.runs if r.kind == "joint"]
    assert len(joints) == 27
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


def _class_name(actor_type) -> str:
    """The Python class behind a Ray actor class (ours recorded by the fake ray.remote, OpenRLHF's real)."""
    cls = getattr(actor_type, "cls", None) or getattr(actor_type, "__ray_actor_class__", None) or actor_type
    return cls.__name__


def test_driver_build_places_every_agent_and_switches_hacpo_on(tmp_path, small_agent, other_agent, toy_data,
                                                               monkeypatch):  # fmt: skip
    """driver.build with Ray's placement, vLLM engines and actor groups recorded instead of started (they
    need GPUs): one shared placement group, every agent's engines and groups on it at the hybrid fractions,
    each agent's own model and arguments, models initialised, use_hacpo with the run's loss, a controller."""
    import importlib

    import openrlhf.trainer.ray as ray_pkg
    import openrlhf.trainer.ray.launcher as launcher
    import ray

    from hacpo.engines.openrlhf.joint import driver

    class PG(str):
        def ready(self):
            return None

    pg_mod = importlib.import_module("ray.util.placement_group")  # `ray.util.placement_group` is the function
    cfg, spec = _tiny_joint(tmp_path, small_agent, other_agent, toy_data)
    calls = []

    class Group:
        def __init__(self, nodes, gpus, actor_type, pg=None, num_gpus_per_actor=1, duplicate_actors=1):
            calls.append(
                (
                    "group",
                    _class_name(actor_type),
                    gpus,
                    pg,
                    num_gpus_per_actor,
                )
            )

        def async_init_model_from_pretrained(self, *args):
            calls.append(("init", args[1]))
            return []

        def async_run_method(self, method_name, **kwargs):
            calls.append((method_name, kwargs))
            return []

    class Remote:
        def __init__(self, cls):
            self.cls = cls

        def remote(self, *args):
            calls.append(("controller", self.cls.__name__, [p["name"] for p in args[1]]))
            return "controller-handle"

    monkeypatch.setattr(
        pg_mod, "placement_group", lambda bundles, strategy: calls.append(("pg", len(bundles))) or PG("pg")
    )
    monkeypatch.setattr(ray, "get", lambda x: x)
    monkeypatch.setattr(ray, "remote", lambda **kw: Remote)
    monkeypatch.setattr(
        ray_pkg,
        "create_vllm_engines",
        lambda *a, **kw: calls.append(("engines", a[2], a[8], kw)) or ["engine"],
    )
    monkeypatch.setattr(launcher, "RayActorGroup", Group)
    assert driver.build(spec) == "controller-handle"
    assert [c for c in calls if c[0] == "pg"] == [("pg", 1)]  # one placement group, shared by both agents
    engines = [c for c in calls if c[0] == "engines"]
    assert [e[1] for e in engines] == [a.path for a in cfg.agents] and all(e[2] == "pg" for e in engines)
    assert all(e[3]["remote_rm_url"] for e in engines)
    groups = [c for c in calls if c[0] == "group"]
    assert [g[1] for g in groups] == ["HacpoPolicyActor", "ReferenceModelActor"] * 2
    assert all(g[3] == "pg" and g[4] == 0.15 for g in groups)  # 2 agents: (1 − 0.4) / 4
    hacpo = [c[1] for c in calls if c[0] == "use_hacpo"]
    assert len(hacpo) == 2 and hacpo[0]["spec"]["kind"] == "hacpo" and hacpo[0]["order"] == "mixed"
    assert calls[-1] == ("controller", "HacpoController", ["llama", "qwen"])


def test_controller_builds_from_real_openrlhf_pieces(tmp_path, small_agent, other_agent, toy_data):
    """HacpoController's own __init__ on CPU: OpenRLHF's BasePPOTrainer (KL controller, TensorBoard logger),
    get_tokenizer per agent, an OpenRLHFStack per agent (SamplesGenerator, RemoteExperienceMaker) and the
    JointLoop; rows logged through OpenRLHF's TensorBoard logger."""
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
    controller._log_row({"step": 0, "llama/reward": 0.5, "omega": [[1, 1], [1, 1]]})
    events = list(Path(parts[0]["args"].logger.tensorboard_dir).rglob("events.out.tfevents.*"))
    assert events, "OpenRLHF's TensorBoard logger wrote nothing"


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
