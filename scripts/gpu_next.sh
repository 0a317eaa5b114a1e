#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued by the thirty-eighth session (whose leases, two H100s and an H200, ran both GPUs'
# queues of then) and the forty-first:
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on one more lease
#         (validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a fourth time
#         (calibration/_plans/queue-s38.txt);
#   H100: Llama-3.1-8B FP8's Poisson chat and long prompts in one traffic on another host,
#         step- and core-traced (validation/h100-next.yaml), then Qwen3-32B AWQ measured a
#         third time (calibration/_plans/h100/queue-s41c.txt), queued by the forty-first
#         session, whose three H100 leases ran the H100's queues of the fortieth and its own.
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0=calibration/_plans/queue-s38.txt \
    LANE0=/tmp/keep/llama-3.1-8b-bf16-lease2.json bash scripts/gpu_session.sh "$deadline"
else
  LANE0_FIRST=validate QUEUE0=calibration/_plans/h100/queue-s41c.txt \
    LANE0=/tmp/keep/llama-3.1-8b-fp8-h100-mix2.json bash scripts/gpu_session.sh "$deadline"
fi
