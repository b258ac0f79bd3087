#!/usr/bin/env bash
# A second virtual environment, .venv-openrlhf, with the real openrlhf==0.11.2 installed the CPU way (no CUDA
# build of flash-attn; deepspeed falls back to its CPU accelerator). It exists to test the OpenRLHF engine's
# CPU-testable parts against OpenRLHF's own code (argument parser, reward loader, loss and experience classes):
#   bash scripts/setup_openrlhf_cpu.sh && .venv-openrlhf/bin/python -m pytest -q tests/openrlhf
# It is separate from .venv because openrlhf pins transformers 5.15.0. On a CUDA machine use
# `EXTRAS=dev,gpu bash scripts/setup_env.sh` instead (docs/openrlhf.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-openrlhf}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

stamp=$VENV/.hacpo-installed
want="$(sha256sum pyproject.toml "$0" | sha256sum | cut -c1-16) torch=$TORCH_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY=$VENV/bin/python
"$PY" -m pip install -q --upgrade pip
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --retries 2 "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
fi
# flash-attn and deepspeed build against the installed torch: no build isolation, their build tools first.
"$PY" -m pip install -q torch=="$TORCH_VERSION" setuptools wheel packaging psutil ninja
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE DS_BUILD_OPS=0 \
  "$PY" -m pip install -q --no-build-isolation "openrlhf==0.11.2"
"$PY" -m pip install -q -e ".[test]"
"$PY" -m pip check >/dev/null || "$PY" -m pip check | grep -v -i -E "vllm|flash" || true
echo "$want" > "$stamp"
