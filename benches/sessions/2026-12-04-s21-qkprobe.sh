#!/usr/bin/env bash
# Session 21, call 2: the one-launch q/k/v conv with q, k normalised measured alone against what it replaced
# (three launches + fla's l2norm), with a sweep of its block sizes (call 1: its backward is slower than the
# three launches it replaced, and fla now rounds dq, dk to bf16 itself); the graphed step's GPU tests alone
# (call 1 ran them after test_kda_fla.py in one process: the one-sync test's update capture failed).
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed qkv-conv-probe "python3 benches/qkv_conv_probe.py" 'us|Error')")
cmds+=("$(pytest_cmd gpu-graphed-step-alone 200 tests/gpu/test_graphed_step.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
