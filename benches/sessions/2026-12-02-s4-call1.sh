#!/usr/bin/env bash
# Fourth H200 session of 2026-12-02, first call: the IEEE-fp32 KDA gate with up to 300 s (fla autotunes
# its fp32 kernels from scratch: the committed pin holds bf16 choices), then the adaptive-depth A/Bs
# (fixed depth vs --rand-depth, vs --mor) on `small`, tinyshakespeare (--heldout-tail 0.1), 150 steps,
# one seed, rows recorded with bpb at every depth.
# Run on the device from the repo root with .whl, .gpu-data and .device-commit carried.
D=.gpu-data/tinyshakespeare
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
exec bash benches/gpu_session.sh \
  "timeout 300 python3 benches/kda_gpu_gate.py --dtype fp32 --out \$OUT/gate-fp32.json > \$OUT/gate-fp32.log 2>&1; tail -14 \$OUT/gate-fp32.log" \
  "$AB --a '' --b '--rand-depth' --out /tmp/ab-rand-depth > \$OUT/ab-rand-depth.log 2>&1; cp /tmp/ab-rand-depth/ab.json \$OUT/ab-rand-depth.json; tail -8 \$OUT/ab-rand-depth.log" \
  "$AB --a '' --b '--mor' --out /tmp/ab-mor > \$OUT/ab-mor.log 2>&1; cp /tmp/ab-mor/ab.json \$OUT/ab-mor.json; tail -8 \$OUT/ab-mor.log"
