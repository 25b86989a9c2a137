#!/usr/bin/env bash
# Device call 1 of session 10: quality A/Bs on the validation slice at the candidate's own budget
# (configs/tinyshakespeare.toml as it stands: weight decay 0.5, 2400 steps), evals every 300, recorded,
# one seed, every B against one arm A (--reuse-a): the weight average (new in session 9, never run on a
# GPU), the d-384 model that led at 1800 steps, --rand-depth (now under --cuda-graph: one graph per depth;
# new), input byte noise (new) and a hybrid block (layer 3 of 4 softmax attention; new), in that order of
# need: at ~28 ms/step they are over one call's 600 s, and the deadline skips the last. Carry .whl,
# .gpu-data, .device-commit and .triton-cache. First, the graphed-step GPU test's weight-average and
# random-depth cases (graph == eager, bitwise).
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --eval-every 300 --record"
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
ab() {  # name, arm B's flags, extra flags (--reuse-a)
  echo "python3 -m dormouse ab $C --a '' --b '$2' $3 --out /tmp/$1 > \$OUT/$1.log 2>&1; $(keep "$1"); grep -a -E '^(overall|ms/step)' \$OUT/$1.log | cut -c1-150"
}
# --ema-decay 0.998: within 2400 steps the warm-up min(0.998, (1 + s) / (10 + s)) is the decay (0.9963 at
# the end: an average over the last ~270 steps).
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v tests/gpu/test_graphed_step.py -k 'ema or rand' > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -8" \
  "$(ab q-ema '--ema-decay 0.998')" \
  "$(ab q-d384 '--d-model 384 --n-heads 6 --ffn-hidden 1152' '--reuse-a /tmp/q-ema')" \
  "$(ab q-rdepth '--rand-depth' '--reuse-a /tmp/q-ema')" \
  "$(ab q-noise '--byte-noise 0.05' '--reuse-a /tmp/q-ema')" \
  "$(ab q-hybrid '--attention-layers 3' '--reuse-a /tmp/q-ema')"
