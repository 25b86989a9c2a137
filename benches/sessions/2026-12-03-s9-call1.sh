#!/usr/bin/env bash
# Session 9, device call 1: quality exploration on the validation slice (ts-val = prepare --heldout-tail 0.1
# --validation-tail 0.1; the real held-out tail is not read). Carry .whl, .gpu-data, .device-commit and
# .triton-cache. Eight `dormouse train` runs of the candidate with one change each, 1800 steps (the cosine
# over 1800), evals every 300, sharing the GPU as eight processes: their bpb are what one process gives
# (runs repeat bit for bit), their ms/step are not, so no bench rows. Then each run's best checkpoint scored
# by `dormouse eval --seq-len 256,1024,4096`: how much of the held-out bpb is the windows' short context.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --steps 1800 --eval-every 300 --ckpt-every 1800"
declare -A ARM=(
  [base]="--weight-decay 0.5"
  [lr2]="--weight-decay 0.5 --lr 2e-3"
  [lr5]="--weight-decay 0.5 --lr 5e-3"
  [rdepth]="--weight-decay 0.5 --rand-depth"
  [wd1d3]="--weight-decay 1.0 --dropout 0.3"
  [d384]="--weight-decay 0.5 --d-model 384 --n-heads 6 --ffn-hidden 1152"
  [depth3]="--weight-decay 0.5 --depth 3"
  [t1024]="--weight-decay 0.5 --seq-len 1024 --batch-size 16"
)
train_all=""
eval_all=""
for name in "${!ARM[@]}"; do
  train_all+="(timeout 330 python3 -m dormouse train $C ${ARM[$name]} --out /tmp/r-$name > /tmp/r-$name.log 2>&1; tr '\r' '\n' < /tmp/r-$name.log | grep -a -v '%|' > \$OUT/r-$name.log; cp /tmp/r-$name/metrics.jsonl \$OUT/r-$name.metrics.jsonl) & "
  eval_all+="(timeout 100 python3 -m dormouse eval /tmp/r-$name --seq-len 256,1024,4096 --batch-size 16 > \$OUT/eval-$name.log 2>&1) & "
done
exec bash benches/gpu_session.sh \
  "$train_all wait; grep -a -h -E '^eval ' \$OUT/r-*.log | cut -c1-90 | tail -60" \
  "$eval_all wait; for f in \$OUT/eval-*.log; do echo \$f; grep -a -E '^eval |Error' \$f | sed -E 's/ (train_ce|tokens|ms_per_step|kda|norm|conv|engram|dspark|jepa)=[^ ]+//g' | cut -c1-120; done"
