#!/usr/bin/env bash
# Planned device call (not run yet): the JEPA A/B the auxiliary-objective issue asks for (the DSpark one
# ran: docs/results.md), on `small`, tinyshakespeare (prepared into .gpu-data/ with --heldout-tail 0.1),
# 150 steps, one seed, rows in benches/history.tsv (--record) with bpb at every depth (--eval-depths).
# Write .device-commit first and carry .whl, .gpu-data and .device-commit.
D=.gpu-data/tinyshakespeare
AB="python3 -m dormouse ab --preset small --dtype bf16 --data $D --steps 150 --eval-every 150 --seeds 1 --record --eval-depths"
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--jepa-weight 0.1' --out /tmp/ab-jepa > \$OUT/ab-jepa.log 2>&1; cp /tmp/ab-jepa/ab.json \$OUT/ab-jepa.json; tail -8 \$OUT/ab-jepa.log"
