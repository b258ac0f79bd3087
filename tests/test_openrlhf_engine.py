"""The OpenRLHF engine without OpenRLHF: command lines, prompt files, the reward file, pipeline wiring.

Against OpenRLHF's own code (its argument parser, reward loader, loggers): tests/openrlhf/, run in CI with the
real openrlhf==0.11.2 installed the CPU way (scripts/setup_rehearsal.sh).
"""

from __future__ import annotations

import importlib.util
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from hacpo.config import RunLogging, TrainConfig
from hacpo.engine_options import OpenRLHFOptions
from hacpo.engines.openrlhf.command import (
    Layout,
    build_command,
    joint_agent_args,
    module_and_args,
    prompt_order,
    reward_file,
    wandb_env,
)
from hacpo.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())


def paper_run(method: str, model: str = "qwen3_1p7b_base", **over) -> TrainConfig:
    pipe = Pipeline(PAPER)
    d = pipe.train_config(pipe.run_at("single", model, method, 42)) | over
    return TrainConfig.model_validate(d)


def flags(argv: list[str]) -> dict[str, list[str]]:
    """A run command's OpenRLHF flags (after its launcher and module), or a bare argument list's."""
    args = module_and_args(argv)[1] if argv[1:2] == ["-m"] else argv
    out, key = {}, None
    for a in args:
        if a.startswith("--"):
            key = a[2:]
            out[key] = []
        else:
            out[key].append(a)
    return out


def argv_of(cfg: TrainConfig, tmp_path=Path("/run")) -> dict[str, list[str]]:
    return flags(build_command(cfg, cfg.openrlhf, Layout(tmp_path)))


def test_paper_gspo_command_carries_every_setting_of_the_spec(tmp_path):
    f = argv_of(paper_run("gspo"), tmp_path)
    assert f["actor.policy_loss_type"] == ["gspo"] and f["actor.eps_clip_low_high"] == ["0.0003", "0.0004"]
    assert f["algo.advantage.estimator"] == ["group_norm"]
    assert f["rollout.batch_size"] == ["128"] and f["rollout.n_samples_per_prompt"] == ["8"]
    assert f["train.batch_size"] == ["512"] and f["train.max_epochs"] == ["1"]  # 2 updates per step
    assert f["actor.adam.lr"] == ["1e-06"] and f["actor.lr_scheduler"] == ["constant"]
    assert f["actor.lr_warmup_ratio"] == ["0.0"]
    assert f["actor.adam.weight_decay"] == ["0.01"] and f["actor.adam.betas"] == ["0.9", "0.999"]
    assert f["actor.max_norm"] == ["1.0"]
    assert (
        f["algo.kl.init_coef"] == ["0.001"] and f["algo.kl.estimator"] == ["k3"] and "algo.kl.use_loss" in f
    )
    assert f["data.max_len"] == ["5120"] and f["rollout.max_new_tokens"] == ["4096"]  # 1,024 + 4,096
    assert f["rollout.temperature"] == ["1.0"] and f["rollout.top_p"] == ["1.0"]
    assert f["data.max_samples"] == [str(58 * 128)]  # ≥ the 58 × 128 rows of the prompt file and val_size
    assert f["actor.num_gpus_per_node"] == ["8"] and f["vllm.num_engines"] == ["8"]
    assert {"train.colocate_all", "vllm.enable_sleep", "ds.enable_sleep", "ckpt.load_enable"} <= f.keys()
    assert f["reward.remote_url"] == [str(reward_file())] and reward_file().is_file()
    assert f["data.prompt_dataset"] == [str(tmp_path.resolve() / "openrlhf" / "prompts.jsonl")]
    assert f["eval.temperature"] == ["0.0"] and f["eval.steps"] == ["3"]  # greedy validation every 3 steps


