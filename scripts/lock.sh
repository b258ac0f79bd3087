#!/usr/bin/env bash
# Refresh the lock files that scripts/setup_env.sh installs from: requirements/lock-<extras>.txt, one per
# extras set the README, the guides and CI use, every package pinned with its hashes, resolved for Linux
# x86_64 and Python 3.11. torch is left out (setup_env.sh installs it: the CPU build where no GPU is present,
# else CUDA's); its CPU build from the PyTorch index is resolved in its place, so no CUDA package is locked.
#   bash scripts/lock.sh            # all of them;   bash scripts/lock.sh dev,docs   # one set
# Resolving needs uv (installed into .venv-lock on the first call) and the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
SETS=("$@")
[ ${#SETS[@]} -gt 0 ] || SETS=(dev dev,docs dev,models dev,models,data dev,models,docs)
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
[ -x .venv-lock/bin/uv ] || { python3 -m venv .venv-lock && .venv-lock/bin/pip install -q "uv>=0.9,<1"; }
override=$(mktemp)
trap 'rm -f "$override"' EXIT
echo "torch==${TORCH_VERSION}+cpu" > "$override"
# where torch's CPU build is found: the PyTorch index, or a folder of wheels pip is told of that holds it
torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
if compgen -G "${PIP_FIND_LINKS:-/nonexistent}/torch-${TORCH_VERSION}+cpu-*.whl" > /dev/null; then
  torch_source=(--find-links "$PIP_FIND_LINKS")
fi
for extras in "${SETS[@]}"; do
  out="requirements/lock-$(tr ',' '\n' <<< "$extras" | sort | paste -sd-).txt"
  flags=()
  for e in ${extras//,/ }; do flags+=(--extra "$e"); done
  .venv-lock/bin/uv pip compile pyproject.toml "${flags[@]}" --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --generate-hashes --no-emit-package torch --override "$override" \
    "${torch_source[@]}" --custom-compile-command "bash scripts/lock.sh $extras" \
    --quiet -o "$out"
  echo "lock.sh: $out ($(grep -c '==' "$out") packages)"
done
