#!/usr/bin/env bash
# Fifth H200 session, third call. Quality tuning on the validation corpus only (the held-out tail is
# never read). The second call found engram off + dropout 0.2 at T 256, B 64 still improving at 1500
# steps (validation 2.1347 bpb) while engram on overfit (3.6025). Here, at about equal wall time: `small`
# without engram for 1500 steps vs half its layers (block_layers 2, ~half the time per step) for 3000.
# Then the GPU test that --cuda-graph equals eager bitwise (now at these widths and shape, bf16 cases first).
# Run from the repo root with .whl, .gpu-data and .device-commit carried.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --preset small --no-engram --dtype bf16 --cuda-graph --data $V --seq-len 256 --batch-size 64 --dropout 0.2 --eval-every 250 --ckpt-every 3000 --seeds 1 --record"
exec bash benches/gpu_session.sh \
  "$AB --a '--steps 1500' --b '--block-layers 2 --steps 3000' --out /tmp/ab-layers > \$OUT/ab-layers.log 2>&1; cp /tmp/ab-layers/ab.json \$OUT/ab-layers.json; for a in a b; do cp /tmp/ab-layers/\$a/seed-0/metrics.jsonl \$OUT/ab-layers-\$a.metrics.jsonl; done; grep -a -E '^(eval|seed|overall|ms/step)' \$OUT/ab-layers.log | tail -20" \
  "python3 -m pytest -v -x --durations=0 tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -E 'PASS|FAIL|Error|passed|failed|s call' \$OUT/test-graphed.log | tail -20"