def test_openrlhf_validates_on_every_validation_problem():
    """OpenRLHF truncates its eval dataset to data.max_samples too: a short run (2 steps × 128 prompts)
    still validates on all 500 MATH-500 problems, and trains exactly the prompt file's 256 rows."""
    f = argv_of(paper_run("gspo", steps=2))
    assert f["data.max_samples"] == ["500"]


def test_grpo_and_the_gspo_variants_follow_the_method_record():
    grpo = argv_of(paper_run("grpo"))
    assert grpo["actor.policy_loss_type"] == ["ppo"] and grpo["actor.eps_clip_low_high"] == ["0.2", "0.28"]
    assert grpo["actor.loss_agg_mode"] == ["token-mean"]
    x2 = argv_of(paper_run("gspo_x2"))  # 16 samples, 32 prompts × 16 = 512 per update: 4 updates
    assert x2["rollout.n_samples_per_prompt"] == ["16"] and x2["train.batch_size"] == ["512"]
    epochs = argv_of(paper_run("gspo_updates_x2"))
    assert epochs["train.max_epochs"] == ["2"] and epochs["train.batch_size"] == ["512"]
    half = argv_of(paper_run("gspo_updates_x2", gspo_updates_x2_mode="half_minibatch"))
    assert half["train.max_epochs"] == ["1"] and half["train.batch_size"] == ["256"]


def joint_run(pair: str, method: str = "hacpo", paper=PAPER) -> TrainConfig:
    pipe = Pipeline(paper)
    return TrainConfig.model_validate(pipe.train_config(pipe.run_at("joint", pair, method, 42)))


def test_joint_runs_get_one_openrlhf_stack_per_agent(tmp_path):
    """A joint run: the driver's command, and per agent its own model, prompt file, checkpoints and GPUs,
    GSPO's flags for its own samples, n·B·G rows per learner in mini-batches of 512 (4 updates per step)."""
    from hacpo.engines.openrlhf.command import joint_agent_args
    from hacpo.engines.openrlhf.runner import joint_command

    cfg = joint_run("q1p7b_q4b")
    layout = Layout(tmp_path)
    driver = module_and_args(joint_command(cfg, cfg.openrlhf, layout))[0]
    assert driver == "hacpo.engines.openrlhf.joint.driver"
    per_agent = [flags(joint_agent_args(cfg, cfg.openrlhf, layout, k)) for k in range(2)]
    for agent, f in zip(cfg.agents, per_agent, strict=True):
        assert f["actor.model_name_or_path"] == [agent.path]  # not downloaded here: kept as given
        assert f["data.prompt_dataset"] == [
            str(tmp_path.resolve() / "openrlhf" / "agents" / agent.name / "prompts.jsonl")
        ]
        assert f["ckpt.path"] == [str(tmp_path.resolve() / "openrlhf" / "agents" / agent.name / "ckpt")]
        assert f["actor.num_gpus_per_node"] == ["8"] and f["vllm.num_engines"] == ["8"]  # all 8 GPUs, shared
        assert f["actor.policy_loss_type"] == ["gspo"] and f["actor.eps_clip_low_high"] == [
            "0.0003",
            "0.0004",
        ]
        assert f["rollout.n_samples_per_prompt"] == ["8"] and f["train.batch_size"] == ["512"]
        assert "algo.kl.use_loss" in f and f["algo.kl.init_coef"] == ["0.001"]
    assert per_agent[0]["actor.model_name_or_path"] != per_agent[1]["actor.model_name_or_path"]
    with pytest.raises(ValueError, match="do not split into mini-batches"):
        joint_agent_args(cfg.model_copy(update={"minibatch_size": 1536}), cfg.openrlhf, layout, 0)
    naive = joint_run("q1p7b_q4b", "naive")  # the paper's Naive: self_old, each learner scores cross rows
    assert naive.naive_cross_ratio == "self_old" and joint_agent_args(naive, naive.openrlhf, layout, 0)
    joint_agent_args(cfg.model_copy(update={"minibatch_size": 2048}), cfg.openrlhf, layout, 0)  # n·B·G rows
    for name in ("xgrpo", "sgt"):  # the other sharing rules train on B·G rows (GSPO's): 1,024 here
        rule = joint_run("q1p7b_q4b", name)
        assert flags(joint_agent_args(rule, rule.openrlhf, layout, 0))["train.batch_size"] == ["512"]
        with pytest.raises(ValueError, match="1024 sequences per step do not split into mini-batches"):
            joint_agent_args(rule.model_copy(update={"minibatch_size": 2048}), rule.openrlhf, layout, 0)


