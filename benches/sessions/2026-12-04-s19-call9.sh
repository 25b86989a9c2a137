#!/usr/bin/env bash
# Session 19, call 9. Carry .whl, .device-commit and .triton-cache.
# benches/swiglu_probe.py (at 22b462f, its kernels inline; they are model/swiglu_kernels.py's since):
# SwiGLU by 2-D tiled kernels against fla's at the `small` B 64 shape (fla's 102 / 176 us a call,
# ~2.9 TB/s, 8 calls of each a step).
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed swiglu-probe "python3 benches/swiglu_probe.py" 'fla|tiled|Error')")
exec bash benches/gpu_session.sh "${cmds[@]}"
