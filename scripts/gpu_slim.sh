#!/usr/bin/env bash
# gpu_slim.sh hold|restore|plan - carry the vLLM bundle to a fresh GPU host in two calls, not
# a dozen.
#
# A `run` call carries the working tree and its `carry` paths, 64 MiB in all, and the tree is
# ~57 MB, most of it stored measurements no GPU call reads (validation/logs, calibration/h200,
# h100, _raw): that left 6 MiB pieces of the 78 MiB bundle for each call (gpu_pieces.sh), and
# twelve calls in a row on a machine that can be taken back between any two (it was, on
# 2026-12-05). `hold` moves those folders into .bundle/hold (ignored, so they do not travel;
# the GPU side needs only src/, scripts/, models/, calibration/_plans and _engines), `plan`
# cuts the bundle's two parts (../shared/gpu/vllm-bundle.sh .bundle) into 8 MiB pieces and
# groups them into folders .bundle/g1, g2 ... that each fit one call beside the slim tree,
# and prints the calls; `restore` moves the folders back (run it before any commit: `git
# status` shows them deleted while held).
set -euo pipefail
cd "$(dirname "$0")/.."
held=(validation/logs calibration/h200 calibration/h100 calibration/_raw)
case ${1:?hold, restore or plan} in
  hold)
    [[ -e .bundle/hold ]] && { echo ".bundle/hold exists: restore first" >&2; exit 1; }
    for d in "${held[@]}"; do mkdir -p ".bundle/hold/$(dirname "$d")"; mv "$d" ".bundle/hold/$d"; done
    echo "held: ${held[*]}" ;;
  restore)
    for d in "${held[@]}"; do
      if [[ -e .bundle/hold/$d ]]; then
        [[ -e $d ]] && { echo "$d exists beside .bundle/hold/$d: move one by hand" >&2; exit 1; }
        mv ".bundle/hold/$d" "$d"
      fi
    done
    rm -rf .bundle/hold; git status --short | head ;;
  plan)
    [[ -e .bundle/hold ]] || { echo "not held: bash scripts/gpu_slim.sh hold first" >&2; exit 1; }
    limit=$((64 * 1024 * 1024))
    tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
            xargs -0 -r stat -c %s 2>/dev/null | awk '{s += 512 + int(($1 + 511) / 512) * 512} END {print s + 0}') || true
    # (|| true: stat fails on the tracked files held away, which do not travel)
    room=$(( limit - tree - 4 * 1024 * 1024 ))  # 4 MiB for the job files and go.sh
    [[ -f .bundle/vllm-bundle.part01 && -f .bundle/vllm-bundle.part02 ]] ||
      { echo "no .bundle/vllm-bundle.part0{1,2}: bash ../shared/gpu/vllm-bundle.sh .bundle" >&2; exit 1; }
    # pieces far smaller than a call's room, so that the groups fill it (gpu_pieces.sh cuts
    # them to the whole tree's room, which the slim tree's first group could not hold)
    rm -rf .bundle/g[0-9]* .bundle/pc_*
    cat .bundle/vllm-bundle.part01 .bundle/vllm-bundle.part02 | split -b $((8 * 1024 * 1024)) -d -a 2 - .bundle/pc_
    g=1 used=0; mkdir -p .bundle/g1
    for p in .bundle/pc_*; do
      n=$(stat -c %s "$p")
      if (( used + n > room )); then g=$((g + 1)) used=0; mkdir -p ".bundle/g$g"; fi
      ln "$p" ".bundle/g$g/"; used=$((used + n))
    done
    cp .bundle/vllm-bundle.sha256 .bundle/vllm-install.sh ".bundle/g$g/"
    n1=$(stat -c %s .bundle/vllm-bundle.part01)
    echo "# slim tree $tree bytes; $g calls"
    for i in $(seq 1 "$g"); do
      echo "# call $i, carry [\".bundle/g$i\"$( ((i == g)) && echo ', "validation/_jobs"')]:"
      cmd="mkdir -p /tmp/vllm-parts && cp .bundle/g$i/* /tmp/vllm-parts/"
      # which card came, by its UUID too (the fifty-fourth session's NVFP4 decode tail did
      # not come back on the next lease's card, and neither lease had recorded which it was)
      (( i == 1 )) && cmd+=" && nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm,power.limit --format=csv > \$OUT/nvidia-smi.csv"
      if (( i == g )); then
        cmd+=" && cd /tmp/vllm-parts && cat pc_* > all && head -c $n1 all > vllm-bundle.part01"
        cmd+=" && tail -c +$((n1 + 1)) all > vllm-bundle.part02 && rm all pc_* && sha256sum -c vllm-bundle.sha256 && cd - > /dev/null && ..."
      fi
      echo "$cmd"
    done ;;
  *) echo "hold, restore or plan" >&2; exit 2 ;;
esac
