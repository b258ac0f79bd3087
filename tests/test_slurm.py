"""SLURM for real: a single-node cluster on localhost (.ci/slurm-up.sh) runs sbatch jobs and the workflow.

The cluster tests need root and Debian packages (slurmctld, slurmd, slurm-client, munge; about 3.4 MB,
installed by the script), so they run only when asked; elsewhere they skip, with the reason. Switches:
  HACPO_REQUIRE_SLURM=1  run them, and fail instead of skip when the cluster cannot be brought up (.ci/run)
  HACPO_SLURM_TESTS=1    run them where possible (a developer box, as root)
  HACPO_SKIP_SLURM=1     never run them
  SLURM_CI_DIR           where the cluster keeps its state and logs (default ${TMPDIR:-/tmp}/slurm-ci)
The `slurm_cluster` fixture (tests/conftest.py) brings the cluster up once per module and always tears it down
afterwards (.ci/slurm-down.sh), about 6 s each; tests/openrlhf uses it too (Ray under SLURM).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CI_PROFILE = ROOT / "profiles" / "slurm-ci"
SLURM_PROFILE = ROOT / "profiles" / "slurm"

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    """The environment for snakemake: the venv's bin first, so rules find `hacpo` (sbatch jobs inherit it)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _snakemake(*args: str, timeout: int, cwd: Path) -> subprocess.CompletedProcess:
    """Run snakemake under `timeout -k` (a hung controller ignores SIGTERM) and capture its output."""
    cmd = ["timeout", "-k", "10", str(timeout), sys.executable, "-m", "snakemake", *args]
    return subprocess.run(
        cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout + 30, check=False
    )


def _tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def _slurm_logs(workdir: Path) -> list[Path]:
    """The per-job sbatch logs: .snakemake/slurm_logs/rule_<name>/[<wildcards>/]<jobid>.log."""
    return sorted((workdir / ".snakemake" / "slurm_logs").glob("rule_*/**/*.log"))


def _submitted_rules(workdir: Path) -> set[str]:
    """Names of the rules that have at least one sbatch log, i.e. whose jobs went through SLURM."""
    base = workdir / ".snakemake" / "slurm_logs"
    return {p.relative_to(base).parts[0].removeprefix("rule_") for p in _slurm_logs(workdir)}


def _report(r: subprocess.CompletedProcess, workdir: Path) -> str:
    logs = "\n".join(f"--- {p}\n{_tail(p.read_text(errors='replace'), 20)}" for p in _slurm_logs(workdir))
    ci_dir = Path(os.environ.get("SLURM_CI_DIR", Path(os.environ.get("TMPDIR", "/tmp")) / "slurm-ci"))
    ctld = ci_dir / "log" / "slurmctld.log"
    ctld_tail = _tail(ctld.read_text(errors="replace"), 15) if ctld.exists() else "(no slurmctld.log)"
    return (
        f"rc={r.returncode}\n--- stdout\n{_tail(r.stdout)}\n--- stderr\n{_tail(r.stderr)}\n"
        f"--- sbatch logs\n{logs}\n--- slurmctld.log\n{ctld_tail}"
    )


