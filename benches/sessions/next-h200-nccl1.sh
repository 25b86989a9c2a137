#!/usr/bin/env bash
# Planned device call (not run yet) for the multi-GPU issue while only one GPU is lent: the NCCL code
# paths on one H200 (torchrun with one process, --parallel ddp and fsdp, bf16, `small` on tinyshakespeare,
# 50 steps), then a resume of each at world size 1 without torchrun, whose held-out bpb must equal the
# checkpoint's. Carry .whl, .gpu-data and .device-commit.
D=.gpu-data/tinyshakespeare
RUN="--preset small --dtype bf16 --data $D --steps 50 --eval-every 50 --ckpt-every 50 --eval-bytes 65536"
exec bash benches/gpu_session.sh \
  "for p in ddp fsdp; do torchrun --nproc-per-node 1 -m dormouse train $RUN --parallel \$p --out /tmp/nccl-\$p > \$OUT/nccl-\$p.log 2>&1; grep -a -E '^(parallel|eval)' \$OUT/nccl-\$p.log | cut -c1-120; python3 -m dormouse eval /tmp/nccl-\$p >> \$OUT/nccl-\$p.log 2>&1; tail -2 \$OUT/nccl-\$p.log; done"
