#!/usr/bin/env bash
# The GPU training-step measurement in one go (bench/RESULTS.md, "Training step on a GPU"), on one GPU:
#   OUT=results-folder bash bench/mfu_gpu.sh
# Each part writes OUT/<part>.json and OUT/<part>.txt as it ends (about 9 minutes in all on an H100, the most
# important first); back on any machine, `python bench/bench_mfu.py --from-json OUT/step.json --from-json
# OUT/trl.json ...` shows the parts' rows as one table and writes them as the section of bench/RESULTS.md.
set -uo pipefail
OUT=${OUT:-mfu-gpu}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}:. DS_ACCELERATOR=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

part() {  # part NAME ARGS...: one bench_mfu run, its table kept even when it fails
  local name=$1
  shift
  python bench/bench_mfu.py "$@" --no-write --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  tail -n 40 "$OUT/$name.log" > "$OUT/$name.txt"
}
# hubgym vs the bare loop at 4k and 16k-token micro-batches: MFU, GPU busy share, kernels, peak memory
part step --preset smollm2-135m --preset qwen2-0.5b --budget 4096 --budget 16384 --steps 3 --profile
# TRL's GRPOTrainer step as a third side (a third model's weights and AdamW state: 4k-token micro-batches)
part trl --preset smollm2-135m --preset qwen2-0.5b --budget 4096 --steps 3 --trl
# a 1.5B model of Qwen2.5's shape at 16k-token micro-batches under ZeRO-3 with gradient checkpointing: hubgym
# alone (a bare loop's second copy of the weights and AdamW state, and its whole logits, would not fit beside it)
part qwen25 --preset qwen2.5-1.5b --budget 16384 --zero-stage 3 --gradient-checkpointing --steps 2 --no-bare
# optim.compile on the hubgym side, at the 4k budget where the host's kernel launches set the pace
part compile --preset qwen2-0.5b --budget 4096 --steps 3 --compile
