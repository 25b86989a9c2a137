#!/usr/bin/env bash
# Session 13, call 2: the one-seed winners of call 1 combined, 3 seeds each against the recipe
# (configs/tinyshakespeare.toml) at 1000 steps on the validation slice, in one `dormouse ab`:
#   c1 seq 1024 x batch 16 + byte noise 0.1 + lr floor 0.5 + weight decay 2.0
#   c2 c1 with attention instead of KDA
#   c3 c1 without the weight decay change
# The pick (2026-12-03-s13-pick.py, fixed before the call): among those whose 95% interval lies below 0,
# the lowest mean validation bpb; its flags then read the held-out tail once (recipe-s13.*). None: nothing.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
C="--config configs/tinyshakespeare.toml --eval-every 250 --record"
base="--seq-len 1024 --batch-size 16 --byte-noise 0.1 --lr-floor 0.5"
declare -A B=([c1]="$base --weight-decay 2.0" [c2]="$base --weight-decay 2.0 --no-kda" [c3]="$base")
cmds=()
source benches/sessions/ab-rows.sh
ab_rows_cmd "python3 -m dormouse ab $C --data $V --steps 1000 --seeds 3" c- "c1 c2 c3"
pick="python3 benches/sessions/2026-12-03-s13-pick.py \$OUT c- '${B[c1]}' '${B[c2]}' '${B[c3]}' > \$OUT/pick.txt 2>&1; cat \$OUT/pick.txt"
cmds+=("$pick; f=\$(sed -n 's/^picked //p' \$OUT/pick.txt); [[ -n \$f && \$f != none ]] || exit 0; s=\$EPOCHREALTIME; python3 -m dormouse train $C \$f --data $D --out /tmp/recipe-s13 > \$OUT/recipe-s13.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe-s13.log; cp /tmp/recipe-s13/metrics.jsonl \$OUT/recipe-s13.metrics.jsonl; cp /tmp/recipe-s13/curves.png \$OUT/recipe-s13.curves.png; tr '\\r' '\\n' < \$OUT/recipe-s13.log | grep -a -E '^eval|first step' | cut -c1-200")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
