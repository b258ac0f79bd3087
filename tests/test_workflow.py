"""The Snakemake workflow: lint and format, the full paper DAG with the slurm profile, one pair = exactly its
jobs, and the CI config end to end — interrupted mid-training, then resumed without redoing finished jobs."""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from toy_runs import assert_events_match_logs

from hacpo.pipeline import Pipeline
from hacpo.pipeline.status import read_status
from hacpo.report import stats

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile")]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())


def run(args, cwd=ROOT, check=True, timeout=600, **kw):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode:
        raise AssertionError(
            f"{' '.join(map(str, args))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        )
    return out


def job_counts(
    configfile: Path, workdir: Path, profile: str | None = None, targets: tuple[str, ...] = ()
) -> dict[str, int]:
    """Jobs per rule of a dry run (of ``targets``; none: the default target), from Snakemake's summary."""
    args = [
        *SNAKEMAKE,
        "-n",
        "--quiet",
        "rules",
        "--configfile",
        str(configfile),
        "--directory",
        str(workdir),
    ]
    if profile:
        args += ["--workflow-profile", str(ROOT / "profiles" / profile)]
    out = run([*args, *targets]).stdout
    stats = out[out.index("Job stats:") :].splitlines()[3:]
    counts = {}
    for line in stats:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_lint_and_format_are_clean():
    lint = run([*SNAKEMAKE, "--lint"])
    assert "Congratulations" in lint.stdout + lint.stderr
    run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/"])


def test_default_config_dry_run_resolves_every_table(tmp_path):
    counts = job_counts(ROOT / "config" / "config.yaml", tmp_path)
    assert counts == {
        "prepare_data": 4,
        "data_manifest": 1,
        "build_agent": 4,
        "train": 57,  # 30 single-agent + 27 joint runs (hacpo plan)
        "evaluate": 82,
        "table": 11,
        "figure": 3,  # Figures 2, 3 and the cross rows inside the stepwise clip by update
        "scorecard": 1,  # the claims (issue 30): no run of its own
        "collect_profiles": 1,
        "all": 1,
    }
    # the opt-in full scorecard: five seeds for every claim, reusing every run of the default target
    full = job_counts(ROOT / "config" / "config.yaml", tmp_path, targets=("claims_full",))
    assert full["scorecard"] == 1 and full["train"] == 150  # 104 new runs + 46 of the default target's
    # the opt-in order sensitivity (default: false): only when named, with exactly its runs
    named = job_counts(ROOT / "config" / "config.yaml", tmp_path, targets=("order_sensitivity",))
    assert named["train"] == 20 and named["table"] == 1  # 4 HACPO variants × 5 seeds
    assert named["evaluate"] == 40  # both agents of each run
    assert "figure" not in named and "collect_profiles" not in named
    # the opt-in sharing rules (issue 45): a table that draws itself, over its own runs only
    rules = job_counts(ROOT / "config" / "config.yaml", tmp_path, targets=("sharing_rules",))
    assert (rules["train"], rules["evaluate"], rules["drawn_table"]) == (65, 115, 1) and "table" not in rules


def test_a_spec_larger_than_one_command_argument_reaches_its_job(tmp_path):
    """The full scorecard's spec is over the 128 KiB a single argument of a command may have (Linux
    MAX_ARG_STRLEN): the rule hands it over through a file written by the shell's printf builtin, and the job
    reads ``--spec @file``. The printf part of the rule's real command, run as Snakemake runs a long one (a
    script file), writes the spec whole."""
    _, spec = Pipeline(yaml.safe_load((ROOT / "config" / "config.yaml").read_text())).table("claims_full")
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    assert len(text.encode()) > 128 * 1024
    out = run([*SNAKEMAKE, "-n", "-p", "claims_full", "--directory", str(tmp_path / "w")]).stdout
    (command,) = [line.removeprefix("Shell command: ") for line in out.splitlines()
                  if line.startswith("Shell command: printf") and "claims_full" in line]  # fmt: skip
    write_spec, _, job = command.partition(" && ")
    assert job.startswith("hacpo report table --spec @results/config/logs/tables/claims_full.spec.json")
    (tmp_path / "results" / "config" / "logs" / "tables").mkdir(parents=True)
    (tmp_path / "script.sh").write_text(write_spec + "\n")
    subprocess.run(["bash", "script.sh"], cwd=tmp_path, check=True)
    assert json.loads((tmp_path / "results/config/logs/tables/claims_full.spec.json").read_text()) == spec


def test_paper_dag_with_the_slurm_profile_and_one_more_pair_adds_exactly_its_jobs(tmp_path):
    counts = job_counts(ROOT / "config" / "paper.yaml", tmp_path / "a", profile="slurm")
    assert counts == {
        "prepare_data": 8,  # MATH train + seven benchmarks
        "data_manifest": 1,
        # 39 single-agent + 27 joint runs (shared/spec/paper-results.md §5), + Naive's other reading
        # (naive_source) on the three Table 1 pairs for the Naive readings table
        "train": 69,
        "evaluate": 106,
        "release_weights": 69,  # Hub models: a run's weights go once its evaluations are written
        "table": 11,
        "figure": 3,  # Figures 2, 3 and the cross rows inside the stepwise clip by update
        "scorecard": 1,
        "collect_profiles": 1,
        "all": 1,
    }
    # A new model combination is one config entry (+ a table that shows it): 2 joint runs, 2 × 2 evaluations;
    # its models' single-agent baselines already exist, so nothing else is added.
    cfg = copy.deepcopy(PAPER)
    cfg["pairs"]["q8b_l1b"] = {
        "agents": ["qwen3_8b_base", "llama3p2_1b_instruct"],
        "heterogeneity": "model",
        "gpus": 8,
    }
    cfg["tables"]["table9"]["pairs"].append("q8b_l1b")
    extended = tmp_path / "extended.yaml"
    extended.write_text(yaml.safe_dump(cfg))
    more = job_counts(extended, tmp_path / "b", profile="slurm")
    assert {k: more[k] - counts[k] for k in counts} == {
        **{k: 0 for k in counts},
        "train": 2,
        "evaluate": 4,
        "release_weights": 2,
    }


def test_the_gpu_profile_refuses_a_cpu_config_before_submitting_and_the_cpu_profile_takes_it(tmp_path):
    """The cluster guide's trap: `--workflow-profile profiles/slurm` without a GPU config ran the toy default
    and submitted its jobs with --gpus=h100:0. Refused at parse time, naming the config, the profile and the
    fix; profiles/slurm-cpu plans the same config with no GPU flag."""
    refused = run([*SNAKEMAKE, "-n", "--workflow-profile", "profiles/slurm", "--directory", str(tmp_path)],
                  check=False)  # fmt: skip
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "profiles/slurm asks a GPU for every evaluate and train job" in said
    assert "config/config.yaml trains on CPU" in said and "--workflow-profile profiles/slurm-cpu" in said
    cpu = run(
        [*SNAKEMAKE, "-n", "--workflow-profile", "profiles/slurm-cpu", "--directory", str(tmp_path / "c")]
    )
    planned = cpu.stdout + cpu.stderr
    assert "gpu_model" not in planned and "rule train:" in planned and "slurm_partition=cpu" in planned


def test_paper_dry_run_lists_openrlhf_jobs_and_vllm_evaluations_with_their_gpus(tmp_path):
    """engine: openrlhf — every single-agent run is an OpenRLHF job (its command line built from the job's own
    params, as `hacpo train --print-command` prints it) on the GPUs of its model; every joint run HACPO's
    driver over one OpenRLHF stack per agent, on the pair's GPUs; every evaluation a vLLM job on the
    evaluation's tensor-parallel GPUs."""
    import shlex

    from hacpo.config import load_train_config
    from hacpo.engines.openrlhf.command import Layout, build_command, joint_agent_args
    from hacpo.engines.openrlhf.runner import joint_command

    args = [*SNAKEMAKE, "-n", "-p", "--configfile", str(ROOT / "config" / "paper.yaml"),
            "--workflow-profile", str(ROOT / "profiles" / "slurm"), "--directory", str(tmp_path)]  # fmt: skip
    out = run(args).stdout
    jobs = out.split("\nrule ")[1:]
    trains = [j for j in jobs if j.startswith("train:")]
    evals = [j for j in jobs if j.startswith("evaluate:")]
    assert len(trains) == 69 and len(evals) == 106  # the paper's 66 + Naive's other reading on 3 pairs
    singles = [j for j in trains if "kind=single" in j]
    assert len(singles) == 39
    for job in trains:
        assert "gpu=8" in job and "--engine openrlhf" in job, job[:300]

    def run_config(job):  # `hacpo train SPEC --runtime RUNTIME …`: the spec and its runtime options
        cmd = shlex.split(job[job.index("Shell command: ") + 15 :].splitlines()[0])
        assert cmd[3] == "--runtime" and "openrlhf" not in json.loads(cmd[2]), cmd[:4]
        return load_train_config(cmd[2], **json.loads(cmd[4]))

    for job in singles:
        cfg = run_config(job)
        argv = build_command(cfg, cfg.openrlhf, Layout(tmp_path / cfg.out_dir))
        assert argv[1:4] == ["-m", "hacpo.engines.openrlhf.launch", "openrlhf.cli.train_ppo_ray"]
        assert argv[argv.index("--actor.num_gpus_per_node") + 1] == "8"
    joints = [j for j in trains if "kind=joint" in j]
    assert len(joints) == 30
    for job in joints:
        cfg = run_config(job)
        assert cfg.resolved_method().joint and len(cfg.agents) == 2
        layout = Layout(tmp_path / cfg.out_dir)
        assert joint_command(cfg, cfg.openrlhf, layout)[3] == "hacpo.engines.openrlhf.joint.driver"
        for k in range(len(cfg.agents)):
            args = joint_agent_args(cfg, cfg.openrlhf, layout, k)
            assert args[args.index("--actor.num_gpus_per_node") + 1] == "8"  # both agents on all 8 (shared)
    for job in evals:
        assert "gpu=1" in job and "--engine vllm" in job, job[:300]
        assert '"vllm":{' in job and '"tensor_parallel_size":1' in job


def test_one_gpu_dag_needs_the_downloaded_models_and_asks_one_gpu_per_job(tmp_path):
    """config/one-gpu.yaml (engine: local): a model directory not yet downloaded stops the workflow when the
    DAG is built, naming the key and the fix; with both directories present every training and evaluation
    job asks for one GPU."""
    args = [*SNAKEMAKE, "-n", "-p", "--configfile", str(ROOT / "config" / "one-gpu.yaml"), "-c8",
            "--resources", "gpu=1", "--directory", str(tmp_path)]  # fmt: skip
    missing = run(args, check=False)
    assert missing.returncode != 0
    text = missing.stdout + missing.stderr
    assert "models.qwen3_0p6b_base.hub: 'models/Qwen3-0.6B-Base' is not a model directory" in text, text
    for name in ("Qwen3-0.6B-Base", "Qwen3-1.7B-Base"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    out = run(args).stdout
    jobs = out.split("\nrule ")[1:]
    gpu_jobs = [j for j in jobs if j.startswith(("train:", "evaluate:"))]
    assert len(gpu_jobs) == 18 and all("gpu=1" in j for j in gpu_jobs)  # 8 runs, 10 evaluations
    assert all("--engine local" in j for j in gpu_jobs)


def test_rehearsal_dags_have_the_papers_shape_on_cpu(tmp_path):
    """config/rehearsal.yaml (CI runs its twin, config/rehearsal-ci.yaml, for real): every method of Tables
    1–3 and the ablations, two pairs and a 3-agent run, all with engine: openrlhf behind the CPU launcher;
    config/rehearsal-real.yaml: the real pair's imports, GSPO on each, joint HACPO, six evaluations."""
    full = job_counts(ROOT / "config" / "rehearsal.yaml", tmp_path / "full")
    # figures: 2 and 3, and the cross rows inside the stepwise clip by update (issue 25)
    assert (full["train"], full["evaluate"], full["table"], full["figure"]) == (27, 35, 10, 3)
    ci = job_counts(ROOT / "config" / "rehearsal-ci.yaml", tmp_path / "ci")
    assert (ci["train"], ci["evaluate"], ci["table"], ci["figure"]) == (3, 6, 6, 2)
    out = run([*SNAKEMAKE, "-n", "-p", "--configfile", str(ROOT / "config" / "rehearsal-ci.yaml"),
               "--directory", str(tmp_path / "ci")]).stdout  # fmt: skip
    assert out.count("--engine openrlhf") == 3 and out.count("--engine vllm") == 6
    assert out.count('"cpu":true') >= 9  # every training run and evaluation on the CPU stack
    # the real pretrained pair on the stack (CI runs its joint run and that run's evaluations)
    real = job_counts(ROOT / "config" / "rehearsal-real.yaml", tmp_path / "real")
    assert (real["import_model"], real["train"], real["evaluate"], real["table"]) == (2, 3, 6, 3)


def test_rehearsal_without_its_venv_says_how_to_make_it(tmp_path):
    import shutil

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "rehearse.sh", tmp_path / "scripts" / "rehearse.sh")
    out = run(["bash", str(tmp_path / "scripts" / "rehearse.sh")], cwd=tmp_path, check=False)
    assert out.returncode == 2 and "bash scripts/setup_rehearsal.sh" in out.stderr, out.stderr


def test_paper_data_prep_covers_eight_datasets_at_pinned_revisions(tmp_path):
    from hacpo.data import registry

    args = [
        *SNAKEMAKE,
        "-n",
        "-p",
        "--configfile",
        str(ROOT / "config" / "paper.yaml"),
        "--directory",
        str(tmp_path),
    ]
    out = run([*args, "results/paper/data/manifest.json"]).stdout
    assert out.count("rule prepare_data:") == 8
    for name in ("math_train", "math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiad"):
        spec = registry.get(name)
        assert len(spec.revision) == 40 and f'"revision": "{spec.revision}"' in out, name


def test_each_config_writes_only_under_its_own_folder(tmp_path):
    """results/<config name> per config file (issue 43); a second file of the same name elsewhere is refused
    before any job, with the fix, unless it sets `results_dir:` to share the folder on purpose."""
    dry = [*SNAKEMAKE, "-n", "--directory", str(tmp_path)]
    out = run([*dry, "--configfile", str(ROOT / "config" / "ci.yaml")]).stdout
    outputs = [w for line in out.splitlines() if line.strip().startswith("output:") for w in line.split()[1:]]
    assert outputs and all(o.strip(",").startswith("results/ci/") for o in outputs)
    (tmp_path / "results" / "ci").mkdir(parents=True)
    owner = {"configs": ["config/ci.yaml"]}
    (tmp_path / "results" / "ci" / "hacpo-results.json").write_text(json.dumps(owner))
    elsewhere = tmp_path / "mine" / "ci.yaml"
    elsewhere.parent.mkdir()
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    elsewhere.write_text(yaml.safe_dump(cfg))
    refused = run([*dry, "--configfile", str(elsewhere)], check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "results/ci/ holds the results of config/ci.yaml, and mine/ci.yaml" in said, said
    assert "`results_dir: results/<name>`" in said
    elsewhere.write_text(yaml.safe_dump(cfg | {"results_dir": "results/ci"}))
    assert run([*dry, "--configfile", str(elsewhere)]).returncode == 0


def test_bad_config_fails_before_any_job_with_the_key_path(tmp_path):
    cfg = copy.deepcopy(PAPER)
    cfg["pairs"]["q1p7b_q4b"]["hacpo"]["cross_clip_low"] = 0.2  # δ where 1−δ is meant
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    out = run([*SNAKEMAKE, "-n", "--configfile", str(bad), "--directory", str(tmp_path)], check=False)
    assert out.returncode != 0
    assert "pairs.q1p7b_q4b.hacpo.cross_clip_low" in out.stdout + out.stderr
    assert not (tmp_path / "results").exists()


def test_wandb_online_without_a_key_stops_before_the_first_job(tmp_path):
    """logging.wandb online needs WANDB_API_KEY: the workflow says so at its start, not each run after its
    models load (a dry run, which starts nothing, plans as usual)."""
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    cfg["logging"] = {"wandb": {"project": "hacpo-tests"}}
    (tmp_path / "wandb.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    args = [*SNAKEMAKE, "-c1", "--configfile", str(tmp_path / "wandb.yaml"), "--directory", str(tmp_path)]
    assert run([*args, "-n"], env=env).returncode == 0
    out = run(args, check=False, env=env)
    assert out.returncode != 0 and "WANDB_API_KEY is not set" in out.stdout + out.stderr
    assert not (tmp_path / "results").exists()


def _wait_for(predicate, timeout: float, proc=None) -> None:
    t0 = time.time()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"snakemake ended early (rc {proc.returncode})")
        if time.time() - t0 > timeout:
            raise AssertionError("timed out waiting")
        time.sleep(0.2)


def _resumable_joint_runs(runs: Path) -> list[Path]:
    """Joint runs with a checkpoint for every agent. run.json records a step only once all its agents'
    checkpoints are written; one agent's ``step-2`` folder alone is not a resumable checkpoint."""
    found = []
    for run_json in runs.glob("joint/*/*/seed*/run.json"):
        try:
            state = json.loads(run_json.read_text())
        except (OSError, ValueError):
            continue
        if state.get("status") == "running" and state.get("step", 0) >= 2:
            found.append(run_json.parent)
    return found


def _outputs(work: Path) -> dict[str, bytes]:
    """Every table and figure CSV except the measured ones (runtime, memory: wall time differs per run)."""
    res = work / "results" / "ci"
    files = [*res.glob("tables/*.csv"), *res.glob("figures/*.csv")]
    return {f.name: f.read_bytes() for f in files if f.stem not in ("table7", "table8")}


@pytest.mark.slow
def test_ci_config_end_to_end_interrupted_and_resumed(tmp_path):
    """The CI config through the whole DAG; then every joint run is deleted and Snakemake is killed while one
    is past a checkpoint. The rerun resumes it from the checkpoint, redoes no finished job, and every table
    and figure CSV is byte-identical to the uninterrupted run's. With `retention: {weights: after_eval}`
    every run's weights go once its evaluations are written: no released run is retrained, and a new
    evaluation of one stops the DAG naming the run."""
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    cfg["training"] |= {"steps": 6, "checkpoint_every": 2}  # validation every step: a checkpoint step too
    cfg["retention"] = {"weights": "after_eval"}
    configfile = tmp_path / "ci.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "w"
    args = [
        *SNAKEMAKE,
        "-c2",
        "--configfile",
        str(configfile),
        "--directory",
        str(work),
        "--rerun-incomplete",
    ]
    run(args, cwd=ROOT, timeout=900)
    uninterrupted = _outputs(work)
    assert {"table1.csv", "table5.csv", "figure2.csv"} <= set(uninterrupted)

    runs = work / "results" / "ci" / "runs"
    released = sorted(runs.glob("*/*/*/seed*/weights-released.json"))
    assert len(released) == 12 and not list(runs.glob("**/checkpoints"))  # every run's, records kept
    assert all((n.parent / "done.json").is_file() and (n.parent / "metrics.jsonl").is_file()
               for n in released)  # fmt: skip
    for downstream in ("runs/joint", "eval/main/joint", "tables", "figures"):  # the joint runs and all after
        shutil.rmtree(work / "results" / "ci" / downstream)
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        curve_run = runs / "joint" / "mixed" / "hacpo" / "seed0"  # a run that figure 2 plots
        _wait_for(lambda: curve_run in _resumable_joint_runs(runs), 300, proc)
        # while Snakemake runs, the run's status (issue 31), read at once: the run is seconds from its end
        now = read_status(curve_run)
        os.killpg(proc.pid, signal.SIGTERM)
        assert now.state == "running" and now.step >= 2 and len(now.val_acc) == 2, now
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Jobs run in the warm worker's forked children (their own sessions): the worker terminates them once
    # Snakemake is gone and logs "exited" after the last one. Snapshot the runs only after that. (No log:
    # HACPO_WORKER=off, the jobs were Snakemake's own children and died with it.)
    worker_log = work / "results" / "ci" / "logs" / "worker.log"
    if worker_log.exists():
        _wait_for(lambda: worker_log.read_text().rstrip().endswith("exited"), 60)
    finished = {p: p.stat().st_mtime_ns for p in runs.glob("*/*/*/*/done.json")}
    interrupted = [d for d in _resumable_joint_runs(runs) if not (d / "done.json").exists()]
    assert finished and curve_run in interrupted, "the kill should fall between finished and unfinished runs"

    out = run(args, cwd=ROOT, timeout=900)
    assert "Nothing to be done" not in out.stdout + out.stderr
    for p, mtime in finished.items():  # finished jobs were not redone
        assert p.stat().st_mtime_ns == mtime, p
    for run_dir in interrupted:  # resumed from their checkpoint (nothing lost, nothing moved)
        rel = run_dir.relative_to(runs)
        train_log = (work / "results" / "ci" / "logs" / "train" / rel).with_suffix(".log")
        assert "resuming" in train_log.read_text(), train_log
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(6))
        val_steps = [
            json.loads(line)["step"] for line in (run_dir / "validation.jsonl").read_text().splitlines()
        ]
        assert val_steps == [s for s in range(7) for _agent in (0, 1)]  # the checkpoint step's row too
    assert not list(runs.glob("**/*.superseded-*"))
    resumed = _outputs(work)
    assert resumed.keys() == uninterrupted.keys()
    for name, content in uninterrupted.items():
        assert resumed[name] == content, f"{name} differs after the interrupted, resumed workflow"

    tables = work / "results" / "ci" / "tables"
    t1 = pd.read_csv(tables / "table1.csv")
    expected = {(m, meth) for m in ("llama", "qwen") for meth in ("base", "gspo", "naive", "hacpo")}
    for column in ("ci_test", "ci_test_k4", "avg"):
        cells = t1[t1["column"] == column]
        assert set(zip(cells["model"], cells["method"], strict=True)) == expected, column
        assert cells["ours"].between(0, 1).all()
    assert t1[t1["column"] == "ci_test"]["paper"].isna().all()  # this pair is a Table 9 block, not Table 1
    t5 = pd.read_csv(tables / "table5.csv").set_index("column")["ours"]
    assert abs(t5["s_homo_mean"] - 1) < 1e-3 and t5["s_hete_range"] >= 0
    t7 = pd.read_csv(tables / "table7.csv")
    assert (t7["ours"].dropna() > 0).all() and set(t7["method"]) == {"gspo", "hacpo"}
    for name in ("table4", "table6", "table8", "alpha_ablation"):
        assert pd.read_csv(tables / f"{name}.csv")["ours"].notna().any(), name
        assert (tables / f"{name}.md").read_text().startswith("# ") and (
            tables / f"{name}.tex"
        ).stat().st_size
    assert (work / "results" / "ci" / "figures" / "figure2.png").stat().st_size > 10_000
    # the sharing rules (issue 45): a table that draws itself, every rule's cells on both agents
    rules = pd.read_csv(tables / "sharing_rules.csv")
    assert set(rules["method"]) == {"gspo", "naive", "xgrpo", "sgt", "hacpo"} and rules["ours"].notna().all()
    assert (work / "results" / "ci" / "figures" / "sharing_rules.png").stat().st_size > 10_000
    # the scorecard (issue 30): Table 6's two seeds give real intervals, each recomputed from the seeds CSV
    card, seeds = pd.read_csv(tables / "claims.csv"), pd.read_csv(tables / "claims_seeds.csv")
    assert set(card["verdict"]) <= set(stats.VERDICTS) and (card["n_seeds"] >= 2).sum() >= 3
    for _, row in card.iterrows():
        d = seeds[(seeds["claim"] == row["claim"]) & (seeds["agent"] == row["agent"])]
        margin = None if pd.isna(row["margin"]) else row["margin"]
        test = stats.paired_test(d["diff"].to_numpy(), row["direction"], margin=margin)
        assert (test.n, test.verdict) == (row["n_seeds"], row["verdict"]) and test.mean == pytest.approx(
            row["diff_mean"]
        )
    headline = (tables / "claims.md").read_text().splitlines()[2]
    assert "claim tests hold at this scale" in headline and headline in (tables / "claims.rst").read_text()
    assert (work / "results" / "ci" / "figures" / "claims.png").stat().st_size > 10_000
    done = json.loads(run([sys.executable, "-m", "hacpo.cli", "status", "--configfile", str(configfile),
                           "--json"], cwd=work).stdout)  # fmt: skip
    assert done["total"]["complete"] == done["total"]["runs"] == 12 and done["total"]["left_s"] == 0
    for run_dir in runs.glob("*/*/*/seed*"):  # the live curves: every local run's, step for step
        assert_events_match_logs(run_dir)
    assert len(list(runs.glob("*/*/*/seed*/weights-released.json"))) == 12  # the rerun's runs' too
    assert not list(runs.glob("**/checkpoints"))
    # an evaluation a released run has not had (a setting added later): the DAG stops, naming run and fix
    cfg["eval_settings"]["later"] = cfg["eval_settings"]["main"]
    configfile.write_text(yaml.safe_dump(cfg))
    later = "results/ci/eval/later/single/llama/gspo/seed0/summary.json"  # under --directory
    out = run([*args, "-n", later], cwd=ROOT, check=False)
    assert out.returncode and "retention: {weights: keep}" in out.stdout + out.stderr
    assert "runs/single/llama/gspo/seed0" in out.stdout + out.stderr
    dry = run([*SNAKEMAKE, "-n", "claims", "--configfile", str(configfile), "--directory", str(work)])
    assert "Nothing to be done" in dry.stdout + dry.stderr  # its runs exist: the scorecard plans none

    # Seeds added where a claim is still open: look 1 reads Table 6's seeds 0 and 1 (trains nothing), look 2
    # trains seed 2 of exactly the open rows' runs; a second call has nothing to do.
    decide = ["decide_claims_sequential", "--configfile", str(configfile), "--directory", str(work)]
    run([*SNAKEMAKE, "-c2", *decide], timeout=600)
    record = json.loads((tables / "claims_sequential_decided.json").read_text())
    assert [x["look"] for x in record["looks"]] == [1, 2] and record["done"]
    assert all(r["n"] == 3 and r["seeds"] == ["0", "1", "2"] for r in record["rows"].values())
    new_runs = {p.parent.relative_to(runs).as_posix() for p in runs.glob("*/*/*/seed2/done.json")}
    assert new_runs == {"joint/mixed/hacpo/seed2", "single/llama/gspo/seed2", "single/qwen/gspo/seed2"}
    assert "## Looks" in (tables / "claims_sequential_decided.md").read_text()
    dry = run([*SNAKEMAKE, "-n", *decide])
    assert "Nothing to be done" in dry.stdout + dry.stderr

    # The folder without its weights, continued on a fresh machine of the same type: once the agents are
    # built there (bit for bit the same), the packed jobs count as done and the looks go on from the record.
    pack, fresh = tmp_path / "ci.tar.gz", tmp_path / "fresh"
    run([sys.executable, "-m", "hacpo.cli", "pack-results", "results/ci", "--out", str(pack)], cwd=work)
    fresh.mkdir()
    unpack = [sys.executable, "-m", "hacpo.cli", "unpack-results", str(pack), "results/ci"]
    refused = run(unpack, cwd=fresh, check=False)
    assert refused.returncode == 2 and "Build them on this machine first" in refused.stderr
    agents = [f"results/ci/agents/{m}/agent.json" for m in ("llama", "qwen")]
    run([*SNAKEMAKE, "-c2", *agents, "--configfile", str(configfile), "--directory", str(fresh)], timeout=600)
    run(unpack, cwd=fresh)
    dry = run([*SNAKEMAKE, "-n", "decide_claims_sequential", "--configfile", str(configfile), "--directory",
               str(fresh)])  # fmt: skip
    assert "Nothing to be done" in dry.stdout + dry.stderr
    manifest = json.loads((work / "results" / "ci" / "data" / "manifest.json").read_text())
    assert set(manifest["datasets"]) == {"ci_train", "ci_dev", "ci_test"}

    # A finished workflow: runtime options (threads, memory knobs, scorer workers, batch budgets) plan
    # nothing; a maths knob plans exactly the runs that read it, and the evaluations and tables after them.
    runtime = copy.deepcopy(cfg) | {"results_dir": "results/ci"}  # another file, the same folder on purpose
    runtime["training"] |= {"threads": 2, "micro_batch_tokens": 4096, "generation_batch_tokens": 4096}
    runtime["training"] |= {"gradient_checkpointing": True, "scorer_workers": 1}
    runtime["eval_settings"]["main"] |= {"scorer_workers": 1, "batch_tokens": 2048}
    assert _planned_train_runs(runtime, tmp_path / "runtime.yaml", work) == set()
    maths = copy.deepcopy(cfg) | {"results_dir": "results/ci"}
    maths["pairs"]["mixed"]["hacpo"] = {**maths["pairs"]["mixed"].get("hacpo", {}), "delta_step": 0.05}
    before, after = Pipeline(cfg, config_files=[str(configfile)]), Pipeline(maths)
    reads = {r.dir for r in before.runs if before.train_spec(r) != after.train_spec(r)}
    assert reads and all("/hacpo" in d for d in reads), reads  # HACPO losses only: not Naive, not GSPO
    assert _planned_train_runs(maths, tmp_path / "maths.yaml", work) == reads

    # A second config in the same checkout (issue 43): its own agent `qwen` is another architecture, its
    # Table 1 another table. It writes only under results/other/; the first config's files stay as they were,
    # and its dry run plans nothing.
    other = copy.deepcopy(cfg)
    other["models"]["qwen"]["warmup"] = "config/agents/ci.yaml:tiny_llama"
    other["tables"] = {"table1": {"kind": "accuracy", "pairs": ["mixed"], "methods": ["base"],
                                  "eval": "main"}}  # fmt: skip
    other["figures"] = {}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    first = {p: p.read_bytes() for p in (work / "results" / "ci").rglob("*") if p.is_file()
             and "logs" not in p.parts}  # fmt: skip
    run(
        [*SNAKEMAKE, "-c2", "--configfile", str(tmp_path / "other.yaml"), "--directory", str(work)],
        timeout=600,
    )
    assert {p.name for p in (work / "results").iterdir()} == {"ci", "other"}
    assert (work / "results" / "other" / "tables" / "table1.md").stat().st_size > 0
    agent = json.loads((work / "results" / "other" / "agents" / "qwen" / "agent.json").read_text())
    assert agent["model_class"] == "LlamaForCausalLM"  # the first config's qwen is a Qwen3, untouched
    after = {p: p.read_bytes() for p in (work / "results" / "ci").rglob("*") if p.is_file()
             and "logs" not in p.parts}  # fmt: skip
    assert after.keys() - first.keys() <= {work / "results" / "ci" / "hacpo-results.json"}
    assert all(after[p] == content for p, content in first.items()), "the second config touched the first's"
    dry = run([*SNAKEMAKE, "-n", "--configfile", str(configfile), "--directory", str(work)])
    assert "Nothing to be done" in dry.stdout + dry.stderr


def _planned_train_runs(cfg: dict, configfile: Path, work: Path) -> set[str]:
    """The run directories a dry run of ``cfg`` in ``work`` would train (and why Snakemake says so)."""
    configfile.write_text(yaml.safe_dump(cfg))
    out = run([*SNAKEMAKE, "-n", "--configfile", str(configfile), "--directory", str(work)]).stdout
    jobs = [j for j in out.split("\nrule ")[1:] if j.startswith("train:")]
    return {j.split("output: ")[1].split()[0].rsplit("/", 1)[0] for j in jobs}


def test_real_model_dag_imports_each_model_once_and_counts_train_threads(tmp_path):
    """config/real.yaml: the two pretrained models are imported by one job each (cached per machine), every
    job on them waits for the import's manifest, and a training job takes the run's two torch threads
    (Snakemake's -c2 then runs one at a time)."""
    counts = job_counts(ROOT / "config" / "real.yaml", tmp_path)
    assert (counts["import_model"], counts["train"], counts["evaluate"]) == (2, 5, 8)
    out = run([*SNAKEMAKE, "-n", "-p", "--configfile", str(ROOT / "config" / "real.yaml"),
               "--directory", str(tmp_path)]).stdout  # fmt: skip
    jobs = out.split("\nrule ")[1:]
    imports = [j for j in jobs if j.startswith("import_model:")]
    assert all("hacpo import-model --spec" in j and '"prompt_format":"few_shot"' in j for j in imports)
    trains = [j for j in jobs if j.startswith("train:")]
    assert all("threads: 2" in j and "results/real/models/" in j and "hacpo-model.json" in j for j in trains)


def test_real_claims_target_at_ci_size_end_to_end(real_models, tmp_path):
    """config/real-claims.yaml under its CI overlay (issue 44), run for real: SmolLM2 imported and warmed by
    the workflow, the state pair's single and joint runs at temperature 0.5 on one seed, their evaluations,
    both drawn tables, the steps figure and the scorecard (one seed: each difference, no verdict; paired seeds
    are decided above, on config/ci.yaml's Table 6)."""
    configs = [str(ROOT / "config" / f"{name}.yaml") for name in ("real-claims", "real-claims-ci")]
    run([*SNAKEMAKE, "-c2", "--configfile", *configs, "--directory", str(tmp_path)], timeout=1800)
    res = tmp_path / "results" / "real-claims-ci"
    warm = json.loads((res / "models" / "smollm2_warm" / "hacpo-model.json").read_text())
    base = json.loads((res / "models" / "smollm2" / "hacpo-model.json").read_text())
    assert warm["warmup"]["identity"]["base"]["source_sha256"] == base["source_sha256"]
    assert warm["warmup"]["steps"] == 2 and warm["prompt_format"] == "few_shot"
    hacpo = res / "runs" / "joint" / "state" / "hacpo" / "seed0"
    assert json.loads((hacpo / "run.json").read_text())["config"]["temperature"] == 0.5
    assert (hacpo / "weights-released.json").is_file() and not (hacpo / "checkpoints").exists()  # retention
    row = json.loads((hacpo / "metrics.jsonl").read_text().splitlines()[0])
    assert {"smollm2/own_adv_sum", "smollm2_warm/cross_adv_sum", "smollm2/s_hete_mean"} <= set(row)
    rows = list(csv.DictReader((res / "tables" / "claims.csv").open()))
    assert rows and all(r["n_seeds"] == "1" and r["verdict"] == "one seed" for r in rows)
    assert {r["claim"] for r in rows} >= {"gspo_beats_base", "hacpo_beats_gspo_x2", "faster_than_gspo_x2"}
    steps = list(csv.DictReader((res / "figures" / "weak_steps.csv").open()))
    assert {r["method"] for r in steps} == {"hacpo"}
    assert {r["seed"] for r in steps} == {"0"}  # the seed's metrics.jsonl
    for name in ("table1", "weak_partner", "claims", "weak_steps", "state_steps"):
        assert (res / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
