#!/usr/bin/env bash
# Planned device call (not run yet; written in session 17, whose device time was spent). The speed
# issue's open goal: batch 64 at >= 1e6 tokens/s (session 17: 7.97e5, 41.1 ms a step, 38.8 ms of kernels).
# NesterovSinkhorn's batched SR-Sinkhorn is ~280 small kernels a `small` step (~1.5 ms predicted from
# call 5's profile: the 70 row/column norms, their clamps, divisions and products); the probe times torch's
# form against a Triton candidate of three kernels an iteration, per shape group, in CUDA-graph replays,
# and checks the candidate against torch's numbers. Wire the candidate into train/optim.py only if the
# probe's total says ~1 ms a step is there. Carry .whl, .gpu-data, .device-commit and .triton-cache.
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "timeout 240 python3 benches/sinkhorn_probe.py --preset small > \$OUT/sinkhorn-probe.log 2>&1; tail -10 \$OUT/sinkhorn-probe.log"
