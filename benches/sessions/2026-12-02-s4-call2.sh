#!/usr/bin/env bash
# Fourth H200 session of 2026-12-02, second call: the `small` step with --cuda-graph (forward and backward
# replayed; train/graphed.py) against eager in the same call, batch 10 and 64, bf16; then the GPU test
# that a graphed run equals the eager one bitwise.
# Run on the device from the repo root with .whl and .device-commit carried.
B="python3 -m dormouse bench --preset small --dtype bf16"
exec bash benches/gpu_session.sh \
  "$B --cuda-graph --profile 3 --note 'forward+backward replayed from one CUDA graph'" \
  "$B --note 'eager, same call as the cuda_graph row'" \
  "$B --cuda-graph --batch-size 64 --note 'forward+backward replayed from one CUDA graph'" \
  "timeout 240 python3 -m pytest -q -x tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; tail -25 \$OUT/test-graphed.log"
