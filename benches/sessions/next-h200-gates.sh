#!/usr/bin/env bash
# Planned device call (not run yet): the IEEE-fp32 KDA gate alone with the whole call (it never finished
# in 61-190 s), then the fla KDAForCausalLM baseline and torch.compile of the small step if time is left.
# Write .device-commit first (benches/gpu_session.sh) and carry .whl and .device-commit.
exec bash benches/gpu_session.sh \
  "python3 benches/kda_gpu_gate.py --dtype fp32 --out \$OUT/gate-fp32.json > \$OUT/gate-fp32.log 2>&1; tail -20 \$OUT/gate-fp32.log" \
  "python3 -m dormouse bench --preset small --dtype bf16 --compile --note 'torch.compile of the replica'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --model fla-kda --warmup 2 --steps 10 --note 'baseline: fla KDAForCausalLM, same sizes; eager'"