def test_joint_gpu_split_and_hybrid_placement(tmp_path):
    from hacpo.engines.openrlhf.command import gpu_fraction, joint_agent_args

    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    paper["pairs"]["q1p7b_q4b"] |= {"gpus": 12, "gpu_split": [4, 8]}  # the 4B model gets twice the GPUs
    cfg = joint_run("q1p7b_q4b", paper=paper)
    assert cfg.openrlhf.agent_gpus == [4, 8] and cfg.openrlhf.gpus_per_node == 12
    gpus = [
        flags(joint_agent_args(cfg, cfg.openrlhf, Layout(tmp_path), k)) for k in range(2)
    ]
    assert [g["actor.num_gpus_per_node"] for g in gpus] == [["4"], ["8"]]
    assert [g["vllm.num_engines"] for g in gpus] == [["4"], ["8"]]
    paper["pairs"]["q1p7b_q4b"]["gpu_split"] = [4, 7]
    with pytest.raises(ValueError, match="gpu_split"):
        Pipeline(paper)
    # hybrid engine: n agents' vLLM at 0.2 each plus n actors and n references on every GPU
    assert [gpu_fraction(n) for n in (1, 2, 3, 4)] == [0.4, 0.15, 0.06, 0.02]
    with pytest.raises(ValueError, match="at most 4 agents"):
        gpu_fraction(5)


def test_joint_methods_and_bad_arithmetic_fail_with_the_fix(tmp_path):
    cfg = joint_run("q1p7b_q4b")
    with pytest.raises(ValueError, match="joint driver"):
        build_command(cfg, cfg.openrlhf, Layout(tmp_path))
    with pytest.raises(ValueError, match="do not split into mini-batches"):
        argv_of(paper_run("gspo", minibatch_size=500))
    odd = paper_run("gspo")
    opts = odd.openrlhf.model_copy(update={"micro_train_batch_size": 3})
    with pytest.raises(ValueError, match="micro_train_batch_size 3"):
        build_command(odd, opts, Layout(tmp_path))
    with pytest.raises(ValueError, match="sleep: true needs colocate"):
        OpenRLHFOptions(colocate=False)
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        OpenRLHFOptions(gpus_per_node=8, vllm_tensor_parallel_size=3)


def test_runtime_options_never_change_a_runs_identity():
    a = paper_run("gspo")
    b = a.model_copy(update={"openrlhf": a.openrlhf.model_copy(update={"zero_stage": 3})})
    assert a.config_hash() == b.config_hash()


def test_prompt_file_order_is_the_local_engines_batches():
    from hacpo.engines.core.schedule import batch_for_step

    cfg = paper_run("gspo", steps=150)
    order = prompt_order(7500, cfg)
    assert len(order) == 150 * 128  # 2.6 epochs laid out in the file: one OpenRLHF episode of 150 steps
    for step in (0, 57, 58, 149):
        assert order[step * 128 : (step + 1) * 128] == batch_for_step(7500, 128, step, 42)


