#!/usr/bin/env bash
# Session 7, device call 1 (run as written). Carry .whl, .gpu-data (ts-val = prepare --heldout-tail 0.1
# --validation-tail 0.1), .device-commit and .triton-cache.
#  1. The GPU tests with -s: every fla kernel reads the pin (none timed at the candidate's shape), then
#     --cuda-graph == eager (session 6 gave it 63 s and 96 s; it imported fla before the pin was set).
#  2. Runs repeat across processes: two 100-step runs of the candidate, each its own process, compared
#     on every step's train ce (session 6's arm A runs parted at step 3).
#  3. The candidate on the validation slice (2400 steps): its eval lines should show fallbacks=0.
#  4. Where a B 64, T 256 step's ~51 ms go: the candidate's shape benched with a 3-step profile.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v -s -x --durations=0 tests/gpu/test_fla_pin_gpu.py tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|s call|^E |first step|fallbacks' \$OUT/test-graphed.log | cut -c1-160 | tail -30" \
  "for r in 1 2; do python3 -m dormouse train $C --steps 100 --eval-every 100 --out /tmp/det\$r > \$OUT/det\$r.log 2>&1; grep -a '\"train\"' /tmp/det\$r/metrics.jsonl > \$OUT/det\$r.train.jsonl; done; cmp \$OUT/det1.train.jsonl \$OUT/det2.train.jsonl && echo 'determinism: 100 steps IDENTICAL across two processes' | tee \$OUT/det.txt; grep -a -E '^eval' \$OUT/det?.log | cut -c1-200" \
  "python3 -m dormouse train $C --out /tmp/r-cand > \$OUT/r-cand.log 2>&1; cp /tmp/r-cand/metrics.jsonl \$OUT/r-cand.metrics.jsonl; grep -a -E '^eval|first step' \$OUT/r-cand.log | cut -c1-200" \
  "python3 -m dormouse bench $C --profile 3 --note 'the candidate recipe shape (T 256, B 64), profiled' > \$OUT/bench-profile.log 2>&1; tail -60 \$OUT/bench-profile.log"
