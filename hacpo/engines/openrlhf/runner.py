"""``hacpo train --engine openrlhf``: OpenRLHF's own trainer (single-agent methods) or HACPO's joint driver
over OpenRLHF agent stacks (joint methods, :mod:`.joint`), writing our run directory.

One call: validate → write the prompt and validation files (rendered with the agent's chat template) →
start the job's Ray cluster → run ``python -m openrlhf.cli.train_ppo_ray`` (:func:`command.build_command`)
while sampling GPU memory and converting OpenRLHF's logs to ``metrics.jsonl`` every minute → move
OpenRLHF's Hugging Face checkpoints to ``checkpoints/<agent>/step-N`` → ``profile.json`` → ``run.json``
complete. Killed and rerun, OpenRLHF resumes from its DeepSpeed checkpoint (``--ckpt.load_enable``) and the
logs of the redone steps replace the old ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from hacpo.checkpoints import newest_intact_step, set_aside
from hacpo.config import TrainConfig
from hacpo.engine_options import OpenRLHFOptions
from hacpo.provenance import machine, versions
from hacpo.reward.custom import RewardRangeError, VerifierError, encode_label, load_verifier
from hacpo.runio import (
    MetricsLog,
    Profile,
    RunRecord,
    atomic_write_json,
    atomic_write_text,
    run_lock,
    sweep_temporaries,
)

from . import logs
from .command import (
    Layout,
    agent_gpus,
    build_command,
    gpu_fraction,
    joint_agent_args,
    program,
    prompt_order,
    wandb_env,
)
from .gpumem import MemorySampler

OPENRLHF_VERSION = "0.11.2"
SYNC_EVERY_S = 60.0
STOP_POLL_S = 1.0  # how often a run with a verifier of your own looks for its stop file
RAY_CPUS_ON_CPU = 32  # logical: Ray schedules by them, the OS shares the real cores
Launcher = Callable[[list[str], dict, Path], int]  # (argv, env, log file) → exit code


def check_installed() -> None:
    """OpenRLHF 0.11.2 exactly (flags and return values changed between 0.11.0 and 0.11.2)."""
    try:
        found = metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        raise ValueError(
            "the OpenRLHF engine needs openrlhf==0.11.2: on a CUDA machine run "
            "`EXTRAS=dev,gpu bash scripts/setup_env.sh` (docs/openrlhf.md)"
        ) from None
    if found != OPENRLHF_VERSION:
        raise ValueError(
            f"openrlhf {found} is installed; this engine is built for exactly {OPENRLHF_VERSION}"
        )


def check_context(cfg: TrainConfig, opts: OpenRLHFOptions) -> None:
    """Prompt + answer must fit every agent's context. vLLM refuses a longer ``max_model_len`` inside its
    Ray actor, which the driver only notices when the weight-sync group times out (5 minutes later)."""
    import json

    want = opts.max_prompt_tokens + cfg.max_new_tokens
    for agent in cfg.agents:
        config = Path(agent.path) / "config.json"
        if not config.is_file():
            continue  # a Hub id: its config is not here to read
        limit = json.loads(config.read_text()).get("max_position_embeddings")
        if limit is not None and want > limit:
            raise ValueError(
                f"agent {agent.name!r} has {limit} positions, but openrlhf.max_prompt_tokens "
                f"({opts.max_prompt_tokens}) + max_new_tokens ({cfg.max_new_tokens}) = {want}: lower "
                "openrlhf.max_prompt_tokens (or max_new_tokens)"
            )


def reward_env(cfg: TrainConfig) -> dict[str, str]:
    """The run's reward for the reward file (:mod:`.reward_func`) in every vLLM engine: a built-in's name, or
    a verifier of your own as JSON (its file made absolute: the engines run elsewhere), its deadline and its
    step budget for failed calls. A joint step's agents generate one after another, each agent's engines at
    once, so each engine gets the step's budget over the number of agents: the step's verifier time stays
    within one budget, as on the local engine."""
    env = {}
    if cfg.reward_timeout_s is not None:
        env["HACPO_REWARD_TIMEOUT_S"] = str(cfg.reward_timeout_s)
    if isinstance(cfg.reward, str):
        return env | {"HACPO_REWARD": cfg.reward}
    from hacpo.reward.custom import step_budget
    from hacpo.reward.scorer import VERIFIER_TIMEOUT_S

    budget = step_budget(cfg.reward_timeout_s or VERIFIER_TIMEOUT_S, cfg.reward_retry_budget_s)
    env["HACPO_REWARD_RETRY_BUDGET_S"] = str(budget / (len(cfg.agents) if cfg.resolved_method().joint else 1))
    entry = cfg.reward.model_dump(exclude_none=True)
    if "file" in entry:
        entry["file"] = str(Path(entry["file"]).resolve())
    return env | {"HACPO_REWARD": json.dumps(entry)}


def write_inputs(cfg: TrainConfig, layout: Layout) -> None:
    """The prompt file (``steps × prompts_per_step`` rows in step order) and the validation file, each
    prompt rendered with the agent's chat template and the run's prompt style (Qwen3 thinking off); a joint
    run gets one prompt file per agent, in that agent's template (its OpenRLHF arguments name it)."""
    if cfg.resolved_method().joint:
        for agent in cfg.agents:
            _write_prompts(cfg, agent.path, layout.agent(agent.name).prompts)
        return
    _write_prompts(cfg, cfg.agents[0].path, layout.prompts, layout.validation)


