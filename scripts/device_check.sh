#!/usr/bin/env bash
# One prepared run on a lent GPU machine (docs/performance.md "On one GPU"): under 8 minutes
# expected, 10 at the most (the timeouts sum to 570 s + kill grace; run it with timeout_s=600):
#   1. the device-sensitive tests on CUDA (HACPO_TEST_DEVICE=cuda): the local engine, models and decoding,
#      agents, evaluation settings, CLI;
#   2. hacpo eval on CUDA with fp32 and bf16 weights (200 toy problems each);
#   3. benchmarks/bench_gpu.py: HACPO vs GSPO×2 vs GSPO on a warmed ~3M/25M pair and a random
#      Qwen3-0.6B/1.7B-shaped pair (declared synthetic reward), 2 steps each, and HACPO with rank-8 LoRA
#      adapters on each pair;
#   (tests/test_adapters.py joins the CUDA tests: LoRA's adapter-off reference, resume, eval and export)
# Results under $OUT (default results/device): versions, nvidia-smi, pytest.txt, bench/bench_gpu.{json,md}.
# How to run it (one call, < 8 minutes expected): `bash scripts/device_wheels.sh` on this machine first
# (math-verify, pydantic, hypothesis and peft wheels for the GPU machine's Python 3.12, ≈ 11 MB, into
# .device-wheels/; the GPU machine needs no internet), then on the GPU machine `bash scripts/device_check.sh`
# carrying .device-wheels and .cache/test-agents (the tests' warmed toy agents, so no warm-up runs there).
# bench/bench_gpu.{json,md} is rewritten after every run, so a time limit keeps the runs done; its tables go
# into docs/performance.md ("On one GPU").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device}
mkdir -p "$OUT"
if [ -d .device-wheels ]; then
  python -m pip install -q --no-index --find-links .device-wheels 'math-verify[antlr4_13_2]' pydantic hypothesis peft \
    > "$OUT/pip.txt" 2>&1 || echo "pip install failed (see $OUT/pip.txt)"
fi
export PYTHONPATH=. TOKENIZERS_PARALLELISM=false
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
python -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))' \
  > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

t0=$(date +%s)
HACPO_TEST_DEVICE=cuda timeout -k 10 240 python -m pytest -q -p no:cacheprovider --durations=10 \
  tests/test_local_engine.py tests/test_lm.py tests/test_agents.py tests/test_eval_settings.py tests/test_cli.py \
  tests/test_adapters.py \
  > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pytest.txt"
tail -n 3 "$OUT/pytest.txt"

# evaluation on CUDA with fp32 and bf16 weights (hacpo eval --precision), same checkpoint and problems
for precision in fp32 bf16; do
  timeout -k 5 25 python -m hacpo eval --checkpoint .cache/test-agents/small-llama-char \
    --benchmark .cache/test-agents/data-add2-s0/test.jsonl --limit 200 --device cuda --precision "$precision" \
    --batch-tokens 8192 --out "$OUT/eval-$precision" > "$OUT/eval-$precision.txt" 2>&1
  echo "eval $precision rc=$?: $(tail -n 1 "$OUT/eval-$precision.txt")"
done

t0=$(date +%s)
timeout -k 10 280 python benchmarks/bench_gpu.py --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
echo "bench rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/bench.txt"
tail -n 40 "$OUT/bench.txt"
