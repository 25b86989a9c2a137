#!/usr/bin/env bash
# Device call 2 of session 10: the graphed-step GPU test's random-depth cases (engram with gradients
# through every iteration; no engram with rand_depth_bptt 2), then A/Bs on the validation slice against
# the lead of call 1, byte noise 0.05 (2.0282 at 2400 steps): more noise (0.1), the weight average on
# top, and both with d 384 (one seed, evals every 300, recorded); then a training run of noise and the
# average over 4000 steps (65.5 M bytes; nanoGPT's run: 82 M; `ab` holds steps equal, so this is a curve,
# not an A/B). Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --eval-every 300 --record"
N="--byte-noise 0.05"
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
ab() {  # name, arm B's flags, extra flags (--reuse-a)
  echo "python3 -m dormouse ab $C --a '$N' --b '$2' $3 --out /tmp/$1 > \$OUT/$1.log 2>&1; $(keep "$1"); grep -a -E '^(overall|ms/step)' \$OUT/$1.log | cut -c1-150"
}
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v tests/gpu/test_graphed_step.py -k 'rand' > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -8" \
  "$(ab n-noise10 '--byte-noise 0.1')" \
  "$(ab n-ema "$N --ema-decay 0.998" '--reuse-a /tmp/n-noise10')" \
  "$(ab n-ema-d384 "$N --ema-decay 0.998 --d-model 384 --n-heads 6 --ffn-hidden 1152" '--reuse-a /tmp/n-noise10')" \
  "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $V $N --ema-decay 0.998 --steps 4000 --eval-every 500 --out /tmp/n-4000 > \$OUT/n-4000.log 2>&1; cp /tmp/n-4000/metrics.jsonl \$OUT/n-4000.metrics.jsonl; grep -a '^eval' \$OUT/n-4000.log | cut -c1-90"
