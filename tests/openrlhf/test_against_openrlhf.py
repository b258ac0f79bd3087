"""The OpenRLHF engine against the real openrlhf==0.11.2 of .venv-rehearsal (scripts/setup_rehearsal.sh).

- every single-agent command line of config/paper.yaml is accepted by OpenRLHF's own argument parser, its
  validation and its DeepspeedStrategy, and lands on the intended values;
- the reward file, loaded and called by OpenRLHF's own SingleTurnAgentExecutor, gives the local reward;
- OpenRLHF's own TensorboardLogger output converts to our metrics (a resumed run's redone steps win);
- the runner, with OpenRLHF's process played by a double that writes OpenRLHF's files with OpenRLHF's own
  logger, yields the run-directory contract, and resumes after a failure;
- the job's own Ray cluster starts with a real ``ray start``, runs a task, and leaves nothing behind, also
  when SIGTERMed.
Skipped (with the install command) where openrlhf is not installed, e.g. in the main .venv.
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import on_this_machine, require  # noqa: E402

require("openrlhf", "vllm")
on_this_machine()

from hacpo.config import TrainConfig  # noqa: E402
from hacpo.engines.openrlhf import logs  # noqa: E402
from hacpo.engines.openrlhf.command import Layout, build_command, module_and_args, reward_file  # noqa: E402
from hacpo.pipeline import Pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())


class Accepted(Exception):
    pass


def parse_with_openrlhf(argv: list[str], monkeypatch):
    """Run ``openrlhf.cli.train_ppo_ray`` as ``__main__`` on ``argv``: its parser, ``hierarchize`` and every
    check, then its ``train()`` up to the strategy, which we build (real) and stop at."""
    import openrlhf.utils
    import ray

    real = openrlhf.utils.get_strategy

    def stop_here(args):
        raise Accepted(args, real(args))

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(openrlhf.utils, "get_strategy", stop_here)
    module, args = module_and_args(argv)
    assert module == "openrlhf.cli.train_ppo_ray"
    monkeypatch.setattr(sys, "argv", ["train_ppo_ray", *args])
    with pytest.raises(Accepted) as got:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    return got.value.args


def test_every_single_agent_run_of_the_paper_is_accepted_by_openrlhf(monkeypatch, tmp_path):
    pipe = Pipeline(PAPER)
    singles = [r for r in pipe.runs if r.kind == "single"]
    assert len(singles) == 39
    for run in singles:
        cfg = TrainConfig.model_validate(pipe.train_config(run))
        argv = build_command(cfg, cfg.openrlhf, Layout(tmp_path / run.dir))
        args, strategy = parse_with_openrlhf(argv, monkeypatch)
        method = cfg.resolved_method()
        assert type(strategy).__name__ == "DeepspeedStrategy"
        assert args.rollout.n_samples_per_prompt == 8 * method.rollout_multiplier, run
        assert args.train.max_epochs == method.epochs
        assert args.algo.advantage.estimator == "group_norm" and args.critic.model_name_or_path is None
        assert args.reward.remote_url == [str(reward_file())]
        assert list(args.actor.adam.betas) == [0.9, 0.999] and args.actor.adam.weight_decay == 0.01
        assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3" and args.algo.kl.init_coef == 0.001
        loss = "ppo" if method.loss == "grpo" else "gspo"
        assert args.actor.policy_loss_type == loss
        assert list(args.actor.eps_clip_low_high) == ([0.2, 0.28] if loss == "ppo" else [3e-4, 4e-4])
        assert args.vllm.enable_sleep and args.ds.enable_sleep and args.train.colocate_all


@pytest.mark.parametrize("kind", ["gspo", "grpo"])
def test_the_selected_openrlhf_loss_equals_hacpo_algo(kind):
    """The flags select OpenRLHF's PolicyLoss (gspo, seq-mean-token-mean; or ppo, token-mean, 0.2/0.28): on
    one batch its value and gradient equal hacpo.algo's loss for the same method."""
    import torch
    from openrlhf.models.loss import PolicyLoss

    from hacpo.algo import get_method
    from hacpo.algo.losses import MiniBatch, policy_loss

    torch.manual_seed(0)
    old = torch.randn(4, 6) * 0.3 - 1
    cur = (old + torch.randn(4, 6) * (0.3 if kind == "grpo" else 3e-4)).requires_grad_()
    adv_row = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.ones(4, 6)
    mask[0, 4:] = 0
    spec = get_method(kind).loss_spec(kl_beta=0.0)
    theirs = PolicyLoss(
        clip_eps_low=spec.eps_low,
        clip_eps_high=spec.eps_high,
        policy_loss_type="ppo" if kind == "grpo" else "gspo",
        token_level_loss=kind == "grpo",
    )
    value = theirs(cur, old, adv_row[:, None].expand(4, 6), action_mask=mask)[0]
    (g_theirs,) = torch.autograd.grad(value, cur)
    mean_old = (old * mask).sum(1) / mask.sum(1)
    batch = MiniBatch(logp=cur, mask=mask, adv=adv_row, old_mean_logp=mean_old, old_logp=old)
    ours, _ = policy_loss(batch, spec)
    (g_ours,) = torch.autograd.grad(ours, cur)
    assert torch.allclose(value, ours, atol=1e-6), (value, ours)
    assert torch.allclose(g_theirs * mask, g_ours * mask, atol=1e-6)


