#!/usr/bin/env bash
# One device call on the lent H200: fla wheels from .whl/, the Triton cache carried in .triton-cache/
# (split tgz), then the commands given as arguments; the grown Triton cache is packed back into $OUT.
#   bash benches/gpu_session.sh "python3 benches/kda_gpu_gate.py --out \$OUT/gate.json" ...
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache FLA_CACHE_RESULTS=1
mkdir -p "$TRITON_CACHE_DIR"
if compgen -G ".triton-cache/tc.tgz.part_*" >/dev/null; then cat .triton-cache/tc.tgz.part_* | tar xz -C "$TRITON_CACHE_DIR"; fi
status=0
for cmd in "$@"; do
  echo "== $cmd"
  bash -c "$cmd" || status=$?
done
(cd "$TRITON_CACHE_DIR" && tar cz .) | split -b 15m - "$OUT/tc.tgz.part_"
exit $status
