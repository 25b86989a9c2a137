#!/usr/bin/env bash
# Device call 2 of session 12 (a dated copy of next-h200-quality.sh, run with LENGTHS="1000 2000" STEPS=1500 ROWS="lr1e3 drop3 wd1 noise10"; AdamW beat every Sinkhorn lr scale in call 1). The recipe under AdamW, on the validation slice only. Session 11 found
# --opt adamw 0.175 bpb ahead of Sinkhorn at 500 steps (3 seeds) and the recipe under it at 1.9983 at step
# 1000 of its 4000, then overfitting hard (val-adamw.log): its schedule and regularisers want retuning.
# Run the ablation's optimizer rows first (next-h200-ablation.sh: ROWS="sink01 sink03 sink003"): if a
# smaller Sinkhorn lr beats AdamW there, set OPT to it. Two parts, each recorded, one seed unless SEEDS=3:
#   LENGTHS="1000 1500 2000"  `dormouse train` runs of the config + --opt adamw at those schedule lengths
#                             (each its own cosine; `ab` holds steps equal, so lengths are runs, not A/Bs)
#   ROWS="drop3 noise10 ..."  A/Bs at STEPS (default 1200) steps, every B against one arm A (the config
#                             + --opt adamw); the first row trains A, the others reuse it (/tmp does not
#                             outlive a call; BASE=FILE reuses an earlier call's collected ab.json instead)
# ~30 ms/step: a 1200-step run is ~45 s with its evals, so a call holds arm A and ~9 one-seed Bs.
#   LENGTHS="1000 1500 2000" ROWS="drop3 noise10 wd1 lr2e3 d640" bash benches/sessions/next-h200-quality.sh
#   ROWS="t1024 engram droppath unigram attn" BASE=... bash benches/sessions/next-h200-quality.sh
# Then the winner goes into configs/tinyshakespeare.toml and next-h200-recipe.sh reads the held-out tail.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
STEPS=${STEPS:-1200}
# OPT: the optimizer flags every run shares (the ablation's sink rows may say --sinkhorn-lr-scale 0.1 instead)
OPT=${OPT:---opt adamw}
C="--config configs/tinyshakespeare.toml $OPT --data $V --eval-every 250 --record"
declare -A B=(
  [drop3]="--dropout 0.3" [noise10]="--byte-noise 0.1" [wd1]="--weight-decay 1.0" [lr2e3]="--lr 2e-3"
  [lr1e3]="--lr 1e-3" [d640]="--d-model 640 --n-heads 10 --ffn-hidden 1920" [t1024]="--seq-len 1024 --batch-size 16"
  [engram]="--engram" [droppath]="--drop-path 0.1" [unigram]="--byte-noise-source unigram" [attn]="--no-kda"
)
cmds=() base=""
for n in ${LENGTHS:-}; do
  cmds+=("python3 -m dormouse train $C --steps $n --out /tmp/len-$n > \$OUT/len-$n.log 2>&1; cp /tmp/len-$n/metrics.jsonl \$OUT/len-$n.metrics.jsonl; tr '\\r' '\\n' < \$OUT/len-$n.log | grep -a -E '^eval' | cut -c1-40")
done
[[ -n "${BASE:-}" ]] && base=given
for row in ${ROWS:-}; do
  if [[ $base == given ]]; then reuse="--reuse-a $BASE"; else reuse=${base:+--reuse-a /tmp/r-$base}; fi
  keep="cp /tmp/r-$row/ab.json \$OUT/r-$row.json; for a in a b; do cp /tmp/r-$row/\$a/seed-0/metrics.jsonl \$OUT/r-$row.\$a.metrics.jsonl 2>/dev/null; done"
  cmds+=("python3 -m dormouse ab $C --steps $STEPS --seeds ${SEEDS:-1} --a '' --b '${B[$row]}' $reuse --out /tmp/r-$row > \$OUT/r-$row.log 2>&1; $keep; grep -a -E '^(overall|ms/step|seed)' \$OUT/r-$row.log | cut -c1-160")
  base=${base:-$row}
done
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