def test_sbatch_roundtrip(slurm_cluster, tmp_path):
    """A plain `sbatch --wait` job runs on the node and writes its SLURM_JOB_ID."""
    r = subprocess.run(
        ["sbatch", "--parsable", "--wait", "-t", "2", "--mem", "100", "-D", str(tmp_path),
         "-o", str(tmp_path / "job-%j.out"), "--wrap", 'echo "job=$SLURM_JOB_ID host=$(hostname)"'],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    jobid = r.stdout.strip().split(";")[0]
    assert jobid.isdigit(), r.stdout
    content = (tmp_path / f"job-{jobid}.out").read_text()
    assert f"job={jobid}" in content


TWO_RULES = r"""
rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}; echo \"b slurm_job=$SLURM_JOB_ID\" >> {output}"

rule a:
    output: "a.txt"
    shell: "echo \"a slurm_job=$SLURM_JOB_ID\" > {output}"
"""


def test_two_rule_workflow_through_slurm(slurm_cluster, tmp_path):
    """Plumbing check of profiles/slurm-ci: two chained jobs go through sbatch and are polled by squeue."""
    (tmp_path / "Snakefile").write_text(TWO_RULES)
    r = _snakemake("--workflow-profile", str(CI_PROFILE), "--jobs", "2", timeout=300, cwd=tmp_path)
    assert r.returncode == 0, _report(r, tmp_path)
    lines = (tmp_path / "b.txt").read_text().splitlines()
    ids = [line.split("slurm_job=")[1] for line in lines]
    assert [line.split()[0] for line in lines] == ["a", "b"]
    assert all(i.isdigit() for i in ids) and ids[0] != ids[1], lines
    assert _submitted_rules(tmp_path) == {"a", "b"}


def test_workflow_through_slurm(slurm_cluster, tmp_path):
    """The project's real workflow (CI config) with its jobs submitted through sbatch: a slice of the DAG
    with every kind of job (data, warm-up, training, evaluation, a table): one HACPO run, its Table 5 and
    both agents' evaluations, 9 jobs instead of the whole DAG's, which tests/test_workflow.py runs locally
    (each sbatch round trip costs seconds)."""
    ci_config = ROOT / "config" / "ci.yaml"
    run = "joint/mixed/hacpo/seed0"
    targets = ["results/ci/tables/table5.csv", *(f"results/ci/eval/main/{run}/{a}/summary.json" for a in
                                                  ("llama", "qwen"))]  # fmt: skip
    r = _snakemake(
        "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
        "--configfile", str(ci_config), "--workflow-profile", str(CI_PROFILE), "--jobs", "2",
        *targets, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, _report(r, tmp_path)
    for target in targets:
        assert (tmp_path / target).stat().st_size > 0, target
    submitted = _submitted_rules(tmp_path)
    gpu_rules = {"train", "evaluate"}  # the GPU rules: they must run as SLURM jobs
    assert gpu_rules <= submitted, f"sbatch logs only for {sorted(submitted)}\n{_report(r, tmp_path)}"


def test_slurm_profile_renders_the_gpu_request(tmp_path):
    """profiles/slurm turns a rule's `gpu` count plus the profile's site settings into the plugin's flags.

    No cluster needed: a fake `sbatch` on PATH records its arguments and refuses the job.
    """
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "sbatch-args.txt"
    (fake / "sbatch").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{record}"\necho refused >&2\nexit 1\n')
    for tool in ("sacct", "squeue", "scontrol", "sinfo", "sshare", "sacctmgr"):
        (fake / tool).write_text("#!/bin/sh\nexit 1\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    wf = tmp_path / "wf"
    wf.mkdir()
    (wf / "Snakefile").write_text(
        'rule train:\n    output: "x.txt"\n    resources: gpu=4\n    shell: "touch {output}"\n'
    )
    env = _env()
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    r = subprocess.run(
        ["timeout", "-k", "10", "120", sys.executable, "-m", "snakemake", "--workflow-profile",
         str(SLURM_PROFILE), "--retries", "0", "--slurm-init-seconds-before-status-checks", "1"],
        cwd=wf, env=env, capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert r.returncode != 0 and record.exists(), _tail(r.stdout + r.stderr)
    args = record.read_text().split(" --wrap=")[0].split()
    site = yaml.safe_load((SLURM_PROFILE / "config.yaml").read_text())["set-resources"]["train"]
    assert args[args.index("-p") + 1] == site["slurm_partition"]
    if "gres" in site:  # the --gres spelling (see the profile's comment): the count is fixed there
        assert f"--gres={site['gres']}" in args and not any(a.startswith("--gpus") for a in args)
    else:
        want = f"--gpus={site['gpu_model']}:4" if "gpu_model" in site else "--gpus=4"
        assert want in args and not any(a.startswith("--gres") for a in args)
    if "cpus_per_gpu" in site:
        assert f"--cpus-per-gpu={site['cpus_per_gpu']}" in args
    assert args[args.index("--mem") + 1] == str(site["mem_mb"])
    assert "-t" in args
