#!/usr/bin/env bash
# gpu_pieces.sh [--gemma] - cut what a fresh GPU host needs into pieces that each fit one
# `run` call's carry beside the working tree, and print the calls that carry them.
#
# A call carries the working tree (tracked files and untracked ones git does not ignore) plus
# its `carry` paths, 64 MiB in all. The tree grows each session (33 MB after the eighteenth,
# once the stored chunk times became microsecond deltas: 62.8 MB before),
# so the piece size is what is left under 64 MiB, less 2 MiB for the job files a session's last
# call carries. The tree is counted as a tar holds it (a 512-byte header per file, each file
# padded to 512 bytes): its bare sizes fell 0.9-1.4 MB short of what the device tool refused on
# 2026-12-01 (1,245 files), the tar's count falls inside that window. Pieces go to .bundle/pc_* (the vLLM bundle's two parts, from
# ../shared/gpu/vllm-bundle.sh) and, with --gemma, .whl/c/cu13_* (FlashAttention 4's CUDA 13
# library, from scripts/gpu_wheels.sh fetch; the small wheels in .whl/b travel whole). Both
# folders are in .git/info/exclude. The plan's last call assembles everything; append the
# session's own command to it (scripts/gpu_session.sh ...).
set -euo pipefail
cd "$(dirname "$0")/.."
gemma=${1:-}
limit=$((64 * 1024 * 1024))
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
        xargs -0 -r stat -c %s 2>/dev/null | awk '{s += 512 + int(($1 + 511) / 512) * 512} END {print s + 0}')
piece=$(( (limit - tree - 2 * 1024 * 1024) / 1048576 * 1048576 ))
(( piece >= 4 * 1048576 )) || { echo "tree is $tree bytes: under 4 MiB left for a piece" >&2; exit 1; }
[[ -f .bundle/vllm-bundle.part01 && -f .bundle/vllm-bundle.part02 ]] ||
  { echo "no .bundle/vllm-bundle.part0{1,2}: bash ../shared/gpu/vllm-bundle.sh .bundle" >&2; exit 1; }
rm -f .bundle/pc_*
cat .bundle/vllm-bundle.part01 .bundle/vllm-bundle.part02 | split -b "$piece" -d -a 2 - .bundle/pc_
pieces=(.bundle/pc_*)
if [[ $gemma == --gemma ]]; then
  [[ -f .whl/c/NAME || -f .whl/a/NAME ]] ||
    { echo "no FlashAttention 4 wheels: bash scripts/gpu_wheels.sh fetch" >&2; exit 1; }
  if [[ ! -f .whl/c/NAME ]]; then mkdir -p .whl/c && cp .whl/a/NAME .whl/c/; fi
  src=(.whl/c/cu13_* ); [[ -e ${src[0]} ]] || src=(.whl/a/cu13_*)
  cat "${src[@]}" > /tmp/capplan-cu13.whl
  rm -f .whl/c/cu13_*
  split -b "$piece" -d -a 2 /tmp/capplan-cu13.whl .whl/c/cu13_ && rm /tmp/capplan-cu13.whl
fi
echo "# tree $tree bytes; pieces of $piece bytes"
echo "# call 1, carry [\"${pieces[0]}\", \".bundle/vllm-bundle.sha256\", \".bundle/vllm-install.sh\"]:"
echo "mkdir -p /tmp/vllm-parts /tmp/whl && cp ${pieces[0]} .bundle/vllm-bundle.sha256 .bundle/vllm-install.sh /tmp/vllm-parts/"
for p in "${pieces[@]:1}"; do
  echo "# carry [\"$p\"]:"; echo "cp $p /tmp/vllm-parts/"
done
if [[ $gemma == --gemma ]]; then
  echo "# carry [\".whl/b\"]:"; echo "cp .whl/b/* /tmp/whl/"
  for p in .whl/c/cu13_*; do echo "# carry [\"$p\"]:"; echo "cp $p /tmp/whl/"; done
fi
echo "# last call, carry [\".whl/c/NAME\", \"validation/_jobs\"] (the session's job files):"
n1=$(stat -c %s .bundle/vllm-bundle.part01)
last="cd /tmp/vllm-parts && cat pc_* > all && head -c $n1 all > vllm-bundle.part01"
last+=" && tail -c +$((n1 + 1)) all > vllm-bundle.part02 && rm all pc_* && sha256sum -c vllm-bundle.sha256 && cd - > /dev/null"
if [[ $gemma == --gemma ]]; then
  last+=" && cat /tmp/whl/cu13_* > \"/tmp/whl/\$(cat .whl/c/NAME)\" && rm -f /tmp/whl/cu13_*"
  last+=" && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cdsl-site /tmp/whl/*.whl"
fi
echo "$last && ..."
