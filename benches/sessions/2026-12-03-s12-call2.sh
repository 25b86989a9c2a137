#!/usr/bin/env bash
# Device call 2 of session 12: the recipe retuned for AdamW on the validation slice, then its one
# held-out run, in one call. Call 1 found AdamW ahead of every Sinkhorn lr scale (0.024 ahead of scale
# 0.1, seed by seed); session 11's recipe under AdamW reached 1.9983 at step 1000 of 4000 and overfit.
# Candidates (config + --opt adamw, one seed, validation slice, evals every 250): schedules of 1000, 1500
# and 2000 steps; at 1500 steps lr 1e-3, dropout 0.3, weight decay 1.0 (`dormouse ab` against the
# 1500-step arm). The rule, fixed before the call: the lowest final validation bpb wins
# (2026-12-03-s12-pick.py); its flags then train once on nanoGPT's split (held-out tail read only there),
# evals at 1/4, 1/2, 3/4 and the end, recorded, wall time of the whole command.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
C="--config configs/tinyshakespeare.toml --opt adamw --eval-every 250 --record"
SHOW="tr '\\r' '\\n' < \$OUT/\$n.log | grep -a -E '^eval' | cut -c1-40"
cmds=()
for n in 1000 2000; do
  cmds+=("n=len-$n; python3 -m dormouse train $C --data $V --steps $n --out /tmp/\$n > \$OUT/\$n.log 2>&1; cp /tmp/\$n/metrics.jsonl \$OUT/\$n.metrics.jsonl; $SHOW")
done
declare -A B=([lr1e3]="--lr 1e-3" [drop3]="--dropout 0.3" [wd1]="--weight-decay 1.0")
reuse=""
for row in lr1e3 drop3 wd1; do
  keep="cp /tmp/r-$row/ab.json \$OUT/r-$row.json; for a in a b; do cp /tmp/r-$row/\$a/seed-0/metrics.jsonl \$OUT/r-$row.\$a.metrics.jsonl 2>/dev/null; done"
  cmds+=("python3 -m dormouse ab $C --data $V --steps 1500 --seeds 1 --a '' --b '${B[$row]}' $reuse --out /tmp/r-$row > \$OUT/r-$row.log 2>&1; $keep; grep -a -E '^(overall|ms/step)' \$OUT/r-$row.log | cut -c1-160")
  reuse="--reuse-a /tmp/r-lr1e3"
done
cmds+=("python3 benches/sessions/2026-12-03-s12-pick.py \$OUT | tee \$OUT/pick.txt")
heldout="f=\$(tail -1 \$OUT/pick.txt); n=\$(echo \$f | sed -E 's/.*--steps ([0-9]+).*/\\1/'); s=\$EPOCHREALTIME; python3 -m dormouse train --config configs/tinyshakespeare.toml --opt adamw \$f --eval-every \$((n / 4)) --data $D --out /tmp/recipe --record > \$OUT/recipe.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe.log; cp /tmp/recipe/metrics.jsonl \$OUT/recipe.metrics.jsonl; cp /tmp/recipe/curves.png \$OUT/recipe.curves.png; tr '\\r' '\\n' < \$OUT/recipe.log | grep -a -E '^eval|first step' | cut -c1-200"
cmds+=("$heldout")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
