#!/usr/bin/env bash
# gpu_session.sh DEADLINE_S - one call on a GPU host, after the vLLM bundle install of
# ../shared/gpu/README.md, with two lanes where the host has two GPUs (one where it has one):
# each lane runs a calibration queue (scripts/gpu_calibrate.sh; lane 0
# QUEUE0=file into $OUT/raw0.tgz, lane 1 QUEUE=file into $OUT/raw.tgz) and then validation
# jobs (LANE0 / LANE1="job.json ...") on its own GPU, side by side, both stopped DEADLINE_S
# seconds from now.
# Sent again on the same host, both lanes resume where the last call stopped. This is how
# the 2026-11-29 data was measured (validation/logs/s3-*, calibration/_raw/device-call-s3-*).
set -u
deadline=${1:?}; shift
lane0=${LANE0:-}; queue0=${QUEUE0:-}; queue=${QUEUE:-}; lane1=${LANE1:-}
source /tmp/vllm-parts/vllm-install.sh /tmp/vllm-parts > /dev/null || exit 3
# FlashAttention 4's packages when scripts/gpu_wheels.sh installed them (Gemma 4 needs them)
[[ -d /tmp/cdsl-site ]] && export PYTHONPATH=/tmp/cdsl-site:/tmp/cdsl-site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_CACHE_ROOT=/tmp/vllm-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/capplan-out}; export OUT; mkdir -p "$OUT"
start=$SECONDS
# each lane on its own half of the host's cores, so that one lane's engine start (torch.compile
# workers) cannot take the other's. The slow stretches of CPU-bound steps this was meant to
# stop happen without it too, on a lone engine (docs/calibration.md, "The engine does not
# repeat itself"); the lane logs say whether a run was pinned.
pin0=() pin1=()
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if (( gpus < 2 )); then
  # one GPU: lane 0 alone, on every core (a lone engine's start wants them all)
  [[ -n $queue || -n $lane1 ]] && echo "one GPU: lane 1 (QUEUE, LANE1) is not run" >&2
  queue= lane1=
elif command -v taskset > /dev/null; then
  read -r cpus0 cpus1 < <(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])), ",".join(map(str, c[h:])))')
  [[ -n ${cpus1:-} ]] && pin0=(taskset -c "$cpus0") pin1=(taskset -c "$cpus1")
fi
# PROBE=1: scripts/cpu_probe.py times the host's CPU beside the lanes into $OUT/cpuprobe.jsonl.gz
probe=
if [[ ${PROBE:-} == 1 ]]; then python3 scripts/cpu_probe.py /tmp/cpuprobe.jsonl & probe=$!; fi
echo "pinned: ${pin0[*]:-no}" > "$OUT/lane0.log"; echo "pinned: ${pin1[*]:-no}" > "$OUT/lane1.log"
(
  # LANE0_FIRST=validate: lane 0 runs its validation jobs before its calibration queue
  if [[ ${LANE0_FIRST:-} == validate && -n $lane0 ]]; then
    "${pin0[@]}" bash scripts/gpu_validate.sh 0 "$deadline" $lane0; lane0=
  fi
  left=$(( deadline - (SECONDS - start) ))
  if [[ -n $queue0 ]]; then
    CUDA_VISIBLE_DEVICES=0 CAL=/tmp/capplan-cal0 PACK=raw0.tgz \
      "${pin0[@]}" bash scripts/gpu_calibrate.sh "$queue0" "$left"
  fi
  left=$(( deadline - (SECONDS - start) ))
  [[ -n $lane0 ]] && "${pin0[@]}" bash scripts/gpu_validate.sh 0 "$left" $lane0
) >> "$OUT/lane0.log" 2>&1 &
l0=$!
(
  # LANE1_FIRST=validate: lane 1 runs its validation jobs before its calibration queue
  if [[ ${LANE1_FIRST:-} == validate && -n $lane1 ]]; then
    "${pin1[@]}" bash scripts/gpu_validate.sh 1 "$deadline" $lane1; lane1=
  fi
  left=$(( deadline - (SECONDS - start) ))
  if [[ -n $queue ]]; then CUDA_VISIBLE_DEVICES=1 "${pin1[@]}" bash scripts/gpu_calibrate.sh "$queue" "$left"; fi
  left=$(( deadline - (SECONDS - start) ))
  [[ -n $lane1 ]] && "${pin1[@]}" bash scripts/gpu_validate.sh 1 "$left" $lane1
) >> "$OUT/lane1.log" 2>&1 &
l1=$!
wait "$l0" "$l1"
if [[ -n $probe ]]; then kill "$probe"; wait "$probe"; gzip -c /tmp/cpuprobe.jsonl > "$OUT/cpuprobe.jsonl.gz"; fi
grep -hE '^pinned|^\[gpu|^===|^ENGINE|^SKIP|STOP|QUEUE END|rc=' "$OUT"/lane*.log | cut -c1-240 | tail -n 80
ls -la "$OUT"
