#!/usr/bin/env bash
# Third H200 session of 2026-12-02, first call: measurements before any speed change.
# small bf16 step with a profile; the KDA op's chunked and recurrent backends at the gate shape; a short
# tinyshakespeare run of small (DSpark on) for `dormouse replay` and decode bytes/s; then the IEEE fp32
# KDA gate with the committed pin (it never finished autotuning without one).
# Run on the device from the repo root with .whl, .triton-cache and .gpu-data carried.
D=.gpu-data/tinyshakespeare
R=/tmp/run-small
exec bash benches/gpu_session.sh \
  "python3 -m dormouse bench --preset small --dtype bf16 --profile 3 --note 'every default arm on; eager; after the q/k dtype fix'" \
  "python3 -m dormouse bench --op kda --preset small --dtype bf16 --kda-backend chunked --steps 10 --note 'kda_chunked (PyTorch) at the gate shape'" \
  "python3 -m dormouse bench --op kda --preset small --dtype fp32 --kda-backend recurrent --warmup 1 --steps 3 --note 'kda_recurrent (loop over t) at the gate shape'" \
  "python3 -m dormouse train --preset small --dtype bf16 --data $D --steps 300 --dspark-weight 0.1 --eval-every 300 --ckpt-every 150 --out $R > \$OUT/train-small.log 2>&1; cp $R/metrics.jsonl \$OUT/ 2>/dev/null; tail -5 \$OUT/train-small.log" \
  "python3 -m dormouse replay $R --step 150 > \$OUT/replay-small.log 2>&1; tail -8 \$OUT/replay-small.log" \
  "for s in '' --speculative; do python3 -m dormouse generate $R --ckpt last --prompt 'ROMEO:' --max-bytes 512 --temperature 0 \$s > \$OUT/generate\$s.log 2>&1; tail -6 \$OUT/generate\$s.log; done" \
  "python3 benches/kda_gpu_gate.py --dtype fp32 --out \$OUT/gate-fp32.json > \$OUT/gate-fp32.log 2>&1; tail -20 \$OUT/gate-fp32.log"
