#!/usr/bin/env bash
# Session 13, call 3 (the rest of the device budget): the fla pin's GPU test at the recipe's new shape
# (T 1024, B 16), next-h200-nccl1.sh's one-GPU NCCL runs (torchrun, ddp and fsdp, each resumed without
# torchrun), then two more candidates against the recipe of call 2 (configs/tinyshakespeare.toml: 1024 x 16,
# byte noise 0.1, lr floor 0.5), 3 seeds at 1000 steps on the validation slice, in one `dormouse ab`:
#   d1 windows of 2048 x 8 (the same bytes per step; 256 -> 1024 was -0.038 alone)
#   d2 byte noise 0.15 (0.05 -> 0.1 was -0.026 alone)
# The pick is call 2's rule (2026-12-03-s13-pick.py, fixed before the call): among those whose 95% interval
# lies below 0, the lowest mean validation bpb reads the held-out tail once (recipe-s13b.*). None: nothing.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
C="--config configs/tinyshakespeare.toml --eval-every 250 --record"
N="--preset small --dtype bf16 --data $D --steps 50 --eval-every 50 --ckpt-every 50 --eval-bytes 65536"
declare -A B=([d1]="--seq-len 2048 --batch-size 8" [d2]="--byte-noise 0.15")
cmds=(
  "python3 -m pytest -q tests/gpu/test_fla_pin_gpu.py > \$OUT/test-fla-pin.log 2>&1; tail -1 \$OUT/test-fla-pin.log"
  "for p in ddp fsdp; do timeout 60 torchrun --nproc-per-node 1 -m dormouse train $N --parallel \$p --out /tmp/nccl-\$p > \$OUT/nccl-\$p.log 2>&1; grep -a -E '^(parallel|eval)' \$OUT/nccl-\$p.log | cut -c1-120; timeout 30 python3 -m dormouse eval /tmp/nccl-\$p >> \$OUT/nccl-\$p.log 2>&1; tail -2 \$OUT/nccl-\$p.log | cut -c1-160; done"
)
source benches/sessions/ab-rows.sh
ab_rows_cmd "python3 -m dormouse ab $C --data $V --steps 1000 --seeds 3" d- "d1 d2"
pick="python3 benches/sessions/2026-12-03-s13-pick.py \$OUT d- '${B[d1]}' '${B[d2]}' > \$OUT/pick-d.txt 2>&1; cat \$OUT/pick-d.txt"
cmds+=("$pick; f=\$(sed -n 's/^picked //p' \$OUT/pick-d.txt); [[ -n \$f && \$f != none ]] || exit 0; s=\$EPOCHREALTIME; python3 -m dormouse train $C \$f --data $D --out /tmp/recipe-s13b > \$OUT/recipe-s13b.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe-s13b.log; cp /tmp/recipe-s13b/metrics.jsonl \$OUT/recipe-s13b.metrics.jsonl; cp /tmp/recipe-s13b/curves.png \$OUT/recipe-s13b.curves.png; tr '\\r' '\\n' < \$OUT/recipe-s13b.log | grep -a -E '^eval|first step' | cut -c1-200")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
