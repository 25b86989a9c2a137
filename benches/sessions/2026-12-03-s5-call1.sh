#!/usr/bin/env bash
# Fifth H200 session, first call: the JEPA A/B the auxiliary-objective issue asks for (`small`,
# tinyshakespeare, 150 steps, one seed, --record --eval-depths); a first look for the quality recipe on
# the validation corpus (prepare --heldout-tail 0.1 --validation-tail 0.1: the held-out tail is never
# read): `small` with --cuda-graph at T 256, B 64 (nanoGPT's shape), no dropout, 1500 steps, to see where
# held-out bpb turns; then the GPU test that --cuda-graph equals eager bitwise (pytest -v: per-dtype lines).
# Run from the repo root with .whl, .gpu-data and .device-commit carried.
D=.gpu-data/tinyshakespeare
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
TRAIN="python3 -m dormouse train --preset small --dtype bf16 --cuda-graph --data $V --seq-len 256 --batch-size 64"
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--jepa-weight 0.1' --out /tmp/ab-jepa > \$OUT/ab-jepa.log 2>&1; cp /tmp/ab-jepa/ab.json \$OUT/ab-jepa.json; tail -6 \$OUT/ab-jepa.log" \
  "$TRAIN --steps 1500 --eval-every 250 --ckpt-every 1500 --out /tmp/r-small > \$OUT/r-small.log 2>&1; cp /tmp/r-small/metrics.jsonl \$OUT/r-small.metrics.jsonl; grep -E 'eval|step 1500' \$OUT/r-small.log | tail -12" \
  "python3 -m pytest -v -x tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; tail -12 \$OUT/test-graphed.log"
