#!/usr/bin/env bash
# Session 9, device call 2. Carry .whl, .gpu-data, .device-commit and .triton-cache.
# Call 1's eight runs sharing the GPU ran at 272 ms/step each (one alone: ~37): no throughput gained, and
# they reached only step 900-1200 of 1800. There lr 2e-3 led (2.159 at step 900 against 2.172 for 3e-3 and
# 2.244 for 5e-3). Here, one process at a time:
# 1. `dormouse ab` (recorded) on the validation slice, 1800 steps, evals every 300: A = the candidate with
#    weight decay 0.5, B = the same with lr 2e-3.
# 2. What call 3 of session 8 never ran: the KDA layer test with fla's in-kernel prep, the candidate's
#    shape benched with and without --kda-prep-in-kernel.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --steps 1800 --eval-every 300"
bench() {  # name, flags, note
  echo "python3 -m dormouse bench $2 --note '$3' > \$OUT/bench-$1.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s|first_step|import|kernels' \$OUT/bench-$1.log | cut -c1-200"
}
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
exec bash benches/gpu_session.sh \
  "python3 -m dormouse ab $C --a '--weight-decay 0.5' --b '--weight-decay 0.5 --lr 2e-3' --record --out /tmp/ab-lr2 > \$OUT/ab-lr2.log 2>&1; $(keep ab-lr2); grep -a -E '^(overall|ms/step|eval step=1800)' \$OUT/ab-lr2.log | cut -c1-150" \
  "timeout 150 python3 -m pytest -v tests/gpu/test_kda_fla.py -k layer > \$OUT/test-layer.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-layer.log | cut -c1-160 | tail -12" \
  "$(bench cand "--config configs/tinyshakespeare.toml --data $V" 'candidate shape, defaults (safe_gate, lean fla import)')" \
  "$(bench cand-prep "--config configs/tinyshakespeare.toml --data $V --kda-prep-in-kernel" 'candidate shape, fla in-kernel prep')"
