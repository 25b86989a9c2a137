#!/usr/bin/env bash
# Planned device calls (not run yet): quality A/Bs on the validation slice at the recipe's own budget
# (configs/tinyshakespeare.toml: byte noise 0.05, weight average, 4000 steps; 2.0286 there at 4000, lowest
# 2.0127 at 3500, held-out 2.0924), evals every 500, recorded, one seed, every B against one arm A. The
# recipe overfits over its last 500-1000 steps, so:
#   t1024     windows of 1024 bytes at the same bytes per step (more context per byte, training and eval)
#   unigram   noise replacements drawn from the text's own byte frequencies (new)
#   droppath  stochastic depth 0.1 (new)
#   rdepth    random depth (38 % faster per step at 2400 steps for −0.005: time for a wider model)
#   drop3     dropout 0.3
#   noise07   byte noise 0.07
#   rdepth3   depth 3 under random depth (a step costs depth 2's on average; the evals run all 3)
#   wide640   d 640 (10 heads, SwiGLU 1920) under random depth: ~1.2x a step of A, within the 149 s
# ~130 s per run: arm A and three Bs fit one call, so split the rows over calls with ROWS (the first row
# of a call trains A, the others reuse it: /tmp does not outlive a call):
#   TEST=1 ROWS="t1024 unigram droppath" bash benches/sessions/next-h200-quality.sh
#   ROWS="rdepth drop3 noise07" bash benches/sessions/next-h200-quality.sh
#   ROWS="rdepth3 wide640" bash benches/sessions/next-h200-quality.sh
# BASE=FILE (an earlier call's A/B JSON as collected, e.g. benches/logs/<session>/r-t1024.json) makes
# every row reuse that call's arm A instead (refused if the code fingerprint changed since): a call of
# four Bs.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --eval-every 500 --record"
declare -A B=(
  [t1024]="--seq-len 1024 --batch-size 16" [unigram]="--byte-noise-source unigram" [droppath]="--drop-path 0.1"
  [rdepth]="--rand-depth" [drop3]="--dropout 0.3" [noise07]="--byte-noise 0.07" [rdepth3]="--depth 3 --rand-depth"
  [wide640]="--d-model 640 --n-heads 10 --ffn-hidden 1920 --rand-depth"
)
# First (TEST=1, ~20 s): the graphed-step GPU test's dropout and drop-path cases (graph == eager, bitwise).
cmds=() base=""
if [[ -n "${TEST:-}" ]]; then
  cmds+=("python3 -m pytest -v tests/gpu/test_graphed_step.py -k 'drop and bf16' > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -8")
fi
[[ -n "${BASE:-}" ]] && base=given
for row in ${ROWS:-t1024 unigram droppath}; do
  if [[ $base == given ]]; then reuse="--reuse-a $BASE"; else reuse=${base:+--reuse-a /tmp/r-$base}; fi
  keep="cp /tmp/r-$row/ab.json \$OUT/r-$row.json; for a in a b; do cp /tmp/r-$row/\$a/seed-0/metrics.jsonl \$OUT/r-$row.\$a.metrics.jsonl 2>/dev/null; done"
  cmds+=("python3 -m dormouse ab $C --a '' --b '${B[$row]}' $reuse --out /tmp/r-$row > \$OUT/r-$row.log 2>&1; $keep; grep -a -E '^(overall|ms/step|seed)' \$OUT/r-$row.log | cut -c1-160")
  base=${base:-$row}
done
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
