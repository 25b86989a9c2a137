#!/usr/bin/env bash
# Planned first device call of the next session (not run yet). Write .device-commit first; carry .whl,
# .gpu-data (ts-val = prepare --heldout-tail 0.1 --validation-tail 0.1), .device-commit and .triton-cache.
#  1. The GPU tests, with -s so the log shows where the time goes: every fla kernel reads the pin (none
#     timed at the candidate's shape), then --cuda-graph == eager (session 6 gave it 63 s and 96 s: no
#     case finished; it imported fla before the pin was set, now fixed).
#  2. The candidate on the validation slice (2400 steps). With the layer norms now reading the pin, its
#     eval lines should show fallbacks=0; run the same command in the next call and compare the eval
#     lines: equal numbers mean a one-seed A/B is no longer measuring kernel timing races (session 6:
#     2.1125 / 2.1003 / 2.1289 for one config). Its log's first-step line splits the warm start-up.
#  3. Where a B 64, T 256 step's 51 ms go: the candidate's shape benched with a 3-step profile (no
#     profile at batch 64 yet; the 1e6 tokens/s goal and the quality runs' step count both hang on it).
V=.gpu-data/ts-val
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v -s -x --durations=0 tests/gpu/test_fla_pin_gpu.py tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|s call|^E |first step|fallbacks' \$OUT/test-graphed.log | cut -c1-160 | tail -30" \
  "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $V --out /tmp/r-cand > \$OUT/r-cand.log 2>&1; cp /tmp/r-cand/metrics.jsonl \$OUT/r-cand.metrics.jsonl; grep -a -E '^eval|first step' \$OUT/r-cand.log | cut -c1-200" \
  "python3 -m dormouse bench --config configs/tinyshakespeare.toml --data $V --profile 3 --note 'the candidate recipe shape (T 256, B 64), profiled'"
