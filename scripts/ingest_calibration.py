"""Store what a GPU session's calibration lanes brought back under calibration/_raw.

    python scripts/ingest_calibration.py SESSION LANE_DIR... [--replace NAME...] [--dry-run]

Each LANE_DIR is an unpacked `raw.tgz` of scripts/gpu_calibrate.sh (NAME.jsonl, NAME.meta.json,
NAME.log, rc.txt; a KV-only engine has no NAME.jsonl; a drain scan's NAME.traces/, the
runner's --trace-points, whose step records and long calls are stored xz-compressed and
whose table is stored as it is, under `_raw/NAME.traces/`, the Chrome traces left in the
lane: tens of MB, for a local viewer; and a core trace's `coretrace/core-<pid>.jsonl`,
xz-compressed, from runner.py --trace-core). Every run there whose rc.txt line
ended rc=0 is stored as `calibration/_raw/NAME.jsonl.xz` + `NAME.meta.json` (the meta gains
`runner_commit`: the last commit that touched the runner, or --runner-commit), its log as
`_raw/logs-SESSION/NAME.log.gz`, its rc.txt line appended to `_raw/rc.txt`. A run already
stored is kept unless named in --replace, when the stored files move to
`_raw/superseded-SESSION/` first (with their rc.txt lines). Nothing is written until every
check has passed. Then rebuild: `capplan calibrate --from-raw calibration/_raw`. Another GPU's
runs go to their own folder (`--raw calibration/_raw/h100`; store.raw_dir), rebuilt with
`capplan calibrate --gpu h100 --from-raw calibration/_raw/h100`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

RAW = Path("calibration/_raw")
RUNNER = "src/capplan/calibrate/runner.py"


def runner_commit() -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%h", "--", RUNNER],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def finished(lane: Path) -> dict[str, str]:
    """NAME -> its rc.txt line, for the runs of this lane that ended rc=0."""
    rc = lane / "rc.txt"
    if not rc.exists():
        return {}
    runs = {}
    for line in rc.read_text().splitlines():
        name, _, rest = line.partition(" ")
        if "rc=0" in rest.split():
            runs[name] = line
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("session", help="tag for the logs and superseded folders, e.g. s9")
    ap.add_argument("lanes", nargs="+", type=Path)
    ap.add_argument("--replace", nargs="*", default=[], help="runs whose stored copy this "
                    "session's run supersedes")
    ap.add_argument("--runner-commit", help="the commit the GPU host ran (default: the last "
                    "one that touched the runner)")
    ap.add_argument("--raw", type=Path, default=RAW, help="where the runs are stored "
                    "(default calibration/_raw, the H200's; another GPU's go apart, e.g. "
                    "calibration/_raw/h100, since run names do not name the GPU)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    raw: Path = args.raw

    plan: list[tuple[str, Path, str]] = []
    for lane in args.lanes:
        for name, line in finished(lane).items():
            if not (lane / f"{name}.meta.json").exists():
                sys.exit(f"{lane}: {name} ended rc=0 but its .meta.json is missing")
            kv_only = json.loads((lane / f"{name}.meta.json").read_text()).get(
                "args", {}).get("kv_only")
            if not kv_only and not (lane / f"{name}.jsonl").exists():
                sys.exit(f"{lane}: {name} ended rc=0 but its .jsonl is missing (a timed run)")
            stored = (raw / f"{name}.meta.json").exists()
            if stored and name not in args.replace:
                sys.exit(f"{raw / name} is stored already; pass --replace {name} to "
                         "supersede it, or store the new run as NAME--rN")
            plan.append((name, lane, line))
    unknown = set(args.replace) - {name for name, _, _ in plan}
    if unknown:
        sys.exit(f"--replace names runs no lane finished: {', '.join(sorted(unknown))}")
    if not plan:
        sys.exit("no finished runs (rc=0 in rc.txt) in " + ", ".join(map(str, args.lanes)))
    commit = args.runner_commit or runner_commit()
    for name, lane, _ in plan:
        print(f"{'replace' if name in args.replace else 'new'} {name} from {lane}")
    if args.dry_run:
        return 0

    logs, old = raw / f"logs-{args.session}", raw / f"superseded-{args.session}"
    raw.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    rc_lines = (raw / "rc.txt").read_text().splitlines() if (raw / "rc.txt").exists() else []
    for name, lane, line in plan:
        if name in args.replace:
            old.mkdir(exist_ok=True)
            for suffix in (".jsonl.xz", ".jsonl.gz", ".meta.json"):
                if (raw / f"{name}{suffix}").exists():
                    shutil.move(raw / f"{name}{suffix}", old / f"{name}{suffix}")
            moved = [x for x in rc_lines if x.split(" ", 1)[0] == name]
            rc_lines = [x for x in rc_lines if x.split(" ", 1)[0] != name]
            with open(old / "rc.txt", "a") as f:
                f.writelines(x + "\n" for x in moved)
        if (lane / f"{name}.jsonl").exists():  # a KV-only engine times no steps
            with open(lane / f"{name}.jsonl", "rb") as src, lzma.open(
                    raw / f"{name}.jsonl.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
                shutil.copyfileobj(src, dst)
        traces = lane / f"{name}.traces"
        if traces.is_dir():
            (raw / traces.name).mkdir(exist_ok=True)
            # the profiler's files, and a core trace's (runner.py --trace-core: coretrace/)
            for f in sorted([*traces.iterdir(), *traces.glob("coretrace/core-*.jsonl")]):
                dest = raw / traces.name / f.relative_to(traces)
                if f.name.endswith((".json", ".jsonl")):
                    dest.parent.mkdir(exist_ok=True)
                    with open(f, "rb") as src, lzma.open(f"{dest}.xz", "wb", preset=9) as dst:
                        shutil.copyfileobj(src, dst)
                elif f.name.endswith(".txt"):
                    shutil.copy(f, dest)
        meta = json.loads((lane / f"{name}.meta.json").read_text())
        meta["runner_commit"] = commit
        (raw / f"{name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if (lane / f"{name}.log").exists():
            with open(lane / f"{name}.log", "rb") as src, gzip.open(logs / f"{name}.log.gz",
                                                                     "wb") as dst:
                shutil.copyfileobj(src, dst)
        rc_lines.append(line)
    (raw / "rc.txt").write_text("".join(x + "\n" for x in rc_lines))
    if (args.lanes[0] / "nvidia-smi.csv").exists():
        shutil.copy(args.lanes[0] / "nvidia-smi.csv", logs / "nvidia-smi.csv")
    print(f"stored {len(plan)} runs; logs in {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
