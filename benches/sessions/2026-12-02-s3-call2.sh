#!/usr/bin/env bash
# Third H200 session of 2026-12-02, second call: the step after batching NesterovSinkhorn by shape,
# fused AdamW on CUDA and one host sync per step; batch 64; torch.compile; tf32; the same-size
# baselines (plain SDPA GPT, fla's KDAForCausalLM); then the IEEE fp32 KDA gate with what is left.
# Run on the device from the repo root with .whl and .triton-cache carried.
N='batched Sinkhorn by shape, fused AdamW, one host sync per step'
exec bash benches/gpu_session.sh \
  "python3 -m dormouse bench --preset small --dtype bf16 --profile 3 --note '$N; eager'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --batch-size 64 --note '$N; eager; batch 64'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --model gpt --note 'baseline: plain SDPA GPT, 8 layers, same sizes; eager'" \
  "timeout 150 python3 -m dormouse bench --preset small --dtype bf16 --compile --note '$N; torch.compile (default mode)'" \
  "python3 -m dormouse bench --preset small --dtype tf32 --note '$N; eager; fp32 weights, TF32 matmuls and Triton dots'" \
  "timeout 150 python3 -m dormouse bench --preset small --dtype bf16 --model fla-kda --warmup 2 --steps 10 --note 'baseline: fla KDAForCausalLM, 8 layers, same sizes; eager'" \
  "python3 benches/kda_gpu_gate.py --dtype fp32 --out \$OUT/gate-fp32.json > \$OUT/gate-fp32.log 2>&1; tail -20 \$OUT/gate-fp32.log"