# ------------------------------------------------------------------------------------------ the reward file


def tiny_tokenizer():
    from hacpo.agents.tokenizers import build_tokenizer

    return build_tokenizer("word")


class OneCompletion:
    """vLLM's AsyncLLMEngine, as OpenRLHF's executor uses it: one completion of given ids."""

    def __init__(self, ids):
        self.ids = ids

    async def generate(self, prompt_ids, params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=self.ids, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def test_openrlhf_loads_and_calls_our_reward_like_the_local_engine():
    """SingleTurnAgentExecutor (OpenRLHF's own) loads reward_func.py by path and calls it from a thread on
    decode(prompt + response ids); the reward equals the local engine's on the same ids."""
    import torch
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from hacpo.agents.prompting import prompt_text
    from hacpo.agents.retokenize import response_text
    from hacpo.data.synthetic import Problem
    from hacpo.reward import Scorer

    tok = tiny_tokenizer()
    problem = Problem(id="p", problem="1 + 2", answer="3", family="add2", difficulty=1)
    prompt = prompt_text(tok, problem, "compact")
    executor = SingleTurnAgentExecutor(remote_rm_url=[str(reward_file())])
    texts = ["\\boxed{3}", "\\boxed{4}", "3", "\\boxed{ 3 }"]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

        params = SimpleNamespace(max_tokens=16, logprobs=None)
        output = asyncio.run(executor.execute(prompt, "3", params, 64, tok, OneCompletion(ids)))
        with Scorer() as s:
            local = s.score([response_text(tok, ids)], ["3"])[0]
        assert float(torch.as_tensor(output["reward"]).item()) == local, text
        # and the sample becomes an Experience the way OpenRLHF builds it
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

        exp = SamplesGenerator._process_response_into_experience(None, output, max_len=64)
        assert exp.info["reward"].shape == (1,) and exp.info["reward"].item() == local


def test_openrlhf_scores_with_a_verifier_of_your_own_and_its_metadata(monkeypatch):
    """Issue 37 on the real stack: OpenRLHF's executor, our reward file, a verifier named in HACPO_REWARD (as
    the runner sets it) and a label carrying the record's metadata (as the runner writes the prompt file)."""
    import torch
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from hacpo.agents.prompting import prompt_text
    from hacpo.data.synthetic import Problem
    from hacpo.reward.custom import encode_label

    verifier = Path(__file__).resolve().parents[1] / "fixtures" / "verifiers.py"
    monkeypatch.setenv("HACPO_REWARD", json.dumps({"file": str(verifier), "name": "exact"}))
    tok = tiny_tokenizer()
    problem = Problem(id="p", problem="1 + 2", answer="3", family="", difficulty=0)
    prompt = prompt_text(tok, problem, "compact")
    executor = SingleTurnAgentExecutor(remote_rm_url=[str(reward_file())])
    label = encode_label("3", {"credit": 0.5}, "p")
    got = []
    for text in ("answer: 3", "answer: 4"):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

        params = SimpleNamespace(max_tokens=16, logprobs=None)
        output = asyncio.run(executor.execute(prompt, label, params, 64, tok, OneCompletion(ids)))
        got.append(float(torch.as_tensor(output["reward"]).item()))
    assert got == [0.5, 0.0]  # the metadata's credit: it reached the verifier through OpenRLHF


# ------------------------------------------------------------------------------------------ logs


def status_dict(step: int, reward: float) -> dict:
    """A status dict as PPOTrainer.fit logs it (keys of openrlhf 0.11.2's train_step/fit)."""
    return {
        "policy_loss": 0.01 * step,
        "actor_lr": 1e-6,
        "actor_grad_norm": 0.5,
        "ppo_clip_ratio": 0.02,
        "ppo_kl": 1e-4,
        "kl": 2e-4,
        "response_length": 100.0,
        "timing/make_experience": 2.0,
        "timing/ppo_train": 3.0,
        "timing/broadcast": 0.5,
        "rollout/reward_mean": reward,
        "rollout/reward_std": 0.1,
        "rollout/response_length_mean": 100.0,
        "rollout/truncated_rate": 0.0,
        "rollout/num_samples": 1024.0,
        "generated_samples": ["text", reward],
        "timing/generation": 4.0,
        "timing/step_total": 9.5,
    }


def write_logs(tb_dir: Path, steps, reward_of, eval_every: int = 0):
    from openrlhf.utils.logging_utils import TensorboardLogger

    args = SimpleNamespace(
        logger=SimpleNamespace(tensorboard_dir=str(tb_dir), wandb=SimpleNamespace(run_name="r"))
    )
    logger = TensorboardLogger(args)
    for g in steps:
        logger.log_train(g, status_dict(g, reward_of(g)))
        if eval_every and g % eval_every == 0:
            logger.log_eval(
                g, {f"eval_{logs.VALIDATION_SOURCE}_pass1": g / 100, "eval_response_length_mean": 5}
            )
    logger.close()
    time.sleep(1.1)  # event file names carry whole seconds: a resumed session gets a later one


def test_openrlhf_logs_convert_and_redone_steps_win(tmp_path):
    tb = tmp_path / "tb"
    write_logs(tb, range(1, 6), lambda g: 0.1, eval_every=3)  # steps 1..5, then killed after a step-4 ckpt
    write_logs(tb, range(5, 7), lambda g: 0.9, eval_every=3)  # resumed: step 5 redone, then 6
    scalars = logs.read_scalars(tb)
    rows = logs.metrics_rows(scalars, "a")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r["a/reward"] for r in rows] == pytest.approx([0.1] * 4 + [0.9, 0.9])
    assert rows[0]["a/own_clip_frac"] == pytest.approx(0.02) and rows[0]["a/kl"] == pytest.approx(2e-4)
    assert rows[0]["time/generate_s"] == 4.0 and rows[0]["time/update_s"] == 3.0
    assert rows[0]["time/step_s"] == pytest.approx(9.5) and rows[0]["openrlhf/ppo_kl"] == pytest.approx(1e-4)
    val = logs.validation_rows(scalars, "a", 500)
    assert [(v["step"], v["acc"]) for v in val] == [(3, pytest.approx(0.03)), (6, pytest.approx(0.06))]
    assert logs.phase_totals(rows) == pytest.approx(
        {"generate": 24.0, "logprobs": 12.0, "update": 18.0, "sync": 3.0}
    )


