#!/usr/bin/env bash
# Session 19, call 3 (calls 1 and 2 carried .tl-carry/aa and .tl-carry/ab to the warm machine, each
# within the idle release of the one before; ignored folders stay between warm calls). Carry .whl,
# .gpu-data/ts-val, .device-commit, .triton-cache, .tl-carry/ac and .base-tree (43b40de, session 18's
# last commit: mkdir -p .base-tree/43b40de && git archive 43b40de dormouse | tar x -C .base-tree/43b40de).
#  1. tilelang's wheels (benches/fetch_tilelang_wheels.sh) installed into /tmp/site-tl.
#  2. GPU tests of this session's changes: the conv kernels with a dilation (the engram's conv now
#     fused), the bias added in the matmul (projections.affine_of), fla's in-kernel gate fed bf16.
#  3. B 64 A/B, interleaved twice: 43b40de; this commit (the gate's input uncast, g_b's bias in the
#     matmul, the engram conv fused); this commit with fla's TileLang backend (FLA_TILELANG=1: its
#     `chunk_kda_bwd_kernel_wy_dqkg_fused`, compiled by nvcc at first use: the first step's time is part
#     of the answer, the cold-start goal is 60 s).
#  4. This commit profiled at B 64; whether fla's registry offers TileLang for KDA; the KDA gate with it.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
install="mkdir -p /tmp/tlw && cat .tl-carry/*/tl.tar.part_* | tar x -C /tmp/tlw && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tl /tmp/tlw/*.whl && ls /tmp/site-tl | head -30"
TL="PYTHONPATH=/tmp/site-tl:\$PYTHONPATH FLA_TILELANG=1"
base="cd .base-tree/43b40de && DORMOUSE_COMMIT=43b40de python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
check="$TL python3 -c \"from dormouse.model import fla_kernels; fla_kernels.chunk_kda(); import fla.backends as b; import fla.ops.kda.backends; r = b._operation_registries['kda']; print('kda backends', [x.backend_type for x in r._get_sorted_backends()], 'active', r.get_active())\""
cmds=("$install")
cmds+=("$(pytest_cmd gpu-conv-proj 200 tests/gpu/test_conv_fused.py tests/gpu/test_projections_cuda.py "tests/gpu/test_kda_fla.py::test_in_kernel_gate_reads_bf16_input_with_the_cast_s_bits")")
interleaved 2 \
  b64-base "$base --note 'batch 64, session 18 (43b40de), round \$round of 2'" \
  b64-new "python3 -m dormouse bench $S --note 'batch 64, gate input uncast, g_b bias in the matmul, engram conv fused, round \$round of 2'" \
  b64-tilelang "$TL python3 -m dormouse bench $S --note 'batch 64, as b64-new with fla TileLang backend (FLA_TILELANG=1), round \$round of 2'"
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --profile 3 --note 'batch 64, gate input uncast, g_b bias in the matmul, engram conv fused, profiled'" 'ms_per_step|first_step|Error|device busy|device idle')")
cmds+=("$check")
cmds+=("$(timed gate-tilelang "$TL python3 benches/kda_gpu_gate.py --dtype bf16 --safe-gate --out \$OUT/gate-tilelang.json" 'Error|max|over|o |dq|dk|dv|dg')")
cmds+=("$(pytest_cmd gpu-graphed-step 150 tests/gpu/test_graphed_step.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