def _write_prompts(cfg: TrainConfig, model: str, prompts: Path, validation: Path | None = None) -> None:
    import json

    from transformers import AutoTokenizer

    from hacpo.agents.prompting import prompt_text
    from hacpo.data.synthetic import as_problem
    from hacpo.engines.core.schedule import read_problems

    problems = read_problems(cfg.train_file)  # both files checked before anything is written
    val = read_problems(cfg.val_file)[: cfg.val_size] if cfg.val_file and cfg.val_size else []
    tok = AutoTokenizer.from_pretrained(model)

    def row(p: dict, **extra) -> str:
        text = prompt_text(tok, as_problem(p), cfg.prompt_style)
        label = p["answer"]
        if not isinstance(cfg.reward, str):  # a verifier of your own reads the record's metadata and id too
            label = encode_label(p["answer"], p.get("metadata") or {}, p["id"])
        return json.dumps({"prompt": text, "answer": label, "id": p["id"], **extra}) + "\n"

    atomic_write_text(prompts, "".join(row(problems[i]) for i in prompt_order(len(problems), cfg)))
    if validation is not None and val:
        atomic_write_text(validation, "".join(row(p, datasource=logs.VALIDATION_SOURCE) for p in val))


def check_trained_order(cfg: TrainConfig, layout: Layout, start: int) -> None:
    """The prompts OpenRLHF trained (its reward file's record, ``rollouts.jsonl``) are the prompt file's, step
    by step from ``start`` (this launch's first step): step s's samples are step s's prompts × G."""
    import json
    from collections import Counter

    from .reward_func import prompt_key

    per_step = cfg.prompts_per_step
    samples = cfg.group_size * cfg.resolved_method().rollout_multiplier
    rows = [json.loads(line) for line in layout.prompts.read_text().splitlines()]
    keys = [prompt_key(r["prompt"]) for r in rows]
    steps = [keys[s * per_step : (s + 1) * per_step] for s in range(cfg.steps)]
    trained = {k for step in steps for k in step}
    log = [json.loads(line)["prompt"] for line in layout.rollouts.read_text().splitlines() if line.strip()]
    log = [k for k in log if k in trained]  # validation prompts are not training prompts
    size = per_step * samples
    for s in range(start, cfg.steps):
        got = Counter(log[(s - start) * size : (s - start + 1) * size])
        want = Counter({k: n * samples for k, n in Counter(steps[s]).items()})
        if got != want:
            raise RuntimeError(
                f"OpenRLHF trained other prompts at step {s} than the run's prompt file lists "
                f"({sum((got - want).values())} of {size} samples differ; {layout.rollouts} against "
                f"{layout.prompts})"
            )


def resumable_step(layout: Layout) -> int:
    """The global step of OpenRLHF's newest complete DeepSpeed checkpoint (``_actor/latest``), or 0."""
    latest = layout.ckpt / "_actor" / "latest"
    if not latest.is_file():
        return 0
    tag = latest.read_text().strip()
    return int(tag.removeprefix("global_step")) if tag.removeprefix("global_step").isdigit() else 0