def test_workflow_passes_gpus_engine_and_vllm_settings():
    pipe = Pipeline(PAPER)
    single = pipe.train_config(pipe.run_at("single", "qwen3_8b_base", "gspo", 42))
    assert single["openrlhf"]["gpus_per_node"] == 8
    assert pipe.eval_engine == "vllm" and pipe.eval_gpus("base/qwen3_4b") == 1
    assert pipe.eval_runtime("len8k")["vllm"]["max_model_len"] == 1024 + 8196
    assert pipe.conda_env.endswith("hacpo-gpu.yaml")
    local = Pipeline(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    run = local.runs[0]
    assert "openrlhf" not in local.train_config(run) and local.eval_engine == "local"


def test_a_vllm_evaluation_sizes_its_context_from_its_benchmarks_prompts(tmp_path, small_agent):
    """The evaluation job's max_model_len: its longest prompt as the model renders it + max_new_tokens, at
    least the workflow's planned bound; a prompt the model cannot hold is named before vLLM starts (vLLM
    refuses such a request, where the local engine would answer it)."""
    import json

    from transformers import AutoTokenizer

    from hacpo.agents.prompting import prompt_ids
    from hacpo.data.synthetic import as_problem
    from hacpo.eval.vllm import context_length

    records = [{"id": f"p{i}", "problem": "1 + 2 " * i, "answer": "3"} for i in (1, 12, 3)]
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = {"max_new_tokens": 13, "prompt_style": "compact", "benchmarks": {"b": {"file": str(bench)}}}
    tok = AutoTokenizer.from_pretrained(small_agent)
    longest = len(prompt_ids(tok, as_problem(records[1]), "compact"))
    assert context_length(str(small_agent), settings) == longest + 13
    assert context_length(str(small_agent), settings, planned=longest + 50) == longest + 50
    limit = json.loads((small_agent / "config.json").read_text())["max_position_embeddings"]
    records.append({"id": "long", "problem": "9 " * limit, "answer": "9"})
    bench.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=f"benchmark b: item long needs .* the model at .* has {limit}"):
        context_length(str(small_agent), settings)


def test_openrlhf_config_needs_gpus_for_every_run():
    cfg = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    cfg["models"]["qwen3_4b"]["gpus"] = 0
    with pytest.raises(ValueError, match="models.qwen3_4b.gpus: the OpenRLHF engine needs a positive"):
        Pipeline(cfg)


# ------------------------------------------------------------------------------------------ the reward file


def load_reward_module():
    """As OpenRLHF's SingleTurnAgentExecutor does: by file path, under the module name reward_func."""
    spec = importlib.util.spec_from_file_location("reward_func", reward_file())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reward_module():
    module = load_reward_module()
    yield module
    if module._scorer is not None:
        module._scorer.close()


PROMPT = (
    "<|im_start|>user\nWhat is 6*7? Let's think step by step and output the final answer within \\boxed{}."
    "<|im_end|>\n<|im_start|>assistant\n"
)


def test_response_of_strips_the_prompt_and_end_markers(reward_module):
    r = reward_module.response_of
    assert r(PROMPT + "so \\boxed{42}<|im_end|>", PROMPT) == "so \\boxed{42}"
    assert r(PROMPT + "x<|endoftext|><|endoftext|>", PROMPT) == "x"
    assert r(PROMPT + "x</s>", PROMPT) == "x" and r("<s> " + PROMPT[5:] + "y", PROMPT) == "y"
    # the prompt's own empty \boxed{} never counts: no box in the response → 0
    out = reward_module.reward_func([PROMPT + "the answer is 42<|im_end|>"], [PROMPT], ["42"])
    assert out["rewards"].tolist() == [0.0]


def test_reward_equals_the_local_reward_from_many_threads(reward_module):
    from hacpo.reward import Scorer

    responses = ["\\boxed{42}", "\\boxed{\\frac{84}{2}}", "\\boxed{41}", "42", "\\boxed{42.0}", "\\boxed{x}"]
    golds = ["42"] * len(responses)
    with Scorer() as s:
        local = s.score(responses, golds)
    calls = [([PROMPT + r + "<|im_end|>"], [PROMPT], [g]) for r, g in zip(responses, golds, strict=True)] * 4
    with ThreadPoolExecutor(8) as pool:  # OpenRLHF: asyncio.to_thread, one sample per call, many at once
        got = list(pool.map(lambda c: reward_module.reward_func(*c), calls))
    assert [g["rewards"].item() for g in got] == local * 4
    assert all(g["scores"].tolist() == g["rewards"].tolist() for g in got)
    assert all(g["extra_logs"]["reward_error"].item() == 0.0 for g in got)


