#!/usr/bin/env bash
# Planned device call (not run yet): the next candidates for the recipe, on the validation slice only.
# Session 12 (2026-12-03-s12-call{2,3}.sh) moved the recipe to AdamW, dropout 0.3, weight decay 1.0, 1000
# steps: 2.0215 on the validation slice, 2.0844 on the held-out tail (goal 2.02). Under AdamW every
# schedule overfit after ~1000 steps; the lowest validation numbers were mid-schedule (1.9926 at step 1000
# of 1500 with weight decay 1.0 alone). Two parts, each recorded, one seed unless SEEDS=3:
#   LENGTHS="1250"            `dormouse train` runs of the config at those schedule lengths (each its own
#                             cosine; `ab` holds steps equal, so lengths are runs, not A/Bs)
#   ROWS="floor5 drop4 ..."   A/Bs at STEPS (default: the config's 1000) steps, every B against one arm A
#                             (the config; its seed 0 must read 2.0215, rw-1000 of session 12), all in
#                             one `dormouse ab` (a --b per row: the first trains A, the others reuse it;
#                             BASE=FILE reuses an earlier call's collected ab.json instead)
# ~29 ms/step: a 1000-step run is ~40 s with its start-up and evals, so a call holds arm A and ~10 Bs.
#   ROWS="floor5 drop4 wd2 noise10 ema995 engram engdrop d384" bash benches/sessions/next-h200-quality.sh
#       (d384 last: 6 heads are new shapes for fla's kernels, whose choices may autotune for minutes)
#   SEEDS=3 ROWS="<the winners>" bash benches/sessions/next-h200-quality.sh
# Then the winners go into configs/tinyshakespeare.toml and next-h200-recipe.sh reads the held-out tail.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
STEPS=${STEPS:-1000}
C="--config configs/tinyshakespeare.toml --data $V --eval-every 250 --record"
declare -A B=(
  [floor5]="--lr-floor 0.5" [floor10]="--lr-floor 1.0" [drop4]="--dropout 0.4" [wd2]="--weight-decay 2.0"
  [noise10]="--byte-noise 0.1" [nonoise]="--byte-noise 0" [d384]="--d-model 384 --n-heads 6 --ffn-hidden 1152"
  [lr2e3]="--lr 2e-3" [lr1e3]="--lr 1e-3" [t1024]="--seq-len 1024 --batch-size 16" [engram]="--engram"
  [droppath]="--drop-path 0.1" [unigram]="--byte-noise-source unigram" [attn]="--no-kda"
  [ema995]="--ema-decay 0.995" [noema]="--ema-decay 0" [engdrop]="--engram --engram-dropout 0.3"
  [engdrop5]="--engram --engram-dropout 0.5"
)
cmds=()
for n in ${LENGTHS:-}; do
  cmds+=("python3 -m dormouse train $C --steps $n --out /tmp/len-$n > \$OUT/len-$n.log 2>&1; cp /tmp/len-$n/metrics.jsonl \$OUT/len-$n.metrics.jsonl; tr '\\r' '\\n' < \$OUT/len-$n.log | grep -a -E '^eval' | cut -c1-40")
done
source benches/sessions/ab-rows.sh
[[ -n "${ROWS:-}" ]] && ab_rows_cmd "python3 -m dormouse ab $C --steps $STEPS --seeds ${SEEDS:-1} ${BASE:+--reuse-a $BASE}" r- "$ROWS"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
