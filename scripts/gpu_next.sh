#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued by the thirty-eighth session (whose leases, two H100s and an H200, ran both GPUs'
# queues of then) and the thirty-ninth (whose two H100 leases ran the H100's, twice):
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on one more lease
#         (validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a fourth time
#         (calibration/_plans/queue-s38.txt);
#   H100: Qwen3-32B AWQ measured again on a fuller plan, then the draft-model profile's graph
#         scan (calibration/_plans/h100/queue-s39b.txt: the first alone takes ~460 s, so the
#         calibration queue goes first), then Qwen3-32B FP8's chat again on its graph-scanned
#         profile (validation/h100-next.yaml), if the call has time left (else send it again).
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0=calibration/_plans/queue-s38.txt \
    LANE0=/tmp/keep/llama-3.1-8b-bf16-lease2.json bash scripts/gpu_session.sh "$deadline"
else
  QUEUE0=calibration/_plans/h100/queue-s39b.txt \
    LANE0=/tmp/keep/qwen3-32b-fp8-h100-c.json bash scripts/gpu_session.sh "$deadline"
fi
