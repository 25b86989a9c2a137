#!/usr/bin/env bash
# Fourth H200 session of 2026-12-02, third call: the GPU test that a --cuda-graph run equals the eager one
# bitwise (autocast's weight-cast cache now off in both), the DSpark A/B on `small`, tinyshakespeare,
# 150 steps, one seed, with decode speed of its DSpark run plain and --speculative recorded as rows,
# the --cuda-graph bench row, then the JEPA A/B.
# Run on the device from the repo root with .whl, .gpu-data and .device-commit carried.
D=.gpu-data/tinyshakespeare
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
GEN="python3 -m dormouse generate /tmp/ab-dspark/b/seed-0 --ckpt last --prompt 'ROMEO:' --max-bytes 512 --temperature 0 --record"
exec bash benches/gpu_session.sh \
  "timeout 200 python3 -m pytest -q -x tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; tail -4 \$OUT/test-graphed.log" \
  "$AB --a '' --b '--dspark-weight 0.1' --out /tmp/ab-dspark > \$OUT/ab-dspark.log 2>&1; cp /tmp/ab-dspark/ab.json \$OUT/ab-dspark.json; tail -6 \$OUT/ab-dspark.log" \
  "for s in '' --speculative; do $GEN \$s > \$OUT/generate\$s.log 2>&1; tail -4 \$OUT/generate\$s.log; done" \
  "python3 -m dormouse bench --preset small --dtype bf16 --cuda-graph --note 'forward+backward replayed from one CUDA graph; autocast cache off'" \
  "$AB --a '' --b '--jepa-weight 0.1' --out /tmp/ab-jepa > \$OUT/ab-jepa.log 2>&1; cp /tmp/ab-jepa/ab.json \$OUT/ab-jepa.json; tail -6 \$OUT/ab-jepa.log"
