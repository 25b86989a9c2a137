#!/usr/bin/env bash
# The wheels of fla's TileLang backend (tilelang and its dependencies, for the H200 image's python 3.12),
# for an A/B of fla's TileLang `chunk_kda_bwd_kernel_wy_dqkg_fused` against its Triton one
# (docs/performance.md, Next). They weigh ~83 MB, more than one device call carries beside the tree
# (64 MiB in all, the tree ~21 MB), so they are tarred and split into folders .tl-carry/aa, ab, ...
# of 34 MB each, one carried per call to a warm machine (benches/sessions/2026-12-04-s19-call3.sh).
# Run from the project root; .tl-carry/ is ignored.
set -euo pipefail
dl=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dl" \
  tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 cloudpickle==3.1.3 ml-dtypes==0.7.0 \
  psutil==7.2.2 z3-solver==4.15.4.0
rm -rf .tl-carry && mkdir -p .tl-carry
tar cf - -C "$dl" . | split -b 34M - .tl-carry/tl.tar.part_
for part in .tl-carry/tl.tar.part_*; do
  folder=.tl-carry/${part##*_}
  mkdir -p "$folder" && mv "$part" "$folder/"
done
rm -rf "$dl"
ls -1 .tl-carry
