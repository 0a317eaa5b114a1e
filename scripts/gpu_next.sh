#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued by the thirty-eighth session (whose leases, two H100s and an H200, ran both GPUs'
# queues of then), the forty-second and the forty-seventh:
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on one more lease, and
#         Qwen3-32B FP8's Poisson chat step- and core-traced (queued by the forty-second
#         session: the H200's Qwen3-32B has no graph-less core time yet;
#         validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a fourth time
#         (calibration/_plans/queue-s38.txt);
#   H100: examples/which-gpu.yaml's Qwen3-32B FP8 chat at the loads one replica of 4 and of 5
#         take, three minutes each, on a third host (validation/h100-next.yaml), queued by the
#         forty-seventh session, whose H100 leases ran them on two (plan5l, plan5lb), then
#         Qwen3-32B FP8 calibrated a seventh time with nine prompt-beside-decodes points
#         (calibration/_plans/h100/queue-s47.txt; a third call on the host, once the
#         validation engine is done, has the time for it).
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0=calibration/_plans/queue-s38.txt \
    LANE0="/tmp/keep/llama-3.1-8b-bf16-lease2.json /tmp/keep/qwen3-32b-fp8-h200-t.json" \
    bash scripts/gpu_session.sh "$deadline"
else
  LANE0_FIRST=validate QUEUE0=calibration/_plans/h100/queue-s47.txt \
    LANE0=/tmp/keep/qwen3-32b-fp8-h100-plan5lc.json \
    bash scripts/gpu_session.sh "$deadline"
fi
