#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (its image has torch, transformers, pandas, seaborn, pytest; no registry
# access): math-verify, pydantic, hypothesis, peft (LoRA) and their dependencies, for Python 3.12 manylinux, ~11 MB, into
# .device-wheels/ (git-ignored), which scripts/device_check.sh installs from. Run here, then carry the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  'math-verify[antlr4_13_2]' pydantic hypothesis peft accelerate -d .device-wheels
ls .device-wheels
