#!/usr/bin/env bash
# Rehearse the paper's workflow on the real stack before booking GPUs: `engine: openrlhf` on this machine's
# CPUs (OpenRLHF 0.11.2's train_ppo_ray and HACPO's joint driver, vLLM, DeepSpeed, Ray; tiny warmed agents).
#   bash scripts/rehearse.sh                                        # config/rehearsal.yaml: the paper's DAG shape
#   bash scripts/rehearse.sh --configfile config/rehearsal-ci.yaml  # CI size: every rule and table kind once
#   bash scripts/rehearse.sh --configfile config/rehearsal-real.yaml --gpus 1  # the real pair, one job at a time
# --gpus N: the logical GPUs jobs share (default 2: two one-GPU jobs at a time). The real pair's jobs take
# 8-12 GB each: two of them, beside a third job's start-up, overflow 24 GB.
# Other arguments go to snakemake (targets, -n, --cores N, ...). Results: results/<config name>/, as for every
# workflow config (config/rehearsal-ci.yaml → results/rehearsal-ci/). Needs .venv-rehearsal.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-rehearsal/bin/snakemake ]; then
  echo "rehearse: .venv-rehearsal is missing; make it first (about 4 minutes, CPU builds only):" >&2
  echo "  bash scripts/setup_rehearsal.sh" >&2
  exit 2
fi
config=config/rehearsal.yaml
gpus=2
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --configfile) config=$2; shift 2 ;;
    --configfile=*) config=${1#*=}; shift ;;
    --gpus) gpus=$2; shift 2 ;;
    --gpus=*) gpus=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -f "$config" ] || { echo "rehearse: no config file $config" >&2; exit 2; }
smk=(--snakefile Snakefile --configfile "$config" --cores 2)
# Pretrained models (`source:` entries) are imported by the project venv: OpenRLHF's transformers 5.15.0
# converts their GGUF tokenizers wrongly (hacpo.agents.sources); the per-machine cache then serves this venv.
if grep -qE '^[[:space:]]+source:' "$config"; then
  if [ ! -x .venv/bin/snakemake ]; then
    echo "rehearse: $config imports pretrained models with the project venv (.venv); make it first:" >&2
    echo "  EXTRAS=dev,models bash scripts/setup_env.sh" >&2
    exit 2
  fi
  dry=()
  for a in "${args[@]}"; do [[ $a == -n || $a == --dry-run || $a == --dryrun ]] && dry=(-n); done
  .venv/bin/snakemake "${smk[@]}" --until import_model "${dry[@]}"
fi
export PATH="$PWD/.venv-rehearsal/bin:$PATH"
# Two jobs at a time: a job is mostly start-up (Ray, vLLM, DeepSpeed), so the two cores overlap them. Two
# logical GPUs: a job asking for both (two data-parallel ranks, ≈ 18 GB of processes) then runs alone.
# --retries 1: two jobs starting at once can race for the same free port in OpenRLHF's distributed set-up
# (EADDRINUSE in a ReferenceModelActor, seen once in CI on 2026-12-02); the failed job runs once more,
# resuming from its checkpoints, as the SLURM profile's retries do for node failures.
exec snakemake "${smk[@]}" --resources gpu="$gpus" --retries 1 "${args[@]}"