def _is_complete_hf(d: Path) -> bool:
    if not (d / "config.json").is_file():
        return False
    index = d / "model.safetensors.index.json"
    if index.is_file():
        import json

        shards = set(json.loads(index.read_text())["weight_map"].values())
        return all((d / s).is_file() for s in shards)
    return any(d.glob("*.safetensors")) or (d / "pytorch_model.bin").is_file()


def resumable_joint_step(layout: Layout) -> int:
    """The step of a joint run's newest complete checkpoint (every agent saved, then the controller)."""
    import json

    if not layout.joint_state.is_file():
        return 0
    return int(json.loads(layout.joint_state.read_text())["step"])


def intact_joint_step(cfg: TrainConfig, layout: Layout, say=print) -> int:
    """A joint run's resume step, checked: the newest checkpointed step whose DeepSpeed folders
    (``_actor/global_step<N>``) are intact for every agent against their manifests. A broken one is moved to
    the agent's ``ckpt/broken-global_step<N>`` (out of OpenRLHF's rotation), named with why; the controller
    state then falls back to that step, with the capability window it had there, and the steps to be trained
    again are logged. No intact checkpoint among written ones: a ValueError, nothing moved."""
    from .joint.state import read_state, write_state

    state = read_state(layout.joint_state)
    saved = {int(k): v for k, v in state["saved"].items() if int(k) <= state["step"]}
    actors = [layout.agent(a.name).ckpt / "_actor" for a in cfg.agents]
    folders = lambda step: [d / f"global_step{step}" for d in actors]  # noqa: E731
    kept = [s for s in saved if any(f.exists() for f in folders(s))]  # older ones: OpenRLHF's rotation
    step = newest_intact_step(cfg.out_dir, kept, folders, say, legacy="mp_rank_00_model_states.pt",
                              aside=lambda f: set_aside(f, f.parent.parent))  # fmt: skip
    if step != state["step"]:
        redo = f"steps {step + 1}–{state['step']} will be trained again"
        say(f"hacpo: resuming {cfg.out_dir} from step {step}: {redo}")
        write_state(layout.joint_state, step, saved.get(step), {str(s): saved[s] for s in saved if s <= step})
    return step


def collect_checkpoints(cfg: TrainConfig, layout: Layout, *, final: bool) -> dict[int, Path]:
    """Move OpenRLHF's ``global_step<N>_hf`` copies (and, at the end, ``save_model``'s) to
    ``checkpoints/<agent>/step-N`` for every agent; drop torn ones and ones past the resumable step; keep
    ``keep_checkpoints`` newest plus the final one. Returns the steps every agent has."""
    if cfg.resolved_method().joint:
        done = resumable_joint_step(layout)
        dirs = [(a.name, layout.agent(a.name).ckpt, layout.agent(a.name).final) for a in cfg.agents]
    else:
        done = resumable_step(layout)
        dirs = [(cfg.agents[0].name, layout.ckpt, layout.final)]
    common: set[int] | None = None
    for agent, ckpt, final_dir in dirs:
        kept = _collect_agent(cfg, agent, ckpt, final_dir, done, final)
        common = set(kept) if common is None else common & set(kept)
    dest = Path(cfg.out_dir) / "checkpoints"
    return {s: dest for s in sorted(common or ())}


def _collect_agent(
    cfg: TrainConfig, agent: str, ckpt: Path, final_dir: Path, done: int, final: bool
) -> list[int]:
    dest = Path(cfg.out_dir) / "checkpoints" / agent
    dest.mkdir(parents=True, exist_ok=True)
    for src in sorted(ckpt.glob("global_step*_hf")):
        n = src.name.removeprefix("global_step").removesuffix("_hf")
        if not n.isdigit():
            continue
        if not _is_complete_hf(src) or int(n) > done:  # a save a kill interrupted: the step is redone
            shutil.rmtree(src, ignore_errors=True)
            continue
        target = dest / f"step-{int(n)}"
        if target.exists():
            shutil.rmtree(target)
        os.replace(src, target)
    if final and _is_complete_hf(final_dir):
        target = dest / f"step-{cfg.steps}"
        if not target.exists():
            os.replace(final_dir, target)
        else:
            shutil.rmtree(final_dir)
    steps = sorted(int(p.name[5:]) for p in dest.glob("step-*") if p.name[5:].isdigit())
    keep = set(steps[-cfg.keep_checkpoints :]) | ({cfg.steps} if final else set())
    for s in steps:
        if s not in keep:
            shutil.rmtree(dest / f"step-{s}", ignore_errors=True)
    return [s for s in steps if s in keep]


