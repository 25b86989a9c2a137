#!/usr/bin/env bash
# Session 7, device call 2 (run as written). Carry .whl, .gpu-data, .device-commit, .triton-cache.
# Call 1 found that pinning every fla kernel (fallbacks=0) did not make runs repeat: two processes of the
# candidate parted at step 3 again, and the graphed run parted from the eager one at step 2.
#  1. Where: benches/determinism_probe.py fingerprints every gradient and weight for 5 steps; four arms,
#     each run twice as separate processes, all eight at once: the candidate (graphed forward/backward and
#     update), --no-graph-update, --no-cuda-graph, and the candidate under torch.use_deterministic_algorithms.
#     (Eight processes at once: none dumps its kernel choices, so that no two write one file.)
#  2. A weight-decay A/B on the validation slice (one seed; arm A is a fourth sample of the candidate).
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V"
P="env -u DORMOUSE_FLA_DUMP python3 benches/determinism_probe.py $C --steps 5"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "R=\$PWD; mkdir -p \$OUT/probe; for r in 1 2; do $P --out \$OUT/probe/graph\$r.jsonl > \$OUT/probe/graph\$r.log 2>&1 & $P --no-graph-update --out \$OUT/probe/nograph-update\$r.jsonl > \$OUT/probe/nograph-update\$r.log 2>&1 & $P --no-cuda-graph --out \$OUT/probe/eager\$r.jsonl > \$OUT/probe/eager\$r.log 2>&1 & $P --torch-deterministic --out \$OUT/probe/graph-det\$r.jsonl > \$OUT/probe/graph-det\$r.log 2>&1 & done; wait; cd \$OUT/probe; for a in graph nograph-update eager graph-det; do echo \"== \$a: 1 vs 2\"; python3 \$R/benches/determinism_probe.py --compare \$a\"1.jsonl\" \$a\"2.jsonl\"; done; for a in graph nograph-update graph-det; do echo \"== \$a vs eager\"; python3 \$R/benches/determinism_probe.py --compare \$a\"1.jsonl\" eager1.jsonl; done; tail -2 *.log | cut -c1-200 | grep -v '^\$' | grep -i -B1 'error\|Trace' ; true" \
  "python3 -m dormouse ab $C --seeds 1 --record --a '' --b '--weight-decay 0.5' --out /tmp/ab-wd05 > \$OUT/ab-wd05.log 2>&1; cp /tmp/ab-wd05/ab.json \$OUT/ab-wd05.json; for a in a b; do cp /tmp/ab-wd05/\$a/seed-0/metrics.jsonl \$OUT/ab-wd05.\$a.metrics.jsonl; done; grep -a -E '^(overall|ms/step|eval)' \$OUT/ab-wd05.log | cut -c1-150"
