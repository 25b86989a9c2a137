#!/usr/bin/env bash
# The quality issue's ablation table, three seeds per row, every row against one baseline (the recipe,
# configs/tinyshakespeare.toml, at STEPS steps) on the validation slice. Sessions 11 and 12 ran it
# (2026-12-03-s11-call{1,2}.sh, 2026-12-03-s12-call1.sh) against the recipe of then: the Sinkhorn
# optimizer, dropout 0.2, weight decay 0.5; the recipe is now AdamW (session 12), so a new table's
# optimizer rows put the default optimizer back in B (sinkhorn, sink01, ...). Each call's rows are one
# `dormouse ab` (a --b per row: benches/sessions/ab-rows.sh), whose first row trains the baseline and the
# others reuse it. Split the rows over calls with ROWS, e.g.
#   ROWS="engram attention depth1 depth3" bash benches/sessions/next-h200-ablation.sh
#   ROWS="attnres dspark jepa moe sinkhorn sink01" bash benches/sessions/next-h200-ablation.sh
# The experts row runs graphed with --experts-dense (every expert on every byte, weighted by the
# routing: the sparse dispatch's function; the sparse one is refused under --cuda-graph); TEST=1 first
# runs the graphed-step GPU test's experts-dense case (passed in session 12).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
# Then the table: python -m dormouse.tools.ab_table "LABEL=ab.json" ...
V=.gpu-data/ts-val
STEPS=${STEPS:-500}
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --steps $STEPS --eval-every $STEPS --seeds 3 --record"
declare -A B=(
  [engram]="--engram" [attention]="--no-kda" [depth1]="--depth 1" [depth3]="--depth 3"
  [attnres]="--attn-res" [dspark]="--dspark-weight 0.1" [jepa]="--jepa-weight 0.1" [sinkhorn]="--opt default"
  [attnsinkhorn]="--no-kda --opt default" [moe]="--n-experts 4 --experts-dense"
  [sink03]="--opt default --sinkhorn-lr-scale 0.3" [sink01]="--opt default --sinkhorn-lr-scale 0.1"
  [sink003]="--opt default --sinkhorn-lr-scale 0.03"
)
# BASE=FILE (an earlier call's ab.json as collected, e.g. benches/logs/<session>/abl-engram.json): every
# row reuses that call's arm A (refused if the code fingerprint changed since).
cmds=()
if [[ -n "${TEST:-}" ]]; then
  cmds+=("python3 -m pytest -v tests/gpu/test_graphed_step.py -k 'experts' > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -8")
fi
source benches/sessions/ab-rows.sh
ab_rows_cmd "$AB ${BASE:+--reuse-a $BASE}" abl- "${ROWS:-moe}"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
