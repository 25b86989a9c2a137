#!/usr/bin/env bash
# Planned (written in session 18, not run). fla 0.6.0's TileLang `chunk_kda_bwd_kernel_wy_dqkg_fused`
# against its Triton one (3.65 ms of a `small` B 64 step, ~1.5 TB/s; docs/performance.md, Next).
# The wheels (~83 MB) do not fit one call's carry: `bash benches/fetch_tilelang_wheels.sh` splits them into
# .tl-carry/aa, ab, ac, and two calls land the first parts on a machine kept warm (the next call within
# its idle release, ~30 s; ignored folders stay between warm calls):
#   run "ls -la .tl-carry"  carry [".tl-carry/aa"]
#   run "ls -la .tl-carry"  carry [".tl-carry/ab"]
#   run "GPU_SESSION_SECONDS=480 bash benches/sessions/next-h200-tilelang.sh"
#       carry [".whl", ".gpu-data/ts-val", ".device-commit", ".triton-cache", ".tl-carry/ac"]
# This third call installs them, checks that fla's registry offers TileLang for KDA (it needs nvcc:
# the image has 13.0), runs the KDA gate with it in bf16, then B 64 with FLA_TILELANG=0 (dormouse's
# default since session 18) and =1, twice each, interleaved. TileLang compiles its kernel with nvcc at
# first use: the first step's time is part of the answer (the cold-start goal is 60 s).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
install="mkdir -p /tmp/tlw && cat .tl-carry/*/tl.tar.part_* | tar x -C /tmp/tlw && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tl /tmp/tlw/*.whl && ls /tmp/site-tl"
TL="PYTHONPATH=/tmp/site-tl:\$PYTHONPATH FLA_TILELANG=1"
check="$TL python3 -c \"from dormouse.model import fla_kernels; fla_kernels.chunk_kda(); import fla.backends as b; import fla.ops.kda.backends; r = b._operation_registries['kda']; print('kda backends', [x.backend_type for x in r._get_sorted_backends()], 'active', r.get_active())\""
cmds=("$install" "$check")
cmds+=("$(timed gate-tilelang "$TL python3 benches/kda_gpu_gate.py --dtype bf16 --safe-gate --out \$OUT/gate-tilelang.json" 'Error|max|over|o |dq|dk|dv|dg')")
interleaved 2 \
  b64-triton "python3 -m dormouse bench $S --note 'batch 64, fla KDA backward by Triton, round \$round of 2'" \
  b64-tilelang "$TL python3 -m dormouse bench $S --note 'batch 64, fla wy_dqkg backward by TileLang, round \$round of 2'"
exec bash benches/gpu_session.sh "${cmds[@]}"
