#!/usr/bin/env bash
# Session 6, device call 3. Carry .whl, .gpu-data, .device-commit and .triton-cache.
# Context length at the same 16 KiB per step (ab now allows a shape change with batch · seq_len equal):
# the eval walks the same held-out bytes in windows of seq_len, so a longer window gives every byte more
# context (on average (T-1)/2 bytes); KDA's cost is linear in T. One seed each, validation slice,
# the candidate's 2400 steps: arm B T 512 × B 32, then T 1024 × B 16 reusing arm A.
# $OUT/fla-pin/unpinned.json names the kernels each eval's `fallbacks=fla.unpinned` counted.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --record --a ''"
keep() { echo "cp /tmp/$1/ab.json \$OUT/$1.json; cp /tmp/$1/ab.png \$OUT/$1.png; for a in a b; do cp /tmp/$1/\$a/seed-*/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done; grep -a -E '^(overall|ms/step|eval|first step)' \$OUT/$1.log | cut -c1-150"; }
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$AB --b '--seq-len 512 --batch-size 32' --out /tmp/ab-t512 > \$OUT/ab-t512.log 2>&1; $(keep ab-t512)" \
  "$AB --b '--seq-len 1024 --batch-size 16' --reuse-a /tmp/ab-t512 --out /tmp/ab-t1024 > \$OUT/ab-t1024.log 2>&1; $(keep ab-t1024)" \
  "python3 -m pytest -v -x --durations=0 tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -E 'PASS|FAIL|passed|failed|s call|^E ' \$OUT/test-graphed.log | tail -20"
