#!/usr/bin/env bash
# Fifth H200 session, second call. Tuning for the quality recipe, on the validation corpus only
# (prepare --heldout-tail 0.1 --validation-tail 0.1; the held-out tail is never read): the first call's
# no-dropout `small` at T 256, B 64 overfit from step ~500 (validation bpb 2.37 at step 250-500, 4.07 at
# 1500, train ce 0.54). Here dropout 0.2 (now possible under --cuda-graph), engram on vs off, 1500 steps,
# one seed, bpb every 250 steps. Then the GPU test that --cuda-graph equals eager bitwise, dropout included.
# Run from the repo root with .whl, .gpu-data and .device-commit carried.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --preset small --dtype bf16 --cuda-graph --data $V --seq-len 256 --batch-size 64 --dropout 0.2 --steps 1500 --eval-every 250 --ckpt-every 1500 --seeds 1 --record"
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--no-engram' --out /tmp/ab-engram > \$OUT/ab-engram.log 2>&1; cp /tmp/ab-engram/ab.json \$OUT/ab-engram.json; for a in a b; do cp /tmp/ab-engram/\$a/seed-0/metrics.jsonl \$OUT/ab-engram-\$a.metrics.jsonl; done; grep -a -E '^(eval|seed|overall|ms/step)' \$OUT/ab-engram.log | tail -16" \
  "python3 -m pytest -v -x --durations=0 tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -E 'PASS|FAIL|Error|passed|failed|s call' \$OUT/test-graphed.log | tail -20"
