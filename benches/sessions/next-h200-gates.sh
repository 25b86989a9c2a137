#!/usr/bin/env bash
# Planned device call (not run yet): the GPU test that a --cuda-graph run equals the eager one bitwise
# (killed at 200 s on a cold machine last time: give it the call's first 360 s), then the fla
# KDAForCausalLM baseline and torch.compile of the small step if time is left.
# Write .device-commit first (benches/gpu_session.sh) and carry .whl and .device-commit.
exec bash benches/gpu_session.sh \
  "timeout 360 python3 -m pytest -v -x tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; tail -20 \$OUT/test-graphed.log" \
  "python3 -m dormouse bench --preset small --dtype bf16 --model fla-kda --warmup 2 --steps 10 --note 'baseline: fla KDAForCausalLM, same sizes; eager'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --compile --note 'torch.compile of the replica'"
