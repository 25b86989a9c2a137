#!/usr/bin/env bash
# Planned device call (not run yet): the A/Bs the adaptive-depth and auxiliary-objective issues ask for,
# on `small`, tinyshakespeare (prepared into .gpu-data/ with --heldout-tail 0.1), equal steps, rows in
# benches/history.tsv (--record) with bpb at every depth (--eval-depths). Then decode bytes/s of the
# DSpark arm's run with and without --speculative (one-forward verifier).
# Write .device-commit first and carry .whl, .gpu-data and .device-commit.
D=.gpu-data/tinyshakespeare
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--rand-depth' --out /tmp/ab-rand-depth > \$OUT/ab-rand-depth.log 2>&1; cp /tmp/ab-rand-depth/ab.json \$OUT/ab-rand-depth.json; tail -8 \$OUT/ab-rand-depth.log" \
  "$AB --a '' --b '--mor' --out /tmp/ab-mor > \$OUT/ab-mor.log 2>&1; cp /tmp/ab-mor/ab.json \$OUT/ab-mor.json; tail -8 \$OUT/ab-mor.log" \
  "$AB --a '' --b '--dspark-weight 0.1' --out /tmp/ab-dspark > \$OUT/ab-dspark.log 2>&1; cp /tmp/ab-dspark/ab.json \$OUT/ab-dspark.json; tail -8 \$OUT/ab-dspark.log" \
  "$AB --a '' --b '--jepa-weight 0.1' --out /tmp/ab-jepa > \$OUT/ab-jepa.log 2>&1; cp /tmp/ab-jepa/ab.json \$OUT/ab-jepa.json; tail -8 \$OUT/ab-jepa.log" \
  "for s in '' --speculative; do python3 -m dormouse generate /tmp/ab-dspark/b/seed-0 --ckpt last --prompt 'ROMEO:' --max-bytes 512 --temperature 0 \$s > \$OUT/generate\$s.log 2>&1; tail -4 \$OUT/generate\$s.log; done"
