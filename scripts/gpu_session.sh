#!/usr/bin/env bash
# gpu_session.sh DEADLINE_S - one call on a two-GPU host, after the vLLM bundle install of
# ../shared/gpu/README.md: lane 0 runs validation jobs on GPU 0 (LANE0="job.json ..."), lane 1
# runs a calibration queue (QUEUE=file, scripts/gpu_calibrate.sh) and then validation jobs
# (LANE1="job.json ...") on GPU 1, side by side, both stopped DEADLINE_S seconds from now.
# Sent again on the same host, both lanes resume where the last call stopped. This is how
# the 2026-11-29 data was measured (validation/logs/s3-*, calibration/_raw/device-call-s3-*).
set -u
deadline=${1:?}; shift
lane0=${LANE0:-}; queue=${QUEUE:-}; lane1=${LANE1:-}
source /tmp/vllm-parts/vllm-install.sh /tmp/vllm-parts > /dev/null || exit 3
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_CACHE_ROOT=/tmp/vllm-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/capplan-out}; export OUT
start=$SECONDS
[[ -n $lane0 ]] && { bash scripts/gpu_validate.sh 0 "$deadline" $lane0 > "$OUT/lane0.log" 2>&1 & }
(
  if [[ -n $queue ]]; then CUDA_VISIBLE_DEVICES=1 bash scripts/gpu_calibrate.sh "$queue" "$deadline"; fi
  left=$(( deadline - (SECONDS - start) ))
  [[ -n $lane1 ]] && bash scripts/gpu_validate.sh 1 "$left" $lane1
) > "$OUT/lane1.log" 2>&1 &
wait
grep -hE '^\[gpu|^===|^ENGINE|^SKIP|STOP|QUEUE END|rc=' "$OUT"/lane*.log | cut -c1-240 | tail -n 80
ls -la "$OUT"
