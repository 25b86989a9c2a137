#!/usr/bin/env bash
# Session 9, call 4: the last ~110 s of device time: the graphed-step GPU test's random-depth case
# (one captured graph per loop depth, graph == eager bitwise), built after call 3. Carry .whl and .triton-cache.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/triton-cache FLA_CACHE_RESULTS=1
mkdir -p $TRITON_CACHE_DIR && cat .triton-cache/tc.tgz.part_* | tar xz -C $TRITON_CACHE_DIR
timeout 80 python3 -m pytest -x -q tests/gpu/test_graphed_step.py -k "rand" 2>&1 | tail -15
