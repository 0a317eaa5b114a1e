#!/usr/bin/env bash
# gpu_validate.sh GPU DEADLINE_S JOB.json... - run validation jobs, one engine at a time, on
# one GPU of the host (CUDA_VISIBLE_DEVICES=GPU), so that several lanes can run side by side.
#
# Each job gets what is left of DEADLINE_S (the runner skips experiments that would end
# later); after every job the lane's raw output is packed into $OUT/validate-gpuGPU.tgz, so
# whatever finished comes back even if a later job dies.
set -u
gpu=${1:?usage: gpu_validate.sh GPU DEADLINE_S JOB.json...}
deadline=${2:?usage: gpu_validate.sh GPU DEADLINE_S JOB.json...}
shift 2
RAW=${RAW:-/tmp/capplan-validate}/gpu$gpu
OUT=${OUT:-/tmp/capplan-out}
mkdir -p "$RAW" "$OUT"
start=$SECONDS
pack() { tar czf "$OUT/validate-gpu$gpu.tgz.tmp" -C "$RAW" . && mv "$OUT/validate-gpu$gpu.tgz.tmp" "$OUT/validate-gpu$gpu.tgz"; }
for job in "$@"; do
  name=$(basename "$job" .json)
  left=$(( deadline - (SECONDS - start) ))
  if (( left < 120 )); then echo "[gpu$gpu] SKIP $name: ${left}s left"; continue; fi
  # a job started before (an earlier call on this host) resumes: a new folder, and the
  # runner skips the runs the earlier folders finished
  done_args=(); out="$RAW/$name"; n=1
  while [[ -e $out ]]; do done_args+=(--done "$out"); n=$((n + 1)); out="$RAW/start$n/$name"; done
  # the engine's start, its warm-ups and its first unfinished experiment must fit (runner.py
  # start_need_s, which takes a resumed job's start from its earlier starts on this host,
  # and counts the imports before the engine starts),
  # or the start is cut inside the compile and measures nothing
  need=$(( $(python3 src/capplan/validate/runner.py --job "$job" --start-need "${done_args[@]}") + 25 ))
  if (( left < need )); then echo "[gpu$gpu] SKIP $name: ${left}s left, its start and first experiment need ${need}s"; continue; fi
  mkdir -p "$(dirname "$out")"
  echo "[gpu$gpu] === $name (${left}s left, start $n) $(date -u +%T)"
  t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpu timeout --signal=INT --kill-after=20 "$left" \
    python3 src/capplan/validate/runner.py --job "$job" --out "$out" "${done_args[@]}" \
    --time-budget-s $(( left - 25 )) > "$out.log" 2>&1
  rc=$?
  grep -E '^(ENGINE|EXP|SKIP|FAIL|DONE)|capplan-runner|Traceback|Error' "$out.log" | sed "s/^/[gpu$gpu] /" | tail -n 40
  echo "[gpu$gpu] === END $name rc=$rc $((SECONDS - t0))s"
  [[ $rc != 0 ]] && tail -n 25 "$out.log" | sed "s/^/[gpu$gpu] /"
  pack
done
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$RAW/nvidia-smi.csv" 2>&1
pack
echo "[gpu$gpu] LANE END $((SECONDS - start))s"
