#!/usr/bin/env bash
# gpu_wheels.sh fetch|install - the FlashAttention-4 packages vLLM 0.26.0 needs for Gemma 4
# (512-wide heads: FA3 cannot run them on SM90, so vLLM picks FA4, a CuTe-DSL kernel), which
# the vLLM bundle of ../shared/gpu leaves out. docs/calibration.md says why.
#
#   fetch    (here, with network) download the wheels into .whl/ (ignored by git): the small
#            ones in .whl/b, the 88 MB CUDA 13 library cut into .whl/a/cu13_00 to 05
#            (15 MB each) so that each call's carry, the working tree's ~46 MB included,
#            stays under 64 MiB
#   install  (on the GPU host, after the parts were carried and copied to /tmp/whl, the
#            last one perhaps only carried) put them together and install into
#            /tmp/cdsl-site; then `source` this file's last line or let
#            scripts/gpu_session.sh pick /tmp/cdsl-site up
#
# Carry plan: `bash scripts/gpu_pieces.sh --gemma` cuts the vLLM bundle and the CUDA 13 wheel
# into pieces that fit beside today's working tree (into .whl/c) and prints the calls that
# carry them; its last call does what `install` does. Each call costs a few seconds of device
# time; the machine is given back 30 s after a call.
set -euo pipefail
case ${1:?usage: gpu_wheels.sh fetch|install} in
fetch)
  plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64)
  rm -rf .whl/a .whl/b && mkdir -p .whl/a .whl/b
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d .whl/b \
    nvidia-cutlass-dsl==4.6.0 nvidia-cutlass-dsl-libs-base==4.6.0 \
    nvidia-cutlass-dsl-libs-core==4.6.0 nvidia-cutlass-dsl-libs-cu13==4.6.0 \
    quack-kernels==0.6.0 cuda-python==13.4.4 nvidia-cuda-nvdisasm==13.5.37 protobuf==6.33.6
  mv .whl/b/nvidia_cutlass_dsl_libs_cu13-*.whl .whl/
  (cd .whl && split -b 15000000 -d nvidia_cutlass_dsl_libs_cu13-*.whl a/cu13_ &&
   basename nvidia_cutlass_dsl_libs_cu13-*.whl > a/NAME && rm nvidia_cutlass_dsl_libs_cu13-*.whl)
  du -sh .whl/a .whl/b
  ;;
install)
  # the parts copied by earlier calls, and any carried by this one
  dir=.whl/c; [[ -f $dir/NAME ]] || dir=.whl/a  # gpu_pieces.sh's cut, or fetch's own
  for part in "$dir"/cu13_*; do [[ -e /tmp/whl/${part##*/} ]] || cp "$part" /tmp/whl/; done
  cat /tmp/whl/cu13_* > "/tmp/whl/$(cat "$dir/NAME")"
  rm -f /tmp/whl/cu13_*
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/cdsl-site /tmp/whl/*.whl
  # the `cutlass` package sits under nvidia_cutlass_dsl/dsl_packages, which the wheel's .pth
  # file adds only in a real site-packages: PYTHONPATH needs it by hand
  echo "export PYTHONPATH=/tmp/cdsl-site:/tmp/cdsl-site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
  ;;
esac
