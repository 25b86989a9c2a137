#!/usr/bin/env bash
# Session 14, call 3 (item 5 of next-h200-speed.sh): `small` B 10 bf16 --cuda-graph with --baselines:
# dormouse, the SDPA GPT and fla's KDAForCausalLM timed in one process, so the ratios come from one run
# on one card (fla's model autotunes its own kernels for minutes on first use). Carry .whl, .gpu-data,
# .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --cuda-graph --data $V"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "s=\$EPOCHREALTIME; timeout 480 python3 -m dormouse bench $S --dtype bf16 --batch-size 10 --baselines --note 'dormouse with both baselines in one process' > \$OUT/baselines.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/baselines.log; grep -a -E 'ms_per_step|first_step|Error|model:' \$OUT/baselines.log | cut -c1-200"
