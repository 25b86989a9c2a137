#!/usr/bin/env bash
# Device call 3 of session 11: the recipe under AdamW (--opt adamw: -0.175 bpb, 95 % interval [-0.199, -0.151],
# against the Sinkhorn optimizer at 500 steps x 3 seeds, abl-adamw of call 2). First its validation run at the
# recipe's 4000 steps (evals every 500, recorded; the Sinkhorn recipe's own: 2.0286 at 4000, 2.0127 at 3500,
# benches/logs/2026-12-03-h200-session10/val-4000.log), then its held-out run on nanoGPT's split (the whole
# command timed, recorded). Only the validation run decides whether the config takes AdamW.
# GPU_SESSION_SECONDS=440. Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
R="python3 -m dormouse train --config configs/tinyshakespeare.toml --opt adamw --record"
keep() {  # name: the run's metrics and curves under $OUT
  echo "cp /tmp/$1/metrics.jsonl \$OUT/$1.metrics.jsonl; cp /tmp/$1/curves.png \$OUT/$1.curves.png"
}
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$R --data $V --eval-every 500 --out /tmp/val-adamw > \$OUT/val-adamw.log 2>&1; $(keep val-adamw); grep -a -E '^eval' \$OUT/val-adamw.log | cut -c1-60" \
  "s=\$EPOCHREALTIME; $R --data $D --out /tmp/recipe-adamw > \$OUT/recipe-adamw.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe-adamw.log; $(keep recipe-adamw); grep -a -E '^eval|first step' \$OUT/recipe-adamw.log | cut -c1-200"
