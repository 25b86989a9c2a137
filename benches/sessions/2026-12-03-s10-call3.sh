#!/usr/bin/env bash
# Device call 3 of session 10 (the session's last device seconds), in order of need, the deadline skipping
# what does not fit:
#  1. The recipe's one held-out run (configs/tinyshakespeare.toml, final: byte noise 0.05, the weight
#     average, 4000 steps; every choice made on the validation slice). The held-out tail is read here
#     only (nanoGPT's split: --heldout-tail 0.1). Wall time: the whole command's, start-up included,
#     with the Triton cache carried.
#  2. The same config on the validation slice to its end (call 2's run stopped at 3500), evals every 500.
#  3. Cold start: `small` B 10 bench with an empty Triton cache (the speed issue's 60 s goal).
#  4. Warm start: the same with the carried cache (goal 10 s).
#  5. `dormouse replay` of the `small` defaults on the H200: two processes, IDENTICAL or not.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
D=.gpu-data/tinyshakespeare
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
timed() {  # name, command: the command's wall time appended to its log
  echo "s=\$EPOCHREALTIME; $2 > \$OUT/$1.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/$1.log; grep -a -E '^eval|ms_per_step|first_step|IDENTICAL|DIFFERS' \$OUT/$1.log | cut -c1-120"
}
exec bash benches/gpu_session.sh \
  "$(timed recipe "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $D --out /tmp/recipe"); cp /tmp/recipe/metrics.jsonl \$OUT/recipe.metrics.jsonl" \
  "$(timed val-4000 "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $V --eval-every 500 --out /tmp/val-4000"); cp /tmp/val-4000/metrics.jsonl \$OUT/val-4000.metrics.jsonl" \
  "$(timed cold "TRITON_CACHE_DIR=/tmp/empty-triton-cache python3 -m dormouse bench $S --batch-size 10 --note 'cold: empty Triton cache'")" \
  "$(timed warm "python3 -m dormouse bench $S --batch-size 10 --note 'warm: Triton cache carried'")" \
  "$(timed replay "python3 -m dormouse replay --preset small --seq-len 512 --batch-size 10 --dtype bf16 --data $V --step 2")"
