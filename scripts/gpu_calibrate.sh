#!/usr/bin/env bash
# gpu_calibrate.sh QUEUE DEADLINE_S - run the calibration queue on a GPU host.
#
# QUEUE lines: NAME|MIN_S|runner args (from `capplan calibrate --emit-queue`). Jobs already
# done (listed in $CAL/done.txt) are skipped, so the same command can be sent again and
# continues where the last call stopped; a job cut short resumes at its first unfinished
# point. Each job gets at most what is left of DEADLINE_S; after every job the whole of
# $CAL is packed into $OUT/$PACK (raw.tgz unless set), so whatever finished comes back even if
# the call dies.
set -u
queue=${1:?usage: gpu_calibrate.sh QUEUE DEADLINE_S}
deadline=${2:-540}
CAL=${CAL:-/tmp/capplan-cal}
OUT=${OUT:-/tmp/capplan-out}
PACK=${PACK:-raw.tgz}
mkdir -p "$CAL" "$OUT"
touch "$CAL/done.txt"
start=$SECONDS
pack() { tar czf "$OUT/$PACK.tmp" -C "$CAL" . && mv "$OUT/$PACK.tmp" "$OUT/$PACK"; }
while IFS='|' read -r name min_s args; do
  [[ -z $name || $name == \#* ]] && continue
  grep -qx "$name" "$CAL/done.txt" && continue
  left=$(( deadline - (SECONDS - start) ))
  if (( left < min_s )); then echo "SKIP $name: ${left}s left, needs ${min_s}s"; continue; fi
  echo "=== JOB $name (${left}s left) $(date -u +%T)"
  t0=$SECONDS
  # rc 5: a point hung the engine (runner.py's watchdog); start it again past that point
  rc=5
  while [[ $rc == 5 ]] && (( deadline - (SECONDS - start) >= min_s / 2 )); do
    left=$(( deadline - (SECONDS - start) ))
    # shellcheck disable=SC2086 # args are a word list by design
    timeout --signal=INT --kill-after=15 "$left" python3 src/capplan/calibrate/runner.py $args \
      --out "$CAL/$name.jsonl" --meta "$CAL/$name.meta.json" >> "$CAL/$name.log" 2>&1
    rc=$?
    [[ $rc == 5 ]] && echo "HUNG $name: $(grep -o 'point [^ ]* hung' "$CAL/$name.log" | tail -n 1); again"
  done
  grep -E '^(ENGINE|POINT|TIME|DONE)|capplan-runner|Error|error' "$CAL/$name.log" | tail -n 60
  echo "=== END $name rc=$rc $((SECONDS - t0))s"
  echo "$name rc=$rc s=$((SECONDS - t0))" >> "$CAL/rc.txt"
  [[ $rc == 0 ]] && echo "$name" >> "$CAL/done.txt"
  pack
  # a failure after the engine started is a driver bug: stop rather than repeat it
  if [[ $rc != 0 && $rc != 124 && $rc != 5 ]] && grep -q '^ENGINE' "$CAL/$name.log"; then
    tail -n 40 "$CAL/$name.log"; echo "STOP: $name failed while measuring"; break
  fi
  [[ $rc != 0 ]] && tail -n 15 "$CAL/$name.log"
done < "$queue"
pack
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$CAL/nvidia-smi.csv" 2>&1
pack
echo "QUEUE END $((SECONDS - start))s"