def test_reward_is_bounded_and_total_in_threads(reward_module):
    here = Path(__file__).with_name("test_reward.py")
    spec = importlib.util.spec_from_file_location("hacpo_test_reward", here)
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    HOSTILE, PER_ITEM_LIMIT_S = corpus.HOSTILE, corpus.PER_ITEM_LIMIT_S  # noqa: N806

    def call(item):
        t = time.perf_counter()
        out = reward_module.reward_func([PROMPT + item[0]], [PROMPT], [item[1]])
        return time.perf_counter() - t, out

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, HOSTILE))
    for (response, _), (elapsed, out) in zip(HOSTILE, results, strict=True):
        # 4 threads share one 2-worker pool: an item may wait for the others' timeouts
        assert elapsed < 4 * PER_ITEM_LIMIT_S, (response[:40], elapsed)
        assert out["rewards"].shape == (1,) and out["rewards"].item() in (0.0, 1.0)
    for bad in ([None], ["q", "r"]), ([], []), (None, None):  # wrong types and lengths: 0, flagged, no raise
        out = reward_module.reward_func(bad[0], bad[1], ["1"])
        assert out["extra_logs"]["reward_error"].item() == 1.0
        assert float(out["rewards"].sum()) == 0.0
    assert threading.active_count() < 50


def test_gpu_smoke_scripts_build_valid_commands(tmp_path):
    """The GPU smoke scripts' runs (single-agent GSPO; three agents sharing one GPU) pass every check the
    OpenRLHF commands make before launch, so a CUDA box finds no arithmetic error minutes in."""
    import sys

    from hacpo.config import load_train_config
    from hacpo.engines.openrlhf.command import joint_agent_args
    from hacpo.engines.openrlhf.runner import joint_command

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_smoke
        import gpu_smoke_joint
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    names = [a[0] for a in gpu_smoke_joint.AGENTS]
    single = gpu_smoke.smoke_run(tmp_path, "gspo", ["m0"], 2, 16, 1, micro_train_batch_size=4)
    joint = gpu_smoke.smoke_run(tmp_path, "hacpo", names, 3, 48, 1, micro_train_batch_size=4)
    cfg = load_train_config(single)
    module, _ = module_and_args(build_command(cfg, cfg.openrlhf, Layout(tmp_path)))
    assert module == "openrlhf.cli.train_ppo_ray"
    cfg = load_train_config(joint)
    driver = joint_command(cfg, cfg.openrlhf, Layout(tmp_path))
    assert module_and_args(driver)[0] == "hacpo.engines.openrlhf.joint.driver"
    assert all(joint_agent_args(cfg, cfg.openrlhf, Layout(tmp_path), k) for k in range(3))


def test_openrlhf_without_cuda_says_to_rehearse_on_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the OpenRLHF engine for real")
    with pytest.raises(ValueError, match=r"rehearse on CPU with openrlhf: \{cpu: true\}"):
        OpenRLHFOptions(gpus_per_node=8).check_device()
    OpenRLHFOptions(cpu=True, gpus_per_node=1).check_device()  # the rehearsal needs none


def test_cpu_rehearsal_options_default_what_a_cpu_can_run_and_refuse_the_rest():
    opts = OpenRLHFOptions(cpu=True, gpus_per_node=1)
    assert (opts.sleep, opts.packing_samples, opts.attn_implementation) == (False, False, "sdpa")
    with pytest.raises(ValueError, match="cpu: true cannot run.*sleep: false"):
        OpenRLHFOptions(cpu=True, sleep=True)
    with pytest.raises(ValueError, match="nodes: 1"):
        OpenRLHFOptions(cpu=True, nodes=2)


