#!/usr/bin/env bash
# Planned second device call of the next session (not run yet): the candidate again (compare its eval
# lines with call 1's: the same numbers or not), then the context-length A/B that looked best in
# session 6 (T 1024 × B 16, -0.028 in one seed) with a second seed round (--seed 1: seed 0's arm B is
# in benches/logs/2026-12-03-h200-session6/ab-t1024.*). Carry .whl, .gpu-data, .device-commit, .triton-cache.
V=.gpu-data/ts-val
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $V --out /tmp/r-cand > \$OUT/r-cand-2.log 2>&1; grep -a -E '^eval|first step' \$OUT/r-cand-2.log | cut -c1-200" \
  "python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --seed 1 --record --a '' --b '--seq-len 1024 --batch-size 16' --out /tmp/ab-t1024-s1 > \$OUT/ab-t1024-s1.log 2>&1; cp /tmp/ab-t1024-s1/ab.json \$OUT/ab-t1024-s1.json; grep -a -E '^(overall|ms/step|eval)' \$OUT/ab-t1024-s1.log | cut -c1-150"
