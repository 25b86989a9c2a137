#!/usr/bin/env bash
# Session 18, call 5 (the session's last ~4 min of device time). Quality guard for the session's numerics
# changes (SR-Sinkhorn by Triton kernels: other summation order; the weights' gradients in fp32 from the
# matmul, not rounded to bf16; kda_recompute off: the same bits): the recipe's held-out run at seed 1,
# 1.9731 bpb at session 17's code (`h200-session17/recipe-seed1.log`).
# Carry .whl, .gpu-data/tinyshakespeare, .device-commit and .triton-cache.
source benches/sessions/heldout-run.sh
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "$(heldout_run_cmd recipe-seed1 "--config configs/tinyshakespeare.toml --seed 1")"