def test_openrlhf_single_agent_runs_log_to_wandb_through_openrlhf(tmp_path):
    """OpenRLHF's own W&B logger for its single-agent runs: its flags (a placeholder key: the real one stays
    in WANDB_API_KEY) and the environment its Ray actor reads: mode, folder, one run id over resumes."""
    wandb = {"project": "p", "group": "g", "entity": "e", "mode": "offline"}
    cfg = paper_run("gspo", logging={"wandb": wandb})
    f = flags(build_command(cfg, cfg.openrlhf, Layout(tmp_path)))
    assert f["logger.wandb.key"] == ["from-WANDB_API_KEY"] and f["logger.wandb.project"] == ["p"]
    assert f["logger.wandb.group"] == ["g"] and f["logger.wandb.org"] == ["e"]
    assert "logger.tensorboard_dir" in f  # metrics.jsonl is read from OpenRLHF's event files
    env = wandb_env(cfg, Layout(tmp_path), resume=False)
    assert env["WANDB_MODE"] == "offline" and env["WANDB_DIR"] == str(tmp_path.resolve())
    assert env["WANDB_RESUME"] == "allow" and "WANDB_API_KEY" not in env
    assert wandb_env(cfg, Layout(tmp_path), resume=True)["WANDB_RUN_ID"] == env["WANDB_RUN_ID"]
    plain = paper_run("gspo")
    assert "logger.wandb.key" not in flags(build_command(plain, plain.openrlhf, Layout(tmp_path)))
    assert wandb_env(plain, Layout(tmp_path), resume=False) == {}


def test_openrlhf_joint_runs_leave_logging_to_the_run_loop(tmp_path):
    """A joint run's agents give OpenRLHF's loggers nothing (the run loop writes TensorBoard and W&B with the
    local engine's tags): no second event directory, no second W&B run."""
    cfg = joint_run("q1p7b_q4b").model_copy(
        update={"logging": RunLogging(wandb={"project": "p", "mode": "offline"})}
    )
    for k in range(2):
        f = flags(joint_agent_args(cfg, cfg.openrlhf, Layout(tmp_path), k))
        assert not {"logger.tensorboard_dir", "logger.wandb.key", "logger.wandb.run_name"} & f.keys()


def test_wandb_variables_reach_the_ray_actors(monkeypatch):
    from hacpo.engines.openrlhf.launch import job_runtime_env

    monkeypatch.setenv("WANDB_RUN_ID", "abc")
    monkeypatch.setenv("WANDB_MODE", "offline")
    env = job_runtime_env({"env_vars": {"OWN": "1"}}, cpu=False)["env_vars"]
    assert env["WANDB_RUN_ID"] == "abc" and env["WANDB_MODE"] == "offline" and env["OWN"] == "1"


def test_the_memory_sampler_names_each_process_of_the_job_with_its_peak():
    """gpumem.MemorySampler without NVML (this machine): the job's summed PSS and each process's own peak
    under its title (a Ray actor's ``ray::<class>``; here a child ``python -c`` holding 300 MB)."""
    import subprocess
    import sys

    pytest.importorskip("psutil")
    from hacpo.engines.openrlhf.gpumem import MemorySampler, process_title

    hold = "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True)"
    with MemorySampler(interval_s=0.05, nvml=None) as sampler:
        child = subprocess.Popen([sys.executable, "-c", hold + "; time.sleep(30)"], stdout=subprocess.PIPE)
        try:
            child.stdout.readline()  # its memory is touched
            time.sleep(0.5)
            assert process_title(child.pid) == Path(sys.executable).name
        finally:
            child.kill()
            child.wait()
    main, details = sampler.summary()
    per_process = details["peak_host_mb_per_process"]
    mine = per_process[f"{Path(sys.executable).name} (pid {child.pid})"]
    assert 280 < mine < 400 and main["peak_rss_mb"] >= mine
    assert main["peak_gpu_mem_mb"] is None  # no GPU here


