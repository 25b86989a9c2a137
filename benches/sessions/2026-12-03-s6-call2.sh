#!/usr/bin/env bash
# Session 6, device call 2. Carry .whl, .gpu-data, .device-commit and .triton-cache (call 1's kernels).
#  0. Where a warm process's ~26 s before its first step goes (call 1: first step at 121.6 s since
#     import, 95.1 s of it the step): torch import, CUDA init, fla import, timed one by one.
#  1. One-seed A/B on the validation slice at the candidate's budget (2400 steps): arm B dropout 0.3
#     (call 1's arm A: train ce 1.20 vs validation 1.46 nats at the end, still overfitting). Arm A is
#     trained again: on a second machine with the same commit and pin, does it give 2.1125 again?
#  2. Arm B context 512 at batch 32 (the same 16 KiB per step; KDA's cost is linear in T), arm A reused.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --record --a ''"
keep() { echo "cp /tmp/$1/ab.json \$OUT/$1.json; cp /tmp/$1/ab.png \$OUT/$1.png; for a in a b; do cp /tmp/$1/\$a/seed-*/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done; grep -a -E '^(overall|ms/step|eval|first step)' \$OUT/$1.log | cut -c1-150"; }
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -c 'import time; t=time.monotonic(); import torch; a=time.monotonic(); torch.zeros(1, device=\"cuda\"); b=time.monotonic(); import fla.ops.kda; c=time.monotonic(); import dormouse.cli; d=time.monotonic(); print(f\"startup: torch import {a-t:.1f} s, CUDA init {b-a:.1f} s, fla import {c-b:.1f} s, dormouse.cli import {d-c:.1f} s\")'" \
  "$AB --b '--dropout 0.3' --out /tmp/ab-drop3 > \$OUT/ab-drop3.log 2>&1; $(keep ab-drop3)" \
  "$AB --b '--seq-len 512 --batch-size 32' --reuse-a /tmp/ab-drop3 --out /tmp/ab-t512 > \$OUT/ab-t512.log 2>&1; $(keep ab-t512)"
