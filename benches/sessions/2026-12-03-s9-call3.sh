#!/usr/bin/env bash
# Session 9, device call 3 (the last of the session's device time). Carry .whl, .gpu-data, .device-commit
# and .triton-cache. Call 2: lr 2e-3 ended worse than 3e-3 at 1800 steps (+0.025, train ce 1.09 against
# 1.15: under AdamW's decoupled decay a lower lr also decays less), and fla's in-kernel prep took the
# candidate's step from 37.3 to 30.4 ms (its kernel choices are now in the pin).
# 1. `dormouse ab` (recorded), both arms with --kda-prep-in-kernel and weight decay 0.5: B = weight decay 1.0.
# 2. `small` B 10 T 512 bf16 --cuda-graph with the in-kernel prep (call 1 of session 8: 19.13 ms without).
# 3. Against the same arm A: B = a narrower model (d 384, 6 heads, SwiGLU 1152).
# 4. `small` B 64 T 512 with the in-kernel prep (the tokens/s goal).
# Since 7f7e8ce the input projections run as one matmul each (KDA's six, SwiGLU's two), in every step here:
# 0. the candidate's shape with the in-kernel prep, against call 2's 30.38 ms without the fused projections.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --steps 1800 --eval-every 300 --kda-prep-in-kernel --weight-decay 0.5"
export TRITON_CACHE_BACK=1
bench() {  # name, flags, note
  echo "python3 -m dormouse bench $2 --note '$3' > \$OUT/bench-$1.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s|first_step|import|kernels' \$OUT/bench-$1.log | cut -c1-200"
}
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --kda-prep-in-kernel --data $V"
exec bash benches/gpu_session.sh \
  "$(bench cand-prep-fused "--config configs/tinyshakespeare.toml --data $V --kda-prep-in-kernel" 'candidate shape, in-kernel prep, fused input projections')" \
  "python3 -m dormouse ab $C --a '' --b '--weight-decay 1.0' --record --out /tmp/ab-wd1 > \$OUT/ab-wd1.log 2>&1; $(keep ab-wd1); grep -a -E '^(overall|ms/step)' \$OUT/ab-wd1.log | cut -c1-150" \
  "$(bench small-b10-prep "$S --batch-size 10" 'fla in-kernel prep')" \
  "python3 -m dormouse ab $C --a '' --b '--d-model 384 --n-heads 6 --ffn-hidden 1152' --reuse-a /tmp/ab-wd1 --record --out /tmp/ab-d384 > \$OUT/ab-d384.log 2>&1; $(keep ab-d384); grep -a -E '^(overall|ms/step)' \$OUT/ab-d384.log | cut -c1-150" \
  "$(bench small-b64-prep "$S --batch-size 64" 'fla in-kernel prep, batch 64')"