def test_lora_reaches_openrlhf_as_its_own_options_per_agent(tmp_path):
    """adapter: {lora: …} → OpenRLHF's --ds.lora.* for the single-agent baselines and each joint agent (an
    agent's own choice wins: one LoRA, one full); what OpenRLHF cannot train is refused with the fix."""
    from hacpo.engines.openrlhf.command import joint_agent_args

    lora = {"lora": {"rank": 8, "alpha": 16}}
    f = argv_of(paper_run("gspo", adapter=lora), tmp_path)
    assert f["ds.lora.rank"] == ["8"] and f["ds.lora.alpha"] == ["16"] and f["ds.lora.dropout"] == ["0.0"]
    assert "ds.lora.target_modules" not in f  # all-linear: OpenRLHF's default, never passed as a name
    assert "ds.lora.rank" not in argv_of(paper_run("gspo"), tmp_path)
    some = {"lora": {"rank": 2, "target_modules": ["q_proj", "v_proj"]}}
    targets = argv_of(paper_run("gspo", adapter=some), tmp_path)["ds.lora.target_modules"]
    assert targets == ["q_proj", "v_proj"]

    cfg = joint_run("q1p7b_q4b")
    agents = [a.model_dump() for a in cfg.agents]
    agents[1]["adapter"] = {}  # the second agent trains fully
    mixed = TrainConfig.model_validate({**cfg.model_dump(), "adapter": lora, "agents": agents})
    per_agent = [flags(joint_agent_args(mixed, mixed.openrlhf, Layout(tmp_path), k)) for k in range(2)]
    assert per_agent[0]["ds.lora.rank"] == ["8"] and "ds.lora.rank" not in per_agent[1]

    for bad, message in (
        ({"lora": {"rank": 8, "alpha": 2.5}}, "whole number"),
        ({"lora": {"rank": 8, "target_modules": ["lm_head", "q_proj"]}}, "head"),
    ):
        with pytest.raises(ValueError, match=message):
            argv_of(paper_run("gspo", adapter=bad), tmp_path)
    zero3 = paper_run("gspo", adapter=lora)
    zero3 = zero3.model_copy(update={"openrlhf": zero3.openrlhf.model_copy(update={"zero_stage": 3})})
    with pytest.raises(ValueError, match="zero_stage 2"):
        argv_of(zero3, tmp_path)


def test_the_merged_sync_sends_base_weights_plus_the_adapter_under_vllms_names(small_agent):
    """What the weight sync sends for a LoRA actor (hacpo.engines.openrlhf.lora.merged_weights): one tensor
    per adapted linear, named as in the base model's checkpoint (what vLLM loads), equal to peft's own merge;
    the frozen embedding and head are not sent (vLLM keeps the base's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hacpo.agents import adapters
    from hacpo.config import LoraSpec
    from hacpo.engines.openrlhf.lora import merged_weights, peft_of

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(small_agent, dtype=torch.float32)
    names = set(base.state_dict())
    peft_model = adapters.attach(base, LoraSpec(rank=4), small_agent)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # a trained adapter: B no longer zero
    sent = dict(merged_weights(peft_model))
    assert sent and set(sent) <= names and not any("embed" in n or "lm_head" in n for n in sent)
    assert any(n.endswith("self_attn.q_proj.weight") for n in sent)
    merged = peft_model.merge_and_unload().state_dict()
    for n, w in sent.items():
        torch.testing.assert_close(w, merged[n], rtol=0, atol=1e-6)

    class Engine:  # OpenRLHF's Actor.model after strategy.prepare: the DeepSpeed engine, .module the model
        module = peft_model

    class Actor:
        model = Engine()

    assert peft_of(Actor()) is peft_model
    Engine.module = base
    assert peft_of(Actor()) is None  # full fine-tuning: OpenRLHF's own sync, unchanged
