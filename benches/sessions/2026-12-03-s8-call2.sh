#!/usr/bin/env bash
# Session 8, device call 2. Carry .whl, .gpu-data (ts-val = prepare --heldout-tail 0.1 --validation-tail 0.1),
# .device-commit and .triton-cache.
# Shrunk to the device time left after several refused starts. 1. Speed with this commit's defaults (fused
#    conv, safe_gate; fla imported without its package __init__s): `small` B 10 T 512, bf16, --cuda-graph;
#    the trainer's first-step line gives fla's import.
#    The KDA layer on CUDA against the chunked form with fla's in-kernel prep (--kda-prep-in-kernel), then
#    the candidate's shape benched with it.
# 2. Quality on the validation slice, 1800 steps with evals every 300 (weight decay 0.5 bottomed at 1800 of
#    2400 in session 7): arm A (the candidate) and B = weight decay 0.5 in one `dormouse ab` (recorded), then
#    two B arms against that A at once (--reuse-a), as two processes sharing the GPU: their results are
#    unaffected (runs repeat), their ms/step are not one process's, so they are not recorded as bench rows
#    (the A/B JSONs and logs are committed): weight decay 1.0; 0.5 with dropout 0.3.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --steps 1800 --eval-every 300"
export TRITON_CACHE_BACK=1
bench() {  # name, flags, note
  echo "python3 -m dormouse bench $2 --note '$3' > \$OUT/bench-$1.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s|first_step|import|kernels' \$OUT/bench-$1.log | cut -c1-200"
}
keep() {  # name: the A/B's JSON and each arm's metrics under $OUT
  echo "cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done"
}
ab_bg() {  # name, arm B's flags: one of the arms sharing the GPU
  echo "(timeout 240 python3 -m dormouse ab $C --a '' --b '$2' --reuse-a /tmp/ab1800-wd05 --out /tmp/$1 > \$OUT/$1.log 2>&1; $(keep "$1")) &"
}
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
exec bash benches/gpu_session.sh \
  "$(bench small-b10 "$S --batch-size 10" 'defaults of 3fec437: conv fused, safe_gate')" \
  "python3 -m pytest -v tests/gpu/test_kda_fla.py -k layer > \$OUT/test-layer.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-layer.log | cut -c1-160 | tail -12" \
  "$(bench cand-prep "--config configs/tinyshakespeare.toml --data $V --kda-prep-in-kernel" 'candidate shape, fla in-kernel prep')" \
  "python3 -m dormouse ab $C --a '' --b '--weight-decay 0.5' --record --out /tmp/ab1800-wd05 > \$OUT/ab1800-wd05.log 2>&1; $(keep ab1800-wd05); grep -a -E '^(overall|ms/step)' \$OUT/ab1800-wd05.log | cut -c1-150" \
  "$(ab_bg ab1800-wd1 '--weight-decay 1.0') $(ab_bg ab1800-wd05-drop3 '--weight-decay 0.5 --dropout 0.3') wait; grep -a -E '^(overall|ms/step)' \$OUT/ab1800-*.log | cut -c1-170"
