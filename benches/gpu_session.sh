#!/usr/bin/env bash
# One device call on the lent H200: fla wheels from .whl/, the Triton cache carried in .triton-cache/
# (split tgz), then the commands given as arguments; $OUT/results.tgz brings back benches/history.tsv
# and benches/logs/ (the rows `dormouse bench` appended there), fla's kernel choices ($OUT/fla-pin) and
# whatever the commands wrote under $OUT.
#   bash benches/gpu_session.sh "python3 benches/kda_gpu_gate.py --out \$OUT/gate.json" ...
# Back here: python benches/collect_session.py <the call's files_at> benches/logs/<session>.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache FLA_CACHE_RESULTS=1
# The copied tree's git metadata is not the tree's: the caller writes the real commit first, e.g.
#   echo "$(git rev-parse --short HEAD)$(git status --porcelain | grep -q . && echo -dirty)" > .device-commit
# and carries .device-commit; `dormouse bench` puts it in the rows' commit column.
if [[ -f .device-commit ]]; then export DORMOUSE_COMMIT="$(cat .device-commit)"; fi
# Every process that imports fla through dormouse writes its kernel choices here at exit (fla's format);
# merge them into the committed pin with benches/merge_fla_pin.py <dir>.
export DORMOUSE_FLA_DUMP="${DORMOUSE_FLA_DUMP:-$OUT/fla-pin}"
mkdir -p "$TRITON_CACHE_DIR"
started=$(mktemp)  # kernels compiled after this are this call's (TRITON_CACHE_BACK below)
if compgen -G ".triton-cache/tc.tgz.part_*" >/dev/null; then cat .triton-cache/tc.tgz.part_* | tar xz -C "$TRITON_CACHE_DIR"; fi
# Commands share one deadline (GPU_SESSION_SECONDS, default 540) so that the packing below always runs
# inside the device call's limit: each gets at most what is left, less 45 s for packing.
deadline=$((SECONDS + ${GPU_SESSION_SECONDS:-540} - 45))
status=0
for cmd in "$@"; do
  left=$((deadline - SECONDS))
  if ((left < 5)); then echo "== skipped (deadline): $cmd"; status=124; continue; fi
  echo "== [$SECONDS s, $left s left] $cmd"
  # LEFT_S: what is left for this command, for one that must stop itself in time to keep its results
  LEFT_S=$left timeout "$left" bash -c "$cmd" || status=$?
done
echo "== [$SECONDS s] packing"
# The device tool returns at most 8 files: everything goes back as one results.tgz (the bench rows and
# logs, fla's kernel choices, whatever the commands wrote under $OUT).
cp benches/history.tsv "$OUT/history.tsv" && cp -r benches/logs "$OUT/bench-logs"
tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
# With TRITON_CACHE_BACK=1 the compiled kernels come back too, as 15 MiB parts (tc.tgz.part_*; at most
# 45 MiB, what the device returns beside results.tgz): put them in .triton-cache/ and carry it, and the
# next call skips the minutes of compiling. Over 45 MiB, only the kernels compiled in this call.
if [[ -n "${TRITON_CACHE_BACK:-}" ]]; then
  limit=$((45 * 1024 * 1024))
  tar czf /tmp/tc.tgz -C "$TRITON_CACHE_DIR" .
  if (($(stat -c %s /tmp/tc.tgz) > limit)); then
    (cd "$TRITON_CACHE_DIR" && find . -mindepth 1 -maxdepth 1 -newer "$started" -print0 | tar czf /tmp/tc.tgz --null -T -)
  fi
  if (($(stat -c %s /tmp/tc.tgz) <= limit)); then split -b 15M /tmp/tc.tgz "$OUT/tc.tgz.part_"; else
    echo "== the Triton cache is over 45 MiB even without the carried kernels: not returned"; fi
fi
exit $status
