#!/usr/bin/env bash
# One call on a remote GPU machine that returns only what is written under $OUT: installs the wheels in
# .whl/ (fla, triton, ... built or downloaded beforehand: the machine has no network), unpacks a carried
# Triton cache (.triton-cache/tc.tgz.part_*), runs each argument as a bash command under one deadline,
# and packs everything under $OUT into $OUT/results.tgz.
#   bash benches/gpu_call.sh \
#     "dormouse bench --preset small --history \$OUT/history.tsv --log-dir \$OUT/logs" \
#     "python -m pytest tests/gpu -q"
# Environment: GPU_CALL_SECONDS (default 540) is the call's limit; TRITON_CACHE_BACK=1 also returns the
# compiled kernels; .device-commit (written beside the tree before the call) names the tree's commit.
set -uo pipefail
: "${OUT:?OUT names the folder whose contents come back}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    exit 1
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache FLA_CACHE_RESULTS=1
# A copied tree has no git history of its own: `dormouse bench` puts DORMOUSE_COMMIT in its rows instead.
#   echo "$(git rev-parse --short HEAD)$(git status --porcelain | grep -q . && echo -dirty)" > .device-commit
if [[ -f .device-commit ]]; then export DORMOUSE_COMMIT="$(cat .device-commit)"; fi
# Every process that imports fla through dormouse writes its kernel choices here at exit (fla's format):
# merge them into the committed pin with `python benches/merge_fla_pin.py <dir>`.
export DORMOUSE_FLA_DUMP="${DORMOUSE_FLA_DUMP:-$OUT/fla-pin}"
mkdir -p "$TRITON_CACHE_DIR"
started=$(mktemp) # kernels compiled after this are this call's (TRITON_CACHE_BACK below)
if compgen -G ".triton-cache/tc.tgz.part_*" >/dev/null; then cat .triton-cache/tc.tgz.part_* | tar xz -C "$TRITON_CACHE_DIR"; fi
# One deadline for all commands, so that the packing below always runs inside the call's limit: each
# command gets at most what is left, less 45 s for packing.
deadline=$((SECONDS + ${GPU_CALL_SECONDS:-540} - 45))
status=0
for cmd in "$@"; do
  left=$((deadline - SECONDS))
  if ((left < 5)); then
    echo "== skipped (deadline): $cmd"
    status=124
    continue
  fi
  echo "== [$SECONDS s, $left s left] $cmd"
  # LEFT_S: the seconds left to this command, for one that must stop itself in time to keep its results
  LEFT_S=$left timeout "$left" bash -c "$cmd" || status=$?
done
echo "== [$SECONDS s] packing"
# The machine returns few files: everything under $OUT goes back as one results.tgz.
tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
# With TRITON_CACHE_BACK=1 the compiled kernels come back too, as 15 MiB parts (tc.tgz.part_*, at most
# 45 MiB): put them in .triton-cache/ and carry it, and the next call skips the minutes of compiling.
# Over 45 MiB, only the kernels compiled in this call.
if [[ -n "${TRITON_CACHE_BACK:-}" ]]; then
  limit=$((45 * 1024 * 1024))
  tar czf /tmp/tc.tgz -C "$TRITON_CACHE_DIR" .
  if (($(stat -c %s /tmp/tc.tgz) > limit)); then
    (cd "$TRITON_CACHE_DIR" && find . -mindepth 1 -maxdepth 1 -newer "$started" -print0 | tar czf /tmp/tc.tgz --null -T -)
  fi
  if (($(stat -c %s /tmp/tc.tgz) <= limit)); then
    split -b 15M /tmp/tc.tgz "$OUT/tc.tgz.part_"
  else
    echo "== the Triton cache is over 45 MiB even without the kernels carried in: not returned"
  fi
fi
exit $status
