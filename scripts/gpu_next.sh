#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued by the thirty-eighth session (whose leases, two H100s and an H200, ran both GPUs'
# queues of then), the forty-first and the forty-second:
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on one more lease, and
#         Qwen3-32B FP8's Poisson chat step- and core-traced (queued by the forty-second
#         session: the H200's Qwen3-32B has no graph-less core time yet;
#         validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a fourth time
#         (calibration/_plans/queue-s38.txt);
#   H100: Qwen3-32B FP8 with max_num_seqs 8 under closed-loop chat at 4, 16 and 32 users,
#         step- and core-traced (validation/h100-next.yaml), queued by the forty-second
#         session, whose three H100 leases ran the H100's queues of the forty-first
#         (Llama-3.1-8B FP8's mixed traffic on another host, Qwen3-32B AWQ measured a third
#         time) and its own (Qwen3-32B FP8's and AWQ's mixed traffic, FP8's under priority).
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0=calibration/_plans/queue-s38.txt \
    LANE0="/tmp/keep/llama-3.1-8b-bf16-lease2.json /tmp/keep/qwen3-32b-fp8-h200-t.json" \
    bash scripts/gpu_session.sh "$deadline"
else
  LANE0_FIRST=validate \
    LANE0=/tmp/keep/qwen3-32b-fp8-h100-seqs8.json \
    bash scripts/gpu_session.sh "$deadline"
fi
