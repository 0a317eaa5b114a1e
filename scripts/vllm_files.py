"""List the Python files of a vLLM wheel, for the test that every vLLM source file capplan
cites exists in the release it models (tests/test_citations.py).

Usage: python scripts/vllm_files.py [--wheel vllm-0.26.0-*.whl] [--out FILE]
(`pip download --no-deps vllm==0.26.0 -d /tmp/vsrc` fetches the wheel.)
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import sys
import zipfile
from pathlib import Path

DEFAULT_WHEEL = "/tmp/vsrc/vllm-0.26.0-*.whl"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests/data/vllm-0.26.0-files.txt.gz"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", default=DEFAULT_WHEEL)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    wheels = sorted(glob.glob(args.wheel))
    if not wheels:
        sys.exit(f"no wheel matches {args.wheel}; pip download --no-deps vllm==0.26.0 first")
    wheel = Path(wheels[-1])
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as z:
        files = sorted(n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py"))
    # mtime 0: the same wheel gives the same bytes
    with open(args.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(f"# {wheel.name} sha256 {digest}\n".encode())
        f.write("".join(x + "\n" for x in files).encode())
    print(f"{args.out}: {len(files)} files of {wheel.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
