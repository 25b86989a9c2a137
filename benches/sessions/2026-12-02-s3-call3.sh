#!/usr/bin/env bash
# Third H200 session of 2026-12-02, third call (what was left of the device budget): one-seed A/Bs of
# `small` on tinyshakespeare at a short fixed budget (150 steps): engram on/off (issue: Engram), and
# fixed depth vs --rand-depth vs --mor with bpb at every depth (issue: adaptive depth).
# Run on the device from the repo root with .whl, .gpu-data and .device-commit carried.
D=.gpu-data/tinyshakespeare
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--no-engram' --out /tmp/ab-engram > \$OUT/ab-engram.log 2>&1; cp /tmp/ab-engram/ab.json \$OUT/ab-engram.json; cp /tmp/ab-engram/*.png \$OUT/ 2>/dev/null; tail -12 \$OUT/ab-engram.log" \
  "$AB --a '' --b '--rand-depth' --out /tmp/ab-rand-depth > \$OUT/ab-rand-depth.log 2>&1; cp /tmp/ab-rand-depth/ab.json \$OUT/ab-rand-depth.json; tail -12 \$OUT/ab-rand-depth.log" \
  "$AB --a '' --b '--mor' --out /tmp/ab-mor > \$OUT/ab-mor.log 2>&1; cp /tmp/ab-mor/ab.json \$OUT/ab-mor.json; tail -12 \$OUT/ab-mor.log"
