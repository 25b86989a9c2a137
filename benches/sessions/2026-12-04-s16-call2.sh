#!/usr/bin/env bash
# Session 16, call 2: call 1's probe timed each call from the host (do_bench), and every input was a slice of
# the [.., 1672] packed projection, whose row stride (1672 elements, 3344 bytes) Triton cannot prove 16-byte
# aligned: vector loads shrink. Again, timed as CUDA-graph replays, for three inputs: a slice of [.., 1672],
# a slice of [.., 1680] (a multiple of 16) and a contiguous tensor. Beside fla's kernels and dormouse's tiled
# ones, a streaming prototype (each program walks its rows once, the last three inputs in registers).
# Predicted: if alignment is the cause, the 1680 and contiguous rows run at 2x-3x call 1's speeds.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "timeout 400 python3 benches/conv_probe.py > \$OUT/conv-probe-2.log 2>&1; cat \$OUT/conv-probe-2.log | tail -80"
