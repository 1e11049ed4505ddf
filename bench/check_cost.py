"""What the verification costs: evaluations per minute of one seeded search, run by two copies
of the package side by side (e.g. before and after a change to the checks), on one backend.

    python bench/check_cost.py --trees OLD_DIR . --backend cpu --op softmax --shape 512x1024

Each tree is a folder holding a `tuner` package; each search is `tuner tune` with the random
sampler and the same seed, so both evaluate the same configs. Prints a table: evaluations,
statuses, search seconds, evaluations per minute."""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.cli import NO_WINNER


def run(tree: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "tuner", "tune", args.op, "--shape", args.shape, "--backend", args.backend,
               "--budget", str(args.budget), "--sampler", "random", "--seed", "1", "--json", "--quiet",
               "--runs-dir", tmp]
        root = str(Path(tree).resolve())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=3600)
        if out.returncode not in (0, NO_WINNER):
            raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
        summary = json.loads(out.stdout)
        run_dir = next(Path(tmp).iterdir())
        statuses = collections.Counter(json.loads(line)["measurement"]["status"]
                                       for line in (run_dir / "records.jsonl").read_text().splitlines() if line)
    tl = summary.get("timeline", {})
    search_s = tl.get("search_done_s", summary["wall_s"]) - tl.get("device_and_reference_s", 0.0)
    return {"tree": tree, "evaluations": summary["evaluations"], "statuses": dict(statuses),
            "search_s": round(search_s, 2), "per_min": round(60 * summary["evaluations"] / max(search_s, 1e-9), 1),
            "best_ms": round(summary["best"]["median_s"] * 1e3, 4) if summary.get("best") else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=["."])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--op", default="softmax")
    ap.add_argument("--shape", default="512x1024")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = [run(t, args) for t in args.trees]
    print(f"| tree | evaluations | statuses | search s | evaluations/min | best ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        st = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        print(f"| {r['tree']} | {r['evaluations']} | {st} | {r['search_s']} | {r['per_min']} | {r['best_ms']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
