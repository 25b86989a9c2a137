#!/usr/bin/env bash
# Session 18, call 1. The speed issue's open goal: batch 64 at >= 1e6 tokens/s (41.1 ms a step, 38.8 ms of
# kernels in session 17). Two probes, then an A/B:
#  1. benches/sinkhorn_probe.py: NesterovSinkhorn's SR-Sinkhorn in torch against a Triton candidate.
#  2. benches/fla_tune_probe.py: fla's KDA backward kernels (~7.5 ms a step) re-tuned at B 64 (the pin's
#     choices were made at other shapes: fla's autotune keys hold no batch or length); the fastest
#     choices written to $OUT/pin-b64 (the probe's own dump off: the committed pin changes only by hand).
#  3. B 64 --cuda-graph, the committed pin and $OUT/pin-b64, two arms x 2 interleaved.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
# As run: the tune probe stopped at once (it built the Trainer without `corpus_note`), so $OUT/pin-b64 was
# never written and the second arm ran fla with a config folder of no files: every fla kernel autotuned
# by Triton at B 64 (first step 481 s), then 42.16 ms against the pin's 41.21 in the same call. Re-tuning
# at B 64 showed no gain; the probe was removed unrun (it is in this commit's history, cd6a68d).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
BWD=chunk_kda_bwd_kernel_wy_dqkg_fused,chunk_kda_bwd_kernel_intra,recompute_w_u_fwd_kda_kernel,chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64,chunk_kda_bwd_kernel_dAv
NEW="DORMOUSE_FLA_DUMP= FLA_CONFIG_DIR=\$OUT/pin-b64 FLA_CACHE_MODE=fuzzy"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=(
  "$(timed sinkhorn-probe "timeout 150 python3 benches/sinkhorn_probe.py --preset small" 'us|Error')"
  "$(timed tune-bwd "DORMOUSE_FLA_DUMP= python3 benches/fla_tune_probe.py --data $V --kernels $BWD --write-pin \$OUT/pin-b64" '==|fastest|all re-tuned|Error')"
)
for i in 1 2; do
  cmds+=("$(timed b64-pin-$i "python3 -m dormouse bench $S --note 'batch 64, the committed fla pin, arm $i of 2 arms x 2'")")
  cmds+=("$(timed b64-pinb64-$i "$NEW python3 -m dormouse bench $S --note 'batch 64, fla backward kernels re-tuned at B 64 (pin-b64), arm $i of 2 arms x 2'")")
done
exec bash benches/gpu_session.sh "${cmds[@]}"