def sync_logs(cfg: TrainConfig, layout: Layout) -> list[dict]:
    """Rewrite ``metrics.jsonl`` and ``validation.jsonl`` from OpenRLHF's event files (atomically)."""
    import json

    agent = cfg.agents[0].name
    scalars = logs.read_scalars(layout.tensorboard) if layout.tensorboard.exists() else {}
    rows = logs.metrics_rows(scalars, agent)
    out = Path(cfg.out_dir)
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    val = logs.validation_rows(scalars, agent, cfg.val_size)
    if val:
        atomic_write_text(
            out / "validation.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in val)
        )
    return rows


def _record(cfg: TrainConfig, status: str, step: int, argv: list[str], **final) -> RunRecord:
    return RunRecord(
        status=status,
        step=step,
        config_hash=cfg.config_hash(),
        config=cfg.model_dump(mode="json"),
        engine="openrlhf",
        versions=versions(),
        machine=machine(),
        details={
            "method": cfg.resolved_method().to_dict(),
            "fidelity": cfg.fidelity_record(),
            "reward": cfg.reward_record(),  # its scale and the map onto [0, 1] the metrics log
            "command": argv,
        },
        **final,
    )


def launch_subprocess(
    argv: list[str], env: dict, log: Path, on_tick: Callable[[], object], stop_file: Path | None = None
) -> int:
    """Run OpenRLHF in its own process group, calling ``on_tick`` every minute (live ``metrics.jsonl``); an
    exception here (SIGTERM from ``scancel``) stops OpenRLHF before it propagates. ``stop_file``, once an
    engine's reward file writes it (a verifier failing on a whole first batch, :mod:`.reward_func`), stops
    OpenRLHF and raises :class:`VerifierError` with its error."""
    from .ray_cluster import stop_process

    next_tick = time.monotonic() + SYNC_EVERY_S
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=STOP_POLL_S if stop_file else SYNC_EVERY_S)
                except subprocess.TimeoutExpired:
                    if stop_file is not None and stop_file.is_file():
                        stop = json.loads(stop_file.read_text())
                        if stop.get("kind") == "range":  # a reward outside its range, at any step
                            raise RewardRangeError(stop["error"]) from None
                        raise VerifierError(
                            f"{stop['error']}; so were the {stop['failed'] - 1} items an engine scored before"
                        ) from None
                    if time.monotonic() >= next_tick:
                        on_tick()
                        next_tick += SYNC_EVERY_S
        finally:
            stop_process(proc)


