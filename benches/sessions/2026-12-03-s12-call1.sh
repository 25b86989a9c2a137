#!/usr/bin/env bash
# Device call 1 of session 12 (a dated copy of next-h200-ablation.sh, run with TEST=1 ROWS="moe sink01 sink03 sink003 adamw"). The quality issue's ablation table, three seeds per row, every row
# against one baseline (the candidate recipe, configs/tinyshakespeare.toml, at STEPS steps) on the
# validation slice. In each call the first row trains the baseline and the others reuse it (--reuse-a:
# /tmp does not outlive a call, so each call trains its own). Split the rows over calls with ROWS:
#   TEST=1 ROWS="moe sink01 sink03 sink003 adamw" bash benches/sessions/next-h200-ablation.sh
#       what session 11 left, ~7 min: the graphed-step test's experts case, arm A, the experts row, the
#       Sinkhorn lr rows, AdamW again against this call's A (one call's rows compare exactly)
# sink*: the Sinkhorn optimizer at smaller matrix lrs (--sinkhorn-lr-scale; AdamW beat it at scale 1.0 by
# 0.175 in session 11; on the CPU, nano, scale 0.1 beat AdamW). The experts row runs graphed with
# --experts-dense (every expert on every byte, weighted by the routing: the sparse dispatch's function,
# tested on the CPU; the sparse one is refused under --cuda-graph and ran at 244 ms/step eager in session
# 11); TEST=1 first runs the graphed-step GPU test's experts-dense case.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
# Then the table: python -m dormouse.tools.ab_table "LABEL=ab.json" ...
V=.gpu-data/ts-val
STEPS=${STEPS:-500}
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --steps $STEPS --eval-every $STEPS --seeds 3 --record"
declare -A B=(
  [engram]="--engram" [attention]="--no-kda" [depth1]="--depth 1" [depth3]="--depth 3"
  [attnres]="--attn-res" [dspark]="--dspark-weight 0.1" [jepa]="--jepa-weight 0.1" [adamw]="--opt adamw"
  [attnadamw]="--no-kda --opt adamw" [moe]="--n-experts 4 --experts-dense"
  [sink03]="--sinkhorn-lr-scale 0.3" [sink01]="--sinkhorn-lr-scale 0.1" [sink003]="--sinkhorn-lr-scale 0.03"
)
SHOW="grep -a -E '^(overall|ms/step|verdict)'"
# BASE=FILE (an earlier call's ab.json as collected, e.g. benches/logs/<session>/abl-engram.json): every
# row reuses that call's arm A (refused if the code fingerprint changed since).
cmds=() base=""
if [[ -n "${TEST:-}" ]]; then
  cmds+=("python3 -m pytest -v tests/gpu/test_graphed_step.py -k 'experts' > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -8")
fi
[[ -n "${BASE:-}" ]] && base=given
for row in ${ROWS:-moe}; do
  if [[ $base == given ]]; then reuse="--reuse-a $BASE"; else reuse=${base:+--reuse-a /tmp/abl-$base}; fi
  cmds+=("$AB --a '' --b '${B[$row]}' $reuse --out /tmp/abl-$row > \$OUT/abl-$row.log 2>&1; cp /tmp/abl-$row/ab.json \$OUT/abl-$row.json; $SHOW \$OUT/abl-$row.log")
  base=${base:-$row}
done
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
