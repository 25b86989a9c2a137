#!/usr/bin/env bash
# Session 16, call 3: the short conv through dormouse's streaming Triton kernels (model/short_conv_kernels.py;
# q, k, v convolved as slices of the packed projection by one autograd Function whose backward writes one
# gradient, no cat), and the KDA output norm through fla's rms_norm_gated.
# Predicted at B 64 (session 15's profile, per step): the convs 24 x (48 + 179) us = 5.4 ms -> 24 x (33 + 66)
# us = 2.4 ms (call 2's probe), the projection's gradient cat (8 x 63 us = 0.5 ms) gone; the gated norm
# saves the sigmoid, its backward and three products over [B, T, H, K] bf16 (~3.8 GB a step at 4 TB/s:
# ~1 ms): about -4 ms of 48.2, to ~44 ms (~7.4e5 tokens/s).
#  1. GPU tests: the conv kernels against float64 and the packed Function against the plain path; the
#     norms (the gated one against float64); the graphed step and decode still equal to eager.
#  2. The probe again with the kernels as committed (fla beside them).
#  3. B 64 --cuda-graph, three arms twice each, interleaved: session 15's end (dc50c96), the gated norm
#     alone (febc5d7), this commit. Then B 10 at this commit.
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("timeout 200 python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_conv_fused.py tests/gpu/test_norm_fused.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py > \$OUT/gpu-tests.log 2>&1; grep -a -E 'PASS|FAIL|ERROR|passed|failed|^E ' \$OUT/gpu-tests.log | cut -c1-200 | tail -30")
cmds+=("timeout 100 python3 benches/conv_probe.py --packed 1672 > \$OUT/conv-probe-3.log 2>&1; tail -12 \$OUT/conv-probe-3.log")
base() {  # from inside .base-tree/<commit>, whose package comes first on sys.path
  echo "cd .base-tree/$1 && DORMOUSE_COMMIT=$1 python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
}
for i in 1 2; do
  cmds+=("$(timed b64-s15end-$i "($(base dc50c96) --batch-size 64 --note 'batch 64, session 15 end (dc50c96), arm $i of 3 arms x 2')")")
  cmds+=("$(timed b64-gated-$i "($(base febc5d7) --batch-size 64 --note 'batch 64, gated norm fused (febc5d7), arm $i of 3 arms x 2')")")
  cmds+=("$(timed b64-conv-$i "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, gated norm and own conv kernels, arm $i of 3 arms x 2'")")
done
cmds+=("$(timed b10-conv "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, gated norm and own conv kernels'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
