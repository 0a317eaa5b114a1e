#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued (the thirty-sixth and thirty-seventh sessions had no lease that held):
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on another lease
#         (validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a third time
#         (calibration/_plans/queue-s36.txt);
#   H100: the same rows on a fourth H100 lease (validation/h100-next.yaml), then the H100's
#         first 4-bit profile, Qwen3-32B AWQ (calibration/_plans/h100/queue-s35.txt).
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0=calibration/_plans/queue-s36.txt \
    LANE0=/tmp/keep/llama-3.1-8b-bf16-lease.json bash scripts/gpu_session.sh "$deadline"
else
  LANE0_FIRST=validate QUEUE0=calibration/_plans/h100/queue-s35.txt \
    LANE0=/tmp/keep/llama-3.1-8b-bf16-lease-h100.json bash scripts/gpu_session.sh "$deadline"
fi