# ------------------------------------------------------------------------------------------ the runner


def make_run(tmp_path, steps=4, every=2) -> TrainConfig:
    from hacpo.agents.models import AgentArch, build_model

    tok = tiny_tokenizer()
    model_dir = tmp_path / "model"
    build_model(
        AgentArch("qwen3", hidden=32, layers=1, heads=2, intermediate=64), tok, seed=0
    ).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    problems = [{"id": str(i), "problem": f"{i} + 1", "answer": str(i + 1)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    return TrainConfig.model_validate(
        {
            "method": "gspo",
            "agents": [{"name": "a", "path": str(model_dir)}],
            "train_file": str(tmp_path / "train.jsonl"),
            "val_file": str(tmp_path / "train.jsonl"),
            "out_dir": str(tmp_path / "run"),
            "steps": steps,
            "prompts_per_step": 4,
            "group_size": 2,
            "minibatch_size": 8,
            "checkpoint_every": every,
            "val_every": 2,
            "openrlhf": {"gpus_per_node": 1, "micro_train_batch_size": 1, "max_prompt_tokens": 64},
        }
    )


class OpenRLHFDouble:
    """Plays ``train_ppo_ray`` on the files it writes: OpenRLHF's own TensorboardLogger, DeepSpeed's
    ``_actor/latest``, ``global_step<N>_hf`` (save_pretrained) every save step, ``save_model`` at the end;
    resumes from ``latest`` like ``--ckpt.load_enable``; can die after a given step."""

    def __init__(self, die_after: int | None = None):
        self.die_after = die_after
        self.calls: list[list[str]] = []

    def __call__(self, argv, env, log: Path) -> int:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.calls.append(argv)
        f = dict(zip(argv, argv[1:], strict=False))
        rows = len(Path(f["--data.prompt_dataset"]).read_text().splitlines())
        ckpt, steps = Path(f["--ckpt.path"]), rows // int(f["--rollout.batch_size"])
        every, model = int(f["--ckpt.save_steps"]), f["--actor.model_name_or_path"]
        assert Path(f["--data.prompt_dataset"]).is_file() and Path(f["--reward.remote_url"]).is_file()
        latest = ckpt / "_actor" / "latest"
        start = int(latest.read_text()[len("global_step") :]) if latest.exists() else 0
        m, tok = AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
        for g in range(start + 1, steps + 1):
            write_logs(Path(f["--logger.tensorboard_dir"]), [g], lambda g: g / 10, eval_every=2)
            if g % every == 0:
                (ckpt / "_actor").mkdir(parents=True, exist_ok=True)
                m.save_pretrained(ckpt / f"global_step{g}_hf")
                tok.save_pretrained(ckpt / f"global_step{g}_hf")
                latest.write_text(f"global_step{g}")
            if self.die_after == g:
                return -9
        m.save_pretrained(f["--ckpt.output_dir"])
        tok.save_pretrained(f["--ckpt.output_dir"])
        return 0


def test_runner_writes_the_contract_and_resumes_after_a_kill(tmp_path):
    from hacpo.engines.openrlhf.runner import train
    from hacpo.runio import RunRecord

    cfg = make_run(tmp_path, steps=5, every=2)
    with pytest.raises(RuntimeError, match="OpenRLHF failed in the driver: exit status -9") as failed:
        train(cfg, cfg.openrlhf, launcher=OpenRLHFDouble(die_after=3))
    assert "a rerun resumes from step 2" in str(failed.value) and "train.log" in str(failed.value)
    rec = RunRecord.read(cfg.out_dir)
    assert rec.status == "failed" and rec.step == 2 and rec.engine == "openrlhf"
    ckpts = Path(cfg.out_dir) / "checkpoints" / "a"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2"]
    prompts = (Path(cfg.out_dir) / "openrlhf" / "prompts.jsonl").read_text().splitlines()
    assert len(prompts) == 5 * 4 and json.loads(prompts[0])["prompt"].endswith("<|assistant|>")

    double = OpenRLHFDouble()
    rec = train(cfg, cfg.openrlhf, launcher=double)
    assert rec.complete and rec.step == 5 and rec.final_checkpoints == {"a": str(ckpts / "step-5")}
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-4", "step-5"]  # keep 2 + the final
    rows = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and rows[3]["a/reward"] == pytest.approx(0.4)
    val = [json.loads(x) for x in (Path(cfg.out_dir) / "validation.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2, 4]
    profile = json.loads((Path(cfg.out_dir) / "profile.json").read_text())
    assert profile["engine"] == "openrlhf" and profile["phase_s"]["generate"] == pytest.approx(20.0)
    assert "peak_gpu_mem_mb" in profile  # None here (no NVML), the busiest device's peak on GPUs
    assert train(cfg, cfg.openrlhf, launcher=OpenRLHFDouble()).complete  # complete: nothing rerun


# ------------------------------------------------------------------------------------------ Ray


def leftovers() -> list[str]:
    """Command lines of processes of any hacpo Ray cluster (named by their temp dir, /tmp/ray-hacpo-*)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if "/tmp/ray-hacpo-" in line:
            found.append(line)
    return found


def test_ray_job_runs_a_task_and_leaves_nothing(tmp_path):
    code = "import ray; ray.init(); print('answer', ray.get(ray.remote(lambda: 41 + 1).remote()))"
    hacpo = Path(sys.executable).with_name("hacpo")
    out = subprocess.run(
        [str(hacpo), "ray-job", "--cpus", "1", "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0 and "answer 42" in out.stdout, out.stdout + out.stderr
    assert leftovers() == []


def test_ray_job_cancelled_stops_everything(tmp_path):
    code = "import ray, time; ray.init(); print('up', flush=True); time.sleep(600)"
    hacpo = Path(sys.executable).with_name("hacpo")
    proc = subprocess.Popen(
        [str(hacpo), "ray-job", "--cpus", "1", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith("up"):
                break
        assert leftovers(), "the cluster should be running"
        proc.send_signal(signal.SIGTERM)  # what scancel does
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(1)
    assert leftovers() == []
    assert os.environ.get("RAY_ADDRESS") is None


# ---------------------------------------------------------------------- Ray under SLURM (opt-in)


def _sbatch(tmp_path: Path, command: str, *extra: str) -> str:
    """Submit ``command`` as a batch job on the local test cluster; its job id."""
    r = subprocess.run(
        ["sbatch", "--parsable", "-t", "5", "--mem", "2000", "-c", "2", "-D", str(tmp_path),
         "-o", str(tmp_path / "job-%j.out"), *extra, f"--wrap={command}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _job_state(jobid: str) -> str:
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%T", "--jobs", jobid],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return out.stdout.strip()


def _ray_job_command(code: str) -> str:
    hacpo = Path(sys.executable).with_name("hacpo")
    return f'{hacpo} ray-job -- {sys.executable} -c "{code}"'


def test_ray_job_through_slurm(slurm_cluster, tmp_path, wait_until):
    """An sbatch job starts its own Ray on the job's node, a task runs there, and the job leaves nothing."""
    code = (
        "import os, ray; ray.init(); "
        "print('answer', ray.get(ray.remote(lambda: 41 + 1).remote()), 'job', os.environ['SLURM_JOB_ID'])"
    )
    jobid = _sbatch(tmp_path, _ray_job_command(code))
    state = wait_until(lambda: _job_state(jobid) in ("COMPLETED", "FAILED") and _job_state(jobid), 300, "job")
    log = (tmp_path / f"job-{jobid}.out").read_text(errors="replace")
    assert state == "COMPLETED" and f"answer 42 job {jobid}" in log, log[-3000:]
    assert leftovers() == []


def test_ray_job_scancelled_stops_everything(slurm_cluster, tmp_path, wait_until):
    """scancel mid-job: the job's Ray cluster (head, raylet, workers) is gone and nothing else is left."""
    code = "import ray, time; ray.init(); print('up', flush=True); time.sleep(600)"
    jobid = _sbatch(tmp_path, _ray_job_command(code))
    out = tmp_path / f"job-{jobid}.out"
    wait_until(lambda: out.exists() and "up" in out.read_text(errors="replace").split(), 300, "Ray up")
    assert any(f"ray-hacpo-{jobid}-" in line for line in leftovers()), "the job's cluster should be running"
    subprocess.run(["scancel", jobid], check=True, timeout=60)
    wait_until(lambda: _job_state(jobid) in ("CANCELLED", "COMPLETED", "FAILED"), 120, "the job to end")
    wait_until(lambda: not leftovers(), 60, "every process of the job's Ray cluster to stop")
