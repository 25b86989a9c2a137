#!/usr/bin/env bash
# Session 14, call 4: what the recipe's held-out 1.9769 (call 1) rests on. No choice is made from these.
#  1. The recipe from an empty Triton cache (TRITON_CACHE_DIR an empty folder on a machine just started;
#     the kernel choices come from the committed pin): the issue's budget is 149 s for the whole command,
#     start-up and compilation included. Seed 0 on nanoGPT's split: the same config and seed as call 1, so
#     its bpb must repeat 1.9769 bit for bit (another process, another machine start).
#  2. Seeds 1 and 2 of the recipe on the validation slice (2000 steps): with call 1's seed 0 and session
#     13's seeds 0-2 at 1000 steps (c-rows-b3: 1.9715 / 1.9674 / 1.9698), the length's effect over 3 seeds.
#  3. Seeds 1 and 2 of the recipe on nanoGPT's split: the held-out number's seed spread (reported beside
#     seed 0's, not used to choose anything).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
source benches/sessions/heldout-run.sh
cmds=("$(heldout_run_cmd recipe-cold "--config configs/tinyshakespeare.toml" "TRITON_CACHE_DIR=/tmp/triton-cold ")")
for seed in 1 2; do
  cmds+=("python3 -m dormouse train --config configs/tinyshakespeare.toml --record --seed $seed --data $V --out /tmp/val-s$seed > \$OUT/val-s$seed.log 2>&1; cp /tmp/val-s$seed/metrics.jsonl \$OUT/val-s$seed.metrics.jsonl; tr '\\r' '\\n' < \$OUT/val-s$seed.log | grep -a -E '^eval' | cut -c1-40")
done
for seed in 1 2; do
  cmds+=("$(heldout_run_cmd recipe-s$seed "--config configs/tinyshakespeare.toml --seed $seed")")
done
exec bash benches/gpu_session.sh "${cmds[@]}"
