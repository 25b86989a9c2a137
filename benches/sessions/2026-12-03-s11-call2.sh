#!/usr/bin/env bash
# Device call 2 of session 11: the ablation rows call 1 did not reach or that QK-norm changed: arm A again (the code
# changed), softmax attention now with QK-norm, attention + AdamW (the mixer under its usual optimizer),
# KDA + AdamW, then the experts row (both arms eager). 500 steps x 3 seeds. GPU_SESSION_SECONDS=560.
ROWS="${ROWS:-attention attnadamw adamw}" MOE=${MOE:-1}
V=.gpu-data/ts-val
STEPS=${STEPS:-500}
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --steps $STEPS --eval-every $STEPS --seeds 3 --record"
declare -A B=(
  [engram]="--engram" [attention]="--no-kda" [depth1]="--depth 1" [depth3]="--depth 3"
  [attnres]="--attn-res" [dspark]="--dspark-weight 0.1" [jepa]="--jepa-weight 0.1" [adamw]="--opt adamw"
  [attnadamw]="--no-kda --opt adamw"
)
SHOW="grep -a -E '^(overall|ms/step|verdict)'"
# BASE=FILE (an earlier call's ab.json as collected, e.g. benches/logs/<session>/abl-engram.json): every
# row reuses that call's arm A (refused if the code fingerprint changed since).
cmds=() base=""
[[ -n "${BASE:-}" ]] && base=given
for row in $ROWS; do
  if [[ $base == given ]]; then reuse="--reuse-a $BASE"; else reuse=${base:+--reuse-a /tmp/abl-$base}; fi
  cmds+=("$AB --a '' --b '${B[$row]}' $reuse --out /tmp/abl-$row > \$OUT/abl-$row.log 2>&1; cp /tmp/abl-$row/ab.json \$OUT/abl-$row.json; $SHOW \$OUT/abl-$row.log")
  base=${base:-$row}
done
if [[ -n "${MOE:-}" ]]; then
  cmds+=("$AB --no-cuda-graph --a '' --b '--n-experts 4' --out /tmp/abl-moe > \$OUT/abl-moe.log 2>&1; cp /tmp/abl-moe/ab.json \$OUT/abl-moe.json; $SHOW \$OUT/abl-moe.log")
fi
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
