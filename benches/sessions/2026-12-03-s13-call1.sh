#!/usr/bin/env bash
# Session 13, call 1 (run): the first commands of next-h200-speed.sh (the engram keys' CUDA test, the
# graphed decode's GPU test and greedy decode rows of `small` without and with --cuda-graph), then the
# quality rows of next-h200-quality.sh at 1000 steps on the validation slice, one seed, all in one
# `dormouse ab` (arm A: configs/tinyshakespeare.toml, whose seed 0 read 2.0215 in session 12).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --cuda-graph --data $V"
C="--config configs/tinyshakespeare.toml --data $V --eval-every 250 --record"
declare -A B=(
  [engdrop]="--engram --engram-dropout 0.3" [attn]="--no-kda" [drop4]="--dropout 0.4" [wd2]="--weight-decay 2.0"
  [ema995]="--ema-decay 0.995" [floor5]="--lr-floor 0.5" [noise10]="--byte-noise 0.1" [lr2e3]="--lr 2e-3"
  [t1024]="--seq-len 1024 --batch-size 16" [d384]="--d-model 384 --n-heads 6 --ffn-hidden 1152"
)
cmds=(
  "python3 -m pytest -q tests/gpu/test_engram_keys_cuda.py > \$OUT/test-keys.log 2>&1; tail -1 \$OUT/test-keys.log"
  "python3 -m pytest -q tests/gpu/test_graphed_decode.py > \$OUT/test-graphed-decode.log 2>&1; tail -1 \$OUT/test-graphed-decode.log"
  "python3 -m dormouse train $S --steps 20 --eval-every 20 --out /tmp/dec > \$OUT/dec-train.log 2>&1; for g in '' --cuda-graph; do python3 -m dormouse generate /tmp/dec --ckpt last --prompt 'ROMEO:' --max-bytes 512 --temperature 0 --record \$g > \$OUT/generate\$g.log 2>&1; tail -2 \$OUT/generate\$g.log; done"
)
source benches/sessions/ab-rows.sh
ab_rows_cmd "python3 -m dormouse ab $C --steps 1000 --seeds 1" r- "engdrop attn drop4 wd2 ema995 floor5 noise10 lr2e3 t1024 d384"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
