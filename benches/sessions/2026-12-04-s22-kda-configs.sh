#!/usr/bin/env bash
# Session 22, call 4: fla's KDA kernel choices at batch 64. The pin holds Triton's choices at batch 10
# (fla's autotune keys leave the batch out); session 18 found a whole re-tune at B 64 no faster, in one arm
# each on machines that spread 2 ms. Here per kernel:
#  1. benches/kda_config_probe.py: every config of the six largest KDA kernels, timed as one layer's mixer
#     forward and backward at [64, 512, 8, 64]; writes $OUT/kda/pin with the faster choices.
#  2. B 64 interleaved three times: this commit with the committed pin, and with $OUT/kda/pin.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed kda-config-probe "python3 benches/kda_config_probe.py --out \$OUT/kda" 'ms|fastest|Error|not run')")
interleaved 3 \
  b64-pin "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, committed pin, round \$round of 3'" \
  b64-b64pin "FLA_CONFIG_DIR=\$OUT/kda/pin FLA_CACHE_MODE=fuzzy python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, KDA kernels chosen at B 64 (kda_config_probe), round \$round of 3'"
exec bash benches/gpu_session.sh "${cmds[@]}"
