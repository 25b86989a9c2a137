#!/usr/bin/env bash
# Device call 3 of session 11: the recipe at context 1024 (T 1024, B 16: the same 16 KiB per step) against
# configs/tinyshakespeare.toml as it stands, 4000 steps, one seed, evals every 500, on the validation slice.
# Then, decided here by that A/B alone (B - A < 0 on the validation slice): if T 1024 won, the recipe's
# held-out run with it (nanoGPT's split, the whole command timed, --record; the config takes T 1024 after
# the call); if not, the drop-path 0.1 row against the same arm A instead. GPU_SESSION_SECONDS=430.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --eval-every 500 --record"
T1024="--seq-len 1024 --batch-size 16"
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
show="grep -a -E '^(overall|ms/step|seed)' | cut -c1-160"
recipe="s=\$EPOCHREALTIME; python3 -m dormouse train --config configs/tinyshakespeare.toml $T1024 --data $D --out /tmp/recipe --record > \$OUT/recipe.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe.log; cp /tmp/recipe/metrics.jsonl \$OUT/recipe.metrics.jsonl; cp /tmp/recipe/curves.png \$OUT/recipe.curves.png; grep -a -E '^eval|first step' \$OUT/recipe.log | cut -c1-200"
droppath="python3 -m dormouse ab $C --a '' --b '--drop-path 0.1' --reuse-a /tmp/r-t1024 --out /tmp/r-droppath > \$OUT/r-droppath.log 2>&1; $(keep r-droppath); $show \$OUT/r-droppath.log"
won="python3 -c \"import json, sys; sys.exit(json.load(open('/tmp/r-t1024/ab.json'))['overall']['diff_mean'] >= 0)\""
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m dormouse ab $C --a '' --b '$T1024' --out /tmp/r-t1024 > \$OUT/r-t1024.log 2>&1; $(keep r-t1024); $show \$OUT/r-t1024.log" \
  "if $won; then echo 'T 1024 won: the held-out run'; $recipe; else echo 'T 1024 did not win: drop path'; $droppath; fi"
