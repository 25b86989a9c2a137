#!/usr/bin/env bash
# Planned device call (not run yet): quality A/Bs on the validation slice at the recipe's own budget
# (configs/tinyshakespeare.toml: byte noise 0.05, weight average, 4000 steps; 2.0286 there at 4000, lowest
# 2.0127 at 3500, held-out 2.0924), evals every 500, recorded, one seed, every B against one arm A
# (--reuse-a). The recipe overfits over its last 500-1000 steps, so: longer windows at the same bytes per
# step (T 1024 B 16: more context per byte in training and in the eval), unigram noise (replacements
# drawn from the text's own byte frequencies: new), random depth (38 % faster per
# step at 2400 steps for −0.005: the time for a wider model), dropout 0.3 and noise 0.07 (more
# regularisation), and depth 3 under random depth (a step costs depth 2's on average; the evals run all
# 3). ~130 s per run: A and three Bs fit one call; the deadline skips the rest. Carry .whl,
# .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --eval-every 500 --record"
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
ab() {  # name, arm B's flags, extra flags (--reuse-a)
  echo "python3 -m dormouse ab $C --a '' --b '$2' $3 --out /tmp/$1 > \$OUT/$1.log 2>&1; $(keep "$1"); grep -a -E '^(overall|ms/step|seed)' \$OUT/$1.log | cut -c1-160"
}
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$(ab r-t1024 '--seq-len 1024 --batch-size 16')" \
  "$(ab r-unigram '--byte-noise-source unigram' '--reuse-a /tmp/r-t1024')" \
  "$(ab r-rdepth '--rand-depth' '--reuse-a /tmp/r-t1024')" \
  "$(ab r-drop3 '--dropout 0.3' '--reuse-a /tmp/r-t1024')" \
  "$(ab r-noise07 '--byte-noise 0.07' '--reuse-a /tmp/r-t1024')" \
  "$(ab r-rdepth3 '--depth 3 --rand-depth' '--reuse-a /tmp/r-t1024')"