def verifier_stop_env(cfg: TrainConfig, opts: OpenRLHFOptions, layout: Layout, start: int) -> dict[str, str]:
    """A fresh run with a verifier of your own: how many failed calls in a row stop it before its first
    update (:mod:`.reward_func`): the first step's samples one vLLM engine gets at least, the smallest share
    of the most engines any agent has. Empty for the built-in rewards; a resumed run (its first step
    passed) gets the stop file alone, which a reward outside the verifier's range still writes."""
    layout.verifier_stop.unlink(missing_ok=True)  # a previous launch's, fixed since
    if isinstance(cfg.reward, str):
        return {}
    if start > 0:
        return {"HACPO_VERIFIER_STOP": str(layout.verifier_stop.resolve())}
    samples = cfg.prompts_per_step * cfg.group_size * cfg.resolved_method().rollout_multiplier
    engines = max(1, opts.nodes * max(agent_gpus(cfg, opts)) // opts.vllm_tensor_parallel_size)
    return {
        "HACPO_VERIFIER_FIRST_BATCH": str(max(1, samples // engines)),
        "HACPO_VERIFIER_STOP": str(layout.verifier_stop.resolve()),
    }


def train(cfg: TrainConfig, opts: OpenRLHFOptions, *, launcher: Launcher | None = None) -> RunRecord:
    """Train (or resume) one run on OpenRLHF; returns its final ``run.json``.

    Single-agent methods run OpenRLHF's own ``train_ppo_ray``; joint methods run HACPO's driver
    (:mod:`.joint.driver`) over one OpenRLHF agent stack per model. ``launcher`` runs the command
    (default: a subprocess inside this job's own Ray cluster)."""
    if not isinstance(cfg.reward, str):  # importable and unchanged since planning, before any Ray actor
        cfg.reward.check_unchanged()
        load_verifier(cfg.reward)
    cfg.check_paths()
    cfg.logging.check_environment()
    check_context(cfg, opts)
    if launcher is None:
        check_installed()
        opts.check_device()
    layout = Layout(Path(cfg.out_dir))
    joint = cfg.resolved_method().joint
    if joint:
        argv = joint_command(cfg, opts, layout)
        resumable = resumable_joint_step
    else:
        argv = build_command(cfg, opts, layout)
        resumable = resumable_step
    with run_lock(cfg.out_dir):
        prev = RunRecord.for_config(cfg.out_dir, cfg.config_hash())
        if prev is not None and prev.complete:
            return prev
        sweep_temporaries(cfg.out_dir)
        layout.root.mkdir(parents=True, exist_ok=True)
        write_inputs(cfg, layout)
        if joint:
            write_joint_spec(cfg, opts, layout)
            intact_joint_step(cfg, layout, say=lambda msg: print(msg, flush=True))  # before any Ray actor
        collect_checkpoints(cfg, layout, final=False)
        start = resumable(layout)
        _record(cfg, "running", start, argv).write(cfg.out_dir)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.update(reward_env(cfg))  # the reward file inside each vLLM engine scores with it
        env.update(verifier_stop_env(cfg, opts, layout, start))
        if not joint:  # which prompts OpenRLHF trains, as its reward file sees them (check_trained_order)
            atomic_write_text(layout.rollouts, "")
            env["HACPO_ROLLOUT_LOG"] = str(layout.rollouts.resolve())
            env.update(wandb_env(cfg, layout, resume=start > 0))  # OpenRLHF's own W&B logger
        on_tick = (lambda: None) if joint else (lambda: sync_logs(cfg, layout))  # joint: written live
        t0 = time.perf_counter()
        with MemorySampler() as memory:
            try:
                rc = _run(argv, env, layout, opts, launcher, on_tick)
            except RewardRangeError as err:  # at any step: resumable from its checkpoints once fixed
                _record(cfg, "failed", resumable(layout), argv).write(cfg.out_dir)
                raise RewardRangeError(f"{err} (log: {layout.log})") from None
            except VerifierError as err:  # stopped before its first update: nothing to resume
                _record(cfg, "failed", resumable(layout), argv).write(cfg.out_dir)
                why = str(err).removeprefix("reward: ")
                why = f"{cfg.reward.key}: {why}: the run stopped before its first update (log: {layout.log})"
                raise VerifierError(why) from None
        wall = time.perf_counter() - t0
        rows = MetricsLog(Path(cfg.out_dir) / "metrics.jsonl").read() if joint else sync_logs(cfg, layout)
        checkpoints = collect_checkpoints(cfg, layout, final=rc == 0)
        if rc != 0:  # resumable from its checkpoints: the rerun continues from `step`
            _record(cfg, "failed", resumable(layout), argv).write(cfg.out_dir)
            raise RuntimeError(logs.failure_report(layout.log, rc, resumable(layout)))
        done = [r["step"] for r in rows]
        if not joint and launcher is None:
            check_trained_order(cfg, layout, start)
        if cfg.steps not in checkpoints or sorted(set(done)) != list(range(cfg.steps)):
            raise RuntimeError(
                f"OpenRLHF finished but the run is incomplete (steps logged: {len(set(done))} of "
                f"{cfg.steps}, final checkpoint of every agent: {cfg.steps in checkpoints}); its log: "
                f"{layout.log}"
            )
        host_gpu, details = memory.summary()
        samples = cfg.prompts_per_step * cfg.group_size * cfg.resolved_method().rollout_multiplier
        generated = sum(
            r.get(f"{a.name}/response_tokens", 0.0) * samples for r in rows for a in cfg.agents
        )  # every agent samples the step's prompts
        phases = logs.phase_totals(rows)
        profile = Profile(
            engine="openrlhf",
            wall_s=wall,
            steps=cfg.steps,
            phase_s=phases,
            generated_tokens=generated,
            tokens_per_s=generated / max(phases.get("generate", 0.0), 1e-9),
            **host_gpu,
            details={**details, "cpu_rehearsal": opts.cpu},
        ).write(cfg.out_dir)
        ckpt = Path(cfg.out_dir) / "checkpoints"
        final = {a.name: str(ckpt / a.name / f"step-{cfg.steps}") for a in cfg.agents}
        _record(cfg, "complete", cfg.steps, argv, final_checkpoints=final, profile=profile).write(cfg.out_dir)
        return RunRecord.read(cfg.out_dir)


def sync_check(cfg: TrainConfig, opts: OpenRLHFOptions) -> dict:
    """Each agent's weight sync checked on its real OpenRLHF stack (:mod:`.joint.sync_check`): vLLM's
    log-probs against the actor's with the weights loaded, after an update before the sync, and after it.
    ``cfg``: a joint run's config (its models, lengths); its ``out_dir`` takes the scratch files and
    ``openrlhf/sync_check.json``. ``openrlhf: {sync_check: true}`` runs the same check at the end of a joint
    run instead. Raises, naming the log, when the check could not run; returns the report (each
    agent's ``holds``)."""
    check_installed()
    opts.check_device()
    check_context(cfg, opts)
    layout = Layout(Path(cfg.out_dir))
    joint_command(cfg, opts, layout)  # every agent's arguments checked before anything starts
    layout.root.mkdir(parents=True, exist_ok=True)
    write_inputs(cfg, layout)
    write_joint_spec(cfg, opts, layout)
    out = layout.sync_check
    module = "hacpo.engines.openrlhf.joint.driver"
    argv = [*program(opts), module, str(layout.joint_spec.resolve()), "--sync-check", str(out.resolve())]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **reward_env(cfg)}
    rc = _run(argv, env, layout, opts, None, lambda: None)
    if not out.is_file():
        raise RuntimeError(logs.failure_report(layout.log, rc, 0))
    return json.loads(out.read_text())


def joint_command(
    cfg: TrainConfig, opts: OpenRLHFOptions, layout: Layout, python: str = sys.executable
) -> list[str]:
    """The driver's command line; every agent's OpenRLHF arguments are built (and checked) here, before
    anything starts, and travel in ``joint.json`` (:func:`write_joint_spec`)."""
    n = len(cfg.agents)
    if not opts.colocate:
        raise ValueError(
            "joint runs on OpenRLHF use the hybrid engine (an agent's vLLM, actor and reference on the same "
            "GPUs): set openrlhf.colocate: true; give agents separate GPUs with the pair's gpu_split"
        )
    if opts.agent_gpus is None:
        gpu_fraction(n, cfg.loss_spec().kl_beta > 0)  # refuses more agents than the hybrid engine can hold
    for k in range(n):
        joint_agent_args(cfg, opts, layout, k)
    return [*program(opts, python), "hacpo.engines.openrlhf.joint.driver", str(layout.joint_spec.resolve())]


def write_joint_spec(cfg: TrainConfig, opts: OpenRLHFOptions, layout: Layout) -> None:
    spec = {
        "config": cfg.model_dump(mode="json"),
        "run_dir": str(Path(cfg.out_dir).resolve()),
        "argv": {a.name: joint_agent_args(cfg, opts, layout, k) for k, a in enumerate(cfg.agents)},
        "shared_gpus": opts.agent_gpus is None,
        "state": str(layout.joint_state.resolve()),
        "sync_check": str(layout.sync_check.resolve()) if opts.sync_check else None,
    }
    atomic_write_json(layout.joint_spec, spec)


def _run(argv, env, layout: Layout, opts: OpenRLHFOptions, launcher, on_tick) -> int:
    if launcher is not None:
        return launcher(argv, env, layout.log)
    from .build_locks import CPU_MIN_AGE_S, SHARED_MIN_AGE_S, clear_stale_build_locks
    from .ray_cluster import ray_cluster, terminate_on_sigterm

    # On CPU the GPUs are logical (Ray places actors by them) and so are the CPUs: every actor gets one
    cpus = RAY_CPUS_ON_CPU if opts.cpu else None
    stop = layout.verifier_stop if "HACPO_VERIFIER_STOP" in env else None
    min_age_s = CPU_MIN_AGE_S if opts.cpu else SHARED_MIN_AGE_S

    def tick():  # a DeepSpeed op's build lock left by a killed builder would hold this job's actors for ever
        clear_stale_build_locks(min_age_s)
        on_tick()

    clear_stale_build_locks(min_age_s)
    with terminate_on_sigterm(), ray_cluster(num_gpus=opts.gpus_per_node, num_cpus=cpus) as address:
        return launch_subprocess(argv, {**env, "RAY_ADDRESS": address}, layout.log, tick, stop)
