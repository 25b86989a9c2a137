#!/usr/bin/env bash
# The quality issue's ablation table (session 11 ran it: 2026-12-03-s11-call{1,2}.sh), three seeds per row, every row
# against one baseline (the candidate recipe, configs/tinyshakespeare.toml, at STEPS steps) on the
# validation slice. In each call the first row trains the baseline and the others reuse it (--reuse-a:
# /tmp does not outlive a call, so each call trains its own). Split the rows over calls with ROWS:
#   ROWS="engram attention depth1 depth3" bash benches/sessions/next-h200-ablation.sh
#   ROWS="attnres dspark jepa adamw" MOE=1 bash benches/sessions/next-h200-ablation.sh
# MOE=1 adds the experts row, both arms eager (MoE is refused under --cuda-graph). Carry .whl, .gpu-data,
# .device-commit and .triton-cache. Then the table: python -m dormouse.tools.ab_table "LABEL=ab.json" ...
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
for row in ${ROWS:-engram attention depth1 depth3}; do
  if [[ $base == given ]]; then reuse="--reuse-a $BASE"; else reuse=${base:+--reuse-a /tmp/abl-$base}; fi
  cmds+=("$AB --a '' --b '${B[$row]}' $reuse --out /tmp/abl-$row > \$OUT/abl-$row.log 2>&1; cp /tmp/abl-$row/ab.json \$OUT/abl-$row.json; $SHOW \$OUT/abl-$row.log")
  base=${base:-$row}
done
if [[ -n "${MOE:-}" ]]; then
  cmds+=("$AB --no-cuda-graph --a '' --b '--n-experts 4' --out /tmp/abl-moe > \$OUT/abl-moe.log 2>&1; cp /tmp/abl-moe/ab.json \$OUT/abl-moe.json; $SHOW \$OUT/abl-moe.log")
fi
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
